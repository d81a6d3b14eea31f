package vault

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/egress"
)

// matchVault has bindings of every auth type on exact and wildcard
// hosts, ports, schemes, methods and paths.
const matchVault = `{
	"credentials": [
		{"name": "gh", "source": {"value": "ghp_SECRET"}},
		{"name": "basic", "source": {"value": "dXNlcjpwYXNz"}},
		{"name": "key", "source": {"value": "key-SECRET"}},
		{"name": "a", "source": {"value": "a-SECRET"}},
		{"name": "b", "source": {"value": "b-SECRET"}},
		{"name": "dup", "source": {"value": "ghp_SECRET"}}
	],
	"bindings": [
		{"name": "github", "match": {"hosts": ["api.github.test"], "paths": ["/v1/*", "/exact"]}, "auth": {"type": "bearer", "credential": "gh"}},
		{"name": "github-get", "match": {"hosts": ["api.github.test"], "paths": ["/v2/*"], "methods": ["GET"]}, "auth": {"type": "basic", "credential": "basic"}},
		{"name": "example", "match": {"hosts": ["*.example.test"], "schemes": ["https", "http"], "ports": [443, 80]}, "auth": {"type": "apiKey", "name": "X-Key", "credential": "key"}},
		{"name": "other", "match": {"hosts": ["*.deep.other.test", "plain.test"], "schemes": ["http"], "ports": [80]},
		 "auth": {"type": "customHeaders", "headers": [{"name": "X-A", "credential": "a"}, {"name": "X-B", "credential": "b"}]}}
	]
}`

// breq is a BindRequest.
func breq(scheme, host string, port uint16, method, path string) egress.BindRequest {
	return egress.BindRequest{Scheme: scheme, Host: host, Port: port, Method: method, Path: path}
}

func matchTestVault(t testing.TB) *Vault {
	opt := testOptions(t)
	opt.AllowHTTP = true
	return mustCreate(t, matchVault, opt)
}

func TestBind(t *testing.T) {
	v := matchTestVault(t)
	type want struct {
		binding string
		headers []egress.InjectedHeader
		path    string
		err     error
		reason  string
	}
	bearer := []egress.InjectedHeader{{Name: "Authorization", Value: "Bearer ghp_SECRET"}}
	apiKey := []egress.InjectedHeader{{Name: "X-Key", Value: "key-SECRET"}}
	cases := []struct {
		name string
		req  egress.BindRequest
		want want
	}{
		{"exact host prefix path", breq("https", "api.github.test", 443, "GET", "/v1/repos"), want{binding: "github", headers: bearer, path: "/v1/repos"}},
		{"prefix dir itself", breq("https", "api.github.test", 443, "GET", "/v1/"), want{binding: "github", headers: bearer, path: "/v1/"}},
		{"prefix does not match its bare name", breq("https", "api.github.test", 443, "GET", "/v1"), want{err: egress.ErrNoBinding, reason: `covers path "/v1"`}},
		{"exact path", breq("https", "api.github.test", 443, "POST", "/exact"), want{binding: "github", headers: bearer, path: "/exact"}},
		{"exact path with slash", breq("https", "api.github.test", 443, "POST", "/exact/"), want{err: egress.ErrNoBinding, reason: "covers path"}},
		{"host case and dot", breq("https", "API.GitHub.test.", 443, "GET", "/v1/x"), want{binding: "github", headers: bearer, path: "/v1/x"}},
		{"basic on GET", breq("https", "api.github.test", 443, "GET", "/v2/x"), want{binding: "github-get", headers: []egress.InjectedHeader{{Name: "Authorization", Value: "Basic dXNlcjpwYXNz"}}, path: "/v2/x"}},
		{"method not bound", breq("https", "api.github.test", 443, "POST", "/v2/x"), want{err: egress.ErrNoBinding, reason: "covers path"}},
		{"method case sensitive", breq("https", "api.github.test", 443, "get", "/v1/x"), want{err: egress.ErrNoBinding, reason: `covers method "get"`}},
		{"method outside defaults", breq("https", "api.github.test", 443, "HEAD", "/v1/x"), want{err: egress.ErrNoBinding, reason: `covers method "HEAD"`}},
		{"port not bound", breq("https", "api.github.test", 80, "GET", "/v1/x"), want{err: egress.ErrNoBinding, reason: "covers port 80"}},
		{"odd port", breq("https", "api.github.test", 8443, "GET", "/v1/x"), want{err: egress.ErrNoBinding, reason: "covers port 8443"}},
		{"scheme not bound", breq("http", "api.github.test", 443, "GET", "/v1/x"), want{err: egress.ErrNoBinding, reason: `covers scheme "http"`}},
		{"host not bound", breq("https", "uploads.github.test", 443, "GET", "/v1/x"), want{err: egress.ErrNoBinding, reason: `no binding names host "uploads.github.test"`}},
		{"wildcard one label", breq("https", "a.example.test", 443, "DELETE", "/"), want{binding: "example", headers: apiKey, path: "/"}},
		{"wildcard many labels", breq("http", "a.b.c.example.test", 80, "PUT", "/x"), want{binding: "example", headers: apiKey, path: "/x"}},
		{"clear text on the TLS port", breq("http", "a.example.test", 443, "PUT", "/x"), want{err: egress.ErrNoBinding, reason: `covers scheme "http"`}},
		{"wildcard not apex", breq("https", "example.test", 443, "GET", "/"), want{err: egress.ErrNoBinding, reason: "no binding names host"}},
		{"wildcard not a lookalike", breq("https", "evilexample.test", 443, "GET", "/"), want{err: egress.ErrNoBinding, reason: "no binding names host"}},
		{"custom headers", breq("http", "x.deep.other.test", 80, "GET", "/"), want{binding: "other", headers: []egress.InjectedHeader{{Name: "X-A", Value: "a-SECRET"}, {Name: "X-B", Value: "b-SECRET"}}, path: "/"}},
		{"custom headers exact host", breq("http", "plain.test", 80, "GET", "/a"), want{binding: "other", path: "/a", headers: []egress.InjectedHeader{{Name: "X-A", Value: "a-SECRET"}, {Name: "X-B", Value: "b-SECRET"}}}},
		{"empty path is /", breq("http", "plain.test", 80, "GET", ""), want{binding: "other", path: "/", headers: []egress.InjectedHeader{{Name: "X-A", Value: "a-SECRET"}, {Name: "X-B", Value: "b-SECRET"}}}},
		// Path normalisation: traversal does not escape a prefix.
		{"dotdot leaves prefix", breq("https", "api.github.test", 443, "GET", "/v1/../x"), want{err: egress.ErrNoBinding, reason: `covers path "/x"`}},
		{"escaped dotdot leaves prefix", breq("https", "api.github.test", 443, "GET", "/v1/%2e%2e/x"), want{err: egress.ErrNoBinding, reason: `covers path "/x"`}},
		{"escaped slash dotdot", breq("https", "api.github.test", 443, "GET", "/v1%2F..%2Fx"), want{err: egress.ErrNoBinding, reason: `covers path "/x"`}},
		{"dotdot within prefix", breq("https", "api.github.test", 443, "GET", "/v1/a/../b"), want{binding: "github", headers: bearer, path: "/v1/b"}},
		{"dot and double slash", breq("https", "api.github.test", 443, "GET", "/v1/./a//b/"), want{binding: "github", headers: bearer, path: "/v1/a/b/"}},
		{"dotdot into prefix", breq("https", "api.github.test", 443, "GET", "/x/../v1/y"), want{binding: "github", headers: bearer, path: "/v1/y"}},
		{"escaped prefix", breq("https", "api.github.test", 443, "GET", "/%76%31/y"), want{binding: "github", headers: bearer, path: "/%76%31/y"}},
		{"escaped slash is re-escaped", breq("https", "api.github.test", 443, "GET", "/v1/a%2Fb"), want{binding: "github", headers: bearer, path: "/v1/a/b"}},
		{"escaped space kept", breq("https", "api.github.test", 443, "GET", "/v1/a%20b"), want{binding: "github", headers: bearer, path: "/v1/a%20b"}},
		{"raw space escaped", breq("https", "api.github.test", 443, "GET", "/v1/a b"), want{binding: "github", headers: bearer, path: "/v1/a%20b"}},
		{"dotdot with parameters", breq("https", "api.github.test", 443, "GET", "/v1/..;/admin"), want{err: egress.ErrNoBinding, reason: "dot segment with parameters"}},
		{"escaped dotdot with parameters", breq("https", "api.github.test", 443, "GET", "/v1/%2e%2e;x=1/admin"), want{err: egress.ErrNoBinding, reason: "dot segment with parameters"}},
		{"dot with parameters", breq("https", "api.github.test", 443, "GET", "/v1/.;/x"), want{err: egress.ErrNoBinding, reason: "dot segment with parameters"}},
		{"parameters elsewhere kept", breq("https", "api.github.test", 443, "GET", "/v1/a;b=c"), want{binding: "github", headers: bearer, path: "/v1/a;b=c"}},
		{"malformed escape", breq("https", "api.github.test", 443, "GET", "/v1/%zz"), want{err: egress.ErrNoBinding, reason: "malformed escape"}},
		{"truncated escape", breq("https", "api.github.test", 443, "GET", "/v1/%2"), want{err: egress.ErrNoBinding, reason: "malformed escape"}},
		{"backslash", breq("https", "api.github.test", 443, "GET", `/v1/..\x`), want{err: egress.ErrNoBinding, reason: "backslash"}},
		{"escaped backslash", breq("https", "api.github.test", 443, "GET", `/v1/..%5cx`), want{err: egress.ErrNoBinding, reason: "backslash"}},
		{"NUL", breq("https", "api.github.test", 443, "GET", `/v1/%00`), want{err: egress.ErrNoBinding, reason: "NUL"}},
		{"not absolute", breq("https", "api.github.test", 443, "OPTIONS", "*"), want{err: egress.ErrNoBinding, reason: "covers method"}},
		{"not absolute GET", breq("https", "api.github.test", 443, "GET", "v1/x"), want{err: egress.ErrNoBinding, reason: "does not start with /"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := v.Bind(c.req)
			if c.want.err != nil {
				if !errors.Is(err, c.want.err) || !strings.Contains(err.Error(), c.want.reason) {
					t.Fatalf("Bind(%+v) = %+v, %v; want %v containing %q", c.req, got, err, c.want.err, c.want.reason)
				}
				if strings.Contains(err.Error(), "SECRET") {
					t.Errorf("error %q holds a value", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Bind(%+v) = %v", c.req, err)
			}
			w := c.want
			if got.Binding != w.binding || got.Path != w.path || !reflect.DeepEqual(got.Headers, w.headers) {
				t.Errorf("Bind(%+v) = %+v, want %s %s %+v", c.req, got, w.binding, w.path, w.headers)
			}
		})
	}
	// The injection's headers are a copy.
	inj, _ := v.Bind(breq("https", "api.github.test", 443, "GET", "/v1/"))
	inj.Headers[0].Value = "changed"
	if again, _ := v.Bind(breq("https", "api.github.test", 443, "GET", "/v1/")); again.Headers[0].Value != "Bearer ghp_SECRET" {
		t.Errorf("changing an injection changed the vault: %+v", again)
	}
}

func TestInterceptsHostBound(t *testing.T) {
	v := matchTestVault(t)
	for _, c := range []struct {
		host   string
		port   uint16
		scheme string
		want   bool
	}{
		{"api.github.test", 443, "https", true},
		{"api.github.test", 80, "https", false},
		{"api.github.test", 443, "http", false},
		{"a.example.test", 80, "http", true},
		{"a.example.test", 443, "http", false}, // never clear text to the TLS port
		{"example.test", 443, "https", false},
		{"x.deep.other.test", 80, "http", true},
		{"deep.other.test", 80, "http", false},
		{"plain.test", 443, "https", false},
		{"nope.test", 443, "https", false},
		{"api.github.test", 8080, "https", false},
		{"api.github.test", 443, "ftp", false},
	} {
		if got := v.Intercepts(c.host, c.port, c.scheme); got != c.want {
			t.Errorf("Intercepts(%s, %d, %s) = %v, want %v", c.host, c.port, c.scheme, got, c.want)
		}
	}
	for host, want := range map[string]bool{
		"api.github.test": true, "a.b.example.test": true, "plain.test": true, "x.deep.other.test": true,
		"example.test": false, "deep.other.test": false, "uploads.github.test": false,
	} {
		if got := v.HostBound(host); got != want {
			t.Errorf("HostBound(%s) = %v, want %v", host, got, want)
		}
	}
	secrets := v.Secrets()
	slices.Sort(secrets)
	if want := []string{"a-SECRET", "b-SECRET", "dXNlcjpwYXNz", "ghp_SECRET", "key-SECRET"}; !reflect.DeepEqual(secrets, want) {
		t.Errorf("Secrets = %q, want %q (distinct)", secrets, want)
	}

	var nilVault *Vault
	var b egress.Binder = nilVault
	if b.Intercepts("api.github.test", 443, "https") || b.HostBound("api.github.test") || b.Secrets() != nil {
		t.Error("a nil vault binds")
	}
	if _, err := b.Bind(breq("https", "api.github.test", 443, "GET", "/")); !errors.Is(err, egress.ErrNoBinding) {
		t.Errorf("nil vault Bind = %v", err)
	}
}

// TestBindAmbiguous: validation keeps bindings from overlapping, so an
// ambiguous vault is built by hand here to check that Bind refuses it.
func TestBindAmbiguous(t *testing.T) {
	v := matchTestVault(t)
	a, b := v.byName["github"], v.byName["github-get"]
	wide := *b
	wide.name = "wide"
	wide.paths = []pathPattern{{p: "/", prefix: true}}
	v.exact["api.github.test"] = []*binding{a, &wide}
	_, err := v.Bind(breq("https", "api.github.test", 443, "GET", "/v1/x"))
	if !errors.Is(err, egress.ErrAmbiguous) || !strings.Contains(err.Error(), `"github" and "wide"`) {
		t.Errorf("Bind with two matches = %v, want ErrAmbiguous naming both", err)
	}
	// One binding reached through two of its hosts is one match.
	opt := testOptions(t)
	v2 := mustCreate(t, vaultJSON(okCred, bindJSON(`{"hosts":["a.example.test","*.example.test"]}`, bearer)), opt)
	if inj, err := v2.Bind(breq("https", "a.example.test", 443, "GET", "/")); err != nil || inj.Binding != "b" {
		t.Errorf("Bind via two hosts of one binding = %+v, %v", inj, err)
	}
}

func TestNormalisePath(t *testing.T) {
	for _, c := range []struct {
		in, decoded, send string
		err               bool
	}{
		{"/", "/", "/", false},
		{"", "/", "/", false},
		{"/a/b", "/a/b", "/a/b", false},
		{"/a/b/", "/a/b/", "/a/b/", false},
		{"/a/./b/../c/", "/a/c/", "/a/c/", false},
		{"/../../etc", "/etc", "/etc", false},
		{"/a/%2e%2E/b", "/b", "/b", false},
		{"/a%2fb", "/a/b", "/a/b", false},
		{"/%41", "/A", "/%41", false},
		{"/a%20b", "/a b", "/a%20b", false},
		{"/é", "/é", "/%C3%A9", false},
		{"/a;b=c", "/a;b=c", "/a;b=c", false},
		{"//a", "/a", "/a", false},
		{"/a/..", "/", "/", false},
		{"/a/../", "/", "/", false},
		{"/%", "", "", true},
		{"/%g0", "", "", true},
		{"a", "", "", true},
		{"/a\\b", "", "", true},
		{"/a%5Cb", "", "", true},
		{"/a%00", "", "", true},
	} {
		d, s, err := normalisePath(c.in)
		if (err != nil) != c.err || d != c.decoded || s != c.send {
			t.Errorf("normalisePath(%q) = %q, %q, %v; want %q, %q, error %v", c.in, d, s, err, c.decoded, c.send, c.err)
		}
	}
}

// TestNormalisePathAllocs: a clean path allocates nothing.
func TestNormalisePathAllocs(t *testing.T) {
	for _, p := range []string{"/v1/repos/x/y", "/v1/a/b/", "/v1/%41"} {
		if n := testing.AllocsPerRun(100, func() { normalisePath(p) }); n > 1 {
			t.Errorf("normalisePath(%q): %v allocations", p, n)
		}
	}
}

// benchVault is about ten bindings, exact and wildcard.
func benchVault(b *testing.B) *Vault {
	var creds, binds []string
	for i := range 10 {
		creds = append(creds, fmt.Sprintf(`{"name":"c%d","source":{"value":"secret-%d"}}`, i, i))
	}
	for i := range 8 {
		binds = append(binds, fmt.Sprintf(`{"name":"b%d","match":{"hosts":["h%d.example.test"],"paths":["/v1/*","/v2/items/*"]},"auth":{"type":"bearer","credential":"c%d"}}`, i, i, i))
	}
	binds = append(binds,
		`{"name":"gh","match":{"hosts":["api.github.test"],"methods":["GET"],"paths":["/repos/*"]},"auth":{"type":"apiKey","name":"X-Key","credential":"c8"}}`,
		`{"name":"other","match":{"hosts":["*.other.test"]},"auth":{"type":"customHeaders","headers":[{"name":"X-A","credential":"c9"},{"name":"X-B","credential":"c0"}]}}`)
	return mustCreate(b, vaultJSON(strings.Join(creds, ","), strings.Join(binds, ",")), testOptions(b))
}

func BenchmarkBind(b *testing.B) {
	v := benchVault(b)
	cases := []struct {
		name string
		req  egress.BindRequest
		want string // binding, "" for no match
	}{
		{"exact", breq("https", "h5.example.test", 443, "POST", "/v2/items/42"), "b5"},
		{"exact-get", breq("https", "api.github.test", 443, "GET", "/repos/o/r/pulls"), "gh"},
		{"wildcard-deep", breq("https", "a.b.c.other.test", 443, "GET", "/x/y"), "other"},
		{"escaped", breq("https", "h1.example.test", 443, "GET", "/v1/a%20b/c"), "b1"},
		{"traversal", breq("https", "h1.example.test", 443, "GET", "/v1/../v2/items/x"), "b1"},
		{"no-host", breq("https", "unbound.example.test", 443, "GET", "/v1/x"), ""},
		{"no-path", breq("https", "h1.example.test", 443, "GET", "/v3/x"), ""},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				inj, err := v.Bind(c.req)
				if c.want == "" && !errors.Is(err, egress.ErrNoBinding) || c.want != "" && inj.Binding != c.want {
					b.Fatalf("Bind(%+v) = %+v, %v; want %q", c.req, inj, err, c.want)
				}
			}
		})
	}
}

func BenchmarkIntercepts(b *testing.B) {
	v := benchVault(b)
	b.ReportAllocs()
	for b.Loop() {
		if !v.Intercepts("a.b.other.test", 443, "https") {
			b.Fatal("Intercepts = false")
		}
	}
}
