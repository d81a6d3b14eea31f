package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func mustMatcher(t testing.TB, o Overlay, p Policy) *Matcher {
	t.Helper()
	m, err := NewMatcher(o, p)
	if err != nil {
		t.Fatalf("NewMatcher(%+v, %+v): %v", o, p, err)
	}
	return m
}

func TestMatcherName(t *testing.T) {
	m := mustMatcher(t, Overlay{}, Policy{DefaultAction: ActionDeny, Egress: rules(
		"allow", "example.com",
		"allow", "*.pythonhosted.org",
		"deny", "bad.allowed.test",
		"allow", "*.allowed.test",
		"deny", "*.x.allowed.test", // shadowed by the wildcard before it
		"deny", "exact.wild.test",
		"allow", "*.wild.test",
		"allow", "deep.x.y.z.test",
	)})
	cases := []struct {
		name string
		want bool
	}{
		{"example.com", true},
		{"EXAMPLE.com.", true},
		{"a.example.com", false}, // exact matches only itself
		{"example.com.evil.test", false},
		{"evilexample.com", false},
		{"pythonhosted.org", false}, // wildcard does not match the apex
		{"files.pythonhosted.org", true},
		{"a.b.c.pythonhosted.org", true}, // any depth
		{"xpythonhosted.org", false},
		{"bad.allowed.test", false}, // the earlier exact deny wins
		{"good.allowed.test", true},
		{"a.x.allowed.test", true}, // the earlier wildcard wins over the later, longer one
		{"exact.wild.test", false},
		{"other.wild.test", true},
		{"deep.x.y.z.test", true},
		{"unlisted.test", false}, // default
		{"", false},
		{".", false},
		{"127.1", false}, // an address in disguise is never a name
	}
	for _, c := range cases {
		if got := m.Name(c.name); got != c.want {
			t.Errorf("Name(%q) = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestMatcherFirstMatchAcrossKinds(t *testing.T) {
	// A later exact rule does not beat an earlier wildcard, and vice versa.
	m := mustMatcher(t, Overlay{}, Policy{DefaultAction: ActionAllow, Egress: rules(
		"deny", "*.a.test",
		"allow", "x.a.test",
		"allow", "y.b.test",
		"deny", "*.b.test",
	)})
	for name, want := range map[string]bool{"x.a.test": false, "y.b.test": true, "z.b.test": false, "a.test": true, "other.test": true} {
		if got := m.Name(name); got != want {
			t.Errorf("Name(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestMatcherOverlay(t *testing.T) {
	o := Overlay{Deny: []string{"evil.test", "203.0.113.66"}, Allow: []string{"otel.test", "*.mirror.test", "evil.test", "198.51.100.0/24"}}
	m := mustMatcher(t, o, Policy{DefaultAction: ActionAllow, Egress: rules(
		"deny", "otel.test", // the operator's allow comes first
		"deny", "pkg.mirror.test",
		"allow", "evil.test", // the operator's deny comes before everything
		"deny", "198.51.100.7",
		"allow", "203.0.113.0/24",
	)})
	for name, want := range map[string]bool{"otel.test": true, "pkg.mirror.test": true, "evil.test": false, "user.test": true} {
		if got := m.Name(name); got != want {
			t.Errorf("Name(%q) = %v, want %v", name, got, want)
		}
	}
	for addr, want := range map[string]bool{"198.51.100.7": true, "203.0.113.66": false, "203.0.113.67": true} {
		if got := m.Addr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Addr(%s) = %v, want %v", addr, got, want)
		}
	}
	// The overlay is not part of the policy the API shows.
	if got := m.Policy(); len(got.Egress) != 5 {
		t.Errorf("Policy() = %+v, want the 5 user rules only", got)
	}
	// A policy change keeps the overlay.
	m2, err := m.WithPolicy(DenyAll())
	if err != nil {
		t.Fatal(err)
	}
	if !m2.Name("otel.test") || m2.Name("user.test") {
		t.Errorf("WithPolicy lost the overlay or the new policy")
	}
	if _, err := NewMatcher(Overlay{Allow: []string{"a..b"}}, DenyAll()); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewMatcher with a bad overlay target: %v, want ErrInvalid", err)
	}
	if _, err := NewMatcher(Overlay{}, Policy{DefaultAction: "maybe"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewMatcher with a bad default: %v, want ErrInvalid", err)
	}
	if _, err := NewMatcher(Overlay{}, Policy{Egress: rules("block", "a.test")}); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewMatcher with a bad action: %v, want ErrInvalid", err)
	}
}

func TestIsSpecial(t *testing.T) {
	special := []string{
		"0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.255", "127.0.0.1", "127.1.2.3",
		"169.254.169.254", "172.16.0.1", "172.31.255.255", "192.0.0.1", "192.168.1.1", "224.0.0.1", "239.255.255.250",
		"240.0.0.1", "255.255.255.255", "100.100.100.200",
		"::", "::1", "fc00::1", "fd00:ec2::254", "fdff::1", "fe80::1", "febf::1", "ff02::1",
		"64:ff9b::808:808", "64:ff9b:1::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "fe80::1%eth0",
	}
	plain := []string{
		"192.0.2.1", "198.51.100.1", "203.0.113.1", "8.8.8.8", "100.63.255.255", "100.128.0.0", "172.15.255.255",
		"172.32.0.0", "192.0.1.255", "192.169.0.0", "223.255.255.255", "1.1.1.1", "2001:db8::1", "2606:4700::1111",
		"::ffff:198.51.100.1", "64:ff9b:2::1",
	}
	for _, s := range special {
		if !IsSpecial(netip.MustParseAddr(s)) {
			t.Errorf("IsSpecial(%s) = false, want true", s)
		}
	}
	for _, s := range plain {
		if IsSpecial(netip.MustParseAddr(s)) {
			t.Errorf("IsSpecial(%s) = true, want false", s)
		}
	}
}

func TestMatcherAddr(t *testing.T) {
	p := Policy{DefaultAction: ActionDeny, Egress: rules(
		"allow", "198.51.100.0/24",
		"deny", "198.51.100.7", // shadowed: the /24 comes first
		"deny", "203.0.113.9",
		"allow", "203.0.113.0/24",
		"allow", "10.1.2.3", // a private address named explicitly
		"allow", "169.254.169.254/32",
		"deny", "2001:db8::/32",
		"allow", "a.test", // a name rule never decides an address
	)}
	m := mustMatcher(t, Overlay{}, p)
	cases := []struct {
		addr           string
		addr2, resolve bool // want Addr, want Resolved
	}{
		{"198.51.100.1", true, true},
		{"198.51.100.7", true, true},
		{"::ffff:198.51.100.7", true, true}, // mapped: judged as IPv4
		{"203.0.113.9", false, false},
		{"203.0.113.10", true, true},
		{"10.1.2.3", true, true},
		{"::ffff:10.1.2.3", true, true},
		{"10.1.2.4", false, false}, // special, no rule
		{"169.254.169.254", true, true},
		{"192.0.2.1", false, true}, // no rule: Addr follows default deny, Resolved allows
		{"127.0.0.1", false, false},
		{"::ffff:127.0.0.1", false, false},
		{"::1", false, false},
		{"fe80::1%eth0", false, false},
		{"2001:db8::1", false, false},
		{"2606:4700::1", false, true},
		{"64:ff9b::c633:6401", false, false}, // NAT64 of 198.51.100.1: the IPv6 form is special
		{"64:ff9b::a01:203", false, false},   // NAT64 of 10.1.2.3
	}
	for _, c := range cases {
		a := netip.MustParseAddr(c.addr)
		if got := m.Addr(a); got != c.addr2 {
			t.Errorf("Addr(%s) = %v, want %v", c.addr, got, c.addr2)
		}
		if got := m.Resolved(a); got != c.resolve {
			t.Errorf("Resolved(%s) = %v, want %v", c.addr, got, c.resolve)
		}
	}
	if m.Addr(netip.Addr{}) || m.Resolved(netip.Addr{}) {
		t.Error("the zero address is allowed")
	}
}

func TestMatcherDefaultAllow(t *testing.T) {
	m := mustMatcher(t, Overlay{}, Policy{DefaultAction: ActionAllow, Egress: rules(
		"deny", "203.0.113.0/24",
		"allow", "64:ff9b::/96",
		"deny", "bad.test",
	)})
	cases := []struct {
		addr string
		want bool
	}{
		{"198.51.100.1", true},
		{"203.0.113.1", false},
		{"10.0.0.1", false}, // special addresses stay denied under default allow
		{"169.254.169.254", false},
		{"100.100.100.200", false},
		{"fd00:ec2::254", false},
		{"2001:db8::1", true},
		{"64:ff9b::c633:6401", true},  // NAT64 allowed, embeds 198.51.100.1: allowed
		{"64:ff9b::cb00:7101", false}, // embeds 203.0.113.1: denied by rule
		{"64:ff9b::a9fe:a9fe", false}, // embeds 169.254.169.254: special
	}
	for _, c := range cases {
		if got := m.Addr(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("Addr(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
	for name, want := range map[string]bool{
		"bad.test": false, "good.test": true,
		"203.0.113.1": false, "198.51.100.1": true, "[2001:db8::1]": true, "127.0.0.1": false, "[::1]": false,
	} {
		if got := m.Name(name); got != want {
			t.Errorf("Name(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestLive(t *testing.T) {
	var zero Live
	if zero.Name("a.test") || zero.Addr(netip.MustParseAddr("198.51.100.1")) || zero.Resolved(netip.MustParseAddr("198.51.100.1")) {
		t.Error("an empty Live allows")
	}
	l := NewLive(mustMatcher(t, Overlay{}, Policy{DefaultAction: ActionAllow}))
	if !l.Name("a.test") || !l.Addr(netip.MustParseAddr("198.51.100.1")) {
		t.Error("allow-all Live denies")
	}
	l.Store(mustMatcher(t, Overlay{}, DenyAll()))
	if l.Name("a.test") || l.Addr(netip.MustParseAddr("198.51.100.1")) || !l.Resolved(netip.MustParseAddr("198.51.100.1")) {
		t.Error("Live did not follow the new matcher")
	}
}

// bigPolicy is a policy of n rules: a fifth CIDRs, the rest exact names
// and wildcards, alternating allow and deny, default deny.
func bigPolicy(n int) Policy {
	p := Policy{DefaultAction: ActionDeny, Egress: make([]Rule, 0, n)}
	for i := range n {
		action := ActionAllow
		if i%2 == 1 {
			action = ActionDeny
		}
		var target string
		switch i % 5 {
		case 0:
			target = netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 0}), 24).String()
		case 1, 2:
			target = fmt.Sprintf("host%d.svc%d.example.test", i, i%97)
		default:
			target = fmt.Sprintf("*.zone%d.example.test", i)
		}
		p.Egress = append(p.Egress, Rule{Action: action, Target: target})
	}
	return p
}

func BenchmarkMatcher(b *testing.B) {
	m := mustMatcher(b, Overlay{Deny: []string{"evil.test"}, Allow: []string{"otel.test"}}, bigPolicy(5000))
	names := []struct {
		name, host string
		want       bool
	}{
		{"exact-allow", "host4992.svc45.example.test", true},
		{"exact-deny", "host4991.svc44.example.test", false},
		{"wildcard-deep", "a.b.c.zone4998.example.test", true},
		{"no-match", "unlisted.example.org", false},
		{"overlay", "otel.test", true},
	}
	for _, c := range names {
		b.Run("Name/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got := m.Name(c.host); got != c.want {
					b.Fatalf("Name(%q) = %v, want %v", c.host, got, c.want)
				}
			}
		})
	}
	addrs := []struct {
		name, addr string
		want       bool
	}{
		{"first-prefix", "11.0.0.1", true},
		{"last-prefix", "11.19.126.1", true}, // rule 4990 (0x137e)
		{"no-match", "198.51.100.1", false},
		{"special", "169.254.169.254", false},
	}
	for _, c := range addrs {
		a := netip.MustParseAddr(c.addr)
		b.Run("Addr/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got := m.Addr(a); got != c.want {
					b.Fatalf("Addr(%s) = %v, want %v", c.addr, got, c.want)
				}
			}
		})
	}
	b.Run("NewMatcher", func(b *testing.B) {
		p := bigPolicy(5000)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := NewMatcher(Overlay{}, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestBindingHostAllowed(t *testing.T) {
	m := mustMatcher(t, Overlay{Deny: []string{"evil.example.test", "*.banned.test"}, Allow: []string{"otel.test", "*.mirror.test"}},
		Policy{DefaultAction: ActionDeny, Egress: rules(
			"deny", "blocked.example.test",
			"deny", "*.private.example.test",
			"allow", "api.github.test",
			"allow", "*.example.test",
			"allow", "*.banned.test",
			"deny", "*.closed.test",
			"allow", "*.closed.test",
			"allow", "*.sub.closed.test",
		)})
	for _, c := range []struct {
		host string
		want string // "" allowed, else in the error
	}{
		{"api.github.test", ""},
		{"a.example.test", ""},
		{"a.b.example.test", ""},
		{"*.example.test", ""},
		{"*.a.example.test", ""},
		{"example.test", "not covered by an explicit allow rule"}, // the apex of a wildcard rule
		{"uploads.github.test", "not covered by an explicit allow rule"},
		{"*.github.test", "not covered by an explicit allow rule"},     // an exact rule covers no wildcard
		{"*.api.github.test", "not covered by an explicit allow rule"}, // nor the names below it
		{"otel.test", "not covered by an explicit allow rule"},         // the overlay is not the user's rule
		{"x.mirror.test", "not covered by an explicit allow rule"},
		{"blocked.example.test", "the egress policy denies it"},
		{"x.private.example.test", "the egress policy denies it"},
		{"*.private.example.test", "the egress policy denies it"},
		{"evil.example.test", "the egress policy denies it"}, // the overlay denies
		{"x.banned.test", "the egress policy denies it"},
		{"*.banned.test", "the egress policy denies it"},
		{"*.closed.test", "the egress policy denies it"}, // an earlier deny for the same wildcard
		{"*.sub.closed.test", "the egress policy denies it"},
		{"a..test", "empty label"},
	} {
		err := m.BindingHostAllowed(c.host)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("BindingHostAllowed(%q) = %v, want %q", c.host, err, c.want)
		}
	}
	empty := mustMatcher(t, Overlay{}, Policy{DefaultAction: ActionAllow})
	if err := empty.BindingHostAllowed("api.github.test"); err == nil || !strings.Contains(err.Error(), "no rules") {
		t.Errorf("BindingHostAllowed with no rules = %v", err)
	}
}
