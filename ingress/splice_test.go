package ingress

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/opensandbox/opensandbox/api"
)

// seeded writes n bytes of a seeded random stream to w, hashing them.
func seeded(w io.Writer, seed uint64, n int64, h hash.Hash) error {
	src := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	buf := make([]byte, 64<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		src.Read(buf[:k])
		if h != nil {
			h.Write(buf[:k])
		}
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func seededSum(seed uint64, n int64) string {
	h := sha256.New()
	seeded(io.Discard, seed, n, h)
	return hex.EncodeToString(h.Sum(nil))
}

// spliceBackend is a sandbox app for the zero-copy path's tests.
type spliceBackend struct {
	srv      *httptest.Server
	newConns atomic.Int64
	writeErr chan error    // /endless: the write error when the gateway let go
	ctxDone  chan struct{} // /stall: the request's context ended
}

func newSpliceBackend(t *testing.T) *spliceBackend {
	b := &spliceBackend{writeErr: make(chan error, 1), ctxDone: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	// /random?n=&seed=: n bytes, no Content-Type (the gateway sniffs it
	// as net/http would), hop-by-hop headers that must not pass.
	mux.HandleFunc("/random", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		seed, _ := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64)
		h := w.Header()
		h.Set("Content-Length", strconv.FormatInt(n, 10))
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set(api.HeaderRequestID, "backend-id")
		h.Add("Set-Cookie", "a=1")
		h.Add("Set-Cookie", "b=2")
		h.Set("X-App", "yes")
		if r.Method == http.MethodHead {
			return
		}
		seeded(w, seed, n, nil)
	})
	// /raw?n=: n bytes with a head of its own, without Content-Type.
	mux.HandleFunc("/raw", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-App: raw\r\n\r\n", n)
		if r.Method != http.MethodHead {
			brw.WriteString("<html><body>")
			seeded(brw, 11, n-12, nil)
		}
		brw.Flush()
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "small answer")
	})
	// /chunked?n=: n bytes without a length.
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Type", "application/octet-stream")
		http.NewResponseController(w).Flush()
		seeded(w, 7, n, nil)
	})
	// /dies: 8 MiB announced, 2 MiB sent, then the connection closes.
	mux.HandleFunc("/dies", func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 8388608\r\nContent-Type: application/octet-stream\r\n\r\n")
		seeded(brw, 3, 2<<20, nil)
		brw.Flush()
	})
	// /endless: 64 GiB announced, written until the gateway lets go.
	mux.HandleFunc("/endless", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(64<<30, 10))
		b.writeErr <- seeded(w, 5, 64<<30, nil)
	})
	// /stall: 64 MiB announced, 2 MiB sent, then nothing until the
	// request's context ends.
	mux.HandleFunc("/stall", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(64<<20, 10))
		seeded(w, 5, 2<<20, nil)
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		b.ctxDone <- struct{}{}
	})
	b.srv = httptest.NewUnstartedServer(mux)
	b.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			b.newConns.Add(1)
		}
	}
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	return b
}

const sbSplice = "splice-target"

// spliceFixture is a gateway (spliceMin as given) in front of a
// spliceBackend, reached as the public sandbox sbSplice.
func spliceFixture(t *testing.T, b *spliceBackend, spliceMin int64) *fixture {
	f := newFixture(t, func(c *Config) { c.SpliceMin = spliceMin })
	f.res.set(sbSplice, api.IngressTarget{State: "Running", Endpoint: strings.TrimPrefix(b.srv.URL, "http://"), Public: true})
	return f
}

func (f *fixture) spliceURL(p string) string { return f.srv.URL + "/" + sbSplice + "/80" + p }

func TestSpliceLargeDownloadByteExact(t *testing.T) {
	b := newSpliceBackend(t)
	f := spliceFixture(t, b, 0)
	size := int64(256 << 20)
	if testing.Short() {
		size = 64 << 20
	}
	resp, err := f.srv.Client().Get(f.spliceURL("/random?seed=42&n=" + strconv.FormatInt(size, 10)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	start := time.Now()
	n, err := io.CopyBuffer(h, resp.Body, make([]byte, 256<<10))
	if err != nil || n != size {
		t.Fatalf("got %d bytes, %v; want %d", n, err, size)
	}
	t.Logf("%d MiB in %v", size>>20, time.Since(start))
	if got, want := hex.EncodeToString(h.Sum(nil)), seededSum(42, size); got != want {
		t.Fatalf("body hash %s, want %s", got, want)
	}
	if !resp.Close { // Connection: close, which net/http takes out of the header
		t.Fatal("the answer did not take the zero-copy path")
	}
	if resp.ContentLength != size || resp.Header.Get(api.HeaderRequestID) == "backend-id" || resp.Header.Get("X-Hop") != "" {
		t.Fatalf("head %v", resp.Header)
	}

	// Metrics and the access log count it.
	waitFor(t, func() bool { return testutil.ToFloat64(f.gw.metrics.requests.WithLabelValues("2xx")) == 1 })
	if got := testutil.ToFloat64(f.gw.metrics.bytesOut); got != float64(size) {
		t.Fatalf("sent bytes metric %v, want %d", got, size)
	}
	if n, err := testutil.GatherAndCount(f.reg, "opensandbox_ingress_request_duration_seconds"); err != nil || n != 1 {
		t.Fatalf("duration series %d, %v", n, err)
	}
	line := accessLine(t, f, 0)
	if line["status"] != float64(200) || line["bytesOut"] != float64(size) || line["sandbox"] != sbSplice || line["err"] != nil {
		t.Fatalf("access log line %v", line)
	}
}

// accessLine returns the i-th access log line.
func accessLine(t *testing.T, f *fixture, i int) map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(f.logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "ingress" {
			lines = append(lines, m)
		}
	}
	if i >= len(lines) {
		t.Fatalf("no access log line %d:\n%s", i, f.logs.String())
	}
	return lines[i]
}

// Answers the zero-copy path does not take come from the same
// connection through the normal writer, keep the client connection, and
// the sandbox connection is reused.
func TestSpliceOtherAnswersRelayed(t *testing.T) {
	b := newSpliceBackend(t)
	f := spliceFixture(t, b, 0)
	c := f.srv.Client()
	get := func(p string) (*http.Response, []byte) {
		t.Helper()
		resp, err := c.Get(f.spliceURL(p))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	for range 5 {
		resp, body := get("/small")
		if resp.StatusCode != 200 || string(body) != "small answer" || resp.Close {
			t.Fatalf("small: %d %q close=%v", resp.StatusCode, body, resp.Close)
		}
	}
	if n := b.newConns.Load(); n != 1 {
		t.Fatalf("%d connections to the sandbox for 5 small answers in a row, want 1 (reused)", n)
	}
	for _, n := range []int64{100, 3 << 20} {
		resp, body := get("/chunked?n=" + strconv.FormatInt(n, 10))
		sum := sha256.Sum256(body)
		if resp.StatusCode != 200 || int64(len(body)) != n || hex.EncodeToString(sum[:]) != seededSum(7, n) ||
			resp.Close || len(resp.TransferEncoding) == 0 {
			t.Fatalf("chunked %d: %d, %d bytes, close=%v, TE %v", n, resp.StatusCode, len(body), resp.Close, resp.TransferEncoding)
		}
	}
	// Below the threshold: relayed.
	resp, body := get("/random?seed=1&n=1000")
	if sum := sha256.Sum256(body); resp.Close || hex.EncodeToString(sum[:]) != seededSum(1, 1000) {
		t.Fatalf("small random: close=%v, %d bytes", resp.Close, len(body))
	}
	// HEAD: the head of a large answer, no body, the connection kept.
	req, _ := http.NewRequest(http.MethodHead, f.spliceURL("/random?n=8388608"), nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != 8<<20 || resp.Close {
		t.Fatalf("HEAD: %d, length %d, close=%v", resp.StatusCode, resp.ContentLength, resp.Close)
	}
	// The gateway's own errors are untouched.
	resp, _ = get("/../x")
	if resp.StatusCode == 0 {
		t.Fatal("no answer")
	}
}

// rawHead sends one request on a new connection and returns the answer's
// head (the body is drained).
func rawHead(t *testing.T, base, method, p string) http.Header {
	h, _ := rawHeadClose(t, base, method, p)
	return h
}

// rawHeadClose is rawHead that also reports whether the answer said
// Connection: close.
func rawHeadClose(t *testing.T, base, method, p string) (http.Header, bool) {
	t.Helper()
	req, _ := http.NewRequest(method, base+"/"+sbSplice+"/80"+p, nil)
	req.Header.Set(api.HeaderRequestID, "client-chosen-id")
	req.Header.Set("Connection", "keep-alive, X-Client-Hop")
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h := resp.Header.Clone()
	h.Del("Date")
	h.Del("Connection")
	h.Set("Status", resp.Status)
	h.Set("Proto", resp.Proto)
	return h, resp.Close
}

// The zero-copy path writes the head the normal path writes, apart from
// Connection: close.
func TestSpliceHeadersMatchNormalPath(t *testing.T) {
	b := newSpliceBackend(t)
	fast := spliceFixture(t, b, 0)
	slow := spliceFixture(t, b, -1)
	for _, c := range []struct {
		method, path string
		spliced      bool
	}{
		{http.MethodGet, "/random?seed=9&n=2097152", true},
		{http.MethodHead, "/random?seed=9&n=2097152", false},
		{http.MethodGet, "/random?seed=9&n=100", false},
		{http.MethodGet, "/raw?n=2097152", true},
		{http.MethodGet, "/small", false},
	} {
		hf, closed := rawHeadClose(t, fast.srv.URL, c.method, c.path)
		hs := rawHead(t, slow.srv.URL, c.method, c.path)
		if closed != c.spliced {
			t.Fatalf("%s %s: Connection: close is %v, want %v (the zero-copy path)", c.method, c.path, closed, c.spliced)
		}
		if fmt.Sprint(hf) != fmt.Sprint(hs) {
			t.Fatalf("%s %s:\nzero-copy path %v\nnormal path    %v", c.method, c.path, hf, hs)
		}
		if hf.Get(api.HeaderRequestID) != "client-chosen-id" || hf.Get("X-Hop") != "" || hf.Get("Keep-Alive") != "" {
			t.Fatalf("%s %s: head %v", c.method, c.path, hf)
		}
	}
	waitFor(t, func() bool { return testutil.ToFloat64(fast.gw.metrics.requests.WithLabelValues("2xx")) == 5 })
	if got := testutil.ToFloat64(fast.gw.metrics.bytesOut); got != 2*2097152+100+float64(len("small answer")) {
		t.Fatalf("sent bytes %v", got)
	}
}

// A sandbox that dies in the middle of a body: the client gets a short
// body and a closed connection, not a hang.
func TestSpliceBackendDiesMidBody(t *testing.T) {
	b := newSpliceBackend(t)
	f := spliceFixture(t, b, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.spliceURL("/dies"), nil)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if ctx.Err() != nil {
		t.Fatal("the client hung")
	}
	if err == nil || n >= 8<<20 || !resp.Close {
		t.Fatalf("got %d bytes, err %v, close=%v; want a short body and an error", n, err, resp.Close)
	}
	waitFor(t, func() bool { return strings.Contains(f.logs.String(), "zero-copy body after") })
	if l := accessLine(t, f, 0); l["status"] != float64(200) || l["bytesOut"] != float64(n) {
		t.Fatalf("access log line %v after %d bytes", l, n)
	}
}

// A client that goes away in the middle of a body: the sandbox's
// connection is closed (whether the sandbox writes or is silent) and no
// goroutine stays.
func TestSpliceClientGoesAway(t *testing.T) {
	b := newSpliceBackend(t)
	f := spliceFixture(t, b, 0)
	// Warm up: the resolver cache and the servers' first goroutines.
	rawHead(t, f.srv.URL, http.MethodGet, "/small")
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()

	readSome := func(p string, n int64) {
		t.Helper()
		c, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /%s/80%s HTTP/1.1\r\nHost: gw\r\n\r\n", sbSplice, p)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Close {
			t.Fatalf("%s did not take the zero-copy path: %v", p, resp.Header)
		}
		if _, err := io.CopyN(io.Discard, resp.Body, n); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}

	readSome("/endless", 1<<20)
	select {
	case err := <-b.writeErr:
		if err == nil {
			t.Fatal("the sandbox wrote 64 GiB")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sandbox's connection stayed open after the client left")
	}
	readSome("/stall", 2<<20) // all it sends: the gateway waits on the sandbox
	select {
	case <-b.ctxDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the silent sandbox's connection stayed open after the client left")
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
	waitFor(t, func() bool { return strings.Count(f.logs.String(), `"msg":"ingress"`) == 3 })
	for i := range 2 {
		if l := accessLine(t, f, i+1); l["err"] == nil || l["status"] != float64(200) {
			t.Fatalf("access log line %v", l)
		}
	}
}
