package egress

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

func rules(pairs ...string) []Rule {
	out := make([]Rule, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, Rule{Action: pairs[i], Target: pairs[i+1]})
	}
	return out
}

func TestParsePolicy(t *testing.T) {
	cases := []struct {
		name string
		body string
		want Policy
	}{
		{"empty", "", DenyAll()},
		{"blank", " \n\t", DenyAll()},
		{"null", "null", DenyAll()},
		{"empty object", "{}", DenyAll()},
		{"default allow", `{"defaultAction":"allow"}`, Policy{ActionAllow, []Rule{}}},
		{"default trimmed and lower-cased", `{"defaultAction":"  ALLOW "}`, Policy{ActionAllow, []Rule{}}},
		{"null egress", `{"defaultAction":"deny","egress":null}`, DenyAll()},
		{"unknown fields ignored", `{"defaultAction":"deny","x":1,"egress":[{"action":"allow","target":"a.test","y":2}]}`,
			Policy{ActionDeny, rules("allow", "a.test")}},
		{"spec example", `{ "defaultAction": "deny",
		  "egress": [ { "action": "allow", "target": "packages.example.org" },
		              { "action": "allow", "target": "*.pythonhosted.org" },
		              { "action": "deny",  "target": "10.0.0.0/8" } ] }`,
			Policy{ActionDeny, rules("allow", "packages.example.org", "allow", "*.pythonhosted.org", "deny", "10.0.0.0/8")}},
		{"action empty is deny", `{"egress":[{"action":"","target":"a.test"}]}`, Policy{ActionDeny, rules("deny", "a.test")}},
		{"action missing is deny", `{"egress":[{"target":"a.test"}]}`, Policy{ActionDeny, rules("deny", "a.test")}},
		{"action trimmed and lower-cased", `{"egress":[{"action":" Allow ","target":"a.test"}]}`, Policy{ActionDeny, rules("allow", "a.test")}},
		{"duplicates kept in order", `{"egress":[{"action":"allow","target":"a.test"},{"action":"deny","target":"A.test"}]}`,
			Policy{ActionDeny, rules("allow", "a.test", "deny", "a.test")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParsePolicy([]byte(c.body))
			if err != nil {
				t.Fatalf("ParsePolicy(%q): %v", c.body, err)
			}
			if !got.Equal(c.want) {
				t.Errorf("ParsePolicy(%q) = %+v, want %+v", c.body, got, c.want)
			}
		})
	}
}

func TestParsePolicyErrors(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"bad JSON", `{"egress":`, "invalid policy: decode JSON"},
		{"trailing data", `{} {}`, "invalid policy: decode JSON"},
		{"wrong type", `[]`, "invalid policy: decode JSON"},
		{"unsupported action", `{"egress":[{"action":"block","target":"a.test"}]}`, `invalid policy: unsupported action "block"`},
		{"unsupported default", `{"defaultAction":"drop"}`, `invalid policy: defaultAction: unsupported action "drop"`},
		{"empty target", `{"egress":[{"action":"allow","target":"  "}]}`, "invalid policy: empty target"},
		{"missing target", `{"egress":[{"action":"allow"}]}`, "invalid policy: empty target"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(c.body))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("ParsePolicy(%q) = %v, want an ErrInvalid starting %q", c.body, err, c.want)
			}
		})
	}
}

func TestNewRuleTargets(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{"Example.COM", "example.com"},
		{" example.com. ", "example.com"},
		{"*.Example.com.", "*.example.com"},
		{"*.com", "*.com"},
		{"_dmarc.example.com", "_dmarc.example.com"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"localhost", "localhost"},
		{"1password.com", "1password.com"},
		{"192.0.2.1", "192.0.2.1"},
		{"2001:DB8:0::1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"::ffff:10.1.2.3", "10.1.2.3"},
		{"10.1.2.3/8", "10.0.0.0/8"},
		{"2001:db8::1/32", "2001:db8::/32"},
		{"::ffff:10.0.0.0/104", "10.0.0.0/8"},
		{"::ffff:0:0/96", "0.0.0.0/0"},
		{"::/0", "::/0"},
		{"0.0.0.0/0", "0.0.0.0/0"},
		{"198.51.100.7/32", "198.51.100.7/32"},
	}
	for _, c := range cases {
		r, err := NewRule(apiRule("allow", c.in))
		if err != nil {
			t.Errorf("NewRule(%q): %v", c.in, err)
			continue
		}
		if r.Target != c.want {
			t.Errorf("NewRule(%q).Target = %q, want %q", c.in, r.Target, c.want)
		}
	}
}

func TestNewRuleBadTargets(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{"", "empty target"},
		{"*", "'*' is allowed only"},
		{"*.", "'*' is allowed only"},
		{"*..", "empty host name"},
		{"a.*.example.com", "'*' is allowed only"},
		{"*example.com", "'*' is allowed only"},
		{"**.example.com", "'*' is allowed only"},
		{"a..b", "empty label"},
		{".example.com", "empty label"},
		{"-a.example.com", "starts or ends with '-'"},
		{"a-.example.com", "starts or ends with '-'"},
		{"exa mple.com", "not allowed in a host name"},
		{"http://example.com", "not a valid CIDR"},
		{"example.com/path", "not a valid CIDR"},
		{"example.com:443", "not a valid IP address"},
		{"fe80::1%eth0", "not a valid IP address"},
		{"bücher.example", "xn-- form"},
		{"10.0.0.0/33", "not a valid CIDR"},
		{"10.0.0/8", "not a valid CIDR"},
		{"127.1", "looks like an IP address"},
		{"0x7f.1", "looks like an IP address"},
		{"010.0.0.1", "looks like an IP address"},
		{"1.2.3.4.5", "looks like an IP address"},
		{"*.10.0.0.1", "looks like an IP address"},
		{strings.Repeat("a", 64) + ".test", "longer than 63"},
		{strings.Repeat("a.", 127) + "test", "longer than 253"},
	}
	for _, c := range cases {
		_, err := NewRule(apiRule("allow", c.in))
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRule(%q) = %v, want an ErrInvalid containing %q", c.in, err, c.want)
		}
	}
}

func TestMode(t *testing.T) {
	cases := []struct {
		p    Policy
		want string
	}{
		{Policy{}, PolicyDenyAll},
		{DenyAll(), PolicyDenyAll},
		{Policy{DefaultAction: ActionAllow}, PolicyAllowAll},
		{Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test")}, PolicyEnforcing},
		{Policy{DefaultAction: ActionAllow, Egress: rules("deny", "a.test")}, PolicyEnforcing},
	}
	for _, c := range cases {
		if got := c.p.Mode(); got != c.want {
			t.Errorf("%+v.Mode() = %q, want %q", c.p, got, c.want)
		}
	}
}

func TestAPIEgressNeverNull(t *testing.T) {
	for _, p := range []Policy{{}, DenyAll(), {DefaultAction: ActionAllow}} {
		data, err := json.Marshal(p.API())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), `"egress":[]`) || !strings.Contains(string(data), `"defaultAction":"`) {
			t.Errorf("json of %+v = %s, want egress [] and a defaultAction", p, data)
		}
	}
}

func TestParsePatch(t *testing.T) {
	for _, body := range []string{"", "  ", "null", "[]", "{}", `[{"action":"block","target":"a.test"}]`, `[{"action":"allow","target":""}]`, `[`} {
		if _, err := ParsePatch([]byte(body)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParsePatch(%q) = %v, want ErrInvalid", body, err)
		}
	}
	got, err := ParsePatch([]byte(`[{"action":"ALLOW","target":"A.test."},{"target":"10.1.0.0/16"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if want := rules("allow", "a.test", "deny", "10.1.0.0/16"); !(Policy{Egress: got}).Equal(Policy{Egress: want}) {
		t.Errorf("ParsePatch = %+v, want %+v", got, want)
	}
}

func TestParseTargets(t *testing.T) {
	for _, body := range []string{"", "null", "[]", `{"a":1}`, `[1]`, `["a"`} {
		if _, err := ParseTargets([]byte(body)); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseTargets(%q) = %v, want ErrInvalid", body, err)
		}
	}
	got, err := ParseTargets([]byte(` ["a.test", " B.test "] `))
	if err != nil || len(got) != 2 || got[0] != "a.test" || got[1] != " B.test " {
		t.Errorf("ParseTargets = %q, %v", got, err)
	}
}

func TestPatch(t *testing.T) {
	old := Policy{DefaultAction: ActionAllow, Egress: rules("allow", "a.test", "deny", "b.test", "allow", "*.c.test", "deny", "10.0.0.0/8")}
	cases := []struct {
		name  string
		patch []Rule
		want  Policy
	}{
		{"new rule goes first",
			rules("deny", "d.test"),
			Policy{ActionAllow, rules("deny", "d.test", "allow", "a.test", "deny", "b.test", "allow", "*.c.test", "deny", "10.0.0.0/8")}},
		{"patched target overrides and moves first",
			rules("allow", "b.test"),
			Policy{ActionAllow, rules("allow", "b.test", "allow", "a.test", "allow", "*.c.test", "deny", "10.0.0.0/8")}},
		{"first of duplicates in the patch wins (spec example)",
			rules("allow", "example.com", "deny", "example.com"),
			Policy{ActionAllow, rules("allow", "example.com", "allow", "a.test", "deny", "b.test", "allow", "*.c.test", "deny", "10.0.0.0/8")}},
		{"request order kept",
			rules("deny", "z.test", "allow", "10.0.0.0/8", "allow", "y.test"),
			Policy{ActionAllow, rules("deny", "z.test", "allow", "10.0.0.0/8", "allow", "y.test", "allow", "a.test", "deny", "b.test", "allow", "*.c.test")}},
		{"wildcard and exact are different targets",
			rules("deny", "c.test"),
			Policy{ActionAllow, rules("deny", "c.test", "allow", "a.test", "deny", "b.test", "allow", "*.c.test", "deny", "10.0.0.0/8")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := old.Patch(c.patch)
			if !got.Equal(c.want) {
				t.Errorf("Patch(%+v)\n got %+v\nwant %+v", c.patch, got, c.want)
			}
		})
	}
	// The default action survives a patch, and the old policy is untouched.
	deny := Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test")}
	if got := deny.Patch(rules("allow", "b.test")); got.DefaultAction != ActionDeny {
		t.Errorf("Patch changed the default action to %q", got.DefaultAction)
	}
	if len(old.Egress) != 4 || old.Egress[0].Target != "a.test" {
		t.Errorf("Patch modified its receiver: %+v", old)
	}
}

func TestDelete(t *testing.T) {
	old := Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test", "deny", "b.test", "allow", "*.c.test", "allow", "2001:db8::1", "allow", "a.test")}
	cases := []struct {
		name    string
		targets []string
		want    []Rule
		removed int
	}{
		{"one", []string{"b.test"}, rules("allow", "a.test", "allow", "*.c.test", "allow", "2001:db8::1", "allow", "a.test"), 1},
		{"every rule with the target", []string{"a.test"}, rules("deny", "b.test", "allow", "*.c.test", "allow", "2001:db8::1"), 2},
		{"case-insensitive and trimmed", []string{"  B.TEST "}, rules("allow", "a.test", "allow", "*.c.test", "allow", "2001:db8::1", "allow", "a.test"), 1},
		{"canonical address", []string{"2001:DB8:0::1"}, rules("allow", "a.test", "deny", "b.test", "allow", "*.c.test", "allow", "a.test"), 1},
		{"wildcard by its text", []string{"*.C.test"}, rules("allow", "a.test", "deny", "b.test", "allow", "2001:db8::1", "allow", "a.test"), 1},
		{"unknown ignored", []string{"nope.test", "", "a b"}, old.Egress, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, n := old.Delete(c.targets)
			if n != c.removed || !got.Equal(Policy{ActionDeny, c.want}) {
				t.Errorf("Delete(%q) = %+v, %d; want %+v, %d", c.targets, got, n, c.want, c.removed)
			}
		})
	}
}

func apiRule(action, target string) api.NetworkRule {
	return api.NetworkRule{Action: action, Target: target}
}
