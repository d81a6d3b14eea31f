package vault

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

const handlerToken = "vault-token"

// failingStore fails its saves while fail is set.
type failingStore struct {
	mu    sync.Mutex
	fail  bool
	inner Store
}

func (s *failingStore) Save(v *Vault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("disk full")
	}
	return s.inner.Save(v)
}

type handlerFixture struct {
	h       *Handler
	live    *Live
	file    *FileStore
	store   *failingStore
	logs    *bytes.Buffer
	changes []*Vault
}

func newHandlerFixture(t *testing.T, tweak func(*HandlerConfig)) *handlerFixture {
	t.Helper()
	f := &handlerFixture{
		live: &Live{},
		file: &FileStore{Path: filepath.Join(t.TempDir(), "vault"), Key: testKey(5), AAD: "sb"},
		logs: &bytes.Buffer{},
	}
	f.store = &failingStore{inner: f.file}
	cfg := HandlerConfig{
		Token:       handlerToken,
		Enabled:     true,
		HostAllowed: testMatcher(t).BindingHostAllowed,
		Live:        f.live,
		Store:       f.store,
		OnChange:    func(v *Vault) { f.changes = append(f.changes, v) },
		Logger:      slog.New(slog.NewTextHandler(f.logs, nil)),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	h, err := NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	return f
}

// do sends a request from a loopback peer with the token; extra are
// header pairs, "RemoteAddr" setting the peer, "" values deleting.
func (f *handlerFixture) do(t *testing.T, method, path, body string, extra ...string) (int, http.Header, string) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = "127.0.0.1:40000"
	r.Header.Set(api.HeaderEgressAuth, handlerToken)
	for i := 0; i+1 < len(extra); i += 2 {
		switch {
		case extra[i] == "RemoteAddr":
			r.RemoteAddr = extra[i+1]
		case extra[i+1] == "":
			r.Header.Del(extra[i])
		default:
			r.Header.Set(extra[i], extra[i+1])
		}
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w.Code, w.Header(), w.Body.String()
}

func (f *handlerFixture) want(t *testing.T, method, path, body string, status int, text string, extra ...string) string {
	t.Helper()
	code, hdr, out := f.do(t, method, path, body, extra...)
	if code != status || !strings.Contains(out, text) {
		t.Errorf("%s %s %.80q = %d %q, want %d containing %q", method, path, body, code, out, status, text)
	}
	if code >= 400 && !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Errorf("%s %s: error Content-Type %q, want text/plain", method, path, hdr.Get("Content-Type"))
	}
	if strings.Contains(out, "SECRET") {
		t.Errorf("%s %s answered a value: %q", method, path, out)
	}
	return out
}

func TestHandlerLifecycle(t *testing.T) {
	for _, prefix := range []string{"", egress.ProxyPrefix} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			f := newHandlerFixture(t, nil)
			p := prefix + "/credential-vault"
			f.want(t, "GET", p, "", 404, "no credential vault")
			f.want(t, "GET", p+"/credentials", "", 404, "no credential vault")
			f.want(t, "GET", p+"/bindings/github", "", 404, "no credential vault")
			f.want(t, "PATCH", p, `{"credentials":{"delete":["x"]}}`, 404, "no credential vault")
			f.want(t, "DELETE", p, "", 404, "no credential vault")

			out := f.want(t, "POST", p, baseVault, 201, `"revision":1`)
			var st api.CredentialVaultState
			if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Credentials) != 2 || len(st.Bindings) != 2 {
				t.Fatalf("POST state = %s (%v)", out, err)
			}
			if v := f.live.Load(); v == nil || v.Revision() != 1 {
				t.Fatal("the vault is not in force after POST")
			}
			if v, ok, err := f.file.Load(); !ok || err != nil || v.Revision() != 1 {
				t.Fatalf("the vault was not persisted: %v %v", ok, err)
			}
			f.want(t, "POST", p, baseVault, 409, "already exists")
			f.want(t, "GET", p, "", 200, `"revision":1`)
			f.want(t, "GET", p+"/credentials", "", 200, `{"revision":1,"credentials":[{"name":"api-key","sourceType":"inline","revision":1},{"name":"gh-token","sourceType":"inline","revision":1}]}`)
			f.want(t, "GET", p+"/credentials/gh-token", "", 200, `{"name":"gh-token","sourceType":"inline","revision":1}`)
			f.want(t, "GET", p+"/credentials/nope", "", 404, `no credential "nope"`)
			f.want(t, "GET", p+"/bindings", "", 200, `"bindings":[{"name":"example"`)
			f.want(t, "GET", p+"/bindings/github", "", 200, `{"name":"github","revision":1,"match":{"hosts":["api.github.test"],"schemes":["https"],"ports":[443],"methods":["GET","POST","PUT","PATCH","DELETE"],"paths":["/*"]},"auth":{"type":"bearer"}}`)
			f.want(t, "GET", p+"/bindings/nope", "", 404, `no binding "nope"`)

			f.want(t, "PATCH", p, `{"expectedRevision":5,"credentials":{"delete":["api-key"]}}`, 409, "expectedRevision is 5")
			f.want(t, "PATCH", p, `{"credentials":{"delete":["gh-token"]}}`, 400, `no credential "gh-token"`)
			f.want(t, "PATCH", p, `{"credentials":{"nuke":true}}`, 400, "unknown field")
			f.want(t, "PATCH", p, ``, 400, "empty body")
			f.want(t, "PATCH", p, `{"expectedRevision":1,"credentials":{"replace":[{"name":"api-key","source":{"value":"key-SECRET3"}}]}}`, 200, `"revision":2`)
			f.want(t, "GET", p+"/bindings/github", "", 200, `"revision":2`)
			f.want(t, "GET", p+"/credentials/gh-token", "", 200, `"revision":1`)
			f.want(t, "GET", p+"/credentials/api-key", "", 200, `"revision":2`)

			f.want(t, "DELETE", p, "", 204, "")
			if f.live.Load() != nil {
				t.Error("the vault is still in force after DELETE")
			}
			if _, ok, _ := f.file.Load(); ok {
				t.Error("the vault file is still there after DELETE")
			}
			f.want(t, "DELETE", p, "", 404, "no credential vault")
			f.want(t, "GET", p, "", 404, "no credential vault")

			if len(f.changes) != 3 || f.changes[0].Revision() != 1 || f.changes[1].Revision() != 2 || f.changes[2] != nil {
				t.Errorf("OnChange calls = %v", f.changes)
			}
			logs := f.logs.String()
			if strings.Count(logs, "credential vault ") != 3 || !strings.Contains(logs, "revision=2") || strings.Contains(logs, "SECRET") {
				t.Errorf("logs:\n%s", logs)
			}
		})
	}
}

func TestHandlerActive(t *testing.T) {
	f := newHandlerFixture(t, nil)
	f.want(t, "POST", "/credential-vault", baseVault, 201, "")
	for _, method := range []string{"GET", "POST", "DELETE"} {
		for _, p := range []string{"/credential-vault/_active", egress.ProxyPrefix + "/credential-vault/_active"} {
			f.want(t, method, p, "", 403, "forbidden")
			f.want(t, method, p, "", 403, "forbidden", api.HeaderEgressAuth, "")
		}
	}
}

func TestHandlerAuth(t *testing.T) {
	f := newHandlerFixture(t, nil)
	for _, c := range []struct{ method, path string }{
		{"GET", "/credential-vault"}, {"POST", "/credential-vault"}, {"PATCH", "/credential-vault"},
		{"DELETE", "/credential-vault"}, {"GET", "/credential-vault/credentials"}, {"GET", "/credential-vault/credentials/x"},
		{"GET", "/credential-vault/bindings"}, {"GET", egress.ProxyPrefix + "/credential-vault/bindings/x"},
	} {
		for _, tok := range []string{"", "wrong", strings.ToUpper(handlerToken)} {
			// 401 comes first: before 412, 426 and the body.
			f.want(t, c.method, c.path, baseVault, 401, "unauthorized", api.HeaderEgressAuth, tok, "RemoteAddr", "192.0.2.1:1")
		}
	}
	if f.live.Load() != nil {
		t.Error("an unauthorized POST created a vault")
	}
}

func TestHandlerPreconditions(t *testing.T) {
	notReady := errors.New("mitm still starting")
	for _, c := range []struct {
		name  string
		tweak func(*HandlerConfig)
		want  string
	}{
		{"not enabled", func(c *HandlerConfig) { c.Enabled = false }, "the credential proxy is not enabled"},
		{"no token", func(c *HandlerConfig) { c.Token = "" }, "needs the egress API's auth token"},
		{"not ready", func(c *HandlerConfig) { c.Ready = func() error { return notReady } }, "not ready: mitm still starting"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newHandlerFixture(t, c.tweak)
			for _, method := range []string{"POST", "PATCH", "DELETE"} {
				// 412 before 426 and before the body is read.
				f.want(t, method, "/credential-vault", "{bad json", 412, c.want, "RemoteAddr", "192.0.2.1:1")
			}
			f.want(t, "GET", "/credential-vault", "", 404, "no credential vault")
		})
	}
}

func TestHandlerPlainHTTP(t *testing.T) {
	f := newHandlerFixture(t, func(c *HandlerConfig) {
		c.PlainPeers = []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16")}
	})
	for _, peer := range []string{"192.0.2.1:5555", "[2001:db8::1]:5555", "10.89.0.1:1", "garbage", ""} {
		_, hdr, _ := f.do(t, "POST", "/credential-vault", baseVault, "RemoteAddr", peer)
		f.want(t, "POST", "/credential-vault", baseVault, 426, "need TLS", "RemoteAddr", peer)
		f.want(t, "DELETE", "/credential-vault", "", 426, "need TLS", "RemoteAddr", peer)
		if hdr.Get("Upgrade") == "" {
			t.Errorf("426 without an Upgrade header")
		}
	}
	// Reads need no TLS.
	f.want(t, "GET", "/credential-vault", "", 404, "no credential vault", "RemoteAddr", "192.0.2.1:5555")
	// Loopback (v4, v6, mapped) and PlainPeers may write.
	f.want(t, "POST", "/credential-vault", baseVault, 201, "", "RemoteAddr", "[::1]:1")
	f.want(t, "PATCH", "/credential-vault", `{"credentials":{"delete":["api-key"]},"bindings":{"delete":["example"]}}`, 200, `"revision":2`, "RemoteAddr", "[::ffff:127.0.0.1]:1")
	f.want(t, "DELETE", "/credential-vault", "", 204, "", "RemoteAddr", "10.88.3.4:1")
}

func TestHandlerBody(t *testing.T) {
	f := newHandlerFixture(t, nil)
	big := `{"credentials":[{"name":"c","source":{"value":"` + strings.Repeat("x", egress.MaxBodyBytes) + `"}}],"bindings":[]}`
	f.want(t, "POST", "/credential-vault", big, 413, "larger than")
	f.want(t, "POST", "/credential-vault", ``, 400, "empty body")
	f.want(t, "POST", "/credential-vault", `{"credentials":[],"bindings":[]}{}`, 400, "data after the object")
	f.want(t, "POST", "/credential-vault", `{"credentials":[],"bindings":[],"x":1}`, 400, "unknown field")
	f.want(t, "POST", "/credential-vault", vaultJSON(`{"name":"c","source":{"value":"SECRET-in-a-bad-vault"}}`, bindJSON(`{"hosts":["10.0.0.1"]}`, bearer)), 400, `bindings[0].match.hosts[0]: "10.0.0.1" is an address, want a name`)
	f.want(t, "POST", "/credential-vault", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"schemes":["http"],"ports":[80]}`, bearer)), 400, "operator must allow")
	if f.live.Load() != nil {
		t.Fatal("an invalid POST created a vault")
	}
	// The handler's AllowHTTP reaches validation.
	g := newHandlerFixture(t, func(c *HandlerConfig) { c.AllowHTTP = true })
	g.want(t, "POST", "/credential-vault", vaultJSON(okCred, bindJSON(`{"hosts":["plain.test"],"schemes":["http"],"ports":[80]}`, bearer)), 201, "")
}

func TestHandlerStoreFailure(t *testing.T) {
	f := newHandlerFixture(t, nil)
	f.store.fail = true
	f.want(t, "POST", "/credential-vault", baseVault, 500, "internal error")
	if f.live.Load() != nil || len(f.changes) != 0 {
		t.Fatal("a failed save put a vault in force")
	}
	f.store.fail = false
	f.want(t, "POST", "/credential-vault", baseVault, 201, "")
	f.store.fail = true
	f.want(t, "PATCH", "/credential-vault", `{"credentials":{"delete":["api-key"]},"bindings":{"delete":["example"]}}`, 500, "internal error")
	f.want(t, "DELETE", "/credential-vault", "", 500, "internal error")
	if v := f.live.Load(); v == nil || v.Revision() != 1 || len(v.Credentials()) != 2 {
		t.Fatalf("a failed save changed the vault in force: %+v", v)
	}
	if !strings.Contains(f.logs.String(), "disk full") {
		t.Errorf("the 500 was not logged:\n%s", f.logs)
	}
}

func TestHandlerMethodNotAllowed(t *testing.T) {
	f := newHandlerFixture(t, nil)
	code, hdr, _ := f.do(t, "PUT", "/credential-vault", "")
	if code != 405 || !strings.Contains(hdr.Get("Allow"), "PATCH") {
		t.Errorf("PUT /credential-vault = %d Allow %q", code, hdr.Get("Allow"))
	}
	if code, _, _ := f.do(t, "POST", "/credential-vault/credentials", ""); code != 405 {
		t.Errorf("POST /credential-vault/credentials = %d, want 405", code)
	}
	if code, _, _ := f.do(t, "GET", "/credential-vault/nope", ""); code != 404 {
		t.Errorf("GET /credential-vault/nope = %d, want 404", code)
	}
}

func TestNewHandlerChecks(t *testing.T) {
	if _, err := NewHandler(HandlerConfig{HostAllowed: func(string) error { return nil }}); err == nil {
		t.Error("NewHandler without Live succeeded")
	}
	if _, err := NewHandler(HandlerConfig{Live: &Live{}}); err == nil {
		t.Error("NewHandler without HostAllowed succeeded")
	}
}

// remoteAs makes every request look as if it came from a non-loopback
// peer, so that only the transport decides.
func remoteAs(h http.Handler, peer string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = peer
		h.ServeHTTP(w, r)
	})
}

// TestHandlerOverTLS serves the handler on real listeners: a write from a
// non-loopback peer passes over TLS and gets 426 over plain HTTP.
func TestHandlerOverTLS(t *testing.T) {
	f := newHandlerFixture(t, nil)
	tlsSrv := httptest.NewTLSServer(remoteAs(f.h, "192.0.2.7:4444"))
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(remoteAs(f.h, "192.0.2.7:4444"))
	defer plainSrv.Close()

	send := func(c *http.Client, url, method, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, url+"/credential-vault", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(api.HeaderEgressAuth, handlerToken)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	if code, out := send(plainSrv.Client(), plainSrv.URL, "POST", baseVault); code != 426 {
		t.Errorf("POST over plain HTTP from a remote peer = %d %q, want 426", code, out)
	}
	if code, out := send(tlsSrv.Client(), tlsSrv.URL, "POST", baseVault); code != 201 {
		t.Errorf("POST over TLS from a remote peer = %d %q, want 201", code, out)
	}
	if code, _ := send(plainSrv.Client(), plainSrv.URL, "GET", ""); code != 200 {
		t.Errorf("GET over plain HTTP = %d, want 200", code)
	}
	if code, _ := send(tlsSrv.Client(), tlsSrv.URL, "DELETE", ""); code != 204 {
		t.Errorf("DELETE over TLS = %d, want 204", code)
	}
}

// TestHandlerConcurrentWrites: writes are serialized, so of many
// concurrent creates exactly one wins, and concurrent patches each get
// their own revision.
func TestHandlerConcurrentWrites(t *testing.T) {
	f := newHandlerFixture(t, func(c *HandlerConfig) { c.OnChange = nil })
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	post := func(method, body string) int {
		req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+"/credential-vault", strings.NewReader(body))
		req.Header.Set(api.HeaderEgressAuth, handlerToken)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Go(func() { codes[i] = post("POST", baseVault) })
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		if c == 201 {
			created++
		} else if c != 409 {
			t.Errorf("concurrent POST = %d", c)
		}
	}
	if created != 1 {
		t.Errorf("%d concurrent creates succeeded, want 1", created)
	}
	for i := range codes {
		name := string(rune('a' + i))
		wg.Go(func() {
			codes[i] = post("PATCH", `{"credentials":{"add":[{"name":"`+name+`","source":{"value":"v"}}]}}`)
		})
	}
	wg.Wait()
	for _, c := range codes {
		if c != 200 {
			t.Errorf("concurrent PATCH = %d", c)
		}
	}
	if v := f.live.Load(); v.Revision() != int64(1+len(codes)) || len(v.Credentials()) != 2+len(codes) {
		t.Errorf("after concurrent patches: revision %d, %d credentials", v.Revision(), len(v.Credentials()))
	}
}
