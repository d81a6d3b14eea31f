package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/opensandbox/opensandbox/api"
)

// The actions of a rule and of a policy's default.
const (
	ActionAllow = "allow"
	ActionDeny  = "deny"
)

// The modes a policy is in, as the egress API reports them in "mode".
const (
	// PolicyDenyAll: the default action is deny and there are no rules.
	PolicyDenyAll = "deny_all"
	// PolicyAllowAll: the default action is allow and there are no rules.
	PolicyAllowAll = "allow_all"
	// PolicyEnforcing: there is at least one rule.
	PolicyEnforcing = "enforcing"
)

// ErrInvalid marks a policy, rule, target or request body that cannot be
// used. Its message starts every such error's text ("invalid policy: ..."),
// which the egress API returns with 400.
var ErrInvalid = errors.New("invalid policy")

// invalid returns an error wrapping ErrInvalid with the given detail.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Policy is a normalised egress policy: rules in order, the first that
// matches decides, and DefaultAction decides when none does. Values built
// by NewPolicy, ParsePolicy, Patch and Delete are normalised; a Policy
// built by hand is checked when a Matcher is made from it.
type Policy struct {
	// DefaultAction is ActionAllow or ActionDeny.
	DefaultAction string
	// Egress are the rules, in order.
	Egress []Rule
}

// Rule is one normalised rule.
type Rule struct {
	// Action is ActionAllow or ActionDeny.
	Action string
	// Target is an IP address ("192.0.2.1", "2001:db8::1"; IPv4-mapped
	// IPv6 addresses written as IPv4), a CIDR prefix with its host bits
	// cleared ("10.0.0.0/8"), an exact host name in lower case without a
	// trailing dot ("example.com"), or a wildcard "*.example.com" that
	// matches the names below example.com at any depth, not example.com.
	Target string
}

// DenyAll is the policy of a sandbox whose policy is empty: no rules,
// default deny.
func DenyAll() Policy {
	return Policy{DefaultAction: ActionDeny, Egress: []Rule{}}
}

// Mode reports PolicyDenyAll, PolicyAllowAll or PolicyEnforcing.
func (p Policy) Mode() string {
	switch {
	case len(p.Egress) > 0:
		return PolicyEnforcing
	case p.DefaultAction == ActionAllow:
		return PolicyAllowAll
	default:
		return PolicyDenyAll
	}
}

// API returns the policy as the egress API sends it; Egress is never nil,
// so it is sent as [] when there are no rules.
func (p Policy) API() api.NetworkPolicy {
	out := api.NetworkPolicy{DefaultAction: p.DefaultAction, Egress: make([]api.NetworkRule, len(p.Egress))}
	if out.DefaultAction == "" {
		out.DefaultAction = ActionDeny
	}
	for i, r := range p.Egress {
		out.Egress[i] = api.NetworkRule{Action: r.Action, Target: r.Target}
	}
	return out
}

// NewPolicy normalises a policy as received on the wire: a missing or
// empty defaultAction is deny, each rule is normalised by NewRule. Errors
// wrap ErrInvalid.
func NewPolicy(in api.NetworkPolicy) (Policy, error) {
	def, err := normaliseAction(in.DefaultAction)
	if err != nil {
		return Policy{}, invalid("defaultAction: unsupported action %q", in.DefaultAction)
	}
	p := Policy{DefaultAction: def, Egress: make([]Rule, 0, len(in.Egress))}
	for i, r := range in.Egress {
		nr, err := NewRule(r)
		if err != nil {
			return Policy{}, fmt.Errorf("%w (egress[%d])", err, i)
		}
		p.Egress = append(p.Egress, nr)
	}
	return p, nil
}

// NewRule normalises one rule: the action is trimmed and lower-cased
// (empty means deny), the target trimmed and written in its canonical form
// (see Rule.Target). Errors wrap ErrInvalid.
func NewRule(in api.NetworkRule) (Rule, error) {
	action, err := normaliseAction(in.Action)
	if err != nil {
		return Rule{}, err
	}
	t, err := parseTarget(in.Target)
	if err != nil {
		return Rule{}, err
	}
	return Rule{Action: action, Target: t.String()}, nil
}

// normaliseAction trims and lower-cases an action; empty is deny.
func normaliseAction(s string) (string, error) {
	switch a := strings.ToLower(strings.TrimSpace(s)); a {
	case "", ActionDeny:
		return ActionDeny, nil
	case ActionAllow:
		return ActionAllow, nil
	default:
		return "", invalid("unsupported action %q", s)
	}
}

// ParsePolicy parses a full policy (the body of POST or PUT /policy, the
// initial policy given to osb-egress, a stored policy file). An empty or
// blank body, null and {} all give DenyAll. Unknown fields are ignored,
// as the reference sidecar does. Errors wrap ErrInvalid.
func ParsePolicy(data []byte) (Policy, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return DenyAll(), nil
	}
	var in api.NetworkPolicy
	if err := json.Unmarshal(data, &in); err != nil {
		return Policy{}, invalid("decode JSON: %v", err)
	}
	return NewPolicy(in)
}

// ParsePatch parses the body of PATCH /policy: a JSON array of at least
// one rule, each normalised by NewRule. Errors wrap ErrInvalid.
func ParsePatch(data []byte) ([]Rule, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, invalid("empty body: want a JSON array of rules")
	}
	var in []api.NetworkRule
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, invalid("decode JSON: %v", err)
	}
	if len(in) == 0 {
		return nil, invalid("no rules: want at least one")
	}
	rules := make([]Rule, 0, len(in))
	for i, r := range in {
		nr, err := NewRule(r)
		if err != nil {
			return nil, fmt.Errorf("%w (rule %d)", err, i)
		}
		rules = append(rules, nr)
	}
	return rules, nil
}

// ParseTargets parses the body of DELETE /policy: a JSON array of at
// least one target. Errors wrap ErrInvalid.
func ParseTargets(data []byte) ([]string, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, invalid("empty body: want a JSON array of targets")
	}
	var targets []string
	if err := json.Unmarshal(data, &targets); err != nil {
		return nil, invalid("decode JSON: %v", err)
	}
	if len(targets) == 0 {
		return nil, invalid("no targets: want at least one")
	}
	return targets, nil
}

// Patch merges rules into the policy as PATCH /policy does: the patch's
// rules come first in their order (of several with the same target the
// first is kept), then the policy's rules whose target the patch does not
// name, in their order. The default action is kept. rules must be
// normalised (ParsePatch, NewRule).
func (p Policy) Patch(rules []Rule) Policy {
	seen := make(map[string]bool, len(rules))
	out := Policy{DefaultAction: p.DefaultAction, Egress: make([]Rule, 0, len(rules)+len(p.Egress))}
	for _, r := range rules {
		k := targetKey(r.Target)
		if seen[k] {
			continue
		}
		seen[k] = true
		out.Egress = append(out.Egress, r)
	}
	for _, r := range p.Egress {
		if !seen[targetKey(r.Target)] {
			out.Egress = append(out.Egress, r)
		}
	}
	return out
}

// Delete removes every rule whose target is one of targets, compared
// case-insensitively after trimming (and in canonical form when a target
// parses, so "2001:DB8:0::1" removes "2001:db8::1"). Unknown targets are
// ignored. It reports how many rules it removed.
func (p Policy) Delete(targets []string) (Policy, int) {
	drop := make(map[string]bool, len(targets))
	for _, t := range targets {
		drop[targetKey(t)] = true
	}
	out := Policy{DefaultAction: p.DefaultAction, Egress: make([]Rule, 0, len(p.Egress))}
	for _, r := range p.Egress {
		if !drop[targetKey(r.Target)] {
			out.Egress = append(out.Egress, r)
		}
	}
	return out, len(p.Egress) - len(out.Egress)
}

// Equal reports whether two policies have the same default and rules.
func (p Policy) Equal(q Policy) bool {
	if p.DefaultAction != q.DefaultAction || len(p.Egress) != len(q.Egress) {
		return false
	}
	for i := range p.Egress {
		if p.Egress[i] != q.Egress[i] {
			return false
		}
	}
	return true
}

// targetKey is what two targets are compared by: the canonical form when
// the target parses, else its trimmed lower-case text.
func targetKey(s string) string {
	if t, err := parseTarget(s); err == nil {
		return t.String()
	}
	return strings.ToLower(strings.TrimSpace(s))
}

// targetKind says what a target names.
type targetKind uint8

const (
	kindPrefix   targetKind = iota + 1 // an address or a CIDR prefix
	kindName                           // one exact host name
	kindWildcard                       // the names below a suffix
)

// target is a parsed rule target.
type target struct {
	kind targetKind
	// prefix is set for kindPrefix: a single address is a full-length
	// prefix (/32, /128).
	prefix netip.Prefix
	// single is true when the target was an address, not a CIDR.
	single bool
	// name is the host name (kindName) or the suffix without "*."
	// (kindWildcard).
	name string
}

// String returns the canonical text of the target.
func (t target) String() string {
	switch t.kind {
	case kindPrefix:
		if t.single {
			return t.prefix.Addr().String()
		}
		return t.prefix.String()
	case kindWildcard:
		return "*." + t.name
	default:
		return t.name
	}
}

// parseTarget classifies and normalises a rule target. Errors wrap
// ErrInvalid and say what is wrong.
func parseTarget(raw string) (target, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return target{}, invalid("empty target")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return target{}, invalid("target %q: not a valid CIDR prefix (want e.g. 10.0.0.0/8 or 2001:db8::/32)", raw)
		}
		a := p.Addr()
		if a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		return target{kind: kindPrefix, prefix: p.Masked()}, nil
	}
	if strings.ContainsAny(s, ":%") || strings.HasPrefix(s, "[") {
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
		if err != nil || a.Zone() != "" {
			return target{}, invalid("target %q: not a valid IP address (no zones, no ports)", raw)
		}
		a = a.Unmap()
		return target{kind: kindPrefix, prefix: netip.PrefixFrom(a, a.BitLen()), single: true}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return target{kind: kindPrefix, prefix: netip.PrefixFrom(a, a.BitLen()), single: true}, nil
	}
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	kind := kindName
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		kind, name = kindWildcard, rest
	}
	if err := checkName(name); err != nil {
		return target{}, invalid("target %q: %v", raw, err)
	}
	return target{kind: kind, name: name}, nil
}

// CheckHostName checks the syntax of a host name as a rule target's name
// is checked (see checkName): name must already be in lower case without
// a trailing dot, and a wildcard's suffix is checked without its "*.".
// The error says what is wrong; it does not wrap ErrInvalid.
func CheckHostName(name string) error { return checkName(name) }

// checkName checks the syntax of a lower-case host name without a
// trailing dot: labels of 1 to 63 letters, digits, '-' and '_' (not
// starting or ending with '-'), at most 253 bytes, and a last label that
// is not a number (a name like "127.1" or "0x7f.1" is an address in
// disguise: many resolvers and URL parsers read it as one).
func checkName(name string) error {
	if name == "" {
		return errors.New("empty host name")
	}
	if len(name) > 253 {
		return errors.New("host name longer than 253 bytes")
	}
	last := ""
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return errors.New("empty label (two dots in a row, or a leading dot)")
		}
		if len(label) > 63 {
			return errors.New("label longer than 63 bytes")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c == '*':
				return errors.New("'*' is allowed only as the whole first label, as in *.example.com")
			case c >= 0x80:
				return errors.New("not ASCII: write an internationalised name in its xn-- form")
			default:
				return fmt.Errorf("character %q not allowed in a host name", c)
			}
		}
		last = label
	}
	if numericLabel(last) {
		return errors.New("looks like an IP address but is not a valid one")
	}
	return nil
}

// numericLabel reports whether a label is a decimal, octal or hex number,
// as the last label of a name that would be parsed as an IPv4 address.
func numericLabel(l string) bool {
	if h, ok := strings.CutPrefix(l, "0x"); ok {
		l = h
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return true
}
