package docker

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/standin"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files of testdata")

// TestNetworkDefaults: an absent blocked_cidrs blocks the private,
// shared and link-local ranges, [] blocks none of them, and the metadata
// ranges stay blocked unless block_metadata is off.
func TestNetworkDefaults(t *testing.T) {
	prefixes := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	off := false
	cases := []struct {
		name string
		cfg  Config
		want []netip.Prefix
	}{
		{"default", Config{}, prefixes("169.254.0.0/16", "100.100.100.200/32", "fd00:ec2::254/128",
			"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7", "fe80::/10")},
		{"emptied", Config{BlockedCIDRs: []string{}}, prefixes("169.254.0.0/16", "100.100.100.200/32", "fd00:ec2::254/128")},
		{"narrowed", Config{BlockedCIDRs: []string{"10.0.0.0/8", "203.0.113.7"}},
			prefixes("169.254.0.0/16", "100.100.100.200/32", "fd00:ec2::254/128", "10.0.0.0/8", "203.0.113.7/32")},
		{"off", Config{BlockedCIDRs: []string{}, BlockMetadata: &off}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.setNetworkDefaults()
			if err := cfg.validateNetwork(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.blocked, c.want) {
				t.Fatalf("blocked = %v, want %v", cfg.blocked, c.want)
			}
			if on := cfg.guardPolicy(nil).on(); on != (len(c.want) > 0) {
				t.Fatalf("guard on = %v", on)
			}
		})
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{BlockedCIDRs: []string{"10.0.0.0/8:22"}}, "runtime.docker.blocked_cidrs"},
		{Config{AllowedCIDRs: []string{"10.0.0.1/8"}}, "runtime.docker.allowed_cidrs"},
		{Config{DNS: []string{"dns.internal"}}, "runtime.docker.dns"},
	} {
		cfg := c.cfg
		cfg.setNetworkDefaults()
		if err := cfg.validateNetwork(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}

// TestGuardRules compares the chains of a network with
// testdata/guard.golden: the order is the policy (replies, DNS, holes,
// the host, the blocked ranges), so any change to it shows here.
func TestGuardRules(t *testing.T) {
	cfg := Config{AllowedCIDRs: []string{"10.1.2.3:443", "192.168.5.0/24", "[fd00::1]:443"}}
	cfg.setNetworkDefaults()
	if err := cfg.validateNetwork(); err != nil {
		t.Fatal(err)
	}
	p := cfg.guardPolicy([]netip.Addr{netip.MustParseAddr("10.255.255.53"), netip.MustParseAddr("fd00::53")})
	n := guardNetwork{id: "0123456789abcdef", bridge: "br-0123456789ab",
		subnets: []netip.Prefix{netip.MustParsePrefix("172.18.0.0/16"), netip.MustParsePrefix("fd7a::/64")}}
	p.isolate = n.subnets
	var got strings.Builder
	for _, v6 := range []bool{false, true} {
		script, _ := chainScript("OSB-GUARD-0123456789ab", p.rules(v6))
		got.WriteString(script)
		for _, j := range jumps(n, v6) {
			got.WriteString("-A " + guardChain + " " + strings.Join(j, " ") + "\n")
		}
	}
	golden := filepath.Join("testdata", "guard.golden")
	if *updateGolden {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Fatalf("rules differ from %s (go test -run TestGuardRules -update rewrites it):\n%s", golden, got.String())
	}
}

// TestGuardRulesOrder checks the properties the golden file shows, so a
// rewrite of it cannot lose them unseen.
func TestGuardRulesOrder(t *testing.T) {
	cfg := Config{AllowedCIDRs: []string{"10.1.2.3:443"}}
	cfg.setNetworkDefaults()
	cfg.validateNetwork()
	p := cfg.guardPolicy([]netip.Addr{netip.MustParseAddr("10.0.0.2")})
	p.isolate = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	rules := p.rules(false)
	index := func(part string) int {
		return slices.IndexFunc(rules, func(r []string) bool { return strings.Contains(strings.Join(r, " "), part) })
	}
	replies, dns, hole := index("ESTABLISHED,RELATED"), index("-d 10.0.0.2/32 -p udp --dport 53"), index("-d 10.1.2.3/32 -p tcp --dport 443")
	host, private, metadata := index("--dst-type LOCAL -j REJECT"), index("-d 10.0.0.0/8 -j REJECT"), index("-d 169.254.0.0/16 -j REJECT")
	for name, i := range map[string]int{"replies": replies, "dns": dns, "hole": hole, "host": host, "private": private, "metadata": metadata} {
		if i < 0 {
			t.Fatalf("no %s rule in %q", name, rules)
		}
	}
	// The network's own range is shut before any hole: no hole may open
	// one sandbox to another.
	if own := index("-d 10.1.0.0/16 -j REJECT"); own < 0 || own > hole || own < replies {
		t.Fatalf("the network's own range is not shut before the holes: %q", rules)
	}
	if !(replies < dns && dns < host && hole < host && host < private && host < metadata) {
		t.Fatalf("rules out of order: %q", rules)
	}
	for _, r := range p.rules(true) {
		if s := strings.Join(r, " "); strings.Contains(s, "10.") {
			t.Fatalf("an IPv4 address in an IPv6 rule: %s", s)
		}
	}
	six := strings.Join(slices.Concat(p.rules(true)...), " ")
	for _, want := range []string{"::ffff:0.0.0.0/96", "64:ff9b::a9fe:0/112", "2002:a9fe::/32", "64:ff9b::a00:0/104", "fc00::/7", "fe80::/10"} {
		if !strings.Contains(six, "-d "+want+" -j REJECT") {
			t.Errorf("IPv6 rules do not block %s: %s", want, six)
		}
	}
}

func TestEmbed4(t *testing.T) {
	for _, c := range []struct{ p6, p4, want string }{
		{"64:ff9b::/96", "169.254.0.0/16", "64:ff9b::a9fe:0/112"},
		{"64:ff9b::/96", "100.100.100.200/32", "64:ff9b::6464:64c8/128"},
		{"2002::/16", "10.0.0.0/8", "2002:a00::/24"},
		{"2002::/16", "192.168.0.0/16", "2002:c0a8::/32"},
	} {
		if got := embed4(netip.MustParsePrefix(c.p6), netip.MustParsePrefix(c.p4)); got.String() != c.want {
			t.Errorf("embed4(%s, %s) = %s, want %s", c.p6, c.p4, got, c.want)
		}
	}
}

func TestHostResolvers(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o644)
		return p
	}
	plain := write("plain", "# made by dhcp\nsearch example.internal\nnameserver 10.255.255.53\nnameserver 127.0.0.1\nnameserver fd00::53\noptions ndots:2\n")
	stub := write("stub", "nameserver 127.0.0.53\noptions edns0\n")
	upstream := write("upstream", "nameserver 172.31.0.2\n")
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, c := range []struct {
		name  string
		paths []string
		want  []netip.Addr
	}{
		{"plain", []string{plain, upstream}, addrs("10.255.255.53", "fd00::53")},
		{"systemd stub", []string{stub, upstream}, addrs("172.31.0.2")},
		{"stub only", []string{stub, filepath.Join(dir, "missing")}, nil},
		{"none", []string{filepath.Join(dir, "missing")}, nil},
	} {
		if got := hostResolvers(c.paths); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSameRule(t *testing.T) {
	r := rule{opts: map[string]string{"-s": "fe80::/10", "-i": "br-1", "-j": "OSB-GUARD-1"}}
	if !sameRule(r, []string{"-s", "fe80::/10", "-i", "br-1", "-j", "OSB-GUARD-1"}) {
		t.Error("the same rule in another order did not match")
	}
	if sameRule(r, []string{"-s", "fe80::/10", "-j", "OSB-GUARD-1"}) {
		t.Error("a rule without -i matched one with it")
	}
}

// TestContainerDNS: the dns key reaches the container; without it the
// engine chooses.
func TestContainerDNS(t *testing.T) {
	for _, dns := range [][]string{nil, {"10.0.0.2", "fd00::53"}} {
		cfg := Config{DNS: dns, ExecdPath: "/bin/true"}
		cfg.setDefaults()
		_, hc, _, err := containerConfig(&cfg, sandbox.ID("x"), &sandbox.Spec{Image: "img"}, time.Now(), "token", "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(hc.DNS, dns) {
			t.Errorf("dns %v: container gets %v", dns, hc.DNS)
		}
	}
}

// testNetwork makes a Docker network like the runtime's own (a bridge
// without inter-container traffic), with IPv6 from subnet6 when it is not
// empty, and removes it and its guard chains when the test ends.
func testNetwork(t *testing.T, subnet6 string) guardNetwork {
	t.Helper()
	testenv.MustHaveRoot(t)
	testenv.MustHaveDocker(t)
	testenv.MustHaveCommand(t, "iptables")
	name := "osbt-" + testScope()[len("test-"):]
	args := []string{"network", "create", "-o", "com.docker.network.bridge.enable_icc=false"}
	if subnet6 != "" {
		testenv.MustHaveCommand(t, "ip6tables")
		args = append(args, "--ipv6", "--subnet", subnet6)
	}
	if out, err := exec.Command("docker", append(args, name)...).CombinedOutput(); err != nil {
		t.Fatalf("docker network create: %v: %s", err, out)
	}
	eng, err := newEngine("")
	if err != nil {
		t.Fatal(err)
	}
	defer eng.close()
	n, err := eng.network(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		exec.Command("docker", "network", "rm", name).Run()
		for _, fw := range []firewall{firewall4, firewall6} {
			fw.removeNetwork(context.Background(), n.id)
		}
	})
	return n
}

// gateway returns the host's address on network n for the family.
func gateway(t *testing.T, n guardNetwork, v6 bool) netip.Addr {
	t.Helper()
	out, err := exec.Command("ip", "-o", "addr", "show", "dev", n.bridge).Output()
	if err != nil {
		t.Fatalf("ip addr show dev %s: %v", n.bridge, err)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if p, err := netip.ParsePrefix(f[i+1]); err == nil && (f[i] == "inet" || f[i] == "inet6") &&
				p.Addr().Is6() == v6 && !p.Addr().IsLinkLocalUnicast() {
				return p.Addr()
			}
		}
	}
	t.Fatalf("no address on %s", n.bridge)
	return netip.Addr{}
}

// hostAddress returns the host's address on the interface of its
// default route (its address on its own network), for the family.
func hostAddress(t *testing.T, v6 bool) (netip.Addr, bool) {
	t.Helper()
	family := "-4"
	if v6 {
		family = "-6"
	}
	out, _ := exec.Command("ip", "-o", family, "route", "show", "default").Output()
	f := strings.Fields(string(out))
	dev := slices.Index(f, "dev")
	if dev < 0 || dev+1 >= len(f) {
		return netip.Addr{}, false
	}
	out, _ = exec.Command("ip", "-o", family, "addr", "show", "dev", f[dev+1], "scope", "global").Output()
	if f := strings.Fields(string(out)); len(f) > 3 {
		if p, err := netip.ParsePrefix(f[3]); err == nil {
			return p.Addr(), true
		}
	}
	return netip.Addr{}, false
}

// hostListener serves "host" on every address of the host, as a service
// listening on 0.0.0.0 (and ::) does, and returns its port.
func hostListener(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "reached host") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// reach sends an HTTP request to host:port from inside a sandbox (with
// busybox's nc: its wget crashes in this image) and says whether body came
// back, with what the sandbox printed.
func reach(t *testing.T, rt *Runtime, id sandbox.ID, hostPort, body string) (bool, string) {
	t.Helper()
	host, port, _ := strings.Cut(hostPort, " ")
	out, _ := run(t, rt, id, `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 `+host+" "+port+" 2>&1")
	return strings.Contains(out, "reached "+body), strings.TrimSpace(out)
}

// target is host and port as reach takes them.
func target(a netip.Addr, port int) string { return a.String() + " " + strconv.Itoa(port) }

// TestNetworkGuard: on a network of its own, a sandbox cannot reach the
// metadata address, a private address, the host (its gateway address and
// a service on all of its addresses), or its DNS server on any port but
// 53, while its DNS, through a server on a blocked range, answers. Each
// stand-in answers the host first, so it works; a hole lets one through;
// and with the lists emptied the same sandbox reaches them all, so what
// stopped it was the guard.
func TestNetworkGuard(t *testing.T) {
	n := testNetwork(t, "")
	ten := netip.MustParsePrefix("10.187.0.0/16")
	sn := standin.New(t, standin.Pick(t, ten, 1), netip.Addr{})
	metadata, private, resolver := netip.MustParseAddr("169.254.169.254"), standin.Pick(t, ten, 7), standin.Pick(t, ten, 53)
	for _, a := range []netip.Addr{metadata, private, resolver} {
		sn.Add(a)
	}
	type probe struct{ name, body, target string }
	var probes []probe
	for body, a := range map[string]netip.Addr{"metadata": metadata, "private": private, "resolver": resolver} {
		url := sn.ServeHTTP(netip.AddrPortFrom(a, 80), "reached "+body)
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("the host does not reach the stand-in %s: %v", url, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != "reached "+body {
			t.Fatalf("stand-in %s: %q", url, got)
		}
		probes = append(probes, probe{body, body, target(a, 80)})
	}
	dns := sn.ServeDNS(resolver, map[string]netip.Addr{"web.test.": private})
	port := hostListener(t)
	probes = append(probes, probe{"host gateway", "host", target(gateway(t, n, false), port)})
	if a, ok := hostAddress(t, false); ok {
		// Outside every blocked range on most test machines: then only
		// the host rule stops it.
		probes = append(probes, probe{"host address", "host", target(a, port)})
	}

	rt := newTestRuntime(t, func(c *Config) { c.Network, c.DNS = n.name, []string{resolver.String()} })
	id := start(t, rt, sandbox.Spec{})
	ids := []sandbox.ID{id}
	if rt.runtimes["runsc"] {
		// gVisor's network stack sits in the same namespace, behind the
		// same host rules.
		ids = append(ids, start(t, rt, sandbox.Spec{Extensions: map[string]string{extRuntime: "runsc"}}))
	}
	for _, id := range ids {
		for _, p := range probes {
			if ok, out := reach(t, rt, id, p.target, p.body); ok || !strings.Contains(out, "refused") {
				t.Errorf("guarded sandbox %s reaching %s (%s): %q, want connection refused", id, p.name, p.target, out)
			}
		}
		if out, _ := run(t, rt, id, "nslookup web.test 2>&1"); !strings.Contains(out, private.String()) {
			t.Errorf("sandbox %s: nslookup web.test through a resolver on a blocked range: %q; the server saw %q", id, out, dns.Queries())
		}
	}

	// A hole for one port of one address, by a second server on the
	// network: its guard replaces the first's.
	newTestRuntime(t, func(c *Config) {
		c.Network, c.DNS, c.AllowedCIDRs = n.name, []string{resolver.String()}, []string{private.String() + ":80"}
	})
	if ok, out := reach(t, rt, id, target(private, 80), "private"); !ok {
		t.Errorf("private address with a hole for it: %q", out)
	}
	if ok, out := reach(t, rt, id, target(metadata, 80), "metadata"); ok {
		t.Errorf("metadata address with a hole elsewhere: %q", out)
	}

	off := false
	newTestRuntime(t, func(c *Config) { c.Network, c.BlockedCIDRs, c.BlockMetadata = n.name, []string{}, &off })
	for _, id := range ids {
		for _, p := range probes {
			if ok, out := reach(t, rt, id, p.target, p.body); !ok {
				t.Errorf("with the guard off, sandbox %s reaching %s (%s): %q", id, p.name, p.target, out)
			}
		}
	}
	if out, _ := firewall4.run(context.Background(), "-S", guardChain); strings.Contains(out, guardNetChain(n.id)) {
		t.Errorf("guard off, yet the guard chain jumps to the network's:\n%s", out)
	}
}

// TestGuardRemovesStaleChains: a start removes the chains of networks
// that are gone, and the rules an older version put in the guard chain
// for its own network.
func TestGuardRemovesStaleChains(t *testing.T) {
	ctx := context.Background()
	gone := testNetwork(t, "")
	newTestRuntime(t, func(c *Config) { c.Network = gone.name })
	if _, err := firewall4.run(ctx, "-n", "-L", guardNetChain(gone.id)); err != nil {
		t.Fatalf("no chain for network %s: %v", gone.name, err)
	}
	if out, err := exec.Command("docker", "network", "rm", gone.name).CombinedOutput(); err != nil {
		t.Fatalf("docker network rm: %v: %s", err, out)
	}
	n := testNetwork(t, "")
	legacy := []string{"-s", n.subnets[0].String(), "-d", "203.0.113.9/32", "-j", "REJECT"}
	if _, err := firewall4.run(ctx, append([]string{"-A", guardChain}, legacy...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { firewall4.run(ctx, append([]string{"-D", guardChain}, legacy...)...) })
	newTestRuntime(t, func(c *Config) { c.Network = n.name })
	if _, err := firewall4.run(ctx, "-n", "-L", guardNetChain(gone.id)); err == nil {
		t.Errorf("the chain of removed network %s is still there", gone.name)
	}
	if _, err := firewall4.run(ctx, append([]string{"-C", guardChain}, legacy...)...); err == nil {
		t.Error("an older version's rule for the network is still in the guard chain")
	}
	out, _ := firewall4.run(ctx, "-S", guardChain)
	if c := strings.Count(out, "-j "+guardNetChain(n.id)); c != len(jumps(n, false)) {
		t.Errorf("%d jumps to the network's chain, want %d:\n%s", c, len(jumps(n, false)), out)
	}
}

// TestNetworkGuardIPv6: on a network with IPv6, the guard holds in
// ip6tables too: the host (its gateway and link-local addresses) and
// another sandbox are unreachable over IPv6, until the guard is turned
// off.
func TestNetworkGuardIPv6(t *testing.T) {
	b := make([]byte, 5)
	rand.Read(b)
	subnet := netip.MustParsePrefix(fmt.Sprintf("fd%02x:%02x%02x:%02x%02x::/64", b[0], b[1], b[2], b[3], b[4])).String()
	n := testNetwork(t, subnet)
	if !n.ipv6 || n.bridge == "" {
		t.Fatalf("network %+v has no IPv6 bridge", n)
	}
	port := hostListener(t)
	targets := []string{target(gateway(t, n, true), port)}
	rt := newTestRuntime(t, func(c *Config) { c.Network = n.name })
	id := start(t, rt, sandbox.Spec{})
	if out := mustRun(t, rt, id, "ip -6 addr show dev eth0"); !strings.Contains(out, strings.TrimSuffix(subnet, "::/64")+"::") {
		t.Fatalf("the sandbox has no address of %s: %s", subnet, out)
	}
	// The host's link-local address on the bridge, as the sandbox sees it.
	out, _ := exec.Command("ip", "-o", "-6", "addr", "show", "dev", n.bridge, "scope", "link").Output()
	if f := strings.Fields(string(out)); len(f) > 3 {
		targets = append(targets, strings.Split(f[3], "/")[0]+"%eth0 "+strconv.Itoa(port))
	}
	// Another sandbox on the network, over IPv6: Docker 20.10 does not
	// keep containers apart over IPv6, the guard's fc00::/7 rule does.
	peer := start(t, rt, sandbox.Spec{Entrypoint: []string{"sh", "-c", "mkdir -p /www && echo 'reached peer' >/www/index.html && exec httpd -f -p 8080 -h /www"}})
	peerAddr := mustRun(t, rt, peer, "ip -6 -o addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1")
	for _, url := range targets {
		if ok, out := reach(t, rt, id, url, "host"); ok || !strings.Contains(out, "refused") {
			t.Errorf("guarded sandbox fetching %s: %q, want connection refused", url, out)
		}
	}
	if ok, out := reach(t, rt, id, peerAddr+" 8080", "peer"); ok || !strings.Contains(out, "refused") {
		t.Errorf("guarded sandbox reaching another sandbox at %s: %q, want connection refused", peerAddr, out)
	}
	out6, _ := firewall6.run(context.Background(), "-S", guardChain)
	if !strings.Contains(out6, "-i "+n.bridge) || !strings.Contains(out6, "-s "+subnet) {
		t.Errorf("ip6tables guard chain lacks the network's jumps:\n%s", out6)
	}
	off := false
	newTestRuntime(t, func(c *Config) { c.Network, c.BlockedCIDRs, c.BlockMetadata = n.name, []string{}, &off })
	for _, url := range targets {
		if ok, out := reach(t, rt, id, url, "host"); !ok {
			t.Errorf("with the guard off, fetching %s: %q", url, out)
		}
	}
	if ok, out := reach(t, rt, id, peerAddr+" 8080", "peer"); !ok {
		t.Errorf("with the guard off, reaching another sandbox at %s: %q", peerAddr, out)
	}
}

// TestGuardPutBack: a firewall reload that drops the guard's chain, or the
// rule sending the network to it, is undone at the next check.
func TestGuardPutBack(t *testing.T) {
	n := testNetwork(t, "")
	rt := newTestRuntime(t, func(c *Config) { c.Network = n.name })
	if rt.guard == nil {
		t.Fatal("no guard installed")
	}
	ctx := context.Background()
	chain := guardNetChain(n.id)
	if !firewall4.intact(ctx, n, rt.guard.p) {
		t.Fatal("the guard is not whole right after start")
	}
	// A reload that forgets the network's chain...
	if _, err := firewall4.run(ctx, "-F", chain); err != nil {
		t.Fatal(err)
	}
	// ...and the rule that sends the network to it.
	jump := jumps(n, false)[0]
	if _, err := firewall4.run(ctx, append([]string{"-D", guardChain}, jump...)...); err != nil {
		t.Fatal(err)
	}
	if firewall4.intact(ctx, n, rt.guard.p) {
		t.Fatal("intact says yes to a guard with its rules gone")
	}
	rt.guard.checked = time.Now().Add(-2 * guardCheckEvery)
	rt.checkGuard(ctx)
	if !firewall4.intact(ctx, n, rt.guard.p) {
		out, _ := firewall4.run(ctx, "-S", chain)
		t.Fatalf("the guard was not put back:\n%s", out)
	}
}
