package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
)

// The tests run the real osb-ingress binary. The lifecycle server is
// stood in for by an HTTP server that speaks the ingress routes of the
// protocol (api.IngressTargetsPath, api.IngressRenewPath): the server's
// own routes are tested in package lifecycle, and the end-to-end tests
// run the binary against the real server on Docker.

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "osb-ingress-test-")
	if err != nil {
		panic(err)
	}
	binPath = filepath.Join(dir, "osb-ingress")
	out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build osb-ingress: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// standIn serves the ingress routes of a lifecycle server with one
// running sandbox whose port is the backend.
type standIn struct {
	*httptest.Server
	mu      sync.Mutex
	targets map[string]api.IngressTarget
	renews  int
}

func newStandIn(t *testing.T, apiKey string) *standIn {
	s := &standIn{targets: map[string]api.IngressTarget{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.IngressTargetsPath+"{id}/{port}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.HeaderAPIKey) != apiKey {
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeInvalidAPIKey, Message: "bad key"})
			return
		}
		s.mu.Lock()
		tg, ok := s.targets[r.PathValue("id")+"/"+r.PathValue("port")]
		s.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "not found"})
			return
		}
		json.NewEncoder(w).Encode(tg)
	})
	mux.HandleFunc("POST "+api.IngressRenewPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.HeaderAPIKey) != apiKey {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		s.mu.Lock()
		s.renews++
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// backend is the sandbox's app: it answers the path it got and the
// headers it saw.
func newBackend(t *testing.T) *httptest.Server {
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"path": r.URL.Path, "header": r.Header})
	}))
	t.Cleanup(b.Close)
	return b
}

// gateway is a running osb-ingress.
type gateway struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
	logs    *lockedBuffer
	done    chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start runs the binary and waits until it listens.
func start(t *testing.T, env []string, args ...string) *gateway {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"--listen", "127.0.0.1:0", "--log-json"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &gateway{cmd: cmd, logs: &lockedBuffer{}, done: make(chan error, 1)}
	listening := make(chan map[string]any, 4)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			g.logs.Write(append(sc.Bytes(), '\n'))
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "listening" {
				listening <- m
			}
		}
		g.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-g.done
		if t.Failed() {
			t.Logf("osb-ingress log:\n%s", g.logs.String())
		}
	})
	want := 1
	for _, a := range args {
		if a == "--metrics-listen" {
			want = 2
		}
	}
	for range want {
		select {
		case m := <-listening:
			if m["listener"] == "metrics" {
				g.metrics = m["addr"].(string)
			} else {
				g.addr = m["addr"].(string)
			}
		case err := <-g.done:
			t.Fatalf("osb-ingress exited: %v\n%s", err, g.logs.String())
		case <-time.After(10 * time.Second):
			t.Fatalf("osb-ingress did not listen:\n%s", g.logs.String())
		}
	}
	return g
}

// sources returns the attributes of the one start-up line "finding
// sandboxes": where sandboxes are found, and where renewals go.
func (g *gateway) sources(t *testing.T) (from, renewals string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(g.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "finding sandboxes" {
			continue
		}
		n++
		from, _ = m["from"].(string)
		renewals, _ = m["renewals"].(string)
	}
	if n != 1 {
		t.Fatalf("%d start-up lines \"finding sandboxes\", want 1:\n%s", n, g.logs.String())
	}
	return from, renewals
}

func writeKeys(t *testing.T, path string, keys ...string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte("# signing key first\n"+strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, c *http.Client, url string, headers ...string) (int, string, *http.Response) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if strings.EqualFold(headers[i], "Host") {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp
}

// eventually retries f until it returns "" or 5 s pass.
func eventually(t *testing.T, f func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBinary(t *testing.T) {
	const id = "0b9f6a1e-3c1d-4a53-9d0e-6f2b8c7a9e10"
	backend := newBackend(t)
	srv := newStandIn(t, "server-key")
	srv.targets[id+"/8080"] = api.IngressTarget{SandboxID: id, Port: 8080, State: "Running",
		Endpoint: strings.TrimPrefix(backend.URL, "http://"), RenewExtendSeconds: 600}

	dir := t.TempDir()
	keyA, _ := ingress.GenerateKey('a')
	keyB, _ := ingress.GenerateKey('b')
	keysPath := filepath.Join(dir, "keys")
	writeKeys(t, keysPath, keyA)
	ka, _ := ingress.ParseKeys([]string{keyA})
	kb, _ := ingress.ParseKeys([]string{keyB})
	tokA, _ := ka.AccessToken(id)
	tokB, _ := kb.AccessToken(id)

	g := start(t, []string{"OSB_API_KEY=server-key"}, "--server", srv.URL, "--signing-keys-file", keysPath,
		"--domain", "sb.test", "--metrics-listen", "127.0.0.1:0", "--reload-every", "100ms")
	base := "http://" + g.addr
	c := &http.Client{}

	// The start-up log says the server is where sandboxes are found and
	// renewed, once.
	if from, renewals := g.sources(t); from != "the lifecycle server at "+srv.URL || renewals != from {
		t.Errorf("start-up log: finding sandboxes from %q, renewals to %q", from, renewals)
	}

	if code, body, _ := get(t, c, base+"/"+id+"/8080/hello", api.HeaderSecureAccess, tokA); code != 200 || !strings.Contains(body, `"path":"/hello"`) {
		t.Fatalf("token path route: %d %s", code, body)
	}
	if code, body, _ := get(t, c, base+"/"+id+"/8080/hello"); code != 401 || !strings.Contains(body, api.CodeIngressUnauthorized) {
		t.Fatalf("no auth: %d %s", code, body)
	}
	signed, _ := ka.SignedRoute(id, 8080, time.Now().Add(time.Hour), ingress.DNSLabelMax)
	if code, body, _ := get(t, c, base+"/sub", "Host", signed+".sb.test"); code != 200 || !strings.Contains(body, `"path":"/sub"`) {
		t.Fatalf("signed subdomain route: %d %s", code, body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body, _ := get(t, c, base+p); code != 200 {
			t.Fatalf("%s: %d %s", p, code, body)
		}
	}

	// h2c on the plain listener.
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	if code, _, resp := get(t, h2c, base+"/x", api.HeaderIngressTo, id+"-8080", api.HeaderSecureAccess, tokA); code != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("h2c: %d %s", code, resp.Proto)
	}

	// Renew-on-access reached the server.
	eventually(t, func() string {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if srv.renews != 1 {
			return fmt.Sprintf("%d renews, want 1", srv.renews)
		}
		return ""
	})

	// Rotation: b signs, a still verifies; found by the file's change.
	writeKeys(t, keysPath, keyB, keyA)
	eventually(t, func() string {
		if code, _, _ := get(t, c, base+"/"+id+"/8080/", api.HeaderSecureAccess, tokB); code != 200 {
			return fmt.Sprintf("new key's token: %d", code)
		}
		return ""
	})
	if code, _, _ := get(t, c, base+"/"+id+"/8080/", api.HeaderSecureAccess, tokA); code != 200 {
		t.Fatalf("old key's token during rotation: %d", code)
	}
	// a removed, and SIGHUP: its token stops working.
	writeKeys(t, keysPath, keyB)
	g.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, func() string {
		if code, _, _ := get(t, c, base+"/"+id+"/8080/", api.HeaderSecureAccess, tokA); code != 401 {
			return fmt.Sprintf("removed key's token: %d", code)
		}
		return ""
	})
	// A broken key file keeps the keys in use.
	os.WriteFile(keysPath, []byte("not a key\n"), 0o600)
	g.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	if code, _, _ := get(t, c, base+"/"+id+"/8080/", api.HeaderSecureAccess, tokB); code != 200 {
		t.Fatalf("after a broken key file: %d", code)
	}

	// Metrics on their own listener.
	code, body, _ := get(t, c, "http://"+g.metrics+"/metrics")
	if code != 200 || !strings.Contains(body, `opensandbox_ingress_requests_total{class="2xx"}`) ||
		!strings.Contains(body, "opensandbox_ingress_route_misses_total") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics: %d\n%s", code, body)
	}
	if code, _, _ := get(t, c, base+"/metrics"); code != 400 {
		t.Fatalf("/metrics on the gateway listener: %d, want 400 (no route)", code)
	}

	// The access log holds no token.
	if logs := g.logs.String(); strings.Contains(logs, tokA) || strings.Contains(logs, tokB) || !strings.Contains(logs, `"msg":"ingress"`) {
		t.Fatalf("access log:\n%s", logs)
	}

	// The server gone: not ready, and routes answer 503.
	srv.Close()
	if code, _, _ := get(t, c, base+"/readyz"); code != 503 {
		t.Fatalf("readyz without server: %d", code)
	}
	time.Sleep(1100 * time.Millisecond) // the cached answer expires
	if code, body, _ := get(t, c, base+"/"+id+"/8080/", api.HeaderSecureAccess, tokB); code != 503 || !strings.Contains(body, api.CodeIngressUnavailable) {
		t.Fatalf("without server: %d %s", code, body)
	}

	// SIGTERM: a clean exit.
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-g.done:
		g.done <- err
		if err != nil {
			t.Fatalf("exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
}

func TestBinaryTLS(t *testing.T) {
	const id = "tls-box"
	backend := newBackend(t)
	srv := newStandIn(t, "k")
	srv.targets[id+"/443"] = api.IngressTarget{SandboxID: id, Port: 443, State: "Running", Endpoint: strings.TrimPrefix(backend.URL, "http://")}
	dir := t.TempDir()
	certPEM, keyPEM, pool := selfSigned(t)
	os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600)
	key, _ := ingress.GenerateKey('a')
	writeKeys(t, filepath.Join(dir, "keys"), key)
	g := start(t, nil, "--server", srv.URL, "--api-key-file", writeFile(t, dir, "apikey", "k\n"),
		"--signing-keys-file", filepath.Join(dir, "keys"),
		"--tls-cert", filepath.Join(dir, "cert.pem"), "--tls-key", filepath.Join(dir, "key.pem"))
	ks, _ := ingress.ParseKeys([]string{key})
	route, _ := ks.SignedRoute(id, 443, time.Now().Add(time.Minute), 0)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	code, body, resp := get(t, c, "https://"+g.addr+"/x", api.HeaderIngressTo, route)
	if code != 200 || resp.ProtoMajor != 2 || !strings.Contains(body, `"X-Forwarded-Proto":["https"]`) {
		t.Fatalf("TLS: %d %s %s", code, resp.Proto, body)
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func selfSigned(t *testing.T) (certPEM, keyPEM []byte, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "osb-ingress test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(priv)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), pool
}

func TestParseFlags(t *testing.T) {
	env := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "say where sandboxes are"},
		{[]string{"--server", "http://x", "--tls-cert", "c"}, "go together"},
		{[]string{"--server", "http://x", "--renew-every", "0s"}, "positive"},
		{[]string{"--server", "http://x", "--log-level", "loud"}, "log-level"},
		{[]string{"--server", "http://x", "extra"}, "unexpected"},
	} {
		err := NewMain().ParseFlags(c.args, env, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseFlags(%q) = %v, want %q", c.args, err, c.want)
		}
	}
	m := NewMain()
	if err := m.ParseFlags([]string{"--server", "http://127.0.0.1:1"}, env, io.Discard); err != nil || m.Listen != ":8090" || m.source.name != "server" {
		t.Fatalf("defaults: %v %+v", err, m)
	}
	// A bad server URL fails at start, naming the flag.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m = NewMain()
	m.ParseFlags([]string{"--server", "127.0.0.1:8080", "--listen", "127.0.0.1:0"}, env, io.Discard)
	if err := m.Run(ctx); err == nil || !strings.Contains(err.Error(), "--server") {
		t.Fatalf("Run with a bad URL: %v", err)
	}
}
