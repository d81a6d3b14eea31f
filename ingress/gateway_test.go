package ingress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/opensandbox/opensandbox/api"
)

// mapResolver answers from a map the test controls, and counts calls.
type mapResolver struct {
	mu      sync.Mutex
	targets map[string]api.IngressTarget // by "id/port" or "id" (any port)
	err     error
	calls   atomic.Int64
	delay   time.Duration
}

func (m *mapResolver) Target(ctx context.Context, id string, port int) (api.IngressTarget, error) {
	m.calls.Add(1)
	if m.delay > 0 {
		time.Sleep(m.delay)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return api.IngressTarget{}, m.err
	}
	t, ok := m.targets[id+"/"+strconv.Itoa(port)]
	if !ok {
		if t, ok = m.targets[id]; !ok {
			return api.IngressTarget{}, ErrNotFound
		}
	}
	t.SandboxID, t.Port = id, port
	return t, nil
}

func (m *mapResolver) set(key string, t api.IngressTarget) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.targets[key] = t
}

// renewRecorder records Renew calls.
type renewRecorder struct {
	mu    sync.Mutex
	calls []string
}

func (r *renewRecorder) Renew(ctx context.Context, id string, port int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, id+"/"+strconv.Itoa(port))
	return nil
}

func (r *renewRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// echo is what the test backend answers on /echo and any unknown path.
type echo struct {
	Method  string      `json:"method"`
	Path    string      `json:"path"`
	RawPath string      `json:"rawPath"`
	Query   string      `json:"query"`
	Host    string      `json:"host"`
	Proto   string      `json:"proto"`
	Header  http.Header `json:"header"`
	Body    string      `json:"body"`
}

var echoHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set(api.HeaderRequestID, "backend-id")
	json.NewEncoder(w).Encode(echo{Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery,
		Host: r.Host, Proto: r.Proto, Header: r.Header, Body: string(body)})
})

// newBackend starts the sandbox's app: a real HTTP server on loopback.
func newBackend(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 3 {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			if err := rc.Flush(); err != nil {
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		buf := bytes.Repeat([]byte("0123456789abcdef"), 64<<10/16*4) // 256 KiB
		for n > 0 {
			k := min(n, int64(len(buf)))
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo: "), msg...)); err != nil {
				return
			}
		}
	})
	mux.Handle("/", echoHandler)
	// Dispatch without the mux's path cleaning: paths reach the app as
	// the gateway sent them.
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(&http.Request{Method: r.Method, URL: &url.URL{Path: path.Clean(r.URL.Path)}, Host: r.Host})
		if pattern == "" {
			h = echoHandler
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// fixture is a gateway on loopback in front of a backend.
type fixture struct {
	t        *testing.T
	keys     atomic.Pointer[Keys]
	res      *mapResolver
	renewer  *renewRecorder
	gw       *Gateway
	srv      *httptest.Server
	backend  *httptest.Server
	reg      *prometheus.Registry
	logs     *syncBuffer
	endpoint string // the backend's host:port
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

const (
	sbRunning  = "0b9f6a1e-3c1d-4a53-9d0e-6f2b8c7a9e10"
	sbOther    = "7d3c2b1a-0f9e-4d8c-8b7a-6e5f4d3c2b1a"
	sbPublic   = "public-demo"
	sbPaused   = "paused-one"
	sbDeadPort = "dead-port"
	sbRenew    = "renews-on-access"
	domain     = "sb.example.test"
)

func newFixture(t *testing.T, adjust func(*Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, renewer: &renewRecorder{}, reg: prometheus.NewRegistry(), logs: &syncBuffer{}}
	f.keys.Store(testKeys(t, 'a'))
	f.backend = newBackend(t)
	f.endpoint = strings.TrimPrefix(f.backend.URL, "http://")
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	f.res = &mapResolver{targets: map[string]api.IngressTarget{
		sbRunning:  {State: "Running", Endpoint: f.endpoint, Headers: map[string]string{"X-Execd-Access-Token": "execd-secret"}},
		sbOther:    {State: "Running", Endpoint: f.endpoint},
		sbPublic:   {State: "Running", Endpoint: f.endpoint + "/prefix", Public: true},
		sbPaused:   {State: "Paused", Reason: "paused by the user"},
		sbDeadPort: {State: "Running", Endpoint: deadAddr},
		sbRenew:    {State: "Running", Endpoint: f.endpoint, RenewExtendSeconds: 600},
	}}
	cfg := Config{
		Keys:     f.keys.Load,
		Resolver: f.res,
		Renewer:  f.renewer,
		Domain:   domain,
		Logger:   slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:  f.reg,
	}
	if adjust != nil {
		adjust(&cfg)
	}
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.gw = gw
	f.srv = httptest.NewUnstartedServer(gw)
	f.srv.Config.ConnState = gw.ConnState
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) token(id string) string {
	tok, err := f.keys.Load().AccessToken(id)
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

func (f *fixture) signed(id string, port int, exp time.Time, labelMax int) string {
	s, err := f.keys.Load().SignedRoute(id, port, exp, labelMax)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// do sends a request to the gateway: host ("" = the gateway's address),
// path (escaped, with query), headers as name, value pairs.
func (f *fixture) do(method, host, path string, body io.Reader, headers ...string) *http.Response {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readEcho(t *testing.T, resp *http.Response) echo {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var e echo
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not an echo: %s", b)
	}
	return e
}

// wantError checks a gateway error answer.
func wantError(t *testing.T, resp *http.Response, status int, code string) api.ErrorResponse {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var e api.ErrorResponse
	if resp.StatusCode != status || json.Unmarshal(b, &e) != nil || e.Code != code || e.Message == "" {
		t.Fatalf("got %d %s, want %d %s", resp.StatusCode, b, status, code)
	}
	if resp.Header.Get(api.HeaderRequestID) == "" {
		t.Fatal("error answer without X-Request-ID")
	}
	return e
}

func TestGatewayRouteForms(t *testing.T) {
	f := newFixture(t, nil)
	exp := time.Now().Add(time.Hour)
	tok := f.token(sbRunning)
	signedHdr := f.signed(sbRunning, 8080, exp, 0)
	signedSub := f.signed(sbRunning, 8080, exp, DNSLabelMax)
	parts := strings.Split(signedHdr, "-")
	expB36, sig := parts[len(parts)-2], parts[len(parts)-1]

	for _, c := range []struct {
		name    string
		host    string
		path    string
		headers []string
		want    string // path at the backend
	}{
		{"header", "", "/api/v1?x=1&y=2", []string{api.HeaderIngressTo, sbRunning + "-8080", api.HeaderSecureAccess, tok}, "/api/v1"},
		{"legacy header", "", "/legacy", []string{api.HeaderIngressLegacy, sbRunning + "-8080", api.HeaderSecureAccess, tok}, "/legacy"},
		{"header signed", "", "/s?x=1&y=2", []string{api.HeaderIngressTo, signedHdr}, "/s"},
		{"subdomain", sbRunning + "-8080." + domain, "/sub?x=1&y=2", []string{api.HeaderSecureAccess, tok}, "/sub"},
		{"subdomain signed", signedSub + "." + domain, "/sub?x=1&y=2", nil, "/sub"},
		{"path", "", "/" + sbRunning + "/8080/p/q?x=1&y=2", []string{api.HeaderSecureAccess, tok}, "/p/q"},
		{"path signed", "", "/" + sbRunning + "/8080/" + expB36 + "/" + sig + "/p?x=1&y=2", nil, "/p"},
		{"path signed slash", "", "/" + sbRunning + "/8080/" + expB36 + "/" + sig + "/?x=1&y=2", nil, "/"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := f.do(http.MethodPost, c.host, c.path, strings.NewReader("body"), c.headers...)
			e := readEcho(t, resp)
			if e.Path != c.want || e.Method != http.MethodPost || e.Body != "body" {
				t.Fatalf("backend saw %s %s body %q, want POST %s body \"body\"", e.Method, e.Path, e.Body, c.want)
			}
			if strings.Contains(c.path, "?") && e.Query != "x=1&y=2" {
				t.Fatalf("query %q, want x=1&y=2", e.Query)
			}
			if e.Host != f.endpoint {
				t.Fatalf("Host %q, want the sandbox's %q", e.Host, f.endpoint)
			}
			for _, h := range []string{api.HeaderIngressTo, api.HeaderIngressLegacy, api.HeaderSecureAccess} {
				if v := e.Header.Get(h); v != "" {
					t.Fatalf("backend got %s: %q", h, v)
				}
			}
			if e.Header.Get("X-Execd-Access-Token") != "execd-secret" {
				t.Fatalf("the target's headers were not added: %v", e.Header)
			}
		})
	}

	t.Run("bare path route redirects to its slash", func(t *testing.T) {
		noFollow := *f.srv.Client()
		noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		for _, p := range []string{"/" + sbRunning + "/8080", "/" + sbRunning + "/8080/" + expB36 + "/" + sig} {
			resp, err := noFollow.Get(f.srv.URL + p + "?x=1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != p+"/?x=1" {
				t.Fatalf("%s: %d Location %q", p, resp.StatusCode, resp.Header.Get("Location"))
			}
		}
		// A client that follows it reaches the app's root.
		e := readEcho(t, f.do(http.MethodGet, "", "/"+sbRunning+"/8080/"+expB36+"/"+sig, nil))
		if e.Path != "/" {
			t.Fatalf("after the redirect: %q", e.Path)
		}
		// Other methods are forwarded to the root at once.
		e = readEcho(t, f.do(http.MethodPost, "", "/"+sbRunning+"/8080", strings.NewReader("b"), api.HeaderSecureAccess, tok))
		if e.Path != "/" || e.Body != "b" {
			t.Fatalf("POST to the bare route reached %q with %q", e.Path, e.Body)
		}
	})
	t.Run("escaped path passes as sent", func(t *testing.T) {
		e := readEcho(t, f.do(http.MethodGet, "", "/"+sbRunning+"/8080/a%2Fb//c", nil, api.HeaderSecureAccess, tok))
		if e.Path != "/a/b//c" || e.RawPath != "/a%2Fb//c" {
			t.Fatalf("backend path %q raw %q", e.Path, e.RawPath)
		}
	})
	t.Run("domain with a port and a wildcard", func(t *testing.T) {
		f := newFixture(t, func(c *Config) { c.Domain = "*." + domain + ":8443" })
		e := readEcho(t, f.do(http.MethodGet, sbPublic+"-3000."+domain+":8443", "/y", nil))
		if e.Path != "/prefix/y" {
			t.Fatalf("backend path %q", e.Path)
		}
	})
	t.Run("public sandbox needs nothing, prefix kept", func(t *testing.T) {
		e := readEcho(t, f.do(http.MethodGet, sbPublic+"-3000."+domain, "/x", nil))
		if e.Path != "/prefix/x" {
			t.Fatalf("backend path %q, want /prefix/x", e.Path)
		}
	})
}

func TestGatewayForwardedHeaders(t *testing.T) {
	f := newFixture(t, nil)
	tok := f.token(sbRunning)
	resp := f.do(http.MethodGet, sbRunning+"-8080."+domain, "/h", nil,
		api.HeaderSecureAccess, tok,
		"X-Forwarded-For", "6.6.6.6",
		"X-Forwarded-Host", "evil.test",
		"X-Forwarded-Proto", "https",
		"Forwarded", "for=6.6.6.6",
		api.HeaderAPIKey, "server-key",
		"Cookie", "app=1",
		api.HeaderRequestID, "client-req-1")
	e := readEcho(t, resp)
	if got := e.Header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Fatalf("X-Forwarded-For %q, want only the client's address", got)
	}
	if got := e.Header.Get("X-Forwarded-Host"); got != sbRunning+"-8080."+domain {
		t.Fatalf("X-Forwarded-Host %q", got)
	}
	if got := e.Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Fatalf("X-Forwarded-Proto %q", got)
	}
	if e.Header.Get("Forwarded") != "" || e.Header.Get(api.HeaderAPIKey) != "" {
		t.Fatalf("client headers passed: %v", e.Header)
	}
	if e.Header.Get("Cookie") != "app=1" {
		t.Fatal("the app's cookie was dropped")
	}
	if e.Header.Get(api.HeaderRequestID) != "client-req-1" || resp.Header.Values(api.HeaderRequestID)[0] != "client-req-1" ||
		len(resp.Header.Values(api.HeaderRequestID)) != 1 {
		t.Fatalf("request id: backend %q, answer %q", e.Header.Get(api.HeaderRequestID), resp.Header.Values(api.HeaderRequestID))
	}
	// Without one, the gateway makes one and gives it both ways.
	resp = f.do(http.MethodGet, "", "/h", nil, api.HeaderIngressTo, sbRunning+"-8080", api.HeaderSecureAccess, tok)
	e = readEcho(t, resp)
	id := resp.Header.Get(api.HeaderRequestID)
	if len(id) != 32 || e.Header.Get(api.HeaderRequestID) != id {
		t.Fatalf("made request id %q, backend saw %q", id, e.Header.Get(api.HeaderRequestID))
	}
}

func TestGatewayAuth(t *testing.T) {
	f := newFixture(t, nil)
	now := time.Now()
	tok := f.token(sbRunning)
	good := f.signed(sbRunning, 8080, now.Add(time.Hour), 0)
	expired := f.signed(sbRunning, 8080, now.Add(-time.Second), 0)
	tampered := good[:len(good)-3] + flipChar(good[len(good)-3]) + good[len(good)-2:]
	otherPort := f.signed(sbRunning, 9090, now.Add(time.Hour), 0)
	unknownSigned := f.signed("no-such-sandbox", 8080, now.Add(time.Hour), 0)
	to := func(route string) []string { return []string{api.HeaderIngressTo, route} }

	for _, c := range []struct {
		name    string
		headers []string
		status  int
		code    string
	}{
		{"no auth", to(sbRunning + "-8080"), 401, api.CodeIngressUnauthorized},
		{"no auth unknown sandbox", to("no-such-sandbox-8080"), 401, api.CodeIngressUnauthorized},
		{"no auth paused sandbox", to(sbPaused + "-8080"), 401, api.CodeIngressUnauthorized},
		{"wrong token", append(to(sbRunning+"-8080"), api.HeaderSecureAccess, tok[:len(tok)-2]+"xa"), 401, api.CodeIngressUnauthorized},
		{"another sandbox's token", append(to(sbRunning+"-8080"), api.HeaderSecureAccess, f.token(sbOther)), 401, api.CodeIngressUnauthorized},
		{"expired", to(expired), 401, api.CodeIngressUnauthorized},
		{"tampered", to(tampered), 401, api.CodeIngressUnauthorized},
		{"signed for another port", to(strings.Replace(otherPort, "-9090-", "-8080-", 1)), 401, api.CodeIngressUnauthorized},
		{"signed for another sandbox", to(strings.Replace(good, sbRunning, sbOther, 1)), 401, api.CodeIngressUnauthorized},
		{"token of unknown sandbox", append(to("no-such-sandbox-8080"), api.HeaderSecureAccess, f.token("no-such-sandbox")), 404, api.CodeIngressSandboxNotFound},
		{"signed unknown sandbox", to(unknownSigned), 404, api.CodeIngressSandboxNotFound},
		{"not running", append(to(sbPaused+"-8080"), api.HeaderSecureAccess, f.token(sbPaused)), 503, api.CodeIngressSandboxNotRunning},
		{"dead port", append(to(sbDeadPort+"-8080"), api.HeaderSecureAccess, f.token(sbDeadPort)), 502, api.CodeIngressBadGateway},
		{"malformed", to(sbRunning + "-99999"), 400, api.CodeIngressInvalidRoute},
		{"no route", nil, 400, api.CodeIngressInvalidRoute},
		{"expired but good token", append(to(expired), api.HeaderSecureAccess, tok), 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := f.do(http.MethodGet, "", "/x", nil, c.headers...)
			if c.status == 200 {
				readEcho(t, resp)
				return
			}
			e := wantError(t, resp, c.status, c.code)
			if c.status == 401 && (strings.Contains(e.Message, "not found") || strings.Contains(e.Message, "Paused")) {
				t.Fatalf("401 tells about the sandbox: %q", e.Message)
			}
			if c.code == api.CodeIngressSandboxNotRunning && !strings.Contains(e.Message, "Paused") || c.code == api.CodeIngressSandboxNotRunning && !strings.Contains(e.Message, "paused by the user") {
				t.Fatalf("503 does not say the state and reason: %q", e.Message)
			}
		})
	}

	t.Run("resolver down", func(t *testing.T) {
		f := newFixture(t, func(c *Config) { c.CacheTTL = -1 })
		f.res.err = fmt.Errorf("lifecycle server: connection refused")
		wantError(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, sbRunning+"-8080", api.HeaderSecureAccess, tok), 503, api.CodeIngressUnavailable)
	})
	t.Run("no keys", func(t *testing.T) {
		f := newFixture(t, nil)
		f.keys.Store(nil)
		wantError(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, sbRunning+"-8080", api.HeaderSecureAccess, tok), 503, api.CodeIngressUnavailable)
		wantError(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, good), 503, api.CodeIngressUnavailable)
		wantError(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, sbRunning+"-8080"), 401, api.CodeIngressUnauthorized)
		readEcho(t, f.do(http.MethodGet, sbPublic+"-80."+domain, "/x", nil))
	})
}

func flipChar(c byte) string {
	if c == 'a' {
		return "b"
	}
	return "a"
}

func TestGatewayKeyRotation(t *testing.T) {
	f := newFixture(t, nil)
	old := f.keys.Load()
	exp := time.Now().Add(time.Hour)
	oldLink := f.signed(sbRunning, 8080, exp, 0)
	oldTok := f.token(sbRunning)

	// A new key signs; the old one still verifies.
	newKey, err := GenerateKey('b')
	if err != nil {
		t.Fatal(err)
	}
	k, _ := ParseKey(newKey)
	oldKey := old.keys[0]
	both, err := NewKeys(k, oldKey)
	if err != nil {
		t.Fatal(err)
	}
	f.keys.Store(both)
	newLink := f.signed(sbRunning, 8080, exp, 0)
	if newLink == oldLink || newLink[len(newLink)-1] != 'b' {
		t.Fatalf("new link %q is not signed by key b", newLink)
	}
	for _, h := range [][]string{
		{api.HeaderIngressTo, oldLink}, {api.HeaderIngressTo, newLink},
		{api.HeaderIngressTo, sbRunning + "-8080", api.HeaderSecureAccess, oldTok},
		{api.HeaderIngressTo, sbRunning + "-8080", api.HeaderSecureAccess, f.token(sbRunning)},
	} {
		readEcho(t, f.do(http.MethodGet, "", "/x", nil, h...))
	}
	// The old key removed: its links and tokens stop working.
	only, _ := NewKeys(k)
	f.keys.Store(only)
	wantError(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, oldLink), 401, api.CodeIngressUnauthorized)
	wantError(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, sbRunning+"-8080", api.HeaderSecureAccess, oldTok), 401, api.CodeIngressUnauthorized)
	readEcho(t, f.do(http.MethodGet, "", "/x", nil, api.HeaderIngressTo, newLink))
}

func TestGatewayWebSocket(t *testing.T) {
	f := newFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	h.Set(api.HeaderSecureAccess, f.token(sbRunning))
	wsURL := "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/" + sbRunning + "/8080/ws"
	c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial %v (resp %v)", err, resp)
	}
	defer c.CloseNow()
	if resp.Header.Get(api.HeaderRequestID) == "" {
		t.Fatal("101 without X-Request-ID")
	}
	for i := range 3 {
		msg := fmt.Sprintf("hello %d", i)
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "echo: "+msg {
			t.Fatalf("got %q", got)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
	// A WebSocket without credentials is refused before the upgrade.
	_, resp, err = websocket.Dial(ctx, wsURL, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unauthenticated dial: %v %v", err, resp)
	}
}

func TestGatewaySSE(t *testing.T) {
	f := newFixture(t, nil)
	resp := f.do(http.MethodGet, "", "/"+sbRunning+"/8080/sse", nil, api.HeaderSecureAccess, f.token(sbRunning))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	start := time.Now()
	br := bufio.NewReader(resp.Body)
	var at []time.Duration
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: ") {
			at = append(at, time.Since(start))
		}
	}
	if len(at) != 3 {
		t.Fatalf("got %d events", len(at))
	}
	// The backend sends one every 300 ms: each must arrive when sent,
	// not at the end.
	if at[0] > 150*time.Millisecond || at[1] < 200*time.Millisecond || at[1] > 500*time.Millisecond || at[2] < 500*time.Millisecond {
		t.Fatalf("events arrived at %v, want about 0, 300ms, 600ms", at)
	}
}

func TestGatewayLargeDownload(t *testing.T) {
	f := newFixture(t, nil)
	size := int64(1 << 30)
	if testing.Short() {
		size = 128 << 20
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	start := time.Now()
	resp := f.do(http.MethodGet, "", "/"+sbRunning+"/8080/big?n="+strconv.FormatInt(size, 10), nil, api.HeaderSecureAccess, f.token(sbRunning))
	n, err := io.CopyBuffer(io.Discard, resp.Body, make([]byte, 256<<10))
	close(stop)
	wg.Wait()
	if err != nil || n != size {
		t.Fatalf("got %d bytes, %v; want %d", n, err, size)
	}
	d := time.Since(start)
	grew := int64(peak.Load()) - int64(before.HeapInuse)
	t.Logf("%d MiB in %v (%.0f MiB/s); heap in use grew at most %d KiB", size>>20, d, float64(size>>20)/d.Seconds(), grew>>10)
	// The client, the gateway and the backend share this process: all
	// of them together must hold a few buffers, not the body.
	if grew > 64<<20 {
		t.Fatalf("heap grew by %d MiB during a %d MiB download", grew>>20, size>>20)
	}
	if got := testutil.ToFloat64(f.gw.metrics.bytesOut); got < float64(size) {
		t.Fatalf("sent bytes metric %v, want >= %d", got, size)
	}
}

func TestGatewayHTTP2(t *testing.T) {
	t.Run("tls", func(t *testing.T) {
		f := newFixture(t, nil)
		s := httptest.NewUnstartedServer(f.gw)
		s.EnableHTTP2 = true
		s.StartTLS()
		defer s.Close()
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/"+sbRunning+"/8080/h2", nil)
		req.Header.Set(api.HeaderSecureAccess, f.token(sbRunning))
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		e := readEcho(t, resp)
		if resp.ProtoMajor != 2 || e.Path != "/h2" || e.Header.Get("X-Forwarded-Proto") != "https" {
			t.Fatalf("proto %s, path %s, X-Forwarded-Proto %q", resp.Proto, e.Path, e.Header.Get("X-Forwarded-Proto"))
		}
	})
	t.Run("h2c", func(t *testing.T) {
		f := newFixture(t, nil)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var protos http.Protocols
		protos.SetHTTP1(true)
		protos.SetUnencryptedHTTP2(true)
		hs := &http.Server{Handler: f.gw, Protocols: &protos}
		go hs.Serve(ln)
		defer hs.Close()
		var cp http.Protocols
		cp.SetUnencryptedHTTP2(true)
		c := &http.Client{Transport: &http.Transport{Protocols: &cp}}
		req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/x", nil)
		req.Header.Set(api.HeaderIngressTo, f.signed(sbRunning, 8080, time.Now().Add(time.Minute), 0))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		e := readEcho(t, resp)
		if resp.ProtoMajor != 2 || e.Path != "/x" {
			t.Fatalf("proto %s path %s", resp.Proto, e.Path)
		}
	})
}

func TestGatewayRenewThrottled(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.RenewEvery = 400 * time.Millisecond })
	tok := f.token(sbRenew)
	for range 20 {
		readEcho(t, f.do(http.MethodGet, "", "/"+sbRenew+"/8080/x", nil, api.HeaderSecureAccess, tok))
	}
	// A sandbox that did not opt in is never renewed.
	readEcho(t, f.do(http.MethodGet, "", "/"+sbRunning+"/8080/x", nil, api.HeaderSecureAccess, f.token(sbRunning)))
	waitFor(t, func() bool { return f.renewer.count() >= 1 })
	time.Sleep(50 * time.Millisecond)
	if n := f.renewer.count(); n != 1 {
		t.Fatalf("%d renews after 21 requests within the throttle, want 1", n)
	}
	time.Sleep(450 * time.Millisecond)
	readEcho(t, f.do(http.MethodGet, "", "/"+sbRenew+"/8080/x", nil, api.HeaderSecureAccess, tok))
	waitFor(t, func() bool { return f.renewer.count() >= 2 })
	f.renewer.mu.Lock()
	defer f.renewer.mu.Unlock()
	if f.renewer.calls[0] != sbRenew+"/8080" || f.renewer.calls[1] != sbRenew+"/8080" {
		t.Fatalf("renewed %v", f.renewer.calls)
	}
}

// TestGatewayRenewNeverBlocks: a Renewer that hangs does not hold the
// request.
func TestGatewayRenewNeverBlocks(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	f := newFixture(t, func(c *Config) { c.Renewer = blockingRenewer(block) })
	start := time.Now()
	readEcho(t, f.do(http.MethodGet, "", "/"+sbRenew+"/8080/x", nil, api.HeaderSecureAccess, f.token(sbRenew)))
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("request took %v behind a hung renew", d)
	}
}

type blockingRenewer chan struct{}

func (b blockingRenewer) Renew(ctx context.Context, id string, port int) error {
	select {
	case <-b:
	case <-ctx.Done():
	}
	return nil
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGatewayResolverCache(t *testing.T) {
	f := newFixture(t, nil)
	f.res.delay = 100 * time.Millisecond
	tok := f.token(sbRunning)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/"+sbRunning+"/8080/x", nil)
			req.Header.Set(api.HeaderSecureAccess, tok)
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	if n := f.res.calls.Load(); n != 1 {
		t.Fatalf("50 concurrent requests asked the resolver %d times, want 1", n)
	}
	// A state change is seen once the answer expires.
	f.res.set(sbRunning, api.IngressTarget{State: "Paused"})
	time.Sleep(DefaultCacheTTL + 100*time.Millisecond)
	wantError(t, f.do(http.MethodGet, "", "/"+sbRunning+"/8080/x", nil, api.HeaderSecureAccess, tok), 503, api.CodeIngressSandboxNotRunning)
}

func TestGatewayHealth(t *testing.T) {
	f := newFixture(t, nil)
	for _, p := range []string{"/healthz", "/readyz"} {
		resp := f.do(http.MethodGet, "", p, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
	}
	f.res.err = fmt.Errorf("server down")
	resp := f.do(http.MethodGet, "", "/readyz", nil)
	wantError(t, resp, 503, api.CodeIngressUnavailable)
	// A routed request to /healthz goes to the sandbox.
	f.res.err = nil
	e := readEcho(t, f.do(http.MethodGet, "", "/healthz", nil, api.HeaderIngressTo, sbPublic+"-80"))
	if e.Path != "/prefix/healthz" {
		t.Fatalf("routed /healthz reached %q", e.Path)
	}
}

func TestGatewayAccessLogAndMetrics(t *testing.T) {
	f := newFixture(t, nil)
	tok := f.token(sbRunning)
	signed := f.signed(sbRunning, 8080, time.Now().Add(time.Hour), 0)
	parts := strings.Split(signed, "-")
	sig := parts[len(parts)-1]
	sub := f.signed(sbRunning, 8080, time.Now().Add(time.Hour), DNSLabelMax)
	subSig := sub[strings.LastIndexByte(sub, '-')+1:]

	readEcho(t, f.do(http.MethodGet, "", "/x?secret=hunter2", nil, api.HeaderIngressTo, sbRunning+"-8080", api.HeaderSecureAccess, tok))
	readEcho(t, f.do(http.MethodGet, "", "/x?secret=hunter2", nil, api.HeaderIngressTo, signed))
	readEcho(t, f.do(http.MethodGet, "", "/"+sbRunning+"/8080/"+parts[len(parts)-2]+"/"+sig+"/y?secret=hunter2", nil))
	readEcho(t, f.do(http.MethodGet, sub+"."+domain, "/z?secret=hunter2", nil))
	wantError(t, f.do(http.MethodGet, "", "/x?secret=hunter2", nil, api.HeaderIngressTo, sbRunning+"-8080", api.HeaderSecureAccess, tok+"x"), 401, api.CodeIngressUnauthorized)
	wantError(t, f.do(http.MethodGet, "", "/x", nil), 400, api.CodeIngressInvalidRoute)

	logs := f.logs.String()
	for _, secret := range []string{tok, sig, subSig, "hunter2", "execd-secret"} {
		if strings.Contains(logs, secret) {
			t.Fatalf("the log holds a secret %q:\n%s", secret, logs)
		}
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "ingress" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 6 {
		t.Fatalf("%d access log lines, want 6:\n%s", len(lines), logs)
	}
	if l := lines[2]; l["sandbox"] != sbRunning || l["path"] != "/y" || l["auth"] != authSigned || l["mode"] != ModePath || l["status"] != float64(200) {
		t.Fatalf("access log line %v", l)
	}
	if l := lines[4]; l["code"] != api.CodeIngressUnauthorized || l["status"] != float64(401) {
		t.Fatalf("access log line %v", l)
	}

	if got := testutil.ToFloat64(f.gw.metrics.requests.WithLabelValues("2xx")); got != 4 {
		t.Fatalf("2xx requests %v, want 4", got)
	}
	if got := testutil.ToFloat64(f.gw.metrics.misses.WithLabelValues(missUnauthorized)); got != 1 {
		t.Fatalf("unauthorized misses %v", got)
	}
	if got := testutil.ToFloat64(f.gw.metrics.misses.WithLabelValues(missInvalidRoute)); got != 1 {
		t.Fatalf("invalid route misses %v", got)
	}
	if n, err := testutil.GatherAndCount(f.reg, "opensandbox_ingress_request_duration_seconds"); err != nil || n != 2 {
		t.Fatalf("duration series %d, %v", n, err)
	}
	if got := testutil.ToFloat64(f.gw.metrics.activeConns); got < 1 {
		t.Fatalf("active connections %v with a keep-alive connection open", got)
	}
}

// BenchmarkGatewayDownload: bytes through the gateway, client, gateway
// and backend in this process (b.SetBytes: MB/s is the rate).
func BenchmarkGatewayDownload(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		buf := make([]byte, 256<<10)
		for n > 0 {
			k := min(n, int64(len(buf)))
			if _, err := w.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	}))
	defer backend.Close()
	res := &mapResolver{targets: map[string]api.IngressTarget{"sb": {State: "Running", Endpoint: strings.TrimPrefix(backend.URL, "http://"), Public: true}}}
	gw, err := New(Config{Resolver: res})
	if err != nil {
		b.Fatal(err)
	}
	s := httptest.NewServer(gw)
	defer s.Close()
	const size = 64 << 20
	buf := make([]byte, 256<<10)
	b.SetBytes(size)
	for b.Loop() {
		resp, err := s.Client().Get(s.URL + "/sb/80/x?n=" + strconv.Itoa(size))
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil || n != size {
			b.Fatalf("%d bytes, %v", n, err)
		}
	}
}
