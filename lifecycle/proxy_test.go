package lifecycle

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

// routedRuntime is the fake with endpoints that lead somewhere: every
// port of every sandbox to one address (a test backend), unless set per
// port.
type routedRuntime struct {
	*fake.Runtime
	mu        sync.Mutex
	def       string
	ports     map[int]string
	noHeaders map[int]bool              // ports whose endpoints carry no headers
	headers   map[int]map[string]string // headers some ports' endpoints add
}

func newRouted(addr string) *routedRuntime {
	rt := fake.New()
	rt.StartDelay = time.Millisecond
	return &routedRuntime{Runtime: rt, def: addr, ports: map[int]string{}, noHeaders: map[int]bool{}, headers: map[int]map[string]string{}}
}

func (r *routedRuntime) route(port int, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ports[port] = addr
}

func (r *routedRuntime) Endpoint(ctx context.Context, id sandbox.ID, port int) (sandbox.Endpoint, error) {
	ep, err := r.Runtime.Endpoint(ctx, id, port)
	if err != nil {
		return ep, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ep.Address = r.def
	if a, ok := r.ports[port]; ok {
		ep.Address = a
	}
	if r.noHeaders[port] {
		ep.Headers = nil
	}
	for k, v := range r.headers[port] {
		if ep.Headers == nil {
			ep.Headers = map[string]string{}
		}
		ep.Headers[k] = v
	}
	return ep, nil
}

// echoed is what the echo backend saw of a request.
type echoed struct {
	Method, Path, Query, Host, Body string
	Header                          http.Header
}

// echoBackend answers every request with what it saw, status 201 and a
// header of its own (and an X-Request-ID, which the proxy must not pass).
func echoBackend(t *testing.T) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Backend", "yes")
		w.Header().Set(api.HeaderRequestID, "backend-id")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(echoed{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Host, string(body), r.Header})
	}))
	t.Cleanup(ts.Close)
	return ts
}

func hostOf(ts *httptest.Server) string { return strings.TrimPrefix(ts.URL, "http://") }

func TestParseProxyPath(t *testing.T) {
	tests := []struct {
		in       string
		ok       bool
		id, port string
		rest     string
	}{
		{"/sandboxes/abc/proxy/8080", true, "abc", "8080", ""},
		{"/v1/sandboxes/abc/proxy/8080/", true, "abc", "8080", "/"},
		{"/v1/sandboxes/abc/proxy/8080/a//b/./c%2Fd?", true, "abc", "8080", "/a//b/./c%2Fd?"},
		{"/sandboxes/a%2Fb/proxy/1/x", true, "a/b", "1", "/x"},
		{"/sandboxes/abc/proxy/x/y", true, "abc", "x", "/y"}, // port checked by serveProxy
		{"/sandboxes/abc/proxy/", false, "", "", ""},
		{"/sandboxes/abc/proxy", false, "", "", ""},
		{"/sandboxes//proxy/80", false, "", "", ""},
		{"/sandboxes/abc/endpoints/80", false, "", "", ""},
		{"/sandboxes/abc/diagnostics/logs", false, "", "", ""},
		{"/v2/sandboxes/abc/proxy/80", false, "", "", ""},
		{"/v1/v1/sandboxes/abc/proxy/80", false, "", "", ""},
		{"/sandboxes/%zz/proxy/80", false, "", "", ""},
	}
	for _, tt := range tests {
		p, ok := parseProxyPath(tt.in)
		if ok != tt.ok || (ok && (string(p.id) != tt.id || p.port != tt.port || p.rest != tt.rest)) {
			t.Errorf("parseProxyPath(%q) = %+v, %v", tt.in, p, ok)
		}
	}
}

func TestProxyHTTP(t *testing.T) {
	backend := echoBackend(t)
	rt := newRouted(hostOf(backend))
	e := newEnvWith(t, rt)
	id := e.create("")
	token := rt.Token(sandbox.ID(id))
	serverHost := strings.TrimPrefix(e.url, "http://")

	for _, prefix := range []string{"", "/v1"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			r := e.call("POST", prefix+"/sandboxes/"+id+"/proxy/8080/a/b%2Fc//d/./e?x=1&y=a%20b", "hello",
				"Cookie", "session=s1", "Authorization", "Bearer app-token", "X-Forwarded-For", "203.0.113.7",
				api.HeaderRequestID, "rid-1", "Connection", "keep-alive, X-Hop", "X-Hop", "secret")
			r.wantStatus(t, http.StatusCreated)
			var got echoed
			r.decode(t, &got)
			if got.Method != "POST" || got.Path != "/a/b%2Fc//d/./e" || got.Query != "x=1&y=a%20b" || got.Body != "hello" || got.Host != hostOf(backend) {
				t.Fatalf("backend saw %+v", got)
			}
			h := got.Header
			for name, want := range map[string]string{
				api.HeaderAPIKey:         "",
				sandbox.HeaderExecdToken: token,
				"Cookie":                 "session=s1",
				"Authorization":          "Bearer app-token",
				"X-Forwarded-For":        "203.0.113.7, 127.0.0.1",
				"X-Forwarded-Proto":      "http",
				"X-Forwarded-Host":       serverHost,
				api.HeaderRequestID:      "rid-1",
				"X-Hop":                  "",
			} {
				if h.Get(name) != want {
					t.Errorf("backend saw %s = %q, want %q", name, h.Get(name), want)
				}
			}
			if r.header.Get("X-Backend") != "yes" || strings.Join(r.header.Values(api.HeaderRequestID), ",") != "rid-1" {
				t.Fatalf("answer headers %v", r.header)
			}
		})
	}

	var got echoed
	e.call("GET", "/sandboxes/"+id+"/proxy/8080", "").wantStatus(t, 201).decode(t, &got)
	if got.Path != "/" || got.Method != "GET" {
		t.Fatalf("no path: backend saw %+v", got)
	}
	for _, m := range []string{"PUT", "PATCH", "DELETE", "OPTIONS"} {
		e.call(m, "/sandboxes/"+id+"/proxy/8080/x", "").wantStatus(t, 201).decode(t, &got)
		if got.Method != m {
			t.Fatalf("%s arrived as %s", m, got.Method)
		}
	}

	// An endpoint with a path prefix, as Docker's execd-forwarded ports.
	rt.route(3000, hostOf(backend)+"/proxy/3000")
	e.call("GET", "/sandboxes/"+id+"/proxy/3000/app?q=1", "").wantStatus(t, 201).decode(t, &got)
	if got.Path != "/proxy/3000/app" || got.Query != "q=1" {
		t.Fatalf("prefixed endpoint: backend saw %+v", got)
	}
	e.call("GET", "/sandboxes/"+id+"/proxy/3000", "").wantStatus(t, 201).decode(t, &got)
	if got.Path != "/proxy/3000" {
		t.Fatalf("prefixed endpoint without path: backend saw %+v", got)
	}

	// A port reached directly, without the token in its endpoint: the
	// token a client authenticated with never reaches the application.
	rt.mu.Lock()
	rt.noHeaders[9000] = true
	rt.mu.Unlock()
	var direct echoed
	e.call("GET", "/sandboxes/"+id+"/proxy/9000/", "", api.HeaderAPIKey, "", sandbox.HeaderExecdToken, token).wantStatus(t, 201).decode(t, &direct)
	if v := direct.Header.Get(sandbox.HeaderExecdToken); v != "" {
		t.Fatalf("the application saw the sandbox token %q", v)
	}

	for _, p := range []string{"0", "65536", "http", "-1"} {
		e.call("GET", "/v1/sandboxes/"+id+"/proxy/"+p+"/x", "").wantError(t, 400, api.CodeDockerInvalidPort)
	}
	e.call("GET", "/v1/sandboxes/nope/proxy/8080/x", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
}

func TestProxyAuth(t *testing.T) {
	backend := echoBackend(t)
	rt := newRouted(hostOf(backend))
	e := newEnvWith(t, rt)
	id, other := e.create(""), e.create("")
	token, otherToken := rt.Token(sandbox.ID(id)), rt.Token(sandbox.ID(other))
	path := "/v1/sandboxes/" + id + "/proxy/8080/x"
	tests := []struct {
		name    string
		headers []string
		status  int
		code    string
	}{
		{"API key", nil, 201, ""},
		{"sandbox token", []string{api.HeaderAPIKey, "", sandbox.HeaderExecdToken, token}, 201, ""},
		{"token and a wrong key", []string{api.HeaderAPIKey, "wrong", sandbox.HeaderExecdToken, token}, 201, ""},
		{"key and a wrong token", []string{sandbox.HeaderExecdToken, "wrong"}, 201, ""},
		{"nothing", []string{api.HeaderAPIKey, ""}, 401, "MISSING_API_KEY"},
		{"wrong key", []string{api.HeaderAPIKey, "wrong"}, 401, "INVALID_API_KEY"},
		{"wrong token", []string{api.HeaderAPIKey, "", sandbox.HeaderExecdToken, "wrong"}, 401, "INVALID_API_KEY"},
		{"another sandbox's token", []string{api.HeaderAPIKey, "", sandbox.HeaderExecdToken, otherToken}, 401, "INVALID_API_KEY"},
		{"token prefix", []string{api.HeaderAPIKey, "", sandbox.HeaderExecdToken, token[:len(token)-1]}, 401, "INVALID_API_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.call("GET", path, "", tt.headers...)
			if tt.status == 201 {
				r.wantStatus(t, 201)
			} else {
				r.wantError(t, tt.status, tt.code)
			}
		})
	}
	// An unknown sandbox: 404 to the API key holder, 401 to anyone else.
	e.call("GET", "/v1/sandboxes/nope/proxy/8080/x", "", api.HeaderAPIKey, "", sandbox.HeaderExecdToken, token).wantError(t, 401, "INVALID_API_KEY")
	e.call("GET", "/v1/sandboxes/nope/proxy/8080/x", "").wantError(t, 404, api.CodeDockerSandboxNotFound)

	insecure := newEnvWith(t, rt, func(c *Config) { c.APIKey, c.Insecure = "", true })
	insecure.call("GET", path, "", api.HeaderAPIKey, "").wantStatus(t, 201)
}

// TestProxyUseServerProxy walks the SDKs' use_server_proxy path: resolve
// the endpoint, then call it with its headers only, never the API key.
func TestProxyUseServerProxy(t *testing.T) {
	backend := echoBackend(t)
	rt := newRouted(hostOf(backend))
	e := newEnvWith(t, rt)
	id := e.create("")
	for _, port := range []int{api.ExecdPort, 8080, 31337} {
		var ep api.Endpoint
		e.call("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d?use_server_proxy=true", id, port), "").wantStatus(t, 200).decode(t, &ep)
		req, _ := http.NewRequest("GET", "http://"+ep.Endpoint+"/ping", nil)
		for k, v := range ep.Headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got echoed
		json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.StatusCode != 201 || got.Path != "/ping" {
			t.Fatalf("port %d via %s: %d, backend saw %+v", port, ep.Endpoint, resp.StatusCode, got)
		}
	}
}

// TestProxyStreams checks that each event arrives before the backend
// writes the next (the backend waits for the client to have read one):
// server-sent events, and a stream the proxy cannot recognize by its type.
func TestProxyStreams(t *testing.T) {
	for _, ctype := range []string{"text/event-stream", "application/x-ndjson"} {
		t.Run(ctype, func(t *testing.T) {
			next := make(chan struct{})
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ctype)
				for i := range 5 {
					fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
					w.(http.Flusher).Flush()
					select {
					case <-next:
					case <-r.Context().Done():
						return
					case <-time.After(5 * time.Second):
						return // the event never reached the client
					}
				}
			}))
			defer backend.Close()
			e := newEnvWith(t, newRouted(hostOf(backend)))
			id := e.create("")

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/sandboxes/"+id+"/proxy/8080/events", nil)
			req.Header.Set(api.HeaderAPIKey, testKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.Header.Get("Content-Type") != ctype {
				t.Fatalf("Content-Type %q", resp.Header.Get("Content-Type"))
			}
			rd := bufio.NewReader(resp.Body)
			for i := range 5 {
				line, err := rd.ReadString('\n')
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				if want := fmt.Sprintf("data: {\"n\":%d}\n", i); line != want {
					t.Fatalf("event %d: %q, want %q", i, line, want)
				}
				rd.ReadString('\n') // the blank line
				select {
				case next <- struct{}{}:
				case <-ctx.Done():
					t.Fatal("the backend gave up waiting")
				}
			}
			if rest, _ := io.ReadAll(rd); len(rest) != 0 {
				t.Fatalf("after the events: %q", rest)
			}
		})
	}
}

func TestProxyWebSocket(t *testing.T) {
	var gotHeader http.Header
	var mu sync.Mutex
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gotHeader = r.Header.Clone()
		mu.Unlock()
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		for {
			typ, msg, err := conn.Read(r.Context())
			if err != nil {
				return
			}
			if err := conn.Write(r.Context(), typ, append([]byte("echo: "), msg...)); err != nil {
				return
			}
		}
	}))
	defer backend.Close()
	rt := newRouted(hostOf(backend))
	e := newEnvWith(t, rt)
	id := e.create("")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, auth := range []http.Header{
		{api.HeaderAPIKey: {testKey}},
		{sandbox.HeaderExecdToken: {rt.Token(sandbox.ID(id))}},
	} {
		wsURL := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sandboxes/" + id + "/proxy/8080/ws"
		conn, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: auth})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		if resp.Header.Get(api.HeaderRequestID) == "" {
			t.Errorf("101 without X-Request-ID")
		}
		for i, typ := range []websocket.MessageType{websocket.MessageText, websocket.MessageBinary, websocket.MessageText} {
			msg := fmt.Sprintf("message %d", i)
			if err := conn.Write(ctx, typ, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			gotTyp, got, err := conn.Read(ctx)
			if err != nil || gotTyp != typ || string(got) != "echo: "+msg {
				t.Fatalf("read %v %q %v, want %v %q", gotTyp, got, err, typ, "echo: "+msg)
			}
		}
		conn.Close(websocket.StatusNormalClosure, "")
		mu.Lock()
		if gotHeader.Get(api.HeaderAPIKey) != "" || gotHeader.Get(sandbox.HeaderExecdToken) != rt.Token(sandbox.ID(id)) {
			t.Errorf("backend handshake headers %v", gotHeader)
		}
		mu.Unlock()
	}
	// Without credentials the upgrade is refused.
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.url, "http")+"/v1/sandboxes/"+id+"/proxy/8080/ws", nil)
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("dial without credentials: %v %v", resp, err)
	}
}

func TestProxyBadGateway(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	e := newEnvWith(t, newRouted(closed))
	id := e.create("")
	r := e.call("GET", "/v1/sandboxes/"+id+"/proxy/8080/x", "")
	r.wantError(t, 502, api.CodeSandboxBadGateway)
	if strings.Contains(string(r.body), closed) {
		t.Fatalf("502 tells the backend address: %s", r.body)
	}
}

// clock is a settable time for renew-on-access tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestRenewOnAccess(t *testing.T) {
	backend := echoBackend(t)
	rt := newRouted(hostOf(backend))
	e := newEnvWith(t, rt)
	clk := &clock{now: time.Now()}
	e.srv.now = clk.Now
	ctx := context.Background()

	renewing := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":60,"extensions":{"access.renew.extend.seconds":"600"}}`)
	plain := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":60}`)
	noExpiry := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"extensions":{"access.renew.extend.seconds":"600"}}`)
	access := func(id string) {
		t.Helper()
		e.call("GET", "/sandboxes/"+id+"/proxy/8080/", "").wantStatus(t, 201)
	}
	expiry := func(id string) *time.Time {
		t.Helper()
		sb, err := rt.Get(ctx, sandbox.ID(id))
		if err != nil {
			t.Fatal(err)
		}
		return sb.ExpiresAt
	}
	setExpiry := func(id string, at time.Time) {
		t.Helper()
		if err := rt.SetExpiry(ctx, sandbox.ID(id), &at); err != nil {
			t.Fatal(err)
		}
	}

	access(renewing)
	if at := expiry(renewing); at == nil || !at.Equal(clk.Now().Add(600*time.Second).UTC()) {
		t.Fatalf("after access: expiry %v, want now+600s", at)
	}
	// Within N/10 (60 s) of the last renewal, access renews nothing.
	short := clk.Now().Add(100 * time.Second)
	setExpiry(renewing, short)
	clk.advance(59 * time.Second)
	access(renewing)
	if at := expiry(renewing); !at.Equal(short) {
		t.Fatalf("throttled access moved the expiry to %v", at)
	}
	clk.advance(2 * time.Second)
	access(renewing)
	if at := expiry(renewing); !at.Equal(clk.Now().Add(600 * time.Second).UTC()) {
		t.Fatalf("after the throttle: expiry %v, want now+600s", at)
	}
	// Never earlier than it was.
	far := clk.Now().Add(5000 * time.Second).UTC()
	setExpiry(renewing, far)
	clk.advance(61 * time.Second)
	access(renewing)
	if at := expiry(renewing); !at.Equal(far) {
		t.Fatalf("access shortened the expiry from %v to %v", far, at)
	}
	// Nor when it is less than one throttle period (N/10) short of now +
	// N: another replica renewed it a moment ago.
	near := clk.Now().Add(61*time.Second + 545*time.Second).UTC()
	setExpiry(renewing, near)
	clk.advance(61 * time.Second)
	access(renewing)
	if at := expiry(renewing); !at.Equal(near) {
		t.Fatalf("access rewrote an expiry 55 s short of now+600s: %v to %v", near, at)
	}
	// Not without the extension, nor without an expiry.
	before := expiry(plain)
	access(plain)
	if at := expiry(plain); !at.Equal(*before) {
		t.Fatalf("sandbox without the extension renewed: %v -> %v", before, at)
	}
	access(noExpiry)
	if at := expiry(noExpiry); at != nil {
		t.Fatalf("sandbox without expiry got one: %v", at)
	}

	// MaxTimeout bounds the renewal.
	bounded := newEnvWith(t, rt, func(c *Config) { c.MaxTimeout = 400 * time.Second })
	clk = &clock{now: time.Now()} // the manager checks the bound on its own clock
	bounded.srv.now = clk.Now
	id := bounded.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":60,"extensions":{"access.renew.extend.seconds":"600"}}`)
	bounded.call("GET", "/sandboxes/"+id+"/proxy/8080/", "").wantStatus(t, 201)
	if at := expiry(id); at == nil || !at.Equal(clk.Now().Add(400*time.Second).UTC()) {
		t.Fatalf("bounded renewal: expiry %v, want now+400s", at)
	}
}

func TestRenewThrottleStaysSmall(t *testing.T) {
	th := newRenewThrottle()
	now := time.Now()
	for i := range 3 * renewThrottleSweep {
		th.claim(sandbox.ID(fmt.Sprint(i)), now.Add(time.Duration(i)*time.Second), now.Add(time.Duration(i)*time.Second+time.Second))
	}
	if n := len(th.next); n > renewThrottleSweep+1 {
		t.Fatalf("throttle holds %d entries", n)
	}
}

// TestProxyVaultWrites: through the proxy route, a write to the egress
// API's credential vault from a client that is neither loopback nor on
// TLS is refused with 426 before it reaches the sandbox (osb-egress
// trusts this server's own hop); reads and other paths pass.
func TestProxyVaultWrites(t *testing.T) {
	backend := echoBackend(t)
	rt := newRouted(hostOf(backend))
	e := newEnvWith(t, rt)
	id := e.create("")
	for _, tc := range []struct {
		method, rest, remote string
		want                 int
	}{
		{"POST", "/credential-vault", "203.0.113.9:4000", http.StatusUpgradeRequired},
		{"PATCH", "/proxy/18080/credential-vault", "203.0.113.9:4000", http.StatusUpgradeRequired},
		{"DELETE", "/x/../credential-vault", "203.0.113.9:4000", http.StatusUpgradeRequired},
		{"PATCH", "/credential%2Dvault", "[2001:db8::1]:4000", http.StatusUpgradeRequired},
		{"POST", "/credential-vault", "127.0.0.1:4000", http.StatusOK},
		{"POST", "/credential-vault", "[::1]:4000", http.StatusOK},
		{"GET", "/credential-vault", "203.0.113.9:4000", http.StatusOK},
		{"POST", "/policy", "203.0.113.9:4000", http.StatusOK},
	} {
		req := httptest.NewRequest(tc.method, "/v1/sandboxes/"+id+"/proxy/18080"+tc.rest, strings.NewReader("{}"))
		req.RemoteAddr = tc.remote
		req.Header.Set(api.HeaderAPIKey, testKey)
		w := httptest.NewRecorder()
		e.srv.Handler().ServeHTTP(w, req)
		if got := w.Code; (tc.want == http.StatusUpgradeRequired) != (got == http.StatusUpgradeRequired) {
			t.Errorf("%s %s from %s: %d, want %d", tc.method, tc.rest, tc.remote, got, tc.want)
		}
	}
}
