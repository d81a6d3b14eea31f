package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/egress"
)

// Names of the chains and sets in TableName.
const (
	chainNAT    = "nat_output"
	chainOutput = "filter_output"
	chainInput  = "filter_input"
	chainRefuse = "refuse" // TCP reset, everything else dropped

	setLearned4 = "learned4"
	setLearned6 = "learned6"
	setAllow4   = "allow4"
	setAllow6   = "allow6"
	setDeny4    = "deny4"
	setDeny6    = "deny6"
	setNS4      = "nameservers4"
	setNS6      = "nameservers6"
)

// natPriority puts the redirects before any other destination NAT of the
// namespace (dstnat is -100): Docker's embedded DNS rewrites 127.0.0.11:53
// in the same hook, and the first NAT chain that maps a connection wins.
const natPriority = nftables.ChainPriority(-110)

// Table is the namespace's egress table, reached through one netlink
// socket opened in the namespace where Open ran. Its methods are safe for
// concurrent use. Closing it leaves the rules in force.
type Table struct {
	mu     sync.Mutex
	ns     *os.File // the namespace, to reconnect from any thread
	conn   *nftables.Conn
	table  *nftables.Table
	closed bool // after Close the library would dial in the caller's namespace
}

// ErrClosed is returned by the methods of a closed Table.
var ErrClosed = errors.New("nftables table is closed")

// Open connects to nftables in the calling thread's network namespace
// (lock the thread with runtime.LockOSThread when it was switched). It
// changes nothing until Apply.
func Open() (*Table, error) {
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	conn, err := dialNS(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &Table{
		ns:    ns,
		conn:  conn,
		table: &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet},
	}, nil
}

// sendBuffer is the netlink socket's send buffer: one Apply with the rule
// cap's worth of prefixes is one message of several hundred KiB.
const sendBuffer = 16 << 20

// dialNS opens a lasting nftables connection in the namespace ns.
func dialNS(ns *os.File) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if !processIn(ns) {
		// Entering a namespace (setns) needs CAP_SYS_ADMIN, which
		// osb-egress does not have: it runs in the namespace it programs,
		// and its sockets are opened there anyway.
		opts = append(opts, nftables.WithNetNSFd(int(ns.Fd())))
	}
	conn, err := nftables.New(append(opts,
		nftables.WithSockOptions(func(c *netlink.Conn) error {
			raw, err := c.SyscallConn()
			if err != nil {
				return err
			}
			var sysErr error
			err = raw.Control(func(fd uintptr) {
				// FORCE passes net.core.wmem_max; it needs CAP_NET_ADMIN,
				// which osb-egress has. Without it, take what SO_SNDBUF gives.
				if sysErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer); sysErr != nil {
					sysErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, sendBuffer)
				}
			})
			if err == nil {
				err = sysErr
			}
			if err != nil {
				return fmt.Errorf("set send buffer: %w", err)
			}
			return nil
		}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink socket: %w", err)
	}
	return conn, nil
}

// discardLocked throws away the messages queued on t.conn by opening a
// new connection: a half-built batch must never be sent.
func (t *Table) discardLocked() error {
	_ = t.conn.CloseLasting()
	conn, err := dialNS(t.ns)
	if err != nil {
		t.closed = true
		t.ns.Close()
		return fmt.Errorf("reconnect after a failed batch: %w", err)
	}
	t.conn = conn
	return nil
}

// Close closes the netlink socket. The rules and learned addresses stay
// in the kernel, so the namespace stays closed while osb-egress restarts.
func (t *Table) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	t.ns.Close()
	if err := t.conn.CloseLasting(); err != nil {
		return fmt.Errorf("close nftables netlink socket: %w", err)
	}
	return nil
}

// Remove deletes the whole table, rules and learned addresses included.
// A missing table is not an error.
func (t *Table) Remove() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	t.conn.DelTable(t.table)
	if err := t.conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete table %s: %w", TableName, err)
	}
	return nil
}

// Apply installs cfg as the namespace's whole ruleset in one netlink
// transaction: the kernel swaps the old rules for the new ones at once,
// so there is never a moment without rules. The learned sets keep their
// elements, whether they were learned by this Table or by an earlier
// process.
func (t *Table) Apply(cfg Config) error {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("apply egress rules: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if err := t.build(cfg); err != nil {
		return errors.Join(fmt.Errorf("apply egress rules: %w", err), t.discardLocked())
	}
	if err := t.conn.Flush(); err != nil {
		return fmt.Errorf("apply egress rules (mode %s): %w", cfg.Mode, err)
	}
	return nil
}

// Learn adds addresses to the learned set for ttl, bounded to
// [MinLearnTTL, MaxLearnTTL]; the kernel drops them when it ends. In
// dns+nft mode a learned address is reachable unless a deny prefix covers
// it. Learning an address again sets its remaining time to ttl.
func (t *Table) Learn(addrs []netip.Addr, ttl time.Duration) error {
	ttl = clampTTL(ttl)
	var v4, v6 []nftables.SetElement
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case a.Is4():
			v4 = append(v4, nftables.SetElement{Key: a.AsSlice(), Timeout: ttl})
		case a.Is6():
			v6 = append(v6, nftables.SetElement{Key: a.AsSlice(), Timeout: ttl})
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	for _, s := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{{t.learnedSet(false), v4}, {t.learnedSet(true), v6}} {
		if len(s.elems) == 0 {
			continue
		}
		if err := addElements(t.conn, s.set, s.elems); err != nil {
			return errors.Join(fmt.Errorf("learn addresses: %w", err), t.discardLocked())
		}
	}
	if err := t.conn.Flush(); err != nil {
		return fmt.Errorf("learn %d addresses: %w", len(addrs), err)
	}
	return nil
}

// Learned lists the learned addresses the kernel still holds.
func (t *Table) Learned() ([]netip.Addr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	var out []netip.Addr
	for _, v6 := range []bool{false, true} {
		s := t.learnedSet(v6)
		elems, err := t.conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list set %s: %w", s.Name, err)
		}
		for _, e := range elems {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// learnedSet describes a learned set; Apply creates it when missing.
func (t *Table) learnedSet(v6 bool) *nftables.Set {
	if v6 {
		return &nftables.Set{Table: t.table, Name: setLearned6, KeyType: nftables.TypeIP6Addr, HasTimeout: true}
	}
	return &nftables.Set{Table: t.table, Name: setLearned4, KeyType: nftables.TypeIPAddr, HasTimeout: true}
}

// build queues the messages of one Apply transaction on t.conn: create
// what is missing (table, chains, sets), delete every rule of the table,
// refill the prefix and nameserver sets, add the rules of cfg. The
// learned sets are created when missing and otherwise left alone.
func (t *Table) build(cfg Config) error {
	c := t.conn
	c.AddTable(t.table)

	accept, drop := nftables.ChainPolicyAccept, nftables.ChainPolicyDrop
	outPolicy := &drop
	if cfg.Mode == egress.ModeDNS {
		outPolicy = &accept
	}
	nat := c.AddChain(&nftables.Chain{
		Name: chainNAT, Table: t.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRef(natPriority),
	})
	out := c.AddChain(&nftables.Chain{
		Name: chainOutput, Table: t.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: outPolicy,
	})
	in := c.AddChain(&nftables.Chain{
		Name: chainInput, Table: t.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	refuse := c.AddChain(&nftables.Chain{Name: chainRefuse, Table: t.table})

	// Sets. Each is created if missing; all but the learned ones are
	// flushed and refilled in this same transaction.
	sets := map[string]*nftables.Set{}
	for _, v6 := range []bool{false, true} {
		s := t.learnedSet(v6)
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("add set %s: %w", s.Name, err)
		}
		sets[s.Name] = s
	}
	type fill struct {
		name  string
		v6    bool
		elems []nftables.SetElement
	}
	var nsPrefixes []netip.Prefix
	for _, a := range cfg.Nameservers {
		a = a.Unmap()
		nsPrefixes = append(nsPrefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	fills := []fill{
		{setAllow4, false, intervalElements(mergeRanges(cfg.AllowPrefixes, true))},
		{setAllow6, true, intervalElements(mergeRanges(cfg.AllowPrefixes, false))},
		{setDeny4, false, intervalElements(mergeRanges(cfg.DenyPrefixes, true))},
		{setDeny6, true, intervalElements(mergeRanges(cfg.DenyPrefixes, false))},
		{setNS4, false, intervalElements(mergeRanges(nsPrefixes, true))},
		{setNS6, true, intervalElements(mergeRanges(nsPrefixes, false))},
	}
	for _, f := range fills {
		s := &nftables.Set{Table: t.table, Name: f.name, KeyType: nftables.TypeIPAddr, Interval: true}
		if f.v6 {
			s.KeyType = nftables.TypeIP6Addr
		}
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("add set %s: %w", s.Name, err)
		}
		c.FlushSet(s)
		if err := addElements(c, s, f.elems); err != nil {
			return fmt.Errorf("fill set %s: %w", s.Name, err)
		}
		sets[s.Name] = s
	}

	// Every rule of the table goes; the new ones follow in the same batch.
	c.FlushTable(t.table)

	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t.table, Chain: ch, Exprs: all})
	}
	verdict := func(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
	jumpRefuse := []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chainRefuse}}
	inSet := func(v6 bool, name string) []expr.Any { return daddrIn(v6, sets[name]) }

	// refuse: fail TCP fast with a reset, drop the rest.
	rule(refuse, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	rule(refuse, verdict(expr.VerdictDrop))

	// nat output: osb-egress's own packets untouched; DNS to the DNS
	// proxy; strict: IPv4 TCP not to loopback to the transparent proxy.
	rule(nat, markIs(egress.Mark), verdict(expr.VerdictAccept))
	for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(nat, l4proto(p), dport(53), redirect(egress.DNSPort))
	}
	if cfg.Mode == egress.ModeStrict {
		rule(nat, nfproto(unix.NFPROTO_IPV4), l4proto(unix.IPPROTO_TCP), notLoopback4(), redirect(egress.ProxyPort))
	}

	// filter output.
	rule(out, markIs(egress.Mark), verdict(expr.VerdictAccept))
	rule(out, nfproto(unix.NFPROTO_IPV4), inSet(false, setNS4), jumpRefuse)
	rule(out, nfproto(unix.NFPROTO_IPV6), inSet(true, setNS6), jumpRefuse)
	// Traffic that stays in the namespace. Not "oif lo": chains of one
	// hook all see the output interface chosen before the nat chain
	// redirected the packet to 127.0.0.1.
	rule(out, daddrLocal(), verdict(expr.VerdictAccept))
	rule(out, ctEstablished(), verdict(expr.VerdictAccept))
	switch cfg.Mode {
	case egress.ModeStrict:
		// TCP left the nat chain for lo; what is still here is IPv6 TCP,
		// UDP other than DNS, ICMP and the rest.
		rule(out, jumpRefuse)
	case egress.ModeDNSNft:
		rule(out, nfproto(unix.NFPROTO_IPV4), inSet(false, setDeny4), jumpRefuse)
		rule(out, nfproto(unix.NFPROTO_IPV6), inSet(true, setDeny6), jumpRefuse)
		rule(out, nfproto(unix.NFPROTO_IPV4), inSet(false, setLearned4), verdict(expr.VerdictAccept))
		rule(out, nfproto(unix.NFPROTO_IPV6), inSet(true, setLearned6), verdict(expr.VerdictAccept))
		rule(out, nfproto(unix.NFPROTO_IPV4), inSet(false, setAllow4), verdict(expr.VerdictAccept))
		rule(out, nfproto(unix.NFPROTO_IPV6), inSet(true, setAllow6), verdict(expr.VerdictAccept))
		if cfg.DefaultAllow {
			rule(out, verdict(expr.VerdictAccept))
		} else {
			rule(out, jumpRefuse)
		}
	}

	// filter input: the API is not for the namespace's own processes
	// (whose packets to 127.0.0.1 or to their own address arrive on lo);
	// the proxies are only for them.
	rule(in, ifname(expr.MetaKeyIIFNAME, "lo", true), l4proto(unix.IPPROTO_TCP), dport(egress.APIPort), jumpRefuse)
	for _, p := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_TCP, egress.ProxyPort}, {unix.IPPROTO_TCP, egress.DNSPort}, {unix.IPPROTO_UDP, egress.DNSPort}} {
		rule(in, ifname(expr.MetaKeyIIFNAME, "lo", false), l4proto(p.proto), dport(p.port), jumpRefuse)
	}
	return nil
}

// elementsPerMessage keeps each message's element list well under the
// 64 KiB a netlink attribute can hold.
const elementsPerMessage = 512

// addElements queues elems for set s, in as many messages as needed.
func addElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	for chunk := range slices.Chunk(elems, elementsPerMessage) {
		if err := c.SetAddElements(s, chunk); err != nil {
			return err
		}
	}
	return nil
}

// intervalElements encodes ranges for an interval set: each range is a
// start element and an end element one past its last address (none when
// the range reaches the top of the address space).
func intervalElements(rs []addrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.from.AsSlice()})
		if next := r.to.Next(); next.IsValid() {
			out = append(out, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// The expressions below match one thing each, always through register 1.

func markIs(mark uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(mark)},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// dport matches the destination port of TCP or UDP; l4proto must come
// first.
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// ifname matches (or, with eq false, excludes) an interface by name.
func ifname(key expr.MetaKey, name string, eq bool) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: b},
	}
}

// daddrLocal matches destinations that are addresses of the namespace
// itself (loopback included), looked up after any redirect.
func daddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// notLoopback4 matches IPv4 destinations outside 127.0.0.0/8; nfproto
// ipv4 must come first.
func notLoopback4() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{127, 0, 0, 0}},
	}
}

// daddrIn matches a destination address in set s; nfproto must come
// first and match the set's family.
func daddrIn(v6 bool, s *nftables.Set) []expr.Any {
	off, n := uint32(16), uint32(4)
	if v6 {
		off, n = 24, 16
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID},
	}
}

// redirect sends the packet to port on the namespace's loopback address.
func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

// processIn reports whether the process's own network namespace is ns.
func processIn(ns *os.File) bool {
	var self, other unix.Stat_t
	if unix.Stat("/proc/self/ns/net", &self) != nil || unix.Fstat(int(ns.Fd()), &other) != nil {
		return false
	}
	return self.Dev == other.Dev && self.Ino == other.Ino
}
