package egress

import (
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
)

var fuzzSeeds = []string{
	``, `null`, `{}`, `[]`,
	`{"defaultAction":"allow"}`,
	`{"defaultAction":" Deny ","egress":[{"action":"allow","target":"Example.COM."}]}`,
	`{"egress":[{"action":"allow","target":"*.pythonhosted.org"},{"action":"deny","target":"10.1.2.3/8"}]}`,
	`{"egress":[{"action":"","target":"::ffff:10.0.0.0/104"},{"target":"[2001:DB8::1]"}]}`,
	`{"egress":[{"action":"block","target":"a.test"}]}`,
	`{"egress":[{"action":"allow","target":"127.1"}]}`,
	`{"egress":[{"action":"allow","target":"xn--bcher-kva.example"},{"action":"allow","target":"_srv.a-b.test"}]}`,
}

// checkStable checks that a normalised policy survives the wire: encoded
// as the API sends it and parsed again, it is the same policy, and a
// matcher can be built from it.
func checkStable(t *testing.T, p Policy) {
	t.Helper()
	data, err := json.Marshal(p.API())
	if err != nil {
		t.Fatalf("marshal %+v: %v", p, err)
	}
	q, err := ParsePolicy(data)
	if err != nil {
		t.Fatalf("reparse %s: %v", data, err)
	}
	if !q.Equal(p) {
		t.Fatalf("parse→marshal→parse changed the policy:\n%+v\n%s\n%+v", p, data, q)
	}
	m, err := NewMatcher(Overlay{}, p)
	if err != nil {
		t.Fatalf("NewMatcher of a parsed policy %+v: %v", p, err)
	}
	for _, r := range p.Egress {
		// Each target, asked about, must not panic; a rule that is the
		// first for its target decides it.
		if a, err := netip.ParseAddr(r.Target); err == nil {
			m.Addr(a)
			m.Resolved(a)
		} else {
			m.Name(r.Target)
		}
	}
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParsePolicy error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if p.DefaultAction != ActionAllow && p.DefaultAction != ActionDeny {
			t.Fatalf("default action %q", p.DefaultAction)
		}
		checkStable(t, p)
	})
}

func FuzzPatchPolicy(f *testing.F) {
	f.Add([]byte(`[{"action":"allow","target":"example.com"},{"action":"deny","target":"EXAMPLE.com"}]`), []byte(`["a.test"]`))
	f.Add([]byte(`[{"target":"10.0.0.0/8"}]`), []byte(`[" 10.0.0.0/8 "]`))
	f.Add([]byte(`[{"action":"allow","target":"*.b.test"}]`), []byte(`["*.B.test","nope"]`))
	f.Add([]byte(`[]`), []byte(`[]`))
	base := Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test", "deny", "*.b.test", "allow", "10.0.0.0/8", "deny", "2001:db8::1")}
	f.Fuzz(func(t *testing.T, patch, del []byte) {
		rs, err := ParsePatch(patch)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParsePatch error %v does not wrap ErrInvalid", err)
			}
			return
		}
		p := base.Patch(rs)
		if p.DefaultAction != base.DefaultAction {
			t.Fatal("Patch changed the default action")
		}
		seen := map[string]bool{}
		for _, r := range p.Egress {
			if seen[r.Target] {
				t.Fatalf("Patch left two rules for %q: %+v", r.Target, p.Egress)
			}
			seen[r.Target] = true
		}
		if p.Egress[0] != rs[0] {
			t.Fatalf("the patch's first rule %+v is not first: %+v", rs[0], p.Egress[0])
		}
		checkStable(t, p)
		targets, err := ParseTargets(del)
		if err != nil {
			return
		}
		q, n := p.Delete(targets)
		if len(q.Egress)+n != len(p.Egress) {
			t.Fatalf("Delete removed %d but left %d of %d", n, len(q.Egress), len(p.Egress))
		}
		checkStable(t, q)
	})
}
