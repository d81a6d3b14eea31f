package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

const testKey = "test-api-key"

// testEnv is a lifecycle server on loopback in front of a runtime.
type testEnv struct {
	t   *testing.T
	rt  sandbox.Runtime
	m   *Manager
	srv *Server
	url string
}

// newEnv serves the API over fake.New() with the API key testKey; opts
// adjust the config.
func newEnv(t *testing.T, opts ...func(*Config)) (*testEnv, *fake.Runtime) {
	rt := fake.New()
	rt.StartDelay = 5 * time.Millisecond
	return newEnvWith(t, rt, opts...), rt
}

// newEnvWith serves the API over rt.
func newEnvWith(t *testing.T, rt sandbox.Runtime, opts ...func(*Config)) *testEnv {
	t.Helper()
	cfg := Config{APIKey: testKey, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, o := range opts {
		o(&cfg)
	}
	m := NewManager(rt, ManagerConfig{MaxTimeout: cfg.MaxTimeout})
	srv, err := New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &testEnv{t: t, rt: rt, m: m, srv: srv, url: ts.URL}
}

// result is an answer, read whole.
type result struct {
	status int
	header http.Header
	body   []byte
}

// call sends a request with the API key (unless headers set
// OPEN-SANDBOX-API-KEY, "" meaning none) and reads the answer.
func (e *testEnv) call(method, path, body string, headers ...string) result {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set(api.HeaderAPIKey, testKey)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return result{resp.StatusCode, resp.Header, b}
}

// decode decodes the body into v.
func (r result) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// wantStatus fails unless the answer has status.
func (r result) wantStatus(t *testing.T, status int) result {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	return r
}

var requestIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// wantError fails unless the answer is the envelope with status and code,
// and carries a request id.
func (r result) wantError(t *testing.T, status int, code string) api.ErrorResponse {
	t.Helper()
	var e struct {
		Code    *string `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Code == nil || e.Message == nil || *e.Message == "" {
		t.Fatalf("body %q (status %d) is not the error envelope", r.body, r.status)
	}
	if r.status != status || *e.Code != code {
		t.Fatalf("answer %d %s (%s), want %d %s", r.status, *e.Code, *e.Message, status, code)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if r.header.Get(api.HeaderRequestID) == "" {
		t.Errorf("no %s on a %d", api.HeaderRequestID, r.status)
	}
	return api.ErrorResponse{Code: *e.Code, Message: *e.Message}
}

const validCreate = `{"image":{"uri":"python:3.11"},"entrypoint":["python","-m","http.server"],"timeout":600,"resourceLimits":{"cpu":"1","memory":"1Gi"}}`

// create makes a sandbox through the API and returns its id.
func (e *testEnv) create(body string) string {
	e.t.Helper()
	if body == "" {
		body = validCreate
	}
	var out api.CreateSandboxResponse
	e.call("POST", "/v1/sandboxes", body).wantStatus(e.t, http.StatusAccepted).decode(e.t, &out)
	return out.ID
}

// waitState polls until the sandbox is in state.
func (e *testEnv) waitState(id string, state sandbox.State) {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sb, err := e.rt.Get(context.Background(), sandbox.ID(id))
		if err == nil && sb.Status.State == state {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s never became %s (last: %+v, %v)", id, state, sb, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// bareRuntime has only the methods every runtime has: no pause,
// snapshots or diagnostics.
type bareRuntime struct{ sandbox.Runtime }

func TestNewChecksConfig(t *testing.T) {
	m := NewManager(fake.New(), ManagerConfig{})
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"key", Config{APIKey: "k"}, true},
		{"insecure without key", Config{Insecure: true}, true},
		{"no key", Config{}, false},
		{"runtime name", Config{APIKey: "k", RuntimeName: "KUBERNETES"}, true},
		{"lower-case runtime name", Config{APIKey: "k", RuntimeName: "docker"}, false},
		{"unknown runtime name", Config{APIKey: "k", RuntimeName: "PODMAN"}, false},
		{"public address with scheme", Config{APIKey: "k", PublicAddress: "http://h:8080"}, false},
		{"public address with path", Config{APIKey: "k", PublicAddress: "h:8080/v1"}, false},
		{"relative allowlist entry", Config{APIKey: "k", HostPathAllowlist: []string{"data"}}, false},
		{"max below min", Config{APIKey: "k", MaxTimeout: time.Second}, false},
		{"negative body limit", Config{APIKey: "k", MaxBodyBytes: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(m, tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("New(%+v) = %v, want ok=%v", tt.cfg, err, tt.ok)
			}
		})
	}
	if _, err := New(m, Config{}); !errors.Is(err, ErrNoAPIKey) {
		t.Fatalf("New without key: %v, want ErrNoAPIKey", err)
	}
	if _, err := New(NewManager(fake.New(), ManagerConfig{RuntimeName: "PODMAN"}), Config{APIKey: "k"}); err == nil {
		t.Fatal("New accepted a manager whose RuntimeName has no codes")
	}
}

func TestRequestID(t *testing.T) {
	e, _ := newEnv(t)
	e.srv.mux.HandleFunc("GET /test-panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	long := strings.Repeat("a", 128)
	tests := []struct {
		name, sent string
		echoed     bool
	}{
		{"echoed", "abc-123", true},
		{"uuid", "3f0c2a4e-8d6b-4a53-9f0e-6f2f3c1d2b11", true},
		{"128 characters", long, true},
		{"absent", "", false},
		{"129 characters", long + "a", false},
		{"non-ASCII", "caf\u00e9", false},
		{"tab", "a\tb", false},
	}
	paths := []struct {
		method, path string
		headers      []string
		status       int
	}{
		{"GET", "/health", nil, 200},
		{"GET", "/v1/sandboxes", nil, 200},
		{"GET", "/v1/sandboxes", []string{api.HeaderAPIKey, ""}, 401},
		{"GET", "/v1/sandboxes/nope", nil, 404},
		{"GET", "/v1/nothing-here", nil, 404},
		{"PUT", "/v1/sandboxes", nil, 405},
		{"GET", "/test-panic", nil, 500},
		{"GET", "/v1/sandboxes/nope/proxy/8080/x", []string{api.HeaderAPIKey, ""}, 401},
	}
	for _, tt := range tests {
		for _, p := range paths {
			t.Run(tt.name+" "+p.method+" "+p.path, func(t *testing.T) {
				req, _ := http.NewRequest(p.method, e.url+p.path, nil)
				req.Header.Set(api.HeaderAPIKey, testKey)
				for i := 0; i+1 < len(p.headers); i += 2 {
					req.Header.Del(p.headers[i])
				}
				if tt.sent != "" {
					req.Header[api.HeaderRequestID] = []string{tt.sent}
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != p.status {
					t.Fatalf("status %d, want %d", resp.StatusCode, p.status)
				}
				got := resp.Header.Values(api.HeaderRequestID)
				if len(got) != 1 {
					t.Fatalf("X-Request-ID %q, want exactly one", got)
				}
				if tt.echoed && got[0] != tt.sent {
					t.Fatalf("X-Request-ID %q, want %q echoed", got[0], tt.sent)
				}
				if !tt.echoed && !requestIDRE.MatchString(got[0]) {
					t.Fatalf("X-Request-ID %q, want 32 lower-case hex digits", got[0])
				}
			})
		}
	}
}

// TestHealthVersion: /health reports Config.Version, and leaves the
// field out when there is none.
func TestHealthVersion(t *testing.T) {
	e, _ := newEnv(t, func(c *Config) { c.Version = "v1.2.3" })
	var h api.Health
	e.call("GET", "/health", "", api.HeaderAPIKey, "").wantStatus(t, 200).decode(t, &h)
	if h.Status != "healthy" || h.Version != "v1.2.3" {
		t.Fatalf("health %+v", h)
	}
	plain, _ := newEnv(t)
	if r := plain.call("GET", "/v1/health", "").wantStatus(t, 200); strings.TrimSpace(string(r.body)) != `{"status":"healthy"}` {
		t.Fatalf("health without a version: %s", r.body)
	}
}

// TestLimits: GET /limits answers the timeout bounds the server enforces,
// and leaves the maximum out when there is none.
func TestLimits(t *testing.T) {
	e, _ := newEnv(t, func(c *Config) { c.MinTimeout, c.MaxTimeout = 30*time.Second, 2*time.Hour })
	var l api.Limits
	e.call("GET", "/v1/limits", "").wantStatus(t, 200).decode(t, &l)
	if l.MinTimeoutSeconds != 30 || l.MaxTimeoutSeconds == nil || *l.MaxTimeoutSeconds != 7200 || !l.NoExpiryAllowed {
		t.Fatalf("limits %+v", l)
	}
	e.call("POST", "/v1/sandboxes", strings.Replace(validCreate, `"timeout":600`, `"timeout":7201`, 1)).wantError(t, 400, api.CodeSandboxInvalidParameter)
	unbounded, _ := newEnv(t)
	if r := unbounded.call("GET", "/limits", "").wantStatus(t, 200); strings.TrimSpace(string(r.body)) != `{"minTimeoutSeconds":60,"noExpiryAllowed":true}` {
		t.Fatalf("limits without a maximum: %s", r.body)
	}
	e.call("GET", "/limits", "", api.HeaderAPIKey, "").wantError(t, 401, "MISSING_API_KEY")
}

func TestAuth(t *testing.T) {
	e, _ := newEnv(t)
	for _, prefix := range []string{"", "/v1"} {
		e.call("GET", prefix+"/sandboxes", "", api.HeaderAPIKey, "").wantError(t, 401, "MISSING_API_KEY")
		e.call("GET", prefix+"/sandboxes", "", api.HeaderAPIKey, "wrong").wantError(t, 401, "INVALID_API_KEY")
		e.call("GET", prefix+"/sandboxes", "", api.HeaderAPIKey, testKey+"x").wantError(t, 401, "INVALID_API_KEY")
		e.call("POST", prefix+"/sandboxes", validCreate, api.HeaderAPIKey, "").wantError(t, 401, "MISSING_API_KEY")
		e.call("GET", prefix+"/nothing", "", api.HeaderAPIKey, "").wantError(t, 401, "MISSING_API_KEY")
		e.call("GET", prefix+"/sandboxes", "").wantStatus(t, 200)
		var h api.Health
		e.call("GET", prefix+"/health", "", api.HeaderAPIKey, "").wantStatus(t, 200).decode(t, &h)
		if h.Status != "healthy" {
			t.Fatalf("health %+v", h)
		}
	}
	// Only the exact health path is exempt.
	e.call("GET", "/healthz", "", api.HeaderAPIKey, "").wantError(t, 401, "MISSING_API_KEY")

	insecure, _ := newEnv(t, func(c *Config) { c.APIKey, c.Insecure = "", true })
	insecure.call("GET", "/v1/sandboxes", "", api.HeaderAPIKey, "").wantStatus(t, 200)
	insecure.call("GET", "/v1/sandboxes", "", api.HeaderAPIKey, "anything").wantStatus(t, 200)
}

// TestBothMounts asks every route at the root and under /v1.
func TestBothMounts(t *testing.T) {
	e, _ := newEnv(t)
	for _, prefix := range []string{"", "/v1"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			var created api.CreateSandboxResponse
			e.call("POST", prefix+"/sandboxes", validCreate).wantStatus(t, 202).decode(t, &created)
			id := created.ID
			e.waitState(id, sandbox.StateRunning)
			sb := "/sandboxes/" + id
			e.call("GET", prefix+"/sandboxes", "").wantStatus(t, 200)
			e.call("GET", prefix+sb, "").wantStatus(t, 200)
			e.call("PATCH", prefix+sb+"/metadata", `{"a":"b"}`).wantStatus(t, 200)
			e.call("GET", prefix+sb+"/endpoints/8080", "").wantStatus(t, 200)
			e.call("POST", prefix+sb+"/renew-expiration", `{"expiresAt":"`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`).wantStatus(t, 200)
			e.call("GET", prefix+sb+"/diagnostics/logs?scope=container", "").wantStatus(t, 200)
			e.call("GET", prefix+sb+"/diagnostics/events?scope=all", "").wantStatus(t, 200)
			e.call("GET", prefix+sb+"/diagnostics/logs", "").wantStatus(t, 200)
			e.call("GET", prefix+sb+"/diagnostics/events", "").wantStatus(t, 200)
			e.call("GET", prefix+sb+"/diagnostics/inspect", "").wantStatus(t, 200)
			e.call("GET", prefix+sb+"/diagnostics/summary", "").wantStatus(t, 200)
			var snap api.Snapshot
			e.call("POST", prefix+sb+"/snapshots", "").wantStatus(t, 202).decode(t, &snap)
			e.call("GET", prefix+"/snapshots", "").wantStatus(t, 200)
			e.call("GET", prefix+"/snapshots/"+snap.ID, "").wantStatus(t, 200)
			e.call("POST", prefix+sb+"/pause", "").wantStatus(t, 202)
			e.call("POST", prefix+sb+"/resume", "").wantStatus(t, 202)
			e.call("GET", prefix+"/pools", "").wantError(t, 501, api.CodePoolNotImplemented)
			e.call("DELETE", prefix+sb, "").wantStatus(t, 204)
			e.call("GET", prefix+"/health", "").wantStatus(t, 200)
		})
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	e, _ := newEnv(t)
	for _, p := range []string{"/nothing", "/v1/nothing", "/v1/sandboxes/x/unknown", "/v2/sandboxes", "/v1/sandboxes/x/proxy"} {
		e.call("GET", p, "").wantError(t, 404, api.CodeSandboxRouteNotFound)
	}
	r := e.call("PUT", "/v1/sandboxes", "")
	r.wantError(t, 405, api.CodeSandboxMethodNotAllowed)
	if allow := r.header.Get("Allow"); allow != "POST, GET, HEAD" {
		t.Fatalf("Allow %q", allow)
	}
	e.call("POST", "/v1/sandboxes/x/metadata", "{}").wantError(t, 405, api.CodeSandboxMethodNotAllowed)
	e.call("DELETE", "/v1/pools", "").wantError(t, 405, api.CodeSandboxMethodNotAllowed)
}

func TestPools(t *testing.T) {
	e, _ := newEnv(t)
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/pools"}, {"POST", "/v1/pools"}, {"GET", "/v1/pools/p"}, {"PUT", "/v1/pools/p"}, {"DELETE", "/pools/p"},
	} {
		e.call(c.method, c.path, `{}`).wantError(t, 501, api.CodePoolNotImplemented)
	}
}

func TestBodyLimit(t *testing.T) {
	e, _ := newEnv(t, func(c *Config) { c.MaxBodyBytes = 100 })
	big := `{"image":{"uri":"python:3.11"},"entrypoint":["x"],"resourceLimits":{},"env":{"A":"` + strings.Repeat("x", 200) + `"}}`
	e.call("POST", "/v1/sandboxes", big).wantError(t, 413, api.CodeSandboxRequestTooLarge)
	e.call("POST", "/v1/sandboxes", `{"image":{"uri":"python:3.11"},"entrypoint":["x"],"resourceLimits":{}}`).wantStatus(t, 202)
}

func TestMalformedBodies(t *testing.T) {
	e, _ := newEnv(t)
	for _, body := range []string{"", "   ", "{", "[]", `{"timeout":"60"}`, `{"image":1}`, `{} {}`, `{"timeout":1e18}`, `{"timeout":60.5}`} {
		e.call("POST", "/v1/sandboxes", body).wantError(t, 400, api.CodeSandboxInvalidParameter)
	}
}

// TestErrorMapping checks the one place where errors become answers.
func TestErrorMapping(t *testing.T) {
	m := NewManager(fake.New(), ManagerConfig{})
	srv, err := New(m, Config{APIKey: "k", RuntimeName: "KUBERNETES"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{sandbox.Coded(sandbox.ErrConflict, api.CodeDockerSandboxNotRunning, "not running"), 409, api.CodeDockerSandboxNotRunning},
		{fmt.Errorf("wrapped: %w", sandbox.Coded(sandbox.ErrNotImplemented, api.CodeSnapshotNotImplemented, "no")), 501, api.CodeSnapshotNotImplemented},
		{sandbox.Coded(sandbox.ErrUnavailable, api.CodeKubernetesQuotaExceeded, "down"), 503, api.CodeKubernetesQuotaExceeded},
		{sandbox.Coded(errors.New("odd"), api.CodeVolumePVCNotFound, "odd"), 500, api.CodeVolumePVCNotFound},
		{fmt.Errorf("sandbox x: %w", sandbox.ErrNotFound), 404, api.CodeKubernetesSandboxNotFound},
		{fmt.Errorf("bad: %w", sandbox.ErrInvalid), 400, api.CodeSandboxInvalidParameter},
		{fmt.Errorf("busy: %w", sandbox.ErrConflict), 409, api.CodeSandboxConflict},
		{fmt.Errorf("no: %w", sandbox.ErrNotImplemented), 501, api.CodeSandboxNotImplemented},
		{fmt.Errorf("engine: %w", sandbox.ErrUnavailable), 503, api.CodeSandboxUnavailable},
		{errors.New("something broke"), 500, api.CodeSandboxUnknownError},
		{&http.MaxBytesError{Limit: 10}, 413, api.CodeSandboxRequestTooLarge},
		{invalid(api.CodeVolumeInvalidName, "x %d", 1), 400, api.CodeVolumeInvalidName},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, "rid"))
		a := srv.classify(r, tt.err)
		if a.status != tt.status || a.code != tt.code || a.message == "" {
			t.Errorf("classify(%v) = %+v, want %d %s", tt.err, a, tt.status, tt.code)
		}
		if a.status == 500 && (strings.Contains(a.message, "broke") || !strings.Contains(a.message, "rid")) {
			t.Errorf("500 message %q: want the request id and no internal detail", a.message)
		}
	}
}

// TestErrorLogLevels checks that server failures are logged at error
// level with the request id, and client errors at debug.
func TestErrorLogLevels(t *testing.T) {
	var buf lockedBuffer
	rt := fake.New()
	e := newEnvWith(t, rt, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	rt.FailNext("Create", errors.New("disk on fire"))
	e.call("POST", "/v1/sandboxes", validCreate, api.HeaderRequestID, "req-500").wantError(t, 500, api.CodeSandboxUnknownError)
	e.call("GET", "/v1/sandboxes/nope", "", api.HeaderRequestID, "req-404").wantError(t, 404, api.CodeDockerSandboxNotFound)
	var sawError, sawDebug bool
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		switch rec[logRequestID] {
		case "req-500":
			sawError = rec["level"] == "ERROR" && strings.Contains(fmt.Sprint(rec[logErr]), "disk on fire")
		case "req-404":
			sawDebug = rec["level"] == "DEBUG"
		}
	}
	if !sawError || !sawDebug {
		t.Fatalf("log (error logged: %v, 404 at debug: %v):\n%s", sawError, sawDebug, buf.String())
	}
}

// lockedBuffer is a bytes.Buffer that server goroutines may write while
// the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
