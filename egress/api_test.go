package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

const testToken = "s3cret-token"

// apiFixture is a handler over a live matcher, with a store in a temp
// directory and an apply hook the test can make fail.
type apiFixture struct {
	h       *Handler
	live    *Live
	store   *FileStore
	denials *Denials

	mu       sync.Mutex
	applyErr error
	applied  []Policy
}

func newAPIFixture(t *testing.T, initial Policy, tweak func(*HandlerConfig)) *apiFixture {
	t.Helper()
	f := &apiFixture{
		live:    NewLive(mustMatcher(t, Overlay{Deny: []string{"evil.test"}, Allow: []string{"otel.test"}}, initial)),
		store:   NewFileStore(filepath.Join(t.TempDir(), "policy.json")),
		denials: NewDenials(10),
	}
	cfg := DefaultHandlerConfig()
	cfg.Token = testToken
	cfg.Store = f.store
	cfg.Denials = f.denials
	cfg.Apply = func(p Policy) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.applyErr != nil {
			return f.applyErr
		}
		f.applied = append(f.applied, p)
		return nil
	}
	if tweak != nil {
		tweak(&cfg)
	}
	h, err := NewHandler(cfg, f.live)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	return f
}

// do sends one request with the token (unless token is "-") and returns
// the status and the body.
func (f *apiFixture) do(t *testing.T, method, path, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set(api.HeaderEgressAuth, testToken)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			r.Header.Del(header[i])
		} else {
			r.Header.Set(header[i], header[i+1])
		}
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w.Code, w.Header(), w.Body.String()
}

func (f *apiFixture) status(t *testing.T, method, path, body string) api.PolicyStatus {
	t.Helper()
	code, hdr, out := f.do(t, method, path, body)
	if code != http.StatusOK {
		t.Fatalf("%s %s %q: %d %q, want 200", method, path, body, code, out)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	var st api.PolicyStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%s %s: decode %q: %v", method, path, out, err)
	}
	return st
}

// wantError checks a text/plain error answer.
func (f *apiFixture) wantError(t *testing.T, method, path, body string, status int, text string) {
	t.Helper()
	code, hdr, out := f.do(t, method, path, body)
	if code != status || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") || !strings.Contains(out, text) {
		t.Errorf("%s %s %.60q = %d %q (%s), want %d text/plain containing %q", method, path, body, code, out, hdr.Get("Content-Type"), status, text)
	}
}

func TestAPIGetPolicy(t *testing.T) {
	for _, prefix := range []string{"", ProxyPrefix} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			f := newAPIFixture(t, DenyAll(), nil)
			code, _, out := f.do(t, "GET", prefix+"/policy", "")
			want := `{"status":"ok","mode":"deny_all","enforcementMode":"strict","policy":{"defaultAction":"deny","egress":[]}}` + "\n"
			if code != 200 || out != want {
				t.Errorf("GET %s/policy = %d %s, want 200 %s", prefix, code, out, want)
			}
			f.status(t, "PATCH", prefix+"/policy", `[{"action":"allow","target":"A.test"}]`)
			st := f.status(t, "GET", prefix+"/policy", "")
			if st.Mode != PolicyEnforcing || st.Policy == nil || len(st.Policy.Egress) != 1 || st.Policy.Egress[0] != (api.NetworkRule{Action: "allow", Target: "a.test"}) {
				t.Errorf("GET after PATCH = %+v (policy %+v)", st, st.Policy)
			}
		})
	}
}

func TestAPIAuth(t *testing.T) {
	f := newAPIFixture(t, DenyAll(), nil)
	for _, path := range []string{"/policy", ProxyPrefix + "/policy", "/denials"} {
		for _, tok := range []string{"", "wrong", testToken + "x", strings.ToUpper(testToken)} {
			code, _, out := f.do(t, "GET", path, "", api.HeaderEgressAuth, tok)
			if code != http.StatusUnauthorized || out != "unauthorized\n" {
				t.Errorf("GET %s with token %q = %d %q, want 401 unauthorized", path, tok, code, out)
			}
		}
	}
	code, _, _ := f.do(t, "PATCH", "/policy", `[{"action":"allow","target":"a.test"}]`, api.HeaderEgressAuth, "")
	if code != http.StatusUnauthorized || f.live.Name("a.test") {
		t.Errorf("PATCH without token = %d, allowed a.test: %v", code, f.live.Name("a.test"))
	}
	for _, path := range []string{"/healthz", ProxyPrefix + "/healthz"} {
		if code, _, out := f.do(t, "GET", path, "", api.HeaderEgressAuth, ""); code != 200 || out != "ok" {
			t.Errorf("GET %s without token = %d %q, want 200 ok", path, code, out)
		}
	}
	// No token configured: authentication is off.
	open := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) { c.Token = "" })
	if code, _, _ := open.do(t, "GET", "/policy", "", api.HeaderEgressAuth, ""); code != 200 {
		t.Errorf("GET /policy with no token configured = %d, want 200", code)
	}
}

func TestAPIHealthz(t *testing.T) {
	var mu sync.Mutex
	ready := errors.New("proxy not ready")
	f := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) {
		c.Ready = func() error { mu.Lock(); defer mu.Unlock(); return ready }
	})
	f.wantError(t, "GET", "/healthz", "", http.StatusServiceUnavailable, "proxy not ready")
	mu.Lock()
	ready = nil
	mu.Unlock()
	if code, _, out := f.do(t, "GET", "/healthz", ""); code != 200 || out != "ok" {
		t.Errorf("GET /healthz once ready = %d %q", code, out)
	}
}

func TestAPIMethodNotAllowed(t *testing.T) {
	f := newAPIFixture(t, DenyAll(), nil)
	for _, c := range []struct{ method, path string }{
		{"POST", "/healthz"}, {"DELETE", ProxyPrefix + "/healthz"}, {"OPTIONS", "/policy"}, {"POST", "/denials"},
	} {
		code, hdr, _ := f.do(t, c.method, c.path, "")
		if code != http.StatusMethodNotAllowed || hdr.Get("Allow") == "" {
			t.Errorf("%s %s = %d Allow %q, want 405 with Allow", c.method, c.path, code, hdr.Get("Allow"))
		}
	}
	_, hdr, _ := f.do(t, "TRACE", "/policy", "")
	for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		if !strings.Contains(hdr.Get("Allow"), m) {
			t.Errorf("Allow of /policy = %q, missing %s", hdr.Get("Allow"), m)
		}
	}
	if code, _, _ := f.do(t, "GET", "/nope", ""); code != http.StatusNotFound {
		t.Errorf("GET /nope = %d, want 404", code)
	}
}

func TestAPISetPolicy(t *testing.T) {
	for _, method := range []string{"POST", "PUT"} {
		t.Run(method, func(t *testing.T) {
			f := newAPIFixture(t, Policy{DefaultAction: ActionAllow, Egress: rules("deny", "x.test")}, nil)
			st := f.status(t, method, "/policy", `{"defaultAction":"deny","egress":[{"action":"allow","target":"a.test"},{"action":"allow","target":"198.51.100.0/24"}]}`)
			if st != (api.PolicyStatus{Status: "ok", Mode: PolicyEnforcing, EnforcementMode: ModeStrict}) {
				t.Errorf("%s = %+v", method, st)
			}
			if !f.live.Name("a.test") || f.live.Name("x.test") || !f.live.Addr(netip.MustParseAddr("198.51.100.9")) {
				t.Error("the new policy is not in force")
			}
			if !f.live.Name("otel.test") || f.live.Name("evil.test") {
				t.Error("the overlay was lost")
			}
			stored, ok, err := f.store.Load()
			if err != nil || !ok || !stored.Equal(f.live.Load().Policy()) {
				t.Errorf("store holds %+v %v %v, want the policy in force", stored, ok, err)
			}

			// Empty body: reset, with the reference's reason.
			code, _, out := f.do(t, method, "/policy", " \n")
			if want := `{"status":"ok","mode":"deny_all","reason":"policy reset to default deny-all"}` + "\n"; code != 200 || out != want {
				t.Errorf("%s empty = %d %s, want %s", method, code, out, want)
			}
			if f.live.Name("a.test") || f.live.Load().Policy().Mode() != PolicyDenyAll {
				t.Error("the reset did not take effect")
			}
			// null and {} also give deny-all, in the normal shape.
			f.status(t, method, "/policy", `{"defaultAction":"allow"}`)
			for _, body := range []string{"null", "{}"} {
				st := f.status(t, method, "/policy", body)
				if st != (api.PolicyStatus{Status: "ok", Mode: PolicyDenyAll, EnforcementMode: ModeStrict}) {
					t.Errorf("%s %s = %+v", method, body, st)
				}
			}
		})
	}
}

func TestAPIBadRequests(t *testing.T) {
	f := newAPIFixture(t, Policy{DefaultAction: ActionDeny, Egress: rules("allow", "keep.test")}, nil)
	cases := []struct {
		method, body, text string
	}{
		{"POST", `{"egress":`, "invalid policy: decode JSON"},
		{"POST", `{"egress":[{"action":"block","target":"a.test"}]}`, `invalid policy: unsupported action "block"`},
		{"PUT", `{"egress":[{"action":"allow","target":""}]}`, "invalid policy: empty target"},
		{"POST", `{"egress":[{"action":"allow","target":"a..test"}]}`, "empty label"},
		{"POST", `{"defaultAction":"maybe"}`, "unsupported action"},
		{"PATCH", ``, "empty body"},
		{"PATCH", `[]`, "no rules"},
		{"PATCH", `null`, "no rules"},
		{"PATCH", `{"action":"allow"}`, "decode JSON"},
		{"PATCH", `[{"action":"block","target":"a.test"}]`, `invalid policy: unsupported action "block"`},
		{"PATCH", `[{"action":"allow","target":"http://a.test/"}]`, "not a valid CIDR"},
		{"DELETE", ``, "empty body"},
		{"DELETE", `[]`, "no targets"},
		{"DELETE", `"a.test"`, "decode JSON"},
	}
	for _, c := range cases {
		f.wantError(t, c.method, "/policy", c.body, http.StatusBadRequest, c.text)
	}
	if p := f.live.Load().Policy(); !p.Equal(Policy{DefaultAction: ActionDeny, Egress: rules("allow", "keep.test")}) {
		t.Errorf("a bad request changed the policy to %+v", p)
	}
	if len(f.applied) != 0 {
		t.Errorf("a bad request was applied: %+v", f.applied)
	}
}

func TestAPIPatch(t *testing.T) {
	f := newAPIFixture(t, Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test", "deny", "b.test")}, nil)
	st := f.status(t, "PATCH", ProxyPrefix+"/policy", `[{"action":"allow","target":"example.com"},{"action":"deny","target":"example.com"},{"action":"allow","target":"B.test"}]`)
	if st != (api.PolicyStatus{Status: "ok", Mode: PolicyEnforcing, EnforcementMode: ModeStrict}) {
		t.Errorf("PATCH = %+v", st)
	}
	want := Policy{DefaultAction: ActionDeny, Egress: rules("allow", "example.com", "allow", "b.test", "allow", "a.test")}
	if got := f.live.Load().Policy(); !got.Equal(want) {
		t.Errorf("after PATCH: %+v, want %+v", got, want)
	}
	if len(f.applied) != 1 || !f.applied[0].Equal(want) {
		t.Errorf("applied %+v, want one apply of %+v", f.applied, want)
	}
}

func TestAPIDelete(t *testing.T) {
	f := newAPIFixture(t, Policy{DefaultAction: ActionAllow, Egress: rules("deny", "a.test", "deny", "b.test")}, nil)
	st := f.status(t, "DELETE", "/policy", `[" A.TEST "]`)
	if st != (api.PolicyStatus{Status: "ok", Mode: PolicyEnforcing, EnforcementMode: ModeStrict}) || !f.live.Name("a.test") {
		t.Errorf("DELETE = %+v; a.test allowed: %v", st, f.live.Name("a.test"))
	}
	st = f.status(t, "DELETE", "/policy", `["nope.test"]`)
	if st.Reason != "no matching targets found" || st.Mode != PolicyEnforcing {
		t.Errorf("DELETE of nothing = %+v", st)
	}
	if len(f.applied) != 1 {
		t.Errorf("a DELETE that removed nothing was applied: %d applies", len(f.applied))
	}
	st = f.status(t, "DELETE", "/policy", `["b.test"]`)
	if st.Mode != PolicyAllowAll {
		t.Errorf("DELETE of the last rule = %+v, want allow_all", st)
	}
}

func TestAPITooLarge(t *testing.T) {
	f := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) { c.MaxRules = 3 })
	big := `[{"action":"allow","target":"` + strings.Repeat("a", MaxBodyBytes) + `"}]`
	f.wantError(t, "PATCH", "/policy", big, http.StatusRequestEntityTooLarge, "larger than")
	f.wantError(t, "POST", "/policy", `{"egress":[`+strings.Repeat(` `, MaxBodyBytes)+`]}`, http.StatusRequestEntityTooLarge, "larger than")

	f.status(t, "PATCH", "/policy", `[{"target":"a.test"},{"target":"b.test"},{"target":"c.test"}]`)
	f.wantError(t, "PATCH", "/policy", `[{"target":"d.test"}]`, http.StatusRequestEntityTooLarge, "too many rules: 4, the limit is 3")
	f.status(t, "PATCH", "/policy", `[{"action":"allow","target":"a.test"}]`) // a replacement stays at 3
	f.wantError(t, "POST", "/policy", `{"egress":[{"target":"1.test"},{"target":"2.test"},{"target":"3.test"},{"target":"4.test"}]}`, http.StatusRequestEntityTooLarge, "too many rules")
	if n := len(f.live.Load().Policy().Egress); n != 3 {
		t.Errorf("%d rules in force, want 3", n)
	}

	// 0 means no cap.
	g := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) { c.MaxRules = 0 })
	var b strings.Builder
	b.WriteString(`{"egress":[`)
	for i := range 5000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"action":"allow","target":"h%d.test"}`, i)
	}
	b.WriteString(`]}`)
	g.status(t, "POST", "/policy", b.String())
	if !g.live.Name("h4999.test") {
		t.Error("5,000 rules without a cap: the last one is not in force")
	}
}

func TestAPIApplyFails(t *testing.T) {
	initial := Policy{DefaultAction: ActionDeny, Egress: rules("allow", "a.test")}
	f := newAPIFixture(t, initial, nil)
	if err := f.store.Save(initial); err != nil {
		t.Fatal(err)
	}
	f.applyErr = errors.New("netlink: operation not permitted")
	f.wantError(t, "PATCH", "/policy", `[{"action":"allow","target":"b.test"}]`, http.StatusInternalServerError, "apply policy: netlink: operation not permitted")
	f.wantError(t, "POST", "/policy", ``, http.StatusInternalServerError, "apply policy")
	f.wantError(t, "DELETE", "/policy", `["a.test"]`, http.StatusInternalServerError, "apply policy")
	if got := f.live.Load().Policy(); !got.Equal(initial) || f.live.Name("b.test") || !f.live.Name("a.test") {
		t.Errorf("after failed applies the policy is %+v", got)
	}
	if stored, _, err := f.store.Load(); err != nil || !stored.Equal(initial) {
		t.Errorf("after failed applies the store holds %+v (%v), want the policy in force", stored, err)
	}
	st := f.status(t, "GET", "/policy", "")
	if len(st.Policy.Egress) != 1 || st.Policy.Egress[0].Target != "a.test" {
		t.Errorf("GET after failed applies = %+v", st.Policy)
	}
}

func TestAPIStoreFails(t *testing.T) {
	f := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) {
		c.Store = NewFileStore(filepath.Join(t.TempDir(), "missing-dir", "policy.json"))
	})
	f.wantError(t, "PATCH", "/policy", `[{"action":"allow","target":"b.test"}]`, http.StatusInternalServerError, "persist policy")
	if f.live.Name("b.test") || len(f.applied) != 0 {
		t.Errorf("a failed persist still changed the policy (applies: %d)", len(f.applied))
	}
}

func TestAPIDenials(t *testing.T) {
	f := newAPIFixture(t, DenyAll(), nil)
	code, hdr, out := f.do(t, "GET", "/denials", "")
	if code != 200 || out != "[]\n" || hdr.Get("X-Denials-Total") != "0" {
		t.Errorf("GET /denials empty = %d %q total %q", code, out, hdr.Get("X-Denials-Total"))
	}
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range 12 {
		f.denials.Add(Denial{Time: t0.Add(time.Duration(i) * time.Second), Kind: "dns", Name: fmt.Sprintf("d%d.test", i), Reason: "denied by policy"})
	}
	code, hdr, out = f.do(t, "GET", ProxyPrefix+"/denials", "")
	var got []Denial
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 200 {
		t.Fatalf("GET /denials = %d %q: %v", code, out, err)
	}
	if len(got) != 10 || got[0].Name != "d2.test" || got[9].Name != "d11.test" || hdr.Get("X-Denials-Total") != "12" {
		t.Errorf("GET /denials = %d entries, first %q last %q, total %q; want the last 10, newest last, total 12",
			len(got), got[0].Name, got[len(got)-1].Name, hdr.Get("X-Denials-Total"))
	}
}

func TestDenialsRing(t *testing.T) {
	d := NewDenials(3)
	if got := d.List(); len(got) != 0 {
		t.Errorf("empty ring lists %v", got)
	}
	for i := range 7 {
		d.Add(Denial{Kind: "tcp", Port: uint16(i)})
		got := d.List()
		if want := min(i+1, 3); len(got) != want || got[len(got)-1].Port != uint16(i) || got[0].Port != uint16(i+1-want) {
			t.Fatalf("after %d adds: %+v", i+1, got)
		}
		if got[0].Time.IsZero() {
			t.Fatal("Add did not stamp the time")
		}
	}
	if d.Total() != 7 {
		t.Errorf("Total = %d, want 7", d.Total())
	}
	if NewDenials(0) == nil || cap(NewDenials(0).buf) != DefaultDenialsKept {
		t.Error("NewDenials(0) does not keep the default")
	}
}

func TestNewHandlerChecks(t *testing.T) {
	live := NewLive(mustMatcher(t, Overlay{}, DenyAll()))
	if _, err := NewHandler(HandlerConfig{EnforcementMode: "nft"}, live); err == nil {
		t.Error("NewHandler accepted an unknown enforcement mode")
	}
	if _, err := NewHandler(HandlerConfig{EnforcementMode: ModeDNS, MaxRules: -1}, live); err == nil {
		t.Error("NewHandler accepted a negative rule cap")
	}
	if _, err := NewHandler(DefaultHandlerConfig(), &Live{}); err == nil {
		t.Error("NewHandler accepted a Live with no matcher")
	}
	h, err := NewHandler(HandlerConfig{EnforcementMode: ModeDNSNft}, live)
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/policy", nil))
	if !strings.Contains(w.Body.String(), `"enforcementMode":"dns+nft"`) {
		t.Errorf("GET /policy = %s, want enforcementMode dns+nft", w.Body.String())
	}
}

// TestAPIConcurrent races PATCHes (each adding one rule) with GETs and
// matcher reads: every GET sees a whole policy, the rule count only
// grows, and at the end every patched rule is in force. Run with -race.
func TestAPIConcurrent(t *testing.T) {
	f := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) { c.Store = nil })
	const writers, perWriter = 4, 25
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 100)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				code, _, out := f.do(t, "PATCH", "/policy", fmt.Sprintf(`[{"action":"allow","target":"w%d-%d.test"}]`, w, i))
				if code != 200 {
					errs <- fmt.Errorf("PATCH: %d %s", code, out)
					return
				}
			}
		})
	}
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			last := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				r := httptest.NewRequest("GET", "/policy", nil)
				r.Header.Set(api.HeaderEgressAuth, testToken)
				w := httptest.NewRecorder()
				f.h.ServeHTTP(w, r)
				var st api.PolicyStatus
				if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Policy == nil {
					errs <- fmt.Errorf("GET: %v %q", err, w.Body.String())
					return
				}
				if n := len(st.Policy.Egress); n < last {
					errs <- fmt.Errorf("GET saw %d rules after %d", n, last)
					return
				} else {
					last = n
				}
				f.live.Name("w0-0.test")
			}
		})
	}
	wg.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	p := f.live.Load().Policy()
	if len(p.Egress) != writers*perWriter {
		t.Errorf("%d rules in force, want %d", len(p.Egress), writers*perWriter)
	}
	for w := range writers {
		for i := range perWriter {
			if name := fmt.Sprintf("w%d-%d.test", w, i); !f.live.Name(name) {
				t.Errorf("%s not allowed at the end", name)
			}
		}
	}
}

func TestAPIVaultRoutes(t *testing.T) {
	// Without a vault handler every vault route answers 412, after the
	// token check.
	f := newAPIFixture(t, DenyAll(), nil)
	for _, c := range []struct{ method, path string }{
		{"GET", "/credential-vault"}, {"POST", "/credential-vault"}, {"DELETE", ProxyPrefix + "/credential-vault"},
		{"GET", "/credential-vault/bindings/x"}, {"PATCH", ProxyPrefix + "/credential-vault"},
	} {
		f.wantError(t, c.method, c.path, "{}", http.StatusPreconditionFailed, "the credential proxy is not enabled for this sandbox")
		if code, _, _ := f.do(t, c.method, c.path, "", api.HeaderEgressAuth, "wrong"); code != http.StatusUnauthorized {
			t.Errorf("%s %s with a wrong token = %d, want 401", c.method, c.path, code)
		}
	}
	// With one, the vault routes (both prefixes) go to it, with their
	// path and method; the others stay.
	var seen []string
	vault := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.Path)
		w.WriteHeader(http.StatusTeapot)
	})
	g := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) { c.Vault = vault })
	for _, p := range []string{"/credential-vault", "/credential-vault/credentials/a", ProxyPrefix + "/credential-vault", ProxyPrefix + "/credential-vault/_active"} {
		if code, _, _ := g.do(t, "PATCH", p, ""); code != http.StatusTeapot {
			t.Errorf("PATCH %s = %d, want the vault handler's 418", p, code)
		}
	}
	if want := []string{"PATCH /credential-vault", "PATCH /credential-vault/credentials/a", "PATCH " + ProxyPrefix + "/credential-vault", "PATCH " + ProxyPrefix + "/credential-vault/_active"}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("vault handler saw %q, want %q", seen, want)
	}
	g.status(t, "GET", "/policy", "")
}

func TestAPICheckPolicy(t *testing.T) {
	var asked []Policy
	f := newAPIFixture(t, DenyAll(), func(c *HandlerConfig) {
		c.CheckPolicy = func(m *Matcher) error {
			asked = append(asked, m.Policy())
			return m.BindingHostAllowed("api.bound.test")
		}
	})
	f.status(t, "PATCH", "/policy", `[{"action":"allow","target":"api.bound.test"}]`)
	f.wantError(t, "DELETE", "/policy", `["api.bound.test"]`, http.StatusBadRequest,
		`credential vault policy validation: host "api.bound.test": the egress policy has no rules`)
	f.wantError(t, "PATCH", "/policy", `[{"action":"deny","target":"api.bound.test"}]`, http.StatusBadRequest, "not covered by an explicit allow rule")
	f.wantError(t, "PATCH", "/policy", `[{"action":"deny","target":"*.bound.test"}]`, http.StatusBadRequest, "the egress policy denies it")
	if !f.live.Name("api.bound.test") {
		t.Error("a refused change was put in force")
	}
	if p, ok, _ := f.store.Load(); !ok || len(p.Egress) != 1 || p.Egress[0].Action != ActionAllow {
		t.Errorf("a refused change was persisted: %+v", p)
	}
	if len(asked) != 4 {
		t.Errorf("CheckPolicy asked %d times, want 4", len(asked))
	}
}
