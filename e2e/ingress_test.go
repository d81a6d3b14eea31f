package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sdk"
)

// ingressDomain is the domain of the gateway's subdomain routes. Names
// under .test are never resolved: the tests' clients dial them on
// loopback (ingressClient) and Chromium maps them there.
const ingressDomain = "sbx.test"

// ingressKey makes a signing key "ID:BASE64" with a fresh 32-byte secret.
func ingressKey(id byte) string {
	b := make([]byte, 32)
	rand.Read(b)
	return string(id) + ":" + base64.StdEncoding.EncodeToString(b)
}

// writeKeys writes a key file: one key a line, the signing key first.
func writeKeys(t *testing.T, keys ...string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "ingress-keys")
	if err := os.WriteFile(f, []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// ingressStack is a lifecycle server in gateway mode (with its own
// in-process gateway listener), the osb-ingress binary in front of it,
// and a sandbox running the app on appPort and appPort2.
type ingressStack struct {
	t      *testing.T
	s      *server
	gw     *gatewayProc
	gwAddr string // osb-ingress, the address the endpoint API names
	inproc string // the server's own [ingress] listen
	// metrics is the first osb-ingress's --metrics-listen.
	metrics string
	word    string // what the app's asset says
	app     string // the app's sandbox
	// created is the app's sandbox as it became Running, before any
	// traffic through the gateway.
	created api.Sandbox
	hc      *http.Client
}

// ingressServerConfig is the [ingress] table of a server whose endpoints
// go through the gateway at gwAddr in route mode mode, signing with the
// keys in keysFile, and that serves a gateway itself on inproc.
func ingressServerConfig(mode, gwAddr, inproc, keysFile string) string {
	_, port, _ := net.SplitHostPort(gwAddr)
	return fmt.Sprintf(`[ingress]
mode = "gateway"
route_mode = %q
address = %q
domain = %q
listen = %q
signing_keys_file = %q
`, mode, gwAddr, ingressDomain+":"+port, inproc, keysFile)
}

// startIngressStack starts the server (route mode mode, signing with
// keys), osb-ingress with the same keys, and the app's sandbox; it
// returns once the app answers through the gateway.
func startIngressStack(t *testing.T, mode string, create func(*api.CreateSandboxRequest), keys ...string) *ingressStack {
	t.Helper()
	testenv.MustHaveImage(t, pythonImage)
	st := &ingressStack{t: t, gwAddr: "127.0.0.1:" + strconv.Itoa(freePort(t)),
		inproc: "127.0.0.1:" + strconv.Itoa(freePort(t)), metrics: "127.0.0.1:" + strconv.Itoa(freePort(t)),
		word: randomHex(8), hc: ingressClient()}
	st.s = startServer(t, serverOptions{extra: ingressServerConfig(mode, st.gwAddr, st.inproc, writeKeys(t, keys...))})
	st.gw = startGateway(t, st.s, st.gwAddr, keys, "--metrics-listen", st.metrics)
	req := sandboxRequest(pythonImage, ingressAppCommand()...)
	req.Env = map[string]*string{"APP_WORD": &st.word}
	if create != nil {
		create(&req)
	}
	st.app = st.s.create(req)
	st.created = st.s.waitState(st.app, "Running")
	// The sandbox is Running when execd answers; the app may still be
	// starting behind it.
	tok := st.token(st.app)
	for _, port := range []int{appPort, appPort2} {
		var last string
		testwait.Until(t, fmt.Sprintf("the app on port %d to answer through the gateway", port), func() bool {
			resp, body := st.get(st.uri(st.app, port)+"/asset.json", api.HeaderSecureAccess, tok)
			last = resp.Status + " " + string(body)
			return resp.StatusCode == 200
		}, func() string { return "last answer: " + last + "\n" + st.gw.logs.String() })
	}
	return st
}

// reconfigure restarts the server with another route mode and key set;
// its sandboxes keep running.
func (st *ingressStack) reconfigure(mode string, keys ...string) {
	st.t.Helper()
	data, err := os.ReadFile(st.s.config)
	if err != nil {
		st.t.Fatal(err)
	}
	cfg := string(data)
	cfg = cfg[:strings.Index(cfg, "[ingress]")] + ingressServerConfig(mode, st.gwAddr, st.inproc, writeKeys(st.t, keys...))
	if err := os.WriteFile(st.s.config, []byte(cfg), 0o600); err != nil {
		st.t.Fatal(err)
	}
	st.s.stop(syscall.SIGTERM)
	st.s.start()
}

// endpoint asks the endpoint API for port of sandbox id (query: "" or
// "?expires=...").
func (st *ingressStack) endpoint(id string, port int, query string) api.Endpoint {
	st.t.Helper()
	var ep api.Endpoint
	st.s.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+strconv.Itoa(port)+query, nil, 200, &ep)
	if strings.Contains(ep.Endpoint, "://") {
		st.t.Fatalf("endpoint with a scheme: %+v", ep)
	}
	return ep
}

// token is sandbox id's access token, as the endpoint API hands it out.
func (st *ingressStack) token(id string) string {
	st.t.Helper()
	ep := st.endpoint(id, appPort, "")
	tok := ep.Headers[api.HeaderSecureAccess]
	if tok == "" {
		st.t.Fatalf("endpoint without %s: %+v", api.HeaderSecureAccess, ep)
	}
	return tok
}

// uri is the base URL of the path route to port of id on osb-ingress.
func (st *ingressStack) uri(id string, port int) string {
	return "http://" + st.gwAddr + "/" + id + "/" + strconv.Itoa(port)
}

// wildcard is the base URL of the subdomain route to port of id.
func (st *ingressStack) wildcard(route string) string {
	_, port, _ := net.SplitHostPort(st.gwAddr)
	return "http://" + route + "." + ingressDomain + ":" + port
}

// get sends GET url with the header pairs ("Host" sets the Host).
func (st *ingressStack) get(url string, header ...string) (*http.Response, []byte) {
	st.t.Helper()
	return st.send("GET", url, nil, header...)
}

func (st *ingressStack) send(method, url string, body io.Reader, header ...string) (*http.Response, []byte) {
	st.t.Helper()
	resp, data, err := st.trySend(method, url, body, header...)
	if err != nil {
		st.t.Fatal(err)
	}
	return resp, data
}

// trySend is send that returns a failed exchange as an error, the
// connection it used closed rather than reused.
func (st *ingressStack) trySend(method, url string, body io.Reader, header ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := st.hc.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, data, fmt.Errorf("%s %s: reading the body: %w", method, url, err)
	}
	return resp, data, nil
}

// viaEndpoint sends GET path to an endpoint the way clients do:
// "http://" + endpoint + path, with every header of the answer.
func (st *ingressStack) viaEndpoint(ep api.Endpoint, path string, header ...string) (*http.Response, []byte) {
	st.t.Helper()
	for k, v := range ep.Headers {
		header = append([]string{k, v}, header...)
	}
	return st.get("http://"+ep.Endpoint+path, header...)
}

// wantAsset checks that a request reached the app: its asset, with the
// sandbox's word.
func (st *ingressStack) wantAsset(what string, resp *http.Response, body []byte) {
	st.t.Helper()
	wantAppAsset(st.t, what, st.word, resp, body)
}

// wantAssetVia fetches the app's asset through an endpoint and checks it.
func (st *ingressStack) wantAssetVia(what string, ep api.Endpoint) {
	st.t.Helper()
	resp, body := st.viaEndpoint(ep, "/asset.json")
	st.wantAsset(what, resp, body)
}

// wantGatewayError checks a refusal: status and code in the lifecycle
// error envelope.
func wantGatewayError(t *testing.T, what string, resp *http.Response, body []byte, status int, code string) api.ErrorResponse {
	t.Helper()
	var e api.ErrorResponse
	if err := json.Unmarshal(body, &e); resp.StatusCode != status || err != nil || e.Code != code || e.Message == "" {
		t.Errorf("%s: %s %q, want %d %s in the error envelope", what, resp.Status, body, status, code)
	}
	return e
}

// ingressClient dials names under .test on loopback and refuses to dial
// any other name, so that no test ever resolves a real one.
func ingressClient() *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, loopbackAddr(addr))
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 16,
	}
	return &http.Client{Transport: tr, Timeout: time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// loopbackAddr maps host:port to 127.0.0.1:port for a .test host; an IP
// stays; any other name becomes an address that cannot be dialed.
func loopbackAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || net.ParseIP(host) != nil {
		return addr
	}
	if strings.HasSuffix(host, ".test") || host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return "name-not-dialed.invalid:" + port
}

// gatewayProc is an osb-ingress process in front of a server.
type gatewayProc struct {
	t      *testing.T
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	logs   *syncBuffer
}

// startGateway runs osb-ingress on addr with keys (the first signs),
// finding sandboxes through the server s, and waits until it is ready;
// extra are more flags. It is stopped when the test ends.
func startGateway(t *testing.T, s *server, addr string, keys []string, extra ...string) *gatewayProc {
	t.Helper()
	return startGatewayWith(t, s, addr, nil, keys, extra...)
}

// startGatewayWith is startGateway for a gateway that hc (with TLS)
// reaches; nil: plain HTTP.
func startGatewayWith(t *testing.T, s *server, addr string, hc *http.Client, keys []string, extra ...string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{t: t, addr: addr, logs: &syncBuffer{}, exited: make(chan struct{})}
	g.cmd = exec.Command(ingressBin, append([]string{
		"--listen", addr,
		"--server", s.base,
		"--signing-keys-file", writeKeys(t, keys...),
		"--domain", ingressDomain,
		"--renew-every", "60s",
	}, extra...)...)
	g.cmd.Env = append(os.Environ(), "OSB_API_KEY="+s.key)
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.cmd.Wait(); close(g.exited) }()
	t.Cleanup(func() {
		g.stop()
		if t.Failed() {
			t.Logf("osb-ingress on %s, log (tail):\n%s", addr, tail(g.logs.String(), 40))
		}
	})
	ready := "http://" + addr + "/readyz"
	if hc == nil {
		hc = http.DefaultClient
	} else {
		ready = "https://" + addr + "/readyz"
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := hc.Get(ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return g
			}
		}
		select {
		case <-g.exited:
			t.Fatalf("osb-ingress exited at start:\n%s", g.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("osb-ingress was not ready on %s:\n%s", addr, g.logs.String())
		}
	}
}

// testCert writes a self-signed certificate for 127.0.0.1 and every name
// under ingressDomain, and returns its files and a client that trusts it
// (and dials .test names on loopback).
func testCert(t *testing.T) (certFile, keyFile string, hc *http.Client) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "osb-ingress e2e"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"*." + ingressDomain},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tr := ingressClient().Transport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	tr.ForceAttemptHTTP2 = true
	return certFile, keyFile, &http.Client{Transport: tr, Timeout: time.Minute}
}

// stop ends the process and waits for it.
func (g *gatewayProc) stop() {
	select {
	case <-g.exited:
		return
	default:
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		g.cmd.Process.Kill()
		<-g.exited
	}
}

// rss is the process's resident memory in bytes.
func (g *gatewayProc) rss() (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(g.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", g.cmd.Process.Pid)
}

// signedParts splits a signed uri endpoint "{addr}/{id}/{port}/{exp}/{sig}".
func signedParts(t *testing.T, endpoint string) (addr, id, port, exp, sig string) {
	t.Helper()
	p := strings.Split(endpoint, "/")
	if len(p) != 5 {
		t.Fatalf("signed uri endpoint %q: want {address}/{id}/{port}/{expires}/{signature}", endpoint)
	}
	return p[0], p[1], p[2], p[3], p[4]
}

// tamper changes the character at i of s to another one of the same
// alphabet.
func tamper(s string, i int) string {
	c := byte('a')
	if s[i] == 'a' {
		c = 'b'
	}
	return s[:i] + string(c) + s[i+1:]
}

func expiresIn(d time.Duration) string {
	return "?expires=" + strconv.FormatInt(time.Now().Add(d).Unix(), 10)
}

// TestIngressGateway drives the real server in gateway mode and the real
// osb-ingress binary in front of it, on Docker, with a web app in a
// sandbox: every route form, signed routes and their expiry, every
// refusal, key rotation, WebSocket, SSE, a 1 GiB download with bounded
// gateway memory, HTTP/2 without TLS, renew-on-access, the server's own
// gateway listener and the SDK's signed endpoints.
func TestIngressGateway(t *testing.T) {
	keyA, keyB := ingressKey('a'), ingressKey('b')
	timeout := int64(120)
	st := startIngressStack(t, "uri", func(r *api.CreateSandboxRequest) {
		r.Timeout = &timeout
		r.Extensions = map[string]string{api.ExtensionRenewExtend: "300"}
	}, keyA)
	s, id, created := st.s, st.app, st.created
	if created.ExpiresAt == nil || created.ExpiresAt.After(time.Now().Add(time.Duration(timeout)*time.Second)) {
		t.Fatalf("the sandbox was created with expiry %v, want within %d s", created.ExpiresAt, timeout)
	}
	other := s.create(sandboxRequest(busyboxImage, "sleep", "infinity"))
	publicReq := sandboxRequest(busyboxImage, "sleep", "infinity")
	publicReq.Extensions = map[string]string{api.ExtensionIngressPublic: "true"}
	public := s.create(publicReq)
	s.waitState(other, "Running")
	s.waitState(public, "Running")

	// The endpoint API in uri mode: the gateway's address, the route in
	// the path, the sandbox's access token.
	ep := st.endpoint(id, appPort, "")
	tok := ep.Headers[api.HeaderSecureAccess]
	if ep.Endpoint != st.gwAddr+"/"+id+"/"+strconv.Itoa(appPort) || tok == "" || len(ep.Headers) != 1 {
		t.Fatalf("uri endpoint %+v, want %s/%s/%d with the access token only", ep, st.gwAddr, id, appPort)
	}
	otherTok := st.token(other)
	if otherTok == tok {
		t.Fatalf("two sandboxes have the same access token %q", tok)
	}

	// Renew on access: the app's traffic moved the expiry from
	// createdAt+120s to about now+300s.
	var renewed time.Time
	testwait.Until(t, "traffic through the gateway to renew the sandbox", func() bool {
		var sb api.Sandbox
		s.call("GET", "/v1/sandboxes/"+id, nil, 200, &sb)
		if sb.ExpiresAt != nil && sb.ExpiresAt.After(created.ExpiresAt.Add(150*time.Second)) {
			renewed = *sb.ExpiresAt
			return true
		}
		return false
	}, func() string { return fmt.Sprintf("created with expiry %v", created.ExpiresAt) })
	renewedAt := time.Now()
	if d := time.Until(renewed); d < 250*time.Second || d > 301*time.Second {
		t.Errorf("renewed to %v, %v from now; want about 300 s", renewed, d)
	}

	section(t, "routes", func() {
		st.wantAssetVia("uri endpoint", ep)
		hdr := func(route string) []string {
			return []string{api.HeaderIngressTo, route, api.HeaderSecureAccess, tok}
		}
		route := id + "-" + strconv.Itoa(appPort)
		resp, body := st.get("http://"+st.gwAddr+"/asset.json", hdr(route)...)
		st.wantAsset("header route", resp, body)
		resp, body = st.get("http://"+st.gwAddr+"/asset.json", api.HeaderIngressLegacy, route, api.HeaderSecureAccess, tok)
		st.wantAsset("legacy header route", resp, body)
		resp, body = st.get(st.wildcard(route)+"/asset.json", api.HeaderSecureAccess, tok)
		st.wantAsset("subdomain route", resp, body)
		// The same, the Host naming the route on a request to the
		// gateway's address.
		resp, body = st.get("http://"+st.gwAddr+"/asset.json", "Host", route+"."+ingressDomain, api.HeaderSecureAccess, tok)
		st.wantAsset("subdomain route in Host", resp, body)

		// Each form reaches the port it names, with the path and query
		// after the route.
		seen := func(what string, resp *http.Response, body []byte) appRequest {
			t.Helper()
			var r appRequest
			if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil {
				t.Fatalf("%s: %s %q", what, resp.Status, body)
			}
			return r
		}
		for _, c := range []struct {
			name string
			url  string
			hdr  []string
			port int
		}{
			{"uri", st.uri(id, appPort2) + "/headers?q=1", []string{api.HeaderSecureAccess, tok}, appPort2},
			{"header", "http://" + st.gwAddr + "/headers?q=1", hdr(id + "-" + strconv.Itoa(appPort2)), appPort2},
			{"subdomain", st.wildcard(id+"-"+strconv.Itoa(appPort2)) + "/headers?q=1", []string{api.HeaderSecureAccess, tok}, appPort2},
			{"uri 8080", st.uri(id, appPort) + "/headers?q=1", []string{api.HeaderSecureAccess, tok}, appPort},
		} {
			resp, body := st.get(c.url, c.hdr...)
			r := seen(c.name, resp, body)
			if r.Port != c.port || r.Path != "/headers?q=1" {
				t.Errorf("%s route: the app on port %d saw %q, want port %d and /headers?q=1", c.name, r.Port, r.Path, c.port)
			}
		}

		// What reaches the app: no route header, no token; the forwarded
		// headers; the caller's request id.
		rid := randomHex(16)
		resp, body = st.get("http://"+st.gwAddr+"/headers", append(hdr(route), api.HeaderRequestID, rid)...)
		r := seen("headers", resp, body)
		for _, h := range []string{api.HeaderIngressTo, api.HeaderIngressLegacy, api.HeaderSecureAccess} {
			if v := r.header(h); v != "" {
				t.Errorf("the app got %s: %q", h, v)
			}
		}
		if r.header("X-Forwarded-For") == "" || r.header("X-Forwarded-Host") != st.gwAddr || r.header("X-Forwarded-Proto") != "http" {
			t.Errorf("forwarded headers: %v", r.Headers)
		}
		if got := r.header(api.HeaderRequestID); got != rid {
			t.Errorf("the app got request id %q, want %q", got, rid)
		}

		// A body goes up and comes back whole.
		up := make([]byte, 3<<20)
		rand.Read(up)
		//
		// One CI run (1 of about 7) saw this echo cut short: the gateway
		// relayed 2.3 of 3 MiB and the response ended early (the client
		// read an unexpected EOF, nothing was passed off as whole). Until
		// its cause (the gateway, Docker's port proxy or the app) is
		// found, a cut echo is logged and tried once more on a new
		// connection; a second cut, or any wrong byte, fails.
		for try := 1; ; try++ {
			resp, body, err := st.trySend("POST", st.uri(id, appPort)+"/echo", bytes.NewReader(up), api.HeaderSecureAccess, tok)
			if err != nil && try == 1 {
				t.Logf("POST 3 MiB, first try cut short (tried again): %v", err)
				continue
			}
			if err != nil || resp.StatusCode != 200 || !bytes.Equal(body, up) {
				t.Errorf("POST 3 MiB: %v, %d bytes back (equal %v), %v", resp, len(body), bytes.Equal(body, up), err)
			}
			break
		}
	})

	// Signed routes from the endpoint API: no token needed, valid until
	// they expire, bound to their sandbox, port and expiry.
	var signedA api.Endpoint
	section(t, "signed", func() {
		signedA = st.endpoint(id, appPort, expiresIn(time.Hour))
		addr, sid, port, exp, sig := signedParts(t, signedA.Endpoint)
		if addr != st.gwAddr || sid != id || port != strconv.Itoa(appPort) || len(signedA.Headers) != 0 {
			t.Fatalf("signed uri endpoint %+v", signedA)
		}
		if sig[len(sig)-1] != 'a' {
			t.Errorf("signature %q: want it made with key a", sig)
		}
		st.wantAssetVia("signed uri route", signedA)
		// The same signed route in the header and in a subdomain.
		signedRoute := id + "-" + port + "-" + exp + "-" + sig
		resp, body := st.get("http://"+st.gwAddr+"/asset.json", api.HeaderIngressTo, signedRoute)
		st.wantAsset("signed header route", resp, body)

		// A link that expires in 2 s works now and not once it expired.
		short := st.endpoint(id, appPort, expiresIn(2*time.Second))
		st.wantAssetVia("short-lived signed route", short)
		_, _, _, shortExp, _ := signedParts(t, short.Endpoint)
		secs, _ := strconv.ParseInt(shortExp, 36, 64)
		time.Sleep(time.Until(time.Unix(secs, 0).Add(100 * time.Millisecond)))
		resp, body = st.viaEndpoint(short, "/asset.json")
		wantGatewayError(t, "expired signed route", resp, body, 401, api.CodeIngressUnauthorized)

		expPlus := strconv.FormatInt(mustParse36(t, exp)+60, 36)
		for _, c := range []struct{ name, url string }{
			{"tampered signature", st.uri(id, appPort) + "/" + exp + "/" + tamper(sig, 3) + "/asset.json"},
			{"later expiry", st.uri(id, appPort) + "/" + expPlus + "/" + sig + "/asset.json"},
			{"another port", st.uri(id, appPort2) + "/" + exp + "/" + sig + "/asset.json"},
			{"another sandbox", st.uri(other, appPort) + "/" + exp + "/" + sig + "/asset.json"},
			{"unknown key", st.uri(id, appPort) + "/" + exp + "/" + sig[:len(sig)-1] + "z/asset.json"},
			{"cut signature", st.uri(id, appPort) + "/" + exp + "/" + sig[:8] + "a/asset.json"},
		} {
			resp, body := st.get(c.url)
			wantGatewayError(t, c.name, resp, body, 401, api.CodeIngressUnauthorized)
		}
		resp, body = st.get("http://"+st.gwAddr+"/asset.json", api.HeaderIngressTo, id+"-"+port+"-"+exp+"-"+tamper(sig, 0))
		wantGatewayError(t, "tampered signed header route", resp, body, 401, api.CodeIngressUnauthorized)
	})

	section(t, "refusals", func() {
		unknown := "00000000-0000-4000-8000-" + randomHex(6)
		for _, c := range []struct {
			name string
			url  string
			hdr  []string
		}{
			{"no auth", st.uri(id, appPort) + "/asset.json", nil},
			{"no auth, header route", "http://" + st.gwAddr + "/asset.json", []string{api.HeaderIngressTo, id + "-8080"}},
			{"no auth, subdomain", st.wildcard(id+"-8080") + "/asset.json", nil},
			{"no auth, unknown sandbox", st.uri(unknown, appPort) + "/", nil},
			{"wrong token", st.uri(id, appPort) + "/asset.json", []string{api.HeaderSecureAccess, tamper(tok, 5)}},
			{"empty-ish token", st.uri(id, appPort) + "/asset.json", []string{api.HeaderSecureAccess, "a"}},
			{"another sandbox's token", st.uri(id, appPort) + "/asset.json", []string{api.HeaderSecureAccess, otherTok}},
			{"token of the sandbox, unknown sandbox", st.uri(unknown, appPort) + "/", []string{api.HeaderSecureAccess, tok}},
		} {
			resp, body := st.get(c.url, c.hdr...)
			wantGatewayError(t, c.name, resp, body, 401, api.CodeIngressUnauthorized)
		}
		for _, c := range []struct {
			name string
			url  string
			hdr  []string
		}{
			{"header without a port", "http://" + st.gwAddr + "/", []string{api.HeaderIngressTo, "garbage", api.HeaderSecureAccess, tok}},
			{"port not a number", "http://" + st.gwAddr + "/", []string{api.HeaderIngressTo, id + "-http", api.HeaderSecureAccess, tok}},
			{"port 0", "http://" + st.gwAddr + "/", []string{api.HeaderIngressTo, id + "-0", api.HeaderSecureAccess, tok}},
			{"port 70000", "http://" + st.gwAddr + "/", []string{api.HeaderIngressTo, id + "-70000", api.HeaderSecureAccess, tok}},
			{"path port not a number", "http://" + st.gwAddr + "/" + id + "/http/", []string{api.HeaderSecureAccess, tok}},
			{"no route at all", "http://" + st.gwAddr + "/index.html", nil},
		} {
			resp, body := st.get(c.url, c.hdr...)
			wantGatewayError(t, c.name, resp, body, 400, api.CodeIngressInvalidRoute)
		}
		// A sandbox made public is served without credentials: nothing
		// listens on its port, so the sandbox's own answer (the gateway's
		// 502) and not a 401. Its neighbours stay private.
		resp, body := st.get(st.uri(public, appPort) + "/")
		wantGatewayError(t, "public sandbox without credentials", resp, body, 502, api.CodeIngressBadGateway)
		resp, body = st.get(st.uri(other, appPort) + "/")
		wantGatewayError(t, "private sandbox beside a public one", resp, body, 401, api.CodeIngressUnauthorized)

		// Nothing listens on the other sandbox's published app port: the
		// gateway's own 502.
		resp, body = st.get(st.uri(other, appPort)+"/", api.HeaderSecureAccess, otherTok)
		wantGatewayError(t, "nothing on the port", resp, body, 502, api.CodeIngressBadGateway)

		// Authenticated, the sandbox paused: 503 saying so; deleted: 404.
		s.call("POST", "/v1/sandboxes/"+other+"/pause", nil, 202, nil)
		s.waitState(other, "Paused")
		// The gateway may hold the sandbox's last answer for a moment.
		testwait.Until(t, "the gateway to see the sandbox paused", func() bool {
			resp, _ := st.get(st.uri(other, appPort)+"/", api.HeaderSecureAccess, otherTok)
			return resp.StatusCode == 503
		}, nil)
		resp, body = st.get(st.uri(other, appPort)+"/", api.HeaderSecureAccess, otherTok)
		if e := wantGatewayError(t, "paused sandbox", resp, body, 503, api.CodeIngressSandboxNotRunning); !strings.Contains(e.Message, "Paused") {
			t.Errorf("paused sandbox: message %q does not say it is Paused", e.Message)
		}
		s.call("DELETE", "/v1/sandboxes/"+other, nil, 204, nil)
		s.waitGone(other)
		testwait.Until(t, "the gateway to see the deleted sandbox gone", func() bool {
			resp, _ := st.get(st.uri(other, appPort)+"/", api.HeaderSecureAccess, otherTok)
			return resp.StatusCode == 404
		}, nil)
		resp, body = st.get(st.uri(other, appPort)+"/", api.HeaderSecureAccess, otherTok)
		wantGatewayError(t, "deleted sandbox", resp, body, 404, api.CodeIngressSandboxNotFound)
		// Nothing listens on this port in the app's sandbox: execd's
		// forwarder says so, and the gateway passes its answer on.
		resp, body = st.get(st.uri(id, 9999)+"/", api.HeaderSecureAccess, tok)
		if resp.StatusCode != 502 {
			t.Errorf("closed port through execd's forwarder: %s %q, want 502", resp.Status, body)
		}
	})

	section(t, "streams", func() {
		// SSE: each event arrives when the app sends it, not at the end.
		wantSSE(t, st.hc, "token", st.uri(id, appPort), http.Header{api.HeaderSecureAccess: {tok}}, 4, 400*time.Millisecond)

		// WebSocket echo, with the token and through a signed link.
		for _, c := range []struct {
			name, url string
			header    http.Header
		}{
			{"token", "ws://" + st.gwAddr + "/" + id + "/" + strconv.Itoa(appPort) + "/ws", http.Header{api.HeaderSecureAccess: {tok}}},
			{"signed link", "ws://" + signedA.Endpoint + "/ws", nil},
			{"subdomain, port through execd", "ws" + strings.TrimPrefix(st.wildcard(id+"-"+strconv.Itoa(appPort2)), "http") + "/ws", http.Header{api.HeaderSecureAccess: {tok}}},
		} {
			wsEcho(t, st.hc, c.name, c.url, c.header)
		}

		// execd's PTY WebSocket, through the gateway: in gateway mode
		// execd's endpoint is the gateway too, which adds execd's token.
		execd := st.endpoint(id, api.ExecdPort, "")
		if execd.Endpoint != st.gwAddr+"/"+id+"/"+execdPort || execd.Headers[api.HeaderExecdToken] != "" {
			t.Fatalf("execd endpoint in gateway mode %+v: want the gateway, without execd's token", execd)
		}
		pty, _ := json.Marshal(api.CreatePTYRequest{Cwd: "/tmp"})
		resp, body := st.send("POST", "http://"+execd.Endpoint+"/pty", bytes.NewReader(pty), api.HeaderSecureAccess, tok, "Content-Type", "application/json")
		var sess api.PTYSession
		if resp.StatusCode != 201 || json.Unmarshal(body, &sess) != nil {
			t.Fatalf("POST /pty through the gateway: %s %q", resp.Status, body)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		conn, _, err := websocket.Dial(ctx, "ws://"+execd.Endpoint+"/pty/"+sess.SessionID+"/ws",
			&websocket.DialOptions{HTTPClient: st.hc, HTTPHeader: http.Header{api.HeaderSecureAccess: {tok}}})
		if err != nil {
			t.Fatalf("PTY WebSocket through the gateway: %v", err)
		}
		defer conn.CloseNow()
		conn.Write(ctx, websocket.MessageBinary, append([]byte{api.PTYFrameStdin}, "echo pty-$((6*7))\n"...))
		var screen strings.Builder
		for !strings.Contains(screen.String(), "pty-42") {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("PTY through the gateway: %v; screen %q", err, screen.String())
			}
			if typ == websocket.MessageBinary && len(data) > 0 && data[0] == api.PTYFrameStdout {
				screen.Write(data[1:])
			}
		}
	})

	section(t, "h2c", func() {
		hc := h2cClient(st.hc.Transport.(*http.Transport))
		for _, url := range []string{st.uri(id, appPort) + "/asset.json", "http://" + signedA.Endpoint + "/asset.json"} {
			resp, body := getH2(t, hc, url, http.Header{api.HeaderSecureAccess: {tok}})
			st.wantAsset("h2c "+url, resp, body)
		}
	})

	// HTTP/2 over TLS: a second osb-ingress with a certificate.
	section(t, "tls", func() {
		cert, key, hc := testCert(t)
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		g := startGatewayWith(t, s, addr, hc, []string{keyA}, "--tls-cert", cert, "--tls-key", key)
		defer g.stop()
		_, port, _ := net.SplitHostPort(addr)
		for _, url := range []string{
			"https://" + addr + "/" + id + "/8080/asset.json",
			"https://" + id + "-8080." + ingressDomain + ":" + port + "/asset.json",
		} {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set(api.HeaderSecureAccess, tok)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", url, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.ProtoMajor != 2 || resp.TLS == nil {
				t.Errorf("GET %s answered in %s (TLS %v), want HTTP/2 over TLS", url, resp.Proto, resp.TLS != nil)
			}
			st.wantAsset("TLS "+url, resp, body)
		}
	})

	section(t, "download", func() {
		hc := &http.Client{Transport: st.hc.Transport, Timeout: 2 * time.Minute}
		wantBoundedDownload(t, hc, st.uri(id, appPort), http.Header{api.HeaderSecureAccess: {tok}}, st.gw.rss, 20*time.Millisecond)
	})

	// The expiry moved once: traffic since (every subtest above) did not
	// renew again within the throttle period.
	section(t, "renew throttled", func() {
		if time.Since(renewedAt) < 2*time.Second {
			time.Sleep(2*time.Second - time.Since(renewedAt))
		}
		st.wantAssetVia("one more request", ep)
		time.Sleep(300 * time.Millisecond)
		var sb api.Sandbox
		s.call("GET", "/v1/sandboxes/"+id, nil, 200, &sb)
		if sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(renewed) {
			t.Errorf("expiry %v after more traffic, want %v (renewed at most once a minute)", sb.ExpiresAt, renewed)
		}
	})

	// The server's own gateway listener serves the same routes.
	section(t, "in-process", func() {
		resp, body := st.get("http://"+st.inproc+"/asset.json", api.HeaderIngressTo, id+"-8080", api.HeaderSecureAccess, tok)
		st.wantAsset("in-process header route", resp, body)
		_, _, _, exp, sig := signedParts(t, signedA.Endpoint)
		resp, body = st.get("http://" + st.inproc + "/" + id + "/8080/" + exp + "/" + sig + "/asset.json")
		st.wantAsset("in-process signed uri route", resp, body)
		_, port, _ := net.SplitHostPort(st.inproc)
		resp, body = st.get("http://"+id+"-8080."+ingressDomain+":"+port+"/asset.json", api.HeaderSecureAccess, tok)
		st.wantAsset("in-process subdomain route", resp, body)
		resp, body = st.get("http://" + st.inproc + "/" + id + "/8080/asset.json")
		wantGatewayError(t, "in-process, no auth", resp, body, 401, api.CodeIngressUnauthorized)
	})

	// The SDK asks for a signed endpoint and reaches the app through it.
	section(t, "sdk", func() {
		c, err := sdk.NewClient(sdk.Config{Domain: s.listen, APIKey: s.key, RequestTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sep, err := c.Sandbox(id).Endpoint(t.Context(), appPort, sdk.WithExpiry(10*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		_, _, _, exp, _ := signedParts(t, sep.Endpoint)
		if left := time.Until(time.Unix(mustParse36(t, exp), 0)); left < 9*time.Minute || left > 11*time.Minute || len(sep.Headers) != 0 {
			t.Errorf("SDK signed endpoint %+v expires in %v, want 10 min and no headers", sep, left)
		}
		st.wantAssetVia("SDK signed endpoint", *sep)
		// The SDK, unchanged, runs a command through the gateway: execd's
		// endpoint is a gateway route with the access token.
		ex, err := c.Sandbox(id).Run(t.Context(), "echo via-gateway-$((6*7))", nil)
		if err != nil || ex.ExitCode != 0 || strings.TrimSpace(ex.Stdout) != "via-gateway-42" {
			t.Errorf("SDK command through the gateway: %+v, %v", ex, err)
		}
	})

	// What the gateway counted of all this, and that its log holds no
	// credential.
	section(t, "metrics and log", func() {
		values, err := scrapeMetrics(st.hc, "http://"+st.metrics+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			series string
			min    float64
		}{
			{`opensandbox_ingress_requests_total{class="2xx"}`, 20},
			{`opensandbox_ingress_requests_total{class="4xx"}`, 20},
			{`opensandbox_ingress_requests_total{class="5xx"}`, 3},
			{`opensandbox_ingress_sent_bytes_total`, 1 << 30},
			{`opensandbox_ingress_received_bytes_total`, 3 << 20},
			{`opensandbox_ingress_route_misses_total{reason="invalid_route"}`, 6},
			{`opensandbox_ingress_route_misses_total{reason="unauthorized"}`, 15},
			{`opensandbox_ingress_route_misses_total{reason="not_found"}`, 1},
			{`opensandbox_ingress_route_misses_total{reason="not_running"}`, 1},
			{`opensandbox_ingress_route_misses_total{reason="upstream"}`, 2},
		} {
			if v, ok := values[c.series]; !ok || v < c.min {
				t.Errorf("metrics: %s = %v (present %v), want at least %v", c.series, v, ok, c.min)
			}
		}
		_, _, _, _, sig := signedParts(t, signedA.Endpoint)
		log := st.gw.logs.String()
		if !strings.Contains(log, id) {
			t.Errorf("the access log does not name the sandbox:\n%s", tail(log, 10))
		}
		for what, secret := range map[string]string{"access token": tok, "other token": otherTok, "signature": sig} {
			if strings.Contains(log, secret) {
				t.Errorf("the gateway's log holds the %s", what)
			}
		}
	})

	// Key rotation: a gateway with a new signing key and the old one
	// still honours the old key's links; without the old key, not.
	section(t, "rotation", func() {
		st.gw.stop()
		st.gw = startGateway(t, s, st.gwAddr, []string{keyB, keyA})
		st.wantAssetVia("old link, both keys", signedA)

		// The server signs with the new key now; header mode.
		st.reconfigure("header", keyB, keyA)
		hep := st.endpoint(id, appPort, "")
		newTok := hep.Headers[api.HeaderSecureAccess]
		if hep.Endpoint != st.gwAddr || hep.Headers[api.HeaderIngressTo] != id+"-8080" || newTok == "" || len(hep.Headers) != 2 {
			t.Fatalf("header endpoint %+v, want %s with the route and the access token", hep, st.gwAddr)
		}
		st.wantAssetVia("header endpoint", hep)
		signedB := st.endpoint(id, appPort, expiresIn(time.Hour))
		route := signedB.Headers[api.HeaderIngressTo]
		if signedB.Endpoint != st.gwAddr || len(signedB.Headers) != 1 || !strings.HasPrefix(route, id+"-8080-") || !strings.HasSuffix(route, "b") {
			t.Fatalf("signed header endpoint %+v, want the route signed with key b and no token", signedB)
		}
		st.wantAssetVia("signed header endpoint", signedB)

		st.gw.stop()
		st.gw = startGateway(t, s, st.gwAddr, []string{keyB})
		resp, body := st.viaEndpoint(signedA, "/asset.json")
		wantGatewayError(t, "old link, old key removed", resp, body, 401, api.CodeIngressUnauthorized)
		resp, body = st.get(st.uri(id, appPort)+"/asset.json", api.HeaderSecureAccess, tok)
		wantGatewayError(t, "token of the old key, old key removed", resp, body, 401, api.CodeIngressUnauthorized)
		st.wantAssetVia("new link, new key only", signedB)
		st.wantAssetVia("new token, new key only", hep)

		// Wildcard mode: the route is the first label of the host.
		st.reconfigure("wildcard", keyB)
		_, gwPort, _ := net.SplitHostPort(st.gwAddr)
		wep := st.endpoint(id, appPort, "")
		if want := id + "-8080." + ingressDomain + ":" + gwPort; wep.Endpoint != want || wep.Headers[api.HeaderSecureAccess] == "" {
			t.Fatalf("wildcard endpoint %+v, want %s with the access token", wep, want)
		}
		st.wantAssetVia("wildcard endpoint", wep)
		sw := st.endpoint(id, appPort, expiresIn(time.Hour))
		label, _, _ := strings.Cut(sw.Endpoint, ".")
		if len(label) > 63 || !strings.HasPrefix(label, id+"-8080-") || len(sw.Headers) != 0 {
			t.Fatalf("signed wildcard endpoint %+v: want a route of at most 63 characters, no headers", sw)
		}
		st.wantAssetVia("signed wildcard endpoint", sw)
	})
}

func mustParse36(t *testing.T, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(s, 36, 64)
	if err != nil {
		t.Fatalf("expiry %q: %v", s, err)
	}
	return v
}

// section runs one part of a long test that shares its sandboxes and
// processes with the other parts, saying in the log which part failed.
// (Subtests would have their own t, which the shared helpers, bound to
// the test's, must not be failed through.)
func section(t *testing.T, name string, f func()) {
	t.Helper()
	failed, start := t.Failed(), time.Now()
	f()
	if t.Failed() && !failed {
		t.Logf("section %q failed", name)
	}
	t.Logf("section %s: %v", name, time.Since(start).Round(time.Millisecond))
}
