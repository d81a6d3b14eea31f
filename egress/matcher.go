package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
)

// Overlay is the platform operator's rules, applied before every user
// policy and never shown through the egress API: a target in Deny is
// always denied, then a target in Allow is always allowed (telemetry
// collectors, package mirrors), then the user's rules decide.
type Overlay struct {
	// Deny are targets (as in Rule.Target) always denied.
	Deny []string
	// Allow are targets always allowed unless Deny covers them.
	Allow []string
}

// Matcher answers policy questions for one policy and one overlay. It
// never changes after NewMatcher and is safe for concurrent use. Rules
// are indexed: exact names in a map, wildcards in a map of suffixes (a
// name is looked up once per label), addresses and prefixes in a map of
// masked prefixes (an address is looked up once per prefix length in
// use).
type Matcher struct {
	policy  Policy
	overlay Overlay
	allow   bool // the default action
	exact   map[string]ruleRef
	wild    map[string]ruleRef
	v4, v6  prefixTable
}

// ruleRef is the position of a rule in the combined list (overlay deny,
// overlay allow, user rules) and its action.
type ruleRef struct {
	index int
	allow bool
}

// prefixTable indexes the address and CIDR rules of one family: the
// first rule for each masked prefix, and the prefix lengths in use. A
// lookup tries each length once.
type prefixTable struct {
	rules   map[netip.Prefix]ruleRef
	lengths []int
}

// add indexes a rule; a later rule for the same prefix never matches.
func (t *prefixTable) add(p netip.Prefix, ref ruleRef) {
	if t.rules == nil {
		t.rules = make(map[netip.Prefix]ruleRef)
	}
	if _, ok := t.rules[p]; ok {
		return
	}
	t.rules[p] = ref
	if !slices.Contains(t.lengths, p.Bits()) {
		t.lengths = append(t.lengths, p.Bits())
	}
}

// lookup returns the earliest rule that covers a.
func (t *prefixTable) lookup(a netip.Addr) (best ruleRef, found bool) {
	for _, bits := range t.lengths {
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if r, ok := t.rules[p]; ok && (!found || r.index < best.index) {
			best, found = r, true
		}
	}
	return best, found
}

var _ Decider = (*Matcher)(nil)

// NewMatcher builds the matcher of a policy under an overlay. It fails,
// with an error wrapping ErrInvalid, when a target of either does not
// parse or an action is unknown.
func NewMatcher(o Overlay, p Policy) (*Matcher, error) {
	def, err := normaliseAction(p.DefaultAction)
	if err != nil {
		return nil, fmt.Errorf("default action: %w", err)
	}
	m := &Matcher{
		policy:  p,
		overlay: Overlay{Deny: append([]string(nil), o.Deny...), Allow: append([]string(nil), o.Allow...)},
		allow:   def == ActionAllow,
		exact:   make(map[string]ruleRef),
		wild:    make(map[string]ruleRef),
	}
	index := 0
	add := func(where func() string, action, raw string) error {
		t, err := parseTarget(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", where(), err)
		}
		ref := ruleRef{index: index, allow: action == ActionAllow}
		index++
		switch t.kind {
		case kindName:
			if _, ok := m.exact[t.name]; !ok {
				m.exact[t.name] = ref
			}
		case kindWildcard:
			if _, ok := m.wild[t.name]; !ok {
				m.wild[t.name] = ref
			}
		case kindPrefix:
			if t.prefix.Addr().Is4() {
				m.v4.add(t.prefix, ref)
			} else {
				m.v6.add(t.prefix, ref)
			}
		}
		return nil
	}
	for _, t := range o.Deny {
		if err := add(func() string { return "always-deny" }, ActionDeny, t); err != nil {
			return nil, err
		}
	}
	for _, t := range o.Allow {
		if err := add(func() string { return "always-allow" }, ActionAllow, t); err != nil {
			return nil, err
		}
	}
	for i, r := range p.Egress {
		action, err := normaliseAction(r.Action)
		if err != nil {
			return nil, fmt.Errorf("egress[%d]: %w", i, err)
		}
		if err := add(func() string { return fmt.Sprintf("egress[%d]", i) }, action, r.Target); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Policy returns the user policy the matcher was built from (without the
// overlay).
func (m *Matcher) Policy() Policy { return m.policy }

// Overlay returns the operator overlay the matcher was built with.
func (m *Matcher) Overlay() Overlay { return m.overlay }

// WithPolicy returns a matcher for p under the same overlay.
func (m *Matcher) WithPolicy(p Policy) (*Matcher, error) {
	return NewMatcher(m.overlay, p)
}

// Name reports whether the sandbox may reach the host name: the first
// name rule that matches decides (an exact rule matches only its name, a
// wildcard "*.example.com" every name below example.com, not
// example.com), else the default action. Upper case and one trailing dot
// are accepted. A name that is an IP literal ("10.0.0.1", "[::1]") is
// judged as Addr judges it.
func (m *Matcher) Name(name string) bool {
	if a, ok := addrLiteral(name); ok {
		return m.Addr(a)
	}
	name = canonicalName(name)
	if name == "" || numericLabel(name[strings.LastIndexByte(name, '.')+1:]) {
		return false // no name, or an address in disguise ("127.1")
	}
	best, found := m.exact[name]
	if r, ok := m.wildAbove(name); ok && (!found || r.index < best.index) {
		best, found = r, true
	}
	if found {
		return best.allow
	}
	return m.allow
}

// wildAbove returns the earliest wildcard rule that covers name: a rule
// "*.s" for a suffix s of name below its first label.
func (m *Matcher) wildAbove(name string) (best ruleRef, found bool) {
	if len(m.wild) == 0 {
		return best, false
	}
	for i := strings.IndexByte(name, '.'); i >= 0; {
		suffix := name[i+1:]
		if r, ok := m.wild[suffix]; ok && (!found || r.index < best.index) {
			best, found = r, true
		}
		j := strings.IndexByte(suffix, '.')
		if j < 0 {
			break
		}
		i += j + 1
	}
	return best, found
}

// BindingHostAllowed reports why a credential binding may not name host,
// or nil when it may. host is a binding's host: a lower-case name, or a
// wildcard "*.suffix" that stands for every name below suffix. A binding
// host must be covered by an explicit allow rule of the user policy (an
// exact host by a rule for itself or by a wildcard above it; a wildcard
// host only by a wildcard rule for its suffix or above it), and the
// policy, overlay included, must decide allow for it: for a wildcard
// host, the decision its names get from the wildcard rules (an exact or
// deeper rule below it may still deny some of them). A policy with no
// rules allows no binding. The error does not wrap ErrInvalid; the
// credential vault wraps it with the binding it is about.
func (m *Matcher) BindingHostAllowed(host string) error {
	name, wildcard := strings.CutPrefix(host, "*.")
	if err := checkName(name); err != nil {
		return fmt.Errorf("host %q: %v", host, err)
	}
	if len(m.policy.Egress) == 0 {
		return fmt.Errorf("host %q: the egress policy has no rules; a binding needs an explicit allow rule for its host", host)
	}
	covered := false
	for _, r := range m.policy.Egress {
		if r.Action != ActionAllow {
			continue
		}
		suffix, isWild := strings.CutPrefix(r.Target, "*.")
		switch {
		case isWild && (strings.HasSuffix(name, "."+suffix) || wildcard && name == suffix):
			covered = true
		case !isWild && !wildcard && r.Target == name:
			covered = true
		}
		if covered {
			break
		}
	}
	if !covered {
		want := "an allow rule for " + name + " or a wildcard above it"
		if wildcard {
			want = "an allow rule *." + name + " or a wildcard above it"
		}
		return fmt.Errorf("host %q is not covered by an explicit allow rule of the egress policy (want %s)", host, want)
	}
	allowed := m.Name(name)
	if wildcard {
		// The wildcard rules for name itself and above it decide for
		// every name below it; with none, the default action.
		best, found := m.wildAbove("x." + name)
		allowed = m.allow
		if found {
			allowed = best.allow
		}
	}
	if !allowed {
		return fmt.Errorf("host %q: the egress policy denies it", host)
	}
	return nil
}

// Resolved reports whether an address an allowed name resolved to may be
// used: the first address or CIDR rule that covers it decides; with none,
// a special address (IsSpecial) is refused and any other is allowed.
// IPv4-mapped IPv6 addresses are judged as IPv4, and NAT64 addresses must
// pass both as themselves and as the IPv4 address they embed.
func (m *Matcher) Resolved(a netip.Addr) bool { return m.judge(a, true) }

// Addr reports whether the sandbox may reach an address it names
// directly: the first address or CIDR rule that covers it decides; with
// none, a special address is denied and any other follows the default
// action. Mapped and NAT64 addresses are treated as in Resolved.
func (m *Matcher) Addr(a netip.Addr) bool { return m.judge(a, false) }

// judge answers Addr (resolved false) and Resolved (resolved true).
func (m *Matcher) judge(a netip.Addr, resolved bool) bool {
	if !a.IsValid() {
		return false
	}
	a = a.WithZone("").Unmap()
	if v4, ok := nat64Embedded(a); ok {
		return m.judgeOne(a, resolved) && m.judgeOne(v4, resolved)
	}
	return m.judgeOne(a, resolved)
}

// judgeOne judges one plain (unmapped, zoneless) address.
func (m *Matcher) judgeOne(a netip.Addr, resolved bool) bool {
	table := &m.v6
	if a.Is4() {
		table = &m.v4
	}
	if r, ok := table.lookup(a); ok {
		return r.allow
	}
	if IsSpecial(a) {
		return false
	}
	return resolved || m.allow
}

// canonicalName lower-cases a name and drops one trailing dot, allocating
// only when the name is not already in that form.
func canonicalName(name string) string {
	name = strings.TrimSuffix(name, ".")
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(name)
		}
	}
	return name
}

// addrLiteral reports whether a host is an IP address literal, possibly
// in brackets.
func addrLiteral(host string) (netip.Addr, bool) {
	if host == "" {
		return netip.Addr{}, false
	}
	if c := host[0]; !(c >= '0' && c <= '9' || c == '[' || strings.IndexByte(host, ':') >= 0) {
		return netip.Addr{}, false
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// specialPrefixes are the addresses denied unless an address or CIDR rule
// allows them: this host, private and shared networks, loopback,
// link-local (cloud metadata), IETF protocol assignments, multicast,
// reserved and broadcast, and their IPv6 counterparts, NAT64 prefixes and
// the metadata addresses of cloud providers. The documentation ranges
// (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) are not
// special.
var specialPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("::ffff:0:0/96"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
}

// SpecialPrefixes returns the ranges IsSpecial judges, for a firewall
// that must deny the same addresses.
func SpecialPrefixes() []netip.Prefix { return slices.Clone(specialPrefixes) }

// IsSpecial reports whether an address is one the policy denies unless
// an address or CIDR rule allows it (see specialPrefixes). An
// IPv4-mapped IPv6 address is judged as its IPv4 address; a NAT64
// address is special.
func IsSpecial(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	for _, p := range specialPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// nat64Prefixes are the NAT64 prefixes whose addresses carry an IPv4
// address in their last 32 bits (RFC 6052, RFC 8215).
var nat64Prefixes = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// nat64Embedded returns the IPv4 address a NAT64 address embeds.
func nat64Embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	for _, p := range nat64Prefixes {
		if p.Contains(a) {
			b := a.As16()
			return netip.AddrFrom4([4]byte(b[12:])), true
		}
	}
	return netip.Addr{}, false
}

// Live is the matcher in force: consumers keep one *Live while the
// policy changes under it. Each question is answered by the matcher
// current when it is asked. The zero Live denies everything until Store.
type Live struct {
	m atomic.Pointer[Matcher]
}

var _ Decider = (*Live)(nil)

// NewLive returns a Live holding m.
func NewLive(m *Matcher) *Live {
	l := &Live{}
	l.m.Store(m)
	return l
}

// Load returns the current matcher, nil before the first Store.
func (l *Live) Load() *Matcher { return l.m.Load() }

// Store makes m the current matcher.
func (l *Live) Store(m *Matcher) { l.m.Store(m) }

// Name asks the current matcher; false before the first Store.
func (l *Live) Name(name string) bool {
	m := l.m.Load()
	return m != nil && m.Name(name)
}

// Resolved asks the current matcher; false before the first Store.
func (l *Live) Resolved(a netip.Addr) bool {
	m := l.m.Load()
	return m != nil && m.Resolved(a)
}

// Addr asks the current matcher; false before the first Store.
func (l *Live) Addr(a netip.Addr) bool {
	m := l.m.Load()
	return m != nil && m.Addr(a)
}
