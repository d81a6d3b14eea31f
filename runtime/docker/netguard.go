package docker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/sandbox"
)

// The network guard keeps sandboxes from what they must never reach: the
// host they run on, the cloud metadata services (credentials of the
// host's cloud identity live there), and by default every private, shared
// and link-local range, where the host's own network, the rest of the
// cloud account and any cluster beside it live. The rules sit in the
// host's firewall, out of the sandbox's reach (it holds no NET_ADMIN):
//
//	DOCKER-USER (or FORWARD), INPUT
//	  -> OPENSANDBOX-GUARD               one jump per source range of each guarded network
//	     -> OSB-GUARD-<network id>       that network's rules, replaced as a whole
//
// A network's chain lets through, in this order: replies to connections
// made from outside (published ports), DNS to the resolvers Docker's
// embedded DNS forwards to (it forwards from inside the container's
// network namespace, so those queries pass here with the sandbox's
// address), and the configured holes; then it rejects new connections to
// the host itself, drops broadcast and multicast, and rejects the blocked
// ranges. Everything else returns to Docker's own rules.
//
// One network has one guard: the server that starts last on a network
// sets it for every server that shares the network, so servers that share
// one should share these settings.

// guardChain is the chain the guard jumps to from the host's chains.
const guardChain = "OPENSANDBOX-GUARD"

// guardNetChainPrefix starts the name of each network's chain.
const guardNetChainPrefix = "OSB-GUARD-"

// guardNetChain names the chain of the network with the given ID (12 hex
// digits of it, as Docker shows them: 22 characters, within iptables'
// limit of 28).
func guardNetChain(networkID string) string {
	return guardNetChainPrefix + networkID[:min(12, len(networkID))]
}

// setNetworkDefaults fills in the network keys' defaults.
func (c *Config) setNetworkDefaults() {
	if c.BlockMetadata == nil {
		t := true
		c.BlockMetadata = &t
	}
	if c.BlockedCIDRs == nil { // absent; blocked_cidrs = [] blocks none
		c.BlockedCIDRs = slices.Clone(sandbox.DefaultBlockedCIDRs)
	}
}

// validateNetwork checks the network keys and keeps what they say.
func (c *Config) validateNetwork() error {
	c.blocked, c.allowed, c.dns = nil, nil, nil
	blocked := slices.Clone(c.BlockedCIDRs)
	if *c.BlockMetadata {
		blocked = slices.Concat(sandbox.MetadataCIDRs, blocked)
	}
	for _, s := range blocked {
		d, err := sandbox.ParseDestination(s, false)
		if err != nil {
			return fmt.Errorf("runtime.docker.blocked_cidrs: %q: %w", s, err)
		}
		if !slices.Contains(c.blocked, d.Prefix) {
			c.blocked = append(c.blocked, d.Prefix)
		}
	}
	for _, s := range c.AllowedCIDRs {
		d, err := sandbox.ParseDestination(s, true)
		if err != nil {
			return fmt.Errorf("runtime.docker.allowed_cidrs: %q: %w", s, err)
		}
		c.allowed = append(c.allowed, d)
	}
	for _, s := range c.DNS {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return fmt.Errorf("runtime.docker.dns: %q is not an IP address", s)
		}
		c.dns = append(c.dns, a)
	}
	return nil
}

// guardPolicy is what the guard of one network enforces: pure data, which
// rules turns into firewall rules.
type guardPolicy struct {
	// blocked are the ranges sandboxes may not reach. None: no guard.
	blocked []netip.Prefix
	// allowed are holes in the blocked ranges and in the host block.
	allowed []sandbox.Destination
	// resolvers are the DNS servers the sandboxes' queries are forwarded
	// to, reachable on port 53 whatever their range.
	resolvers []netip.Addr
	// isolate are the ranges of the runtime's own network, whose
	// sandboxes may not reach one another: not through the host's
	// published ports either, which the kernel forwards to the other
	// sandbox's address. No hole opens them.
	isolate []netip.Prefix
}

func (c *Config) guardPolicy(resolvers []netip.Addr) guardPolicy {
	return guardPolicy{blocked: c.blocked, allowed: c.allowed, resolvers: resolvers}
}

// on reports whether the policy needs a guard at all.
func (p guardPolicy) on() bool { return len(p.blocked) > 0 }

// nat64Prefix and sixToFourPrefix are the IPv6 ranges that embed IPv4
// addresses and that a host may route towards an IPv4 network: the NAT64
// well-known prefix (RFC 6052) and 6to4 (RFC 3056).
var (
	nat64Prefix     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFourPrefix = netip.MustParsePrefix("2002::/16")
	// mapped4Prefix holds the IPv4-mapped addresses: a sandbox that dials
	// ::ffff:10.0.0.1 sends IPv4 (matched by the IPv4 rules); as an IPv6
	// destination on the wire it is bogus.
	mapped4Prefix = netip.MustParsePrefix("::ffff:0:0/96")
)

// embed4 returns the IPv6 range that spells the IPv4 range p4 inside
// prefix6 (whose length is 96 or less), the IPv4 bits right after it.
func embed4(prefix6, p4 netip.Prefix) netip.Prefix {
	b := prefix6.Addr().As16()
	v4 := p4.Addr().As4()
	at := prefix6.Bits() / 8
	copy(b[at:at+4], v4[:])
	return netip.PrefixFrom(netip.AddrFrom16(b), prefix6.Bits()+p4.Bits())
}

// blocked6 returns the IPv6 ranges the policy blocks: the configured ones,
// and every configured IPv4 range as NAT64 and 6to4 spell it.
func (p guardPolicy) blocked6() []netip.Prefix {
	out := []netip.Prefix{mapped4Prefix}
	for _, b := range p.blocked {
		if b.Addr().Is6() {
			out = append(out, b)
		}
	}
	for _, b := range p.blocked {
		if b.Addr().Is4() {
			out = append(out, embed4(nat64Prefix, b), embed4(sixToFourPrefix, b))
		}
	}
	return out
}

// rules returns the rules of a network's chain for IPv4 or IPv6, each as
// the arguments that follow "-A CHAIN".
func (p guardPolicy) rules(v6 bool) [][]string {
	var rules [][]string
	add := func(r ...string) { rules = append(rules, r) }
	family := func(a netip.Addr) bool { return a.Is6() == v6 }
	// Replies: published ports are connections from outside into the
	// sandbox, and their answers go back through here.
	add("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN")
	for _, r := range p.resolvers {
		if family(r) {
			for _, proto := range []string{"udp", "tcp"} {
				add("-d", netip.PrefixFrom(r, r.BitLen()).String(), "-p", proto, "--dport", "53", "-j", "RETURN")
			}
		}
	}
	if v6 {
		// Neighbour discovery with the host: without it a sandbox has no
		// IPv6 at all.
		for _, t := range []string{"router-solicitation", "neighbour-solicitation", "neighbour-advertisement"} {
			add("-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", t, "-j", "RETURN")
		}
	}
	for _, n := range p.isolate {
		if family(n.Addr()) {
			add("-d", n.String(), "-j", "REJECT")
		}
	}
	for _, d := range p.allowed {
		if !family(d.Prefix.Addr()) {
			continue
		}
		if d.Port == 0 {
			add("-d", d.Prefix.String(), "-j", "RETURN")
			continue
		}
		for _, proto := range []string{"tcp", "udp"} {
			add("-d", d.Prefix.String(), "-p", proto, "--dport", strconv.Itoa(int(d.Port)), "-j", "RETURN")
		}
	}
	// The host itself, on every address it has (the gateway, its public
	// and private addresses): no service of the host is the sandbox's
	// business.
	add("-m", "addrtype", "--dst-type", "LOCAL", "-j", "REJECT")
	if !v6 {
		add("-m", "addrtype", "--dst-type", "BROADCAST", "-j", "DROP")
	}
	add("-m", "addrtype", "--dst-type", "MULTICAST", "-j", "DROP")
	blocked := p.blocked
	if v6 {
		blocked = p.blocked6()
	}
	for _, b := range blocked {
		if family(b.Addr()) {
			add("-d", b.String(), "-j", "REJECT")
		}
	}
	return rules
}

// chainScript returns the iptables-restore input that replaces the chain
// of a network with rules, in one transaction: no packet ever sees a
// half-made chain. The first rule is a comment with a fingerprint of the
// rest, by which a server sees that it replaces another configuration.
func chainScript(chain string, rules [][]string) (script, fingerprint string) {
	var body strings.Builder
	for _, r := range rules {
		body.WriteString("-A " + chain + " " + strings.Join(r, " ") + "\n")
	}
	sum := sha256.Sum256([]byte(body.String()))
	fingerprint = hex.EncodeToString(sum[:8])
	return "*filter\n:" + chain + " - [0:0]\n" +
		"-A " + chain + ` -m comment --comment "opensandbox guard ` + fingerprint + `"` + "\n" +
		body.String() + "COMMIT\n", fingerprint
}

// jumps returns the rules of the guard chain that send a network's
// traffic to its chain: one per source range of the family, and on an
// IPv6 bridge one for link-local sources from its interface.
func jumps(n guardNetwork, v6 bool) [][]string {
	chain := guardNetChain(n.id)
	var out [][]string
	for _, s := range n.subnets {
		if s.Addr().Is6() == v6 {
			out = append(out, []string{"-s", s.String(), "-j", chain})
		}
	}
	if v6 && n.bridge != "" && len(out) > 0 {
		out = append(out, []string{"-s", "fe80::/10", "-i", n.bridge, "-j", chain})
	}
	return out
}

// resolvConf is the file the engine takes its DNS servers from, and the
// one it takes them from when that file names only a local stub (as
// systemd-resolved's 127.0.0.53).
var resolvConf = []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"}

// hostResolvers returns the name servers the engine gives containers that
// ask for none: those of the first file of paths that names one that is
// not on loopback (a loopback server is dialed from the host, never
// through the guard).
func hostResolvers(paths []string) []netip.Addr {
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var out []netip.Addr
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "nameserver" {
				continue
			}
			if a, err := netip.ParseAddr(f[1]); err == nil && !a.IsLoopback() && a.Zone() == "" {
				out = append(out, a.Unmap())
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// firewall runs one family's iptables commands.
type firewall struct {
	cmd, restore string
	v6           bool
}

var (
	firewall4 = firewall{cmd: "iptables", restore: "iptables-restore"}
	firewall6 = firewall{cmd: "ip6tables", restore: "ip6tables-restore", v6: true}
)

func (f firewall) run(ctx context.Context, args ...string) (string, error) {
	return f.exec(ctx, f.cmd, nil, args...)
}

// apply runs an iptables-restore script without touching the chains it
// does not name.
func (f firewall) apply(ctx context.Context, script string) error {
	_, err := f.exec(ctx, f.restore, strings.NewReader(script), "--noflush")
	return err
}

func (f firewall) exec(ctx context.Context, name string, stdin *strings.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, append([]string{"-w", "5"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// rule is one rule of iptables -S output: its options by name, and the
// arguments that would add it again.
type rule struct {
	chain string
	opts  map[string]string
	args  []string
}

// listRules returns the rules of chain (nil if there is no such chain).
// Rules with quoted arguments (comments) keep their quotes in args; the
// guard chain, the only one this is used on, never has them.
func (f firewall) listRules(ctx context.Context, chain string) ([]rule, bool) {
	out, err := f.run(ctx, "-S", chain)
	if err != nil {
		return nil, false
	}
	var rules []rule
	for line := range strings.Lines(out) {
		args := strings.Fields(line)
		if len(args) < 2 || args[0] != "-A" {
			continue
		}
		r := rule{chain: args[1], opts: map[string]string{}, args: args[2:]}
		for i := 2; i+1 < len(args); i++ {
			if strings.HasPrefix(args[i], "-") {
				r.opts[args[i]] = args[i+1]
			}
		}
		rules = append(rules, r)
	}
	return rules, true
}

// sameRule reports whether a listed rule is the rule args would add
// (options and their values alike, in any order).
func sameRule(r rule, args []string) bool {
	want := map[string]string{}
	for i := 0; i+1 < len(args); i += 2 {
		want[args[i]] = args[i+1]
	}
	for k, v := range want {
		if r.opts[k] != v {
			return false
		}
	}
	return len(r.opts) == len(want)
}

// guardMu serializes the guard's changes within this process (several
// runtimes in one test binary); lockGuard serializes them between
// processes.
var guardMu sync.Mutex

// guardLockPath is the file whose lock serializes guard changes between
// servers on one host.
const guardLockPath = "/run/opensandbox-netguard.lock"

func lockGuard() (unlock func(), err error) {
	guardMu.Lock()
	f, err := os.OpenFile(guardLockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		guardMu.Unlock()
		return nil, fmt.Errorf("open the guard's lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		guardMu.Unlock()
		return nil, fmt.Errorf("lock %s: %w", guardLockPath, err)
	}
	return func() { f.Close(); guardMu.Unlock() }, nil
}

// installGuard makes the guard of the sandbox network what the
// configuration says, replacing what an earlier start left: with a policy
// that blocks nothing it removes the network's rules. It also removes the
// chains of networks that no longer exist.
func installGuard(ctx context.Context, eng *engine, cfg *Config, log *slog.Logger) (*installedGuard, error) {
	n, err := eng.network(ctx, cfg.Network)
	if err != nil {
		return nil, err
	}
	resolvers := cfg.dns
	if len(resolvers) == 0 {
		resolvers = hostResolvers(resolvConf)
	}
	p := cfg.guardPolicy(resolvers)
	if cfg.Network == defaultNetwork {
		p.isolate = n.subnets
	}
	unlock, err := lockGuard()
	if err != nil && !p.on() {
		// Off, and most likely not root: there is nothing this server
		// could have installed to remove.
		log.Warn("sandbox network guard off: sandboxes may reach the host, its networks and the metadata services",
			"network", n.name, "cleanup", err)
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	defer unlock()
	for _, fw := range []firewall{firewall4, firewall6} {
		want := p.on() && (!fw.v6 || n.ipv6)
		if !want {
			if err := fw.removeNetwork(ctx, n.id); err != nil && !errors.Is(err, exec.ErrNotFound) {
				log.Warn("remove the guard of a network", "network", n.name, "cmd", fw.cmd, "err", err)
			}
		} else if err := fw.install(ctx, n, p, log); err != nil {
			return nil, err
		}
		fw.removeStale(ctx, eng, n.id, log)
	}
	if !p.on() {
		log.Warn("sandbox network guard off: sandboxes may reach the host, its networks and the metadata services",
			"network", n.name)
		return nil, nil
	}
	log.Info("sandbox network guard", "network", n.name, "blocked", p.blocked, "allowed", p.allowed,
		"dns", p.resolvers, "ipv6", n.ipv6)
	return &installedGuard{n: n, p: p, checked: time.Now()}, nil
}

// installedGuard is the guard this server installed, which it checks
// now and then is still in place.
type installedGuard struct {
	n       guardNetwork
	p       guardPolicy
	checked time.Time
}

// guardCheckEvery is how often the guard is checked: a firewall reload
// (firewalld, iptables-restore, netfilter-persistent) removes it without
// a word.
const guardCheckEvery = 30 * time.Second

// checkGuard puts the guard back if something removed any part of it:
// its chain, the rules sending the network to it, the host's jumps.
func (r *Runtime) checkGuard(ctx context.Context) {
	g := r.guard
	if g == nil || time.Since(g.checked) < guardCheckEvery {
		return
	}
	g.checked = time.Now()
	for _, fw := range []firewall{firewall4, firewall6} {
		if fw.v6 && !g.n.ipv6 {
			continue
		}
		if fw.intact(ctx, g.n, g.p) {
			continue
		}
		r.log.Error("the sandbox network guard was gone from the host's firewall (a firewall reload?); putting it back",
			"network", g.n.name, "cmd", fw.cmd)
		unlock, err := lockGuard()
		if err != nil {
			r.log.Error("put the network guard back", "err", err)
			continue
		}
		if err := fw.install(ctx, g.n, g.p, r.log); err != nil {
			r.log.Error("put the network guard back", "err", err)
		}
		unlock()
	}
}

// intact reports whether the guard of network n with policy p is whole in
// this firewall.
func (f firewall) intact(ctx context.Context, n guardNetwork, p guardPolicy) bool {
	chain := guardNetChain(n.id)
	_, fingerprint := chainScript(chain, p.rules(f.v6))
	if out, err := f.run(ctx, "-S", chain); err != nil || !strings.Contains(out, "opensandbox guard "+fingerprint) {
		return false
	}
	have, ok := f.listRules(ctx, guardChain)
	if !ok {
		return false
	}
	for _, args := range jumps(n, f.v6) {
		if !slices.ContainsFunc(have, func(r rule) bool { return sameRule(r, args) }) {
			return false
		}
	}
	forward := "DOCKER-USER"
	if _, err := f.run(ctx, "-n", "-L", forward); err != nil {
		forward = "FORWARD"
	}
	for _, c := range []string{forward, "INPUT"} {
		if _, err := f.run(ctx, "-C", c, "-j", guardChain); err != nil {
			return false
		}
	}
	return true
}

// install replaces network n's chain and makes the guard chain, and the
// host's chains, jump to it.
func (f firewall) install(ctx context.Context, n guardNetwork, p guardPolicy, log *slog.Logger) error {
	if _, err := f.run(ctx, "-n", "-L", guardChain); err != nil {
		if _, err := f.run(ctx, "-N", guardChain); err != nil {
			return err
		}
	}
	chain := guardNetChain(n.id)
	script, fingerprint := chainScript(chain, p.rules(f.v6))
	if out, err := f.run(ctx, "-S", chain); err == nil && strings.Contains(out, "opensandbox guard") &&
		!strings.Contains(out, "opensandbox guard "+fingerprint) {
		log.Warn("replacing the network guard another configuration installed (servers that share a network should share its settings)",
			"network", n.name, "chain", chain)
	}
	if err := f.apply(ctx, script); err != nil {
		return err
	}
	want := jumps(n, f.v6)
	have, _ := f.listRules(ctx, guardChain)
	for _, args := range want {
		if !slices.ContainsFunc(have, func(r rule) bool { return sameRule(r, args) }) {
			if _, err := f.run(ctx, append([]string{"-A", guardChain}, args...)...); err != nil {
				return err
			}
		}
	}
	// What else jumps to this network's chain (its ranges changed) goes,
	// and so do the rules an older version put in the guard chain itself
	// for this network's ranges: this chain replaces them.
	for _, r := range have {
		stale := r.opts["-j"] == chain && !slices.ContainsFunc(want, func(args []string) bool { return sameRule(r, args) })
		legacy := !strings.HasPrefix(r.opts["-j"], guardNetChainPrefix) &&
			slices.ContainsFunc(n.subnets, func(s netip.Prefix) bool { return r.opts["-s"] == s.String() })
		if stale || legacy {
			if _, err := f.run(ctx, append([]string{"-D", guardChain}, r.args...)...); err != nil {
				log.Warn("remove a rule of the guard chain", "rule", strings.Join(r.args, " "), "err", err)
			}
		}
	}
	forward := "DOCKER-USER"
	if _, err := f.run(ctx, "-n", "-L", forward); err != nil {
		forward = "FORWARD"
	}
	for _, c := range []string{forward, "INPUT"} {
		if _, err := f.run(ctx, "-C", c, "-j", guardChain); err != nil {
			if _, err := f.run(ctx, "-I", c, "1", "-j", guardChain); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeNetwork removes the chain of the network with the given ID and
// the jumps to it.
func (f firewall) removeNetwork(ctx context.Context, id string) error {
	chain := guardNetChain(id)
	rules, _ := f.listRules(ctx, guardChain)
	for _, r := range rules {
		if r.opts["-j"] == chain {
			if _, err := f.run(ctx, append([]string{"-D", guardChain}, r.args...)...); err != nil {
				return err
			}
		}
	}
	if _, err := f.run(ctx, "-n", "-L", chain); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return err
		}
		return nil // no such chain
	}
	if _, err := f.run(ctx, "-F", chain); err != nil {
		return err
	}
	_, err := f.run(ctx, "-X", chain)
	return err
}

// removeStale removes the chains of networks the engine no longer has
// (made by tests, or removed by an operator), so that their rules never
// apply to a later network that gets the same range.
func (f firewall) removeStale(ctx context.Context, eng *engine, keep string, log *slog.Logger) {
	out, err := f.run(ctx, "-S")
	if err != nil {
		return
	}
	for line := range strings.Lines(out) {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "-N "+guardNetChainPrefix)
		if !ok || strings.HasPrefix(keep, name) {
			continue
		}
		if _, err := eng.network(ctx, name); !errors.Is(err, errNoSuchObject) {
			continue // it exists, or the engine could not say
		}
		if err := f.removeNetwork(ctx, name); err != nil {
			log.Warn("remove the guard of a network that is gone", "chain", guardNetChainPrefix+name, "err", err)
		}
	}
}
