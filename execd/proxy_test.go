package execd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
)

// backend starts a loopback HTTP server for the proxy to reach and returns
// its port.
func backend(t *testing.T, h http.Handler) string {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	u, err := url.Parse(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

// seen is what a backend received.
type seen struct {
	Method, RequestURI, Host, Body string
	Header                         http.Header
}

// recorder returns a backend that records each request and answers with
// status 201, a header and a body naming the path.
func recorder(t *testing.T) (port string, last func() seen) {
	var got atomic.Pointer[seen]
	port = backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got.Store(&seen{Method: r.Method, RequestURI: r.RequestURI, Host: r.Host, Body: string(body), Header: r.Header.Clone()})
		w.Header().Set("X-Backend", "yes")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	}))
	return port, func() seen {
		if s := got.Load(); s != nil {
			return *s
		}
		t.Fatal("the backend received no request")
		return seen{}
	}
}

func TestProxyForwards(t *testing.T) {
	_, c := newTestServer(t, nil)
	port, last := recorder(t)
	cases := []struct {
		name, method, path, body string
		wantURI                  string
	}{
		{"GET root without slash", http.MethodGet, "/proxy/" + port, "", "/"},
		{"GET root", http.MethodGet, "/proxy/" + port + "/", "", "/"},
		{"GET with query", http.MethodGet, "/proxy/" + port + "/api/items?q=a+b&x=%2F&x=2", "", "/api/items?q=a+b&x=%2F&x=2"},
		{"escaped characters", http.MethodGet, "/proxy/" + port + "/a%2Fb/c%20d/%E2%9C%93/x%3Fy", "", "/a%2Fb/c%20d/%E2%9C%93/x%3Fy"},
		{"POST with body", http.MethodPost, "/proxy/" + port + "/submit?id=7", `{"k":"v"}`, "/submit?id=7"},
		{"PUT", http.MethodPut, "/proxy/" + port + "/put", "data", "/put"},
		{"DELETE", http.MethodDelete, "/proxy/" + port + "/things/1", "", "/things/1"},
		{"PATCH", http.MethodPatch, "/proxy/" + port + "/things/1", "p", "/things/1"},
		{"OPTIONS", http.MethodOptions, "/proxy/" + port + "/cors", "", "/cors"},
		{"leading zeros in the port", http.MethodGet, "/proxy/0" + port + "/z", "", "/z"},
		{"untidy path forwarded as it is", http.MethodPost, "/proxy/" + port + "//a/./b/../c", "kept", "//a/./b/../c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body any
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			resp, data := c.do(c.request(tc.method, tc.path, body))
			if resp.StatusCode != http.StatusCreated || resp.Header.Get("X-Backend") != "yes" {
				t.Fatalf("%s %s: status %d, X-Backend %q; body %s", tc.method, tc.path, resp.StatusCode, resp.Header.Get("X-Backend"), data)
			}
			got := last()
			if got.Method != tc.method || got.RequestURI != tc.wantURI || got.Body != tc.body {
				t.Errorf("%s %s reached the backend as %s %s with body %q; want %s %s with %q",
					tc.method, tc.path, got.Method, got.RequestURI, got.Body, tc.method, tc.wantURI, tc.body)
			}
			u, _ := url.ParseRequestURI(tc.wantURI)
			if want := "hello from " + u.Path; string(data) != want {
				t.Errorf("%s %s: body %q, want %q", tc.method, tc.path, data, want)
			}
		})
	}
}

func TestProxyHeaders(t *testing.T) {
	_, c := newTestServer(t, nil)
	port, last := recorder(t)
	req := c.request(http.MethodGet, "/proxy/"+port+"/h", nil)
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("X-Forwarded-Host", "evil.example")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("X-Custom", "kept")
	req.Header.Set("Authorization", "Bearer app-token")
	c.do(req)
	got := last()
	h := got.Header
	checks := []struct{ header, want string }{
		{api.HeaderExecdToken, ""},
		{"X-Forwarded-Host", ""},
		{"X-Forwarded-For", "203.0.113.7, 127.0.0.1"},
		{"X-Forwarded-Proto", "http"},
		{"X-Custom", "kept"},
		{"Authorization", "Bearer app-token"},
	}
	for _, ck := range checks {
		if v := h.Get(ck.header); v != ck.want {
			t.Errorf("backend saw %s: %q, want %q (all headers %v)", ck.header, v, ck.want, h)
		}
	}
	if want := strings.TrimPrefix(c.base, "http://"); got.Host != want {
		t.Errorf("backend saw Host %q, want the client's %q", got.Host, want)
	}

	// Without a client X-Forwarded-For, the header is the client address.
	c.do(c.request(http.MethodGet, "/proxy/"+port+"/h", nil))
	if v := last().Header.Get("X-Forwarded-For"); v != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want 127.0.0.1", v)
	}
}

func TestProxyRejects(t *testing.T) {
	_, c := newTestServer(t, nil)
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()

	cases := []struct {
		name, method, path string
		wantStatus         int
		wantBody           string
	}{
		{"missing port", http.MethodGet, "/proxy/", http.StatusBadRequest, "port is required"},
		{"missing port POST", http.MethodPost, "/proxy/", http.StatusBadRequest, "port is required"},
		{"letters", http.MethodGet, "/proxy/abc/x", http.StatusBadRequest, "invalid port"},
		{"zero", http.MethodGet, "/proxy/0/", http.StatusBadRequest, "invalid port"},
		{"too big", http.MethodGet, "/proxy/65536/", http.StatusBadRequest, "invalid port"},
		{"huge", http.MethodGet, "/proxy/99999999999999999999/", http.StatusBadRequest, "invalid port"},
		{"negative", http.MethodGet, "/proxy/-1/", http.StatusBadRequest, "invalid port"},
		{"signed", http.MethodGet, "/proxy/+80/", http.StatusBadRequest, "invalid port"},
		{"hex", http.MethodGet, "/proxy/0x50/", http.StatusBadRequest, "invalid port"},
		{"escaped slash", http.MethodGet, "/proxy/80%2F/x", http.StatusBadRequest, "invalid port"},
		{"host and port", http.MethodGet, "/proxy/10.0.0.1:80/", http.StatusBadRequest, "invalid port"},
		{"closed port", http.MethodGet, "/proxy/" + closed + "/x", http.StatusBadGateway, "Bad Gateway"},
		{"closed port POST", http.MethodPost, "/proxy/" + closed, http.StatusBadGateway, "Bad Gateway"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, data := c.do(c.request(tc.method, tc.path, nil))
			ct := resp.Header.Get("Content-Type")
			if resp.StatusCode != tc.wantStatus || strings.TrimSpace(string(data)) != tc.wantBody || !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("%s %s: %d %q (%s); want %d %q text/plain", tc.method, tc.path, resp.StatusCode, data, ct, tc.wantStatus, tc.wantBody)
			}
		})
	}
}

func TestProxyNeedsToken(t *testing.T) {
	_, c := newTestServer(t, nil)
	var hits atomic.Int32
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	for _, token := range []string{"", "wrong"} {
		req := c.request(http.MethodGet, "/proxy/"+port+"/x", nil)
		req.Header.Set(api.HeaderExecdToken, token)
		resp, data := c.do(req)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: status %d, want 401; body %s", token, resp.StatusCode, data)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the backend was reached %d times without a valid token", n)
	}
}

// TestProxyStreamsEvents has a backend send one server-sent event and
// wait: the client must get it before the backend finishes.
func TestProxyStreamsEvents(t *testing.T) {
	_, c := newTestServer(t, nil)
	next := make(chan struct{})
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 3 {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			rc.Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Second):
				return
			}
		}
	}))
	resp, err := c.hc.Do(c.request(http.MethodGet, "/proxy/"+port+"/events", nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		got := make(chan string, 1)
		go func() {
			line, _ := br.ReadString('\n')
			br.ReadString('\n')
			got <- line
		}()
		select {
		case line := <-got:
			if want := fmt.Sprintf("data: event %d\n", i); line != want {
				t.Fatalf("event %d: %q, want %q", i, line, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d did not pass through while the backend was waiting", i)
		}
		next <- struct{}{}
	}
}

func TestProxyWebSocket(t *testing.T) {
	_, c := newTestServer(t, nil)
	var sawToken atomic.Bool
	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawToken.Store(r.Header.Get(api.HeaderExecdToken) != "")
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		conn.SetReadLimit(1 << 20)
		ctx := r.Context()
		for {
			typ, msg, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if err := conn.Write(ctx, typ, append([]byte("echo: "), msg...)); err != nil {
				return
			}
		}
	}))

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(c.base, "http") + "/proxy/" + port + "/ws?room=1"
	conn, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		HTTPHeader: http.Header{api.HeaderExecdToken: {c.token}},
	})
	if err != nil {
		t.Fatalf("dial %s: %v (response %+v)", wsURL, err, resp)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	for i, msg := range []string{"hello", strings.Repeat("x", 100000)} {
		typ := websocket.MessageText
		if i == 1 {
			typ = websocket.MessageBinary
		}
		if err := conn.Write(ctx, typ, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		gotTyp, got, err := conn.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if gotTyp != typ || string(got) != "echo: "+msg {
			t.Errorf("message %d: got %v %.40q, want %v %.40q", i, gotTyp, got, typ, "echo: "+msg)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
	if sawToken.Load() {
		t.Error("the WebSocket backend saw execd's access token")
	}

	// The upgrade without a token is refused before it reaches the backend.
	_, resp, err = websocket.Dial(ctx, wsURL, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("dial without token: err %v, response %+v; want 401", err, resp)
	}
}

// TestProxyLargeBodies streams 64 MiB to a backend and 64 MiB back.
func TestProxyLargeBodies(t *testing.T) {
	_, c := newTestServer(t, nil)
	const size = 64 << 20
	payload := func() io.Reader {
		return io.LimitReader(rand.NewChaCha8([32]byte{1, 2, 3}), size)
	}
	h := sha256.New()
	io.Copy(h, payload())
	want := hex.EncodeToString(h.Sum(nil))

	port := backend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
			h := sha256.New()
			n, err := io.Copy(h, r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
		case http.MethodGet:
			io.Copy(w, payload())
		}
	}))

	t.Run("upload", func(t *testing.T) {
		req := c.request(http.MethodPost, "/proxy/"+port+"/up", payload())
		req.ContentLength = -1 // chunked: the proxy must stream, not buffer
		resp, data := c.do(req)
		if got := fmt.Sprintf("%d %s", size, want); resp.StatusCode != http.StatusOK || string(data) != got {
			t.Errorf("upload: %d %q, want 200 %q", resp.StatusCode, data, got)
		}
	})
	t.Run("download", func(t *testing.T) {
		resp, err := c.hc.Do(c.request(http.MethodGet, "/proxy/"+port+"/down", nil))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		if err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != want {
			t.Errorf("download: %d bytes, err %v, sha256 %x; want %d bytes %s", n, err, h.Sum(nil), size, want)
		}
	})
}

func TestProxyTarget(t *testing.T) {
	cases := []struct {
		in       string
		wantPort int
		wantPath string
		wantErr  error
	}{
		{"/proxy/8080", 8080, "/", nil},
		{"/proxy/8080/", 8080, "/", nil},
		{"/proxy/1/a/b", 1, "/a/b", nil},
		{"/proxy/65535/a%2Fb?", 65535, "/a%2Fb?", nil},
		{"/proxy/%38%30/x", 80, "/x", nil},
		{"/proxy/00080/x", 80, "/x", nil},
		{"/proxy/", 0, "", errPortRequired},
		{"/proxy//x", 0, "", errPortRequired},
		{"/other/80", 0, "", errPortRequired},
		{"/proxy/0", 0, "", errInvalidPort},
		{"/proxy/65536", 0, "", errInvalidPort},
		{"/proxy/000080/x", 80, "/x", nil},
		{"/proxy/0000000000000000000065535", 65535, "/", nil},
		{"/proxy/8o", 0, "", errInvalidPort},
		{"/proxy/%zz/x", 0, "", errInvalidPort},
		{"/proxy/%2B80/x", 0, "", errInvalidPort},
	}
	for _, c := range cases {
		port, path, err := proxyTarget(c.in)
		if port != c.wantPort || path != c.wantPath || err != c.wantErr {
			t.Errorf("proxyTarget(%q) = %d, %q, %v; want %d, %q, %v", c.in, port, path, err, c.wantPort, c.wantPath, c.wantErr)
		}
	}
}

func FuzzProxyTarget(f *testing.F) {
	for _, s := range []string{"/proxy/8080/a%2Fb", "/proxy/", "/proxy/%38%30", "/proxy/65536/x", "/proxy/1//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		port, path, err := proxyTarget(in)
		if err != nil {
			return
		}
		if port < 1 || port > 65535 || !strings.HasPrefix(path, "/") {
			t.Fatalf("proxyTarget(%q) = %d, %q", in, port, path)
		}
		if !strings.HasSuffix(in, path[1:]) {
			t.Fatalf("proxyTarget(%q) path %q is not the rest of the input", in, path)
		}
	})
}

// selfPrefix is the path prefix under which Docker-style endpoints
// ({host}:{port}/proxy/44772) reach execd.
var selfPrefix = "/proxy/" + strconv.Itoa(api.ExecdPort)

// prefixed returns a client of the same server whose every request goes
// through execd's /proxy/{own port} prefix, as a client given the
// Docker-style endpoint sends it.
func prefixed(c *testClient) *testClient {
	p := *c
	p.base += selfPrefix
	return &p
}

// TestProxyToExecdItself: through the prefix the whole API works as
// without it, streams, uploads and WebSockets included; the token check is
// the same, and the path the handlers see is the one after the prefix.
func TestProxyToExecdItself(t *testing.T) {
	_, direct := newTestServer(t, func(cfg *Config) { cfg.Port = api.ExecdPort })
	c := prefixed(direct)
	c.call("GET", "/ping", nil, http.StatusOK, nil)

	t.Run("command stream", func(t *testing.T) {
		events := c.stream("/command", api.RunCommandRequest{Command: "echo through the proxy; echo err >&2; exit 3"})
		if got := outputOf(events, api.EventStdout); got != "through the proxy" {
			t.Fatalf("stdout through the prefix: %+v", events)
		}
		if got := outputOf(events, api.EventStderr); got != "err" {
			t.Fatalf("stderr through the prefix: %+v", events)
		}
		c.wantError("GET", "/command/status/nope", nil, http.StatusNotFound, api.CodeInvalidRequestBody)
	})

	t.Run("upload and download", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "through prefix.txt")
		if resp, body := c.upload(metaPart(meta(path)), filePart([]byte("uploaded via /proxy"))); resp.StatusCode != http.StatusOK {
			t.Fatalf("upload: %d %s", resp.StatusCode, body)
		}
		// Query and escaped characters survive the prefix being cut.
		resp, body := c.do(c.request(http.MethodGet, "/files/download?path="+url.QueryEscape(path), nil))
		if resp.StatusCode != http.StatusOK || string(body) != "uploaded via /proxy" {
			t.Fatalf("download: %d %q", resp.StatusCode, body)
		}
		var info map[string]api.FileInfo
		c.call("GET", "/files/info?path="+url.QueryEscape(path), nil, http.StatusOK, &info)
		if info[path].Size != int64(len("uploaded via /proxy")) {
			t.Fatalf("info: %+v", info)
		}
	})

	t.Run("pty websocket", func(t *testing.T) {
		id := createPTY(t, c, api.CreatePTYRequest{Cwd: t.TempDir()})
		p := dialPTY(t, c, id, "")
		p.shell("echo mark-$((40+2))", "mark-42")
		if st := ptyStatus(t, direct, id); !st.Running {
			t.Fatalf("the session seen without the prefix: %+v", st)
		}
	})

	t.Run("metrics stream", func(t *testing.T) {
		var m api.Metrics
		c.call("GET", "/metrics", nil, http.StatusOK, &m)
		if m.CPUCount <= 0 {
			t.Fatalf("metrics: %+v", m)
		}
		if lines := readWatch(t, c, 1); len(lines) != 1 {
			t.Fatalf("watch: %q", lines)
		}
	})

	t.Run("unknown route", func(t *testing.T) {
		for _, cl := range []*testClient{direct, c} {
			if resp, _ := cl.do(cl.request("GET", "/no/such/route", nil)); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("%s/no/such/route: %d, want 404", cl.base, resp.StatusCode)
			}
		}
	})
}

// TestProxyToExecdItselfNeedsToken: a missing or wrong token gets the same
// 401, byte for byte, with and without the prefix, before anything runs.
func TestProxyToExecdItselfNeedsToken(t *testing.T) {
	_, direct := newTestServer(t, func(cfg *Config) { cfg.Port = api.ExecdPort })
	marker := filepath.Join(t.TempDir(), "ran")
	for _, token := range []string{"", "wrong-token"} {
		var answers []string
		for _, cl := range []*testClient{direct, prefixed(direct)} {
			req := cl.request("POST", "/command", api.RunCommandRequest{Command: "touch " + marker})
			req.Header.Del(api.HeaderExecdToken)
			if token != "" {
				req.Header.Set(api.HeaderExecdToken, token)
			}
			resp, body := cl.do(req)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("%s with token %q: %d %s", req.URL.Path, token, resp.StatusCode, body)
			}
			answers = append(answers, resp.Header.Get("Content-Type")+"\n"+string(body))
		}
		if answers[0] != answers[1] {
			t.Fatalf("token %q: answer without the prefix %q, with it %q", token, answers[0], answers[1])
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a refused request ran its command: %v", err)
	}
}

// TestProxyToExecdItselfNested: the prefix is cut once; a second
// /proxy/{own port} is a 400 that names the problem, while a prefix for
// another port after it still reaches that port.
func TestProxyToExecdItselfNested(t *testing.T) {
	_, direct := newTestServer(t, func(cfg *Config) { cfg.Port = api.ExecdPort })
	c := prefixed(direct)
	for _, path := range []string{selfPrefix + "/ping", "/proxy/0" + strconv.Itoa(api.ExecdPort) + "/ping", selfPrefix} {
		resp, body := c.do(c.request("GET", path, nil))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "nested proxy prefix") {
			t.Fatalf("GET %s%s: %d %q, want 400 naming the nested prefix", c.base, path, resp.StatusCode, body)
		}
	}
	port, last := recorder(t)
	c.call("GET", "/proxy/"+port+"/app?q=1", nil, http.StatusCreated, nil)
	if got := last(); got.RequestURI != "/app?q=1" || got.Header.Get(api.HeaderExecdToken) != "" {
		t.Fatalf("through the prefix to another port, the backend saw %+v", got)
	}
}

// BenchmarkSelfPrefix measures what the /proxy/{own port} prefix adds to
// a request, in the handler, without the network's noise: compare the
// "prefixed" and "plain" figures.
func BenchmarkSelfPrefix(b *testing.B) {
	s, _ := newTestServer(b, func(cfg *Config) { cfg.Port = api.ExecdPort })
	h := s.Handler()
	for _, bc := range []struct{ name, path string }{{"plain", "/ping"}, {"prefixed", selfPrefix + "/ping"}} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", bc.path, nil)
			req.Header.Set(api.HeaderExecdToken, testToken)
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("GET %s: %d", bc.path, w.Code)
				}
			}
		})
	}
}
