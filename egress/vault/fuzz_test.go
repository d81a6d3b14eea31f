package vault

import (
	"errors"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/egress"
)

var createSeeds = []string{
	``, `{}`, `null`, `[]`, baseVault, matchVault,
	`{"credentials":[],"bindings":[]}`,
	vaultJSON(okCred, bindJSON(`{"hosts":["*.example.test"],"paths":["/a/*","/b"],"methods":["get"]}`, `{"type":"customHeaders","headers":[{"name":"x-a","credential":"c"}]}`)),
	vaultJSON(okCred, bindJSON(`{"hosts":["10.0.0.1"]}`, bearer)),
	`{"credentials":[{"name":"c","source":{"value":123}}],"bindings":[]}`,
}

// FuzzParseCreate: any body either fails with ErrInvalid or gives a
// request that Create accepts or refuses with ErrInvalid; an accepted
// vault survives sealing and never binds ambiguously.
func FuzzParseCreate(f *testing.F) {
	for _, s := range createSeeds {
		f.Add([]byte(s))
	}
	opt := Options{AllowHTTP: true, HostAllowed: testMatcher(f).BindingHostAllowed}
	key := testKey(1)
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseCreate(data)
		if err != nil {
			if !errors.Is(err, egress.ErrInvalid) {
				t.Fatalf("ParseCreate error %v does not wrap ErrInvalid", err)
			}
			return
		}
		v, err := Create(req, opt)
		if err != nil {
			if !errors.Is(err, egress.ErrInvalid) {
				t.Fatalf("Create error %v does not wrap ErrInvalid", err)
			}
			for _, c := range req.Credentials {
				if len(c.Source.Value) >= 4 && strings.Contains(err.Error(), c.Source.Value) && !strings.Contains(string(data), `"name":"`+c.Source.Value) {
					t.Fatalf("Create error %q holds a value", err)
				}
			}
			return
		}
		checkVault(t, v, key)
	})
}

var mutationSeeds = []string{
	``, `{}`, `{"expectedRevision":1}`,
	`{"credentials":{"delete":["api-key"]}}`,
	`{"credentials":{"replace":[{"name":"gh-token","source":{"value":"n"}}]},"bindings":{"delete":["example"]}}`,
	`{"bindings":{"add":[{"name":"x","match":{"hosts":["a.other.test"]},"auth":{"type":"basic","credential":"api-key"}}]}}`,
	`{"expectedRevision":2,"credentials":{"add":[{"name":"n","source":{"value":"v"}}]}}`,
}

// FuzzParseMutation: a mutation of a real vault either fails cleanly
// (ErrInvalid, ErrConflict) leaving the vault as it was, or gives the
// next revision.
func FuzzParseMutation(f *testing.F) {
	for _, s := range mutationSeeds {
		f.Add([]byte(s))
	}
	opt := Options{AllowHTTP: true, HostAllowed: testMatcher(f).BindingHostAllowed}
	base := mustCreate(f, baseVault, opt)
	before := base.State()
	key := testKey(2)
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseMutation(data)
		if err != nil {
			if !errors.Is(err, egress.ErrInvalid) {
				t.Fatalf("ParseMutation error %v does not wrap ErrInvalid", err)
			}
			return
		}
		v, err := base.Mutate(req, opt)
		if err != nil {
			if !errors.Is(err, egress.ErrInvalid) && !errors.Is(err, ErrConflict) {
				t.Fatalf("Mutate error %v is neither ErrInvalid nor ErrConflict", err)
			}
			if base.Revision() != before.Revision || len(base.Credentials()) != len(before.Credentials) || len(base.Bindings()) != len(before.Bindings) {
				t.Fatal("a failed mutation changed the vault")
			}
			return
		}
		if v.Revision() != base.Revision()+1 {
			t.Fatalf("revision %d after %d", v.Revision(), base.Revision())
		}
		checkVault(t, v, key)
	})
}

// checkVault checks the invariants of a valid vault.
func checkVault(t *testing.T, v *Vault, key []byte) {
	t.Helper()
	sealed, err := Seal(key, v, "f")
	if err != nil {
		t.Fatalf("Seal: %v", err)
	}
	w, err := Open(key, sealed, "f")
	if err != nil {
		t.Fatalf("Open of a sealed valid vault: %v", err)
	}
	if w.Revision() != v.Revision() || len(w.Bindings()) != len(v.Bindings()) || len(w.Credentials()) != len(v.Credentials()) {
		t.Fatal("seal round trip changed the vault")
	}
	for _, b := range v.Bindings() {
		for _, h := range b.Match.Hosts {
			host := strings.TrimPrefix(h, "*.")
			if h != host {
				host = "x." + host
			}
			for _, p := range b.Match.Paths {
				req := egress.BindRequest{Scheme: b.Match.Schemes[0], Host: host, Port: uint16(b.Match.Ports[0]), Method: b.Match.Methods[0], Path: strings.TrimSuffix(p, "*")}
				inj, err := v.Bind(req)
				if err != nil || inj.Binding != b.Name {
					t.Fatalf("Bind(%+v) = %+v, %v; want binding %q", req, inj, err, b.Name)
				}
			}
		}
	}
}

// FuzzNormalisePath: the normalised path is clean, starts with '/', and
// the path sent decodes to it; normalising it again changes nothing.
func FuzzNormalisePath(f *testing.F) {
	for _, s := range []string{"/", "", "/a/../b", "/a/%2e%2e/b", "/a%2Fb", "/%zz", "/a b", "/é/./", "//x//", "/a/..%2f..%2fc", "*", "/%41%42/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		decoded, send, err := normalisePath(p)
		if err != nil {
			var pe errPath
			if !errors.As(err, &pe) {
				t.Fatalf("normalisePath(%q) error %v of another kind", p, err)
			}
			return
		}
		if !strings.HasPrefix(decoded, "/") || cleanPath(decoded) != decoded {
			t.Fatalf("normalisePath(%q) = %q, not clean", p, decoded)
		}
		if strings.ContainsAny(decoded, "\\\x00") {
			t.Fatalf("normalisePath(%q) = %q holds a backslash or NUL", p, decoded)
		}
		got, uerr := url.PathUnescape(send)
		if uerr != nil || got != decoded {
			t.Fatalf("normalisePath(%q): send %q decodes to %q (%v), want %q", p, send, got, uerr, decoded)
		}
		if path.Clean(got) != path.Clean(decoded) {
			t.Fatalf("normalisePath(%q): send %q is not the judged path", p, send)
		}
		d2, s2, err := normalisePath(send)
		if err != nil || d2 != decoded || s2 != send {
			t.Fatalf("normalisePath(%q) = %q, %q; again = %q, %q, %v", p, decoded, send, d2, s2, err)
		}
		if strings.Contains(strings.ToLower(send), "%2f") {
			t.Fatalf("normalisePath(%q): send %q carries an escaped slash", p, send)
		}
	})
}
