package proxy

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// waitFor bounds every wait in these tests; generous for a loaded machine.
const waitFor = 30 * time.Second

// The test's small internet on loopback. Every server of a test listens
// on the same port on its own address, because the proxy dials a name
// on the original destination's port.
var (
	addrAllowed = netip.MustParseAddr("127.0.0.2") // allowed.test
	addrDenied  = netip.MustParseAddr("127.0.0.3") // denied.test
	addrOther   = netip.MustParseAddr("127.0.0.4") // no name; learned or not per test
	addrBlocked = netip.MustParseAddr("127.0.0.5") // rebind.test: allowed name, refused address
)

// testDecider allows the names in names; Resolved accepts loopback
// addresses other than those in blocked, so the tests can run on
// 127.0.0.0/8; Addr allows only the addresses in addrs.
type testDecider struct {
	mu      sync.Mutex
	names   map[string]bool
	addrs   map[netip.Addr]bool
	blocked map[netip.Addr]bool
}

func (d *testDecider) Name(n string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.names[n]
}

func (d *testDecider) Resolved(a netip.Addr) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return a.IsLoopback() && !d.blocked[a]
}

func (d *testDecider) Addr(a netip.Addr) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.addrs[a]
}

func (d *testDecider) set(f func(d *testDecider)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

// testLearned is a fixed learned table.
type testLearned struct {
	mu    sync.Mutex
	names map[netip.Addr][]string
}

func (l *testLearned) Names(a netip.Addr) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.names[a]...)
}

func (l *testLearned) Has(name string, a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.names[a] {
		if n == name {
			return true
		}
	}
	return false
}

func (l *testLearned) learn(name string, a netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names[a] = append(l.names[a], name)
}

// testResolver answers .test names from a map and counts lookups.
type testResolver struct {
	addrs   map[string][]netip.Addr
	lookups atomic.Int32
}

func (r *testResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	if network != "ip4" {
		return nil, fmt.Errorf("test resolver: network %q", network)
	}
	if a, ok := r.addrs[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// harness is a proxy on 127.0.0.1 whose OriginalDst is chosen by the
// test per client connection: each client binds its own source address,
// and the test records which destination that address "connected to".
type harness struct {
	t       testing.TB
	p       *Proxy
	addr    string
	dec     *testDecider
	learned *testLearned
	res     *testResolver
	denials chan egress.Denial

	mu      sync.Mutex
	dsts    map[netip.Addr]netip.AddrPort
	nextSrc uint32
}

func newHarness(t testing.TB, configure func(*Config)) *harness {
	t.Helper()
	h := &harness{
		t: t,
		dec: &testDecider{
			names:   map[string]bool{"allowed.test": true, "rebind.test": true},
			addrs:   map[netip.Addr]bool{},
			blocked: map[netip.Addr]bool{addrBlocked: true},
		},
		learned: &testLearned{names: map[netip.Addr][]string{}},
		res: &testResolver{addrs: map[string][]netip.Addr{
			"allowed.test": {addrAllowed},
			"denied.test":  {addrDenied},
			"rebind.test":  {addrBlocked},
		}},
		denials: make(chan egress.Denial, 100),
		dsts:    map[netip.Addr]netip.AddrPort{},
	}
	cfg := Config{
		Decider:     h.dec,
		Learned:     h.learned,
		Resolver:    h.res,
		OriginalDst: h.originalDst,
		Deny:        func(d egress.Denial) { h.denials <- d },
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if configure != nil {
		configure(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.p, h.addr = p, l.Addr().String()
	served := make(chan error, 1)
	go func() { served <- p.Serve(l) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

func (h *harness) originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
	h.mu.Lock()
	defer h.mu.Unlock()
	dst, ok := h.dsts[src]
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("no destination recorded for %v", src)
	}
	return dst, nil
}

// dial connects to the proxy as a sandbox process that connected to dst.
func (h *harness) dial(dst netip.AddrPort) *net.TCPConn {
	h.t.Helper()
	c, err := h.tryDial(dst)
	if err != nil {
		h.t.Fatalf("dial proxy: %v", err)
	}
	return c
}

// tryDial is dial for a connection the proxy may reset before connect
// returns.
func (h *harness) tryDial(dst netip.AddrPort) (*net.TCPConn, error) {
	h.mu.Lock()
	h.nextSrc++
	n := h.nextSrc
	src := netip.AddrFrom4([4]byte{127, 99, byte(n >> 8), byte(n)})
	h.dsts[src] = dst
	h.mu.Unlock()
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: waitFor}
	c, err := d.Dial("tcp", h.addr)
	if err != nil {
		return nil, err
	}
	h.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(waitFor))
	return c.(*net.TCPConn), nil
}

// wantDenial waits for the proxy to report a denial and checks it.
func (h *harness) wantDenial(kind, name string, dst netip.AddrPort, reason string) {
	h.t.Helper()
	select {
	case d := <-h.denials:
		if d.Kind != kind || d.Name != name || d.Addr != dst.Addr() || d.Port != dst.Port() || !strings.Contains(d.Reason, reason) {
			h.t.Fatalf("denial %+v; want kind %q name %q dst %v reason containing %q", d, kind, name, dst, reason)
		}
	case <-time.After(waitFor):
		h.t.Fatalf("no denial reported; want kind %q name %q reason %q", kind, name, reason)
	}
}

// noDenial checks that nothing was refused.
func (h *harness) noDenial() {
	h.t.Helper()
	select {
	case d := <-h.denials:
		h.t.Fatalf("unexpected denial %+v", d)
	default:
	}
}

// wantRefused checks that the proxy resets c without passing any byte.
func wantRefused(t *testing.T, c net.Conn) {
	t.Helper()
	b, err := io.ReadAll(c)
	if len(b) > 0 {
		t.Fatalf("refused connection returned %q", b)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("refused connection: read error %v, want a reset", err)
	}
}

// countingListener counts the connections a test server accepted.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// listenSamePort listens on one port on each address.
func listenSamePort(t testing.TB, addrs ...netip.Addr) (uint16, []*countingListener) {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		first, err := net.Listen("tcp", netip.AddrPortFrom(addrs[0], 0).String())
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(first.Addr().(*net.TCPAddr).Port)
		ls := []*countingListener{{Listener: first}}
		for _, a := range addrs[1:] {
			l, err := net.Listen("tcp", netip.AddrPortFrom(a, port).String())
			if err != nil {
				break
			}
			ls = append(ls, &countingListener{Listener: l})
		}
		if len(ls) == len(addrs) {
			for _, l := range ls {
				t.Cleanup(func() { l.Close() })
			}
			return port, ls
		}
		for _, l := range ls {
			l.Close()
		}
	}
	t.Fatal("no port free on all test addresses")
	return 0, nil
}

// serve runs handle for each connection l accepts until the test ends.
func serve(t testing.TB, l net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(waitFor))
				handle(c)
			}()
		}
	}()
}

// testPKI is a CA the test clients trust and a way to issue server
// certificates from it.
type testPKI struct {
	pool   *x509.CertPool
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "proxy test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testPKI{pool: pool, caCert: cert, caKey: key}
}

// serverConfig returns a TLS server config with a certificate for name.
func (pki *testPKI) serverConfig(t testing.TB, name string) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, pki.caCert, &key.PublicKey, pki.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// tlsGreeter answers each TLS connection's first line with its name.
func tlsGreeter(cfg *tls.Config, name string) func(net.Conn) {
	return func(c net.Conn) {
		tc := tls.Server(c, cfg)
		line, err := bufio.NewReader(tc).ReadString('\n')
		if err != nil {
			return
		}
		fmt.Fprintf(tc, "%s got %s", name, line)
	}
}

// tlsRoundTrip handshakes as a client with cfg over c, sends a line and
// returns the answer.
func tlsRoundTrip(c net.Conn, cfg *tls.Config) (string, error) {
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return "", fmt.Errorf("handshake: %w", err)
	}
	if _, err := io.WriteString(tc, "ping\n"); err != nil {
		return "", err
	}
	return bufio.NewReader(tc).ReadString('\n')
}

// tlsEnv has a TLS server for allowed.test and one for denied.test, and
// one with a certificate for other.test on the unnamed address.
type tlsEnv struct {
	*harness
	pki                    *testPKI
	port                   uint16
	allowed, denied, other *countingListener
}

func newTLSEnv(t *testing.T) *tlsEnv {
	h := newHarness(t, nil)
	pki := newTestPKI(t)
	port, ls := listenSamePort(t, addrAllowed, addrDenied, addrOther)
	serve(t, ls[0], tlsGreeter(pki.serverConfig(t, "allowed.test"), "allowed"))
	serve(t, ls[1], tlsGreeter(pki.serverConfig(t, "denied.test"), "denied"))
	serve(t, ls[2], tlsGreeter(pki.serverConfig(t, "other.test"), "other"))
	return &tlsEnv{harness: h, pki: pki, port: port, allowed: ls[0], denied: ls[1], other: ls[2]}
}

func (e *tlsEnv) at(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, e.port) }

func TestTLS(t *testing.T) {
	t.Run("allowed SNI, learned destination", func(t *testing.T) {
		e := newTLSEnv(t)
		e.learned.learn("allowed.test", addrAllowed)
		got, err := tlsRoundTrip(e.dial(e.at(addrAllowed)), &tls.Config{ServerName: "allowed.test", RootCAs: e.pki.pool})
		if err != nil || got != "allowed got ping\n" {
			t.Fatalf("round trip = %q, %v", got, err)
		}
		if n := e.res.lookups.Load(); n != 0 {
			t.Errorf("%d lookups; a destination learned for the name is dialed as is", n)
		}
		e.noDenial()
	})
	t.Run("allowed SNI, destination not learned", func(t *testing.T) {
		e := newTLSEnv(t)
		got, err := tlsRoundTrip(e.dial(e.at(addrAllowed)), &tls.Config{ServerName: "Allowed.Test.", RootCAs: e.pki.pool})
		if err != nil || got != "allowed got ping\n" {
			t.Fatalf("round trip = %q, %v", got, err)
		}
		if n := e.res.lookups.Load(); n != 1 {
			t.Errorf("%d lookups, want 1", n)
		}
	})
	t.Run("allowed SNI to the denied server's address", func(t *testing.T) {
		e := newTLSEnv(t)
		e.learned.learn("denied.test", addrDenied) // learned, but for another name
		got, err := tlsRoundTrip(e.dial(e.at(addrDenied)), &tls.Config{ServerName: "allowed.test", RootCAs: e.pki.pool})
		if err != nil || got != "allowed got ping\n" {
			t.Fatalf("round trip = %q, %v; want the allowed name's server", got, err)
		}
		if n := e.denied.n.Load(); n != 0 {
			t.Fatalf("the denied server accepted %d connections", n)
		}
	})
	t.Run("denied SNI", func(t *testing.T) {
		e := newTLSEnv(t)
		e.learned.learn("denied.test", addrDenied)
		_, err := tlsRoundTrip(e.dial(e.at(addrDenied)), &tls.Config{ServerName: "denied.test", RootCAs: e.pki.pool})
		if err == nil {
			t.Fatal("handshake with a denied name succeeded")
		}
		e.wantDenial(kindTLS, "denied.test", e.at(addrDenied), "name not allowed")
		if n := e.denied.n.Load(); n != 0 {
			t.Fatalf("the denied server accepted %d connections", n)
		}
	})
	t.Run("ECH extension", func(t *testing.T) {
		e := newTLSEnv(t)
		e.learned.learn("allowed.test", addrAllowed)
		c := e.dial(e.at(addrAllowed))
		if _, err := c.Write(buildHello(0, sniExt("allowed.test"), echExt())); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		e.wantDenial(kindTLS, "allowed.test", e.at(addrAllowed), "encrypted ClientHello")
		if n := e.allowed.n.Load(); n != 0 {
			t.Fatalf("the server accepted %d connections", n)
		}
	})
	t.Run("malformed ClientHello", func(t *testing.T) {
		e := newTLSEnv(t)
		c := e.dial(e.at(addrAllowed))
		if _, err := c.Write(buildHello(0, sniExt("allowed.test", "denied.test"))); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		e.wantDenial(kindTLS, "", e.at(addrAllowed), "malformed ClientHello")
	})
	t.Run("SNI that is no host name", func(t *testing.T) {
		e := newTLSEnv(t)
		c := e.dial(e.at(addrAllowed))
		if _, err := c.Write(buildHello(0, sniExt("allowed.test/x"))); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		e.wantDenial(kindTLS, "", e.at(addrAllowed), "invalid SNI")
	})

	// Without SNI (or with an address as SNI) only the address counts.
	noSNI := func(e *tlsEnv) *tls.Config {
		return &tls.Config{InsecureSkipVerify: true, VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: e.pki.pool, DNSName: "other.test"})
			return err
		}}
	}
	t.Run("no SNI, address not allowed", func(t *testing.T) {
		e := newTLSEnv(t)
		if _, err := tlsRoundTrip(e.dial(e.at(addrOther)), noSNI(e)); err == nil {
			t.Fatal("handshake without SNI to an unlearned address succeeded")
		}
		e.wantDenial(kindTLS, "", e.at(addrOther), "no SNI")
		if n := e.other.n.Load(); n != 0 {
			t.Fatalf("the server accepted %d connections", n)
		}
	})
	t.Run("no SNI, address learned", func(t *testing.T) {
		e := newTLSEnv(t)
		e.learned.learn("allowed.test", addrOther)
		got, err := tlsRoundTrip(e.dial(e.at(addrOther)), noSNI(e))
		if err != nil || got != "other got ping\n" {
			t.Fatalf("round trip = %q, %v", got, err)
		}
	})
	t.Run("no SNI, address allowed by an IP rule", func(t *testing.T) {
		e := newTLSEnv(t)
		e.dec.set(func(d *testDecider) { d.addrs[addrOther] = true })
		got, err := tlsRoundTrip(e.dial(e.at(addrOther)), noSNI(e))
		if err != nil || got != "other got ping\n" {
			t.Fatalf("round trip = %q, %v", got, err)
		}
	})
	t.Run("SNI is an address", func(t *testing.T) {
		e := newTLSEnv(t)
		c := e.dial(e.at(addrOther))
		if _, err := c.Write(buildHello(0, sniExt(addrAllowed.String()))); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		e.wantDenial(kindTLS, "", e.at(addrOther), "SNI is an address")
	})
}

// httpEnv has HTTP servers that answer with their own name and the Host
// and target they saw.
type httpEnv struct {
	*harness
	port            uint16
	allowed, denied *countingListener
	blocked         *countingListener
}

func newHTTPEnv(t *testing.T) *httpEnv {
	h := newHarness(t, nil)
	port, ls := listenSamePort(t, addrAllowed, addrDenied, addrBlocked)
	for i, name := range []string{"allowed", "denied", "blocked"} {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s saw %s %s", name, r.Host, r.RequestURI)
		})}
		go srv.Serve(ls[i])
		t.Cleanup(func() { srv.Close() })
	}
	return &httpEnv{harness: h, port: port, allowed: ls[0], denied: ls[1], blocked: ls[2]}
}

func (e *httpEnv) at(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, e.port) }

// get sends a raw request head over c and returns the response body.
func httpGet(c net.Conn, head string) (string, error) {
	if _, err := io.WriteString(c, head); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestHTTP(t *testing.T) {
	t.Run("allowed Host to the denied server's address", func(t *testing.T) {
		e := newHTTPEnv(t)
		body, err := httpGet(e.dial(e.at(addrDenied)), "GET /x HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
		if err != nil || body != "allowed saw allowed.test /x" {
			t.Fatalf("GET = %q, %v", body, err)
		}
		if n := e.denied.n.Load(); n != 0 {
			t.Fatalf("the denied server accepted %d connections", n)
		}
		e.noDenial()
	})
	t.Run("with net/http's client", func(t *testing.T) {
		e := newHTTPEnv(t)
		client := &http.Client{Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return e.dial(e.at(addrAllowed)), nil
			},
		}}
		resp, err := client.Get(fmt.Sprintf("http://allowed.test:%d/y?z", e.port))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("allowed saw allowed.test:%d /y?z", e.port); err != nil || string(b) != want {
			t.Fatalf("GET = %q, %v; want %q", b, err, want)
		}
	})
	t.Run("absolute form", func(t *testing.T) {
		e := newHTTPEnv(t)
		body, err := httpGet(e.dial(e.at(addrDenied)), "GET http://allowed.test/a HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
		if err != nil || body != "allowed saw allowed.test http://allowed.test/a" {
			t.Fatalf("GET = %q, %v", body, err)
		}
	})
	refusals := []struct {
		name, head, reason, denialName string
	}{
		{"denied Host", "GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n", "name not allowed", "denied.test"},
		{"Host and absolute URI disagree", "GET http://denied.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "disagree", ""},
		{"two Host headers", "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: denied.test\r\n\r\n", "malformed", ""},
		{"folded Host", "GET / HTTP/1.1\r\nHost: allowed.test\r\n denied.test\r\n\r\n", "malformed", ""},
		{"no Host, address not allowed", "GET / HTTP/1.0\r\n\r\n", "no Host name", ""},
		{"Host is an address", "GET / HTTP/1.1\r\nHost: 127.0.0.3\r\n\r\n", "no Host name", ""},
		{"CONNECT to a denied name", "CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n", "name not allowed", "denied.test"},
		{"CONNECT to an address", "CONNECT 127.0.0.3:443 HTTP/1.1\r\n\r\n", "CONNECT to an address", ""},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			e := newHTTPEnv(t)
			c := e.dial(e.at(addrDenied))
			if _, err := io.WriteString(c, r.head); err != nil {
				t.Fatal(err)
			}
			wantRefused(t, c)
			e.wantDenial(kindHTTP, r.denialName, e.at(addrDenied), r.reason)
			if n := e.denied.n.Load() + e.allowed.n.Load(); n != 0 {
				t.Fatalf("servers accepted %d connections", n)
			}
		})
	}
	t.Run("allowed name resolving to a blocked address", func(t *testing.T) {
		e := newHTTPEnv(t)
		e.learned.learn("rebind.test", addrBlocked)
		c := e.dial(e.at(addrBlocked))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: rebind.test\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		e.wantDenial(kindHTTP, "rebind.test", e.at(addrBlocked), "resolves to a blocked address")
		if n := e.blocked.n.Load(); n != 0 {
			t.Fatalf("the blocked server accepted %d connections", n)
		}
	})
	t.Run("incomplete head", func(t *testing.T) {
		e := newHarness(t, func(c *Config) { c.HeadTimeout = 200 * time.Millisecond })
		c := e.dial(netip.AddrPortFrom(addrAllowed, 80))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n"); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		e.wantDenial(kindHTTP, "", netip.AddrPortFrom(addrAllowed, 80), "incomplete request head")
	})
}

func TestCONNECT(t *testing.T) {
	e := newTLSEnv(t)
	// The sandbox talks to some forward proxy; the transparent proxy
	// carries out the CONNECT itself, to the allowed name.
	proxyDst := netip.AddrPortFrom(addrOther, 3128)
	c := e.dial(proxyDst)
	fmt.Fprintf(c, "CONNECT allowed.test:%d HTTP/1.1\r\nHost: allowed.test:%d\r\n\r\n", e.port, e.port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT response %v, %v", resp, err)
	}
	if br.Buffered() != 0 {
		t.Fatalf("%d bytes after the CONNECT response", br.Buffered())
	}
	got, err := tlsRoundTrip(c, &tls.Config{ServerName: "allowed.test", RootCAs: e.pki.pool})
	if err != nil || got != "allowed got ping\n" {
		t.Fatalf("round trip through the tunnel = %q, %v", got, err)
	}
	if n := e.other.n.Load(); n != 0 {
		t.Fatalf("the server at the original destination accepted %d connections", n)
	}
}

// echo copies what it reads back until EOF.
func echo(c net.Conn) { io.Copy(c, c) }

func TestOpaqueTCP(t *testing.T) {
	setup := func(t *testing.T, configure func(*Config)) (*harness, netip.AddrPort, *countingListener) {
		h := newHarness(t, configure)
		port, ls := listenSamePort(t, addrOther)
		return h, netip.AddrPortFrom(addrOther, port), ls[0]
	}
	roundTrip := func(c net.Conn) (string, error) {
		if _, err := io.WriteString(c, "\x00hello\n"); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}
	t.Run("learned address", func(t *testing.T) {
		h, dst, l := setup(t, nil)
		serve(t, l, echo)
		h.learned.learn("allowed.test", dst.Addr())
		if got, err := roundTrip(h.dial(dst)); err != nil || got != "\x00hello\n" {
			t.Fatalf("echo = %q, %v", got, err)
		}
		h.noDenial()
	})
	t.Run("unlearned address", func(t *testing.T) {
		h, dst, l := setup(t, nil)
		serve(t, l, echo)
		c := h.dial(dst)
		if _, err := io.WriteString(c, "\x00hello\n"); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		h.wantDenial(kindTCP, "", dst, "address not allowed")
		if n := l.n.Load(); n != 0 {
			t.Fatalf("the server accepted %d connections", n)
		}
	})
	t.Run("learned for a name no longer allowed", func(t *testing.T) {
		h, dst, l := setup(t, nil)
		serve(t, l, echo)
		h.learned.learn("denied.test", dst.Addr())
		c := h.dial(dst)
		if _, err := io.WriteString(c, "\x00hello\n"); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, c)
		h.wantDenial(kindTCP, "", dst, "address not allowed")
	})
	t.Run("destination is the proxy", func(t *testing.T) {
		h, _, _ := setup(t, nil)
		self := netip.MustParseAddrPort(h.addr)
		h.dec.set(func(d *testDecider) { d.addrs[self.Addr()] = true })
		c, err := h.tryDial(self)
		if err == nil {
			wantRefused(t, c)
		} else if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("dial: %v, want a reset", err)
		}
		h.wantDenial(kindTCP, "", self, "proxy itself")
	})
	t.Run("server speaks first", func(t *testing.T) {
		h, dst, l := setup(t, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
		serve(t, l, func(c net.Conn) {
			io.WriteString(c, "220 banner\r\n")
			echo(c)
		})
		h.learned.learn("allowed.test", dst.Addr())
		c := h.dial(dst)
		br := bufio.NewReader(c)
		if line, err := br.ReadString('\n'); err != nil || line != "220 banner\r\n" {
			t.Fatalf("banner = %q, %v", line, err)
		}
		io.WriteString(c, "QUIT\r\n")
		if line, err := br.ReadString('\n'); err != nil || line != "QUIT\r\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
	})
	t.Run("server speaks first, unlearned", func(t *testing.T) {
		h, dst, l := setup(t, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
		serve(t, l, func(c net.Conn) { io.WriteString(c, "220 banner\r\n") })
		wantRefused(t, h.dial(dst))
		h.wantDenial(kindTCP, "", dst, "address not allowed")
	})
}

// TestLateClientHello checks that a client cannot wait out PeekTimeout to
// carry a name past the check: its first bytes are checked when they come.
func TestLateClientHello(t *testing.T) {
	cases := []struct {
		sni, reason string // reason "" means the handshake succeeds
	}{
		{"allowed.test", ""},
		{"denied.test", "name not allowed"},
		{"rebind.test", "name sent late to an address not learned for it"},
	}
	for _, c := range cases {
		t.Run(c.sni, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.PeekTimeout = 50 * time.Millisecond })
			pki := newTestPKI(t)
			port, ls := listenSamePort(t, addrOther)
			serve(t, ls[0], tlsGreeter(pki.serverConfig(t, "allowed.test"), "other"))
			dst := netip.AddrPortFrom(addrOther, port)
			h.learned.learn("allowed.test", addrOther)
			conn := h.dial(dst)
			// The proxy dials the learned address once the peek times out.
			for deadline := time.Now().Add(waitFor); ls[0].n.Load() == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the proxy never dialed the learned address of a silent client")
				}
			}
			got, err := tlsRoundTrip(conn, &tls.Config{ServerName: c.sni, InsecureSkipVerify: true})
			if c.reason == "" {
				if err != nil || got != "other got ping\n" {
					t.Fatalf("round trip = %q, %v", got, err)
				}
				h.noDenial()
				return
			}
			if err == nil {
				t.Fatalf("late ClientHello for %s went through: %q", c.sni, got)
			}
			h.wantDenial(kindTLS, c.sni, dst, c.reason)
		})
	}
}

func TestHalfClose(t *testing.T) {
	h := newHarness(t, nil)
	port, ls := listenSamePort(t, addrOther)
	dst := netip.AddrPortFrom(addrOther, port)
	h.learned.learn("allowed.test", addrOther)
	after := make(chan string, 1)
	serve(t, ls[0], func(c net.Conn) {
		br := bufio.NewReader(c)
		mode, _ := br.ReadString('\n')
		switch mode {
		case "client-first\n":
			// Read to the client's EOF, then answer: the answer must
			// still reach the client.
			n, _ := io.Copy(io.Discard, br)
			fmt.Fprintf(c, "read %d bytes", n)
		case "server-first\n":
			// Finish sending first; the client goes on sending after
			// it has seen this side's EOF.
			io.WriteString(c, "bye")
			c.(*net.TCPConn).CloseWrite()
			b, _ := io.ReadAll(br)
			after <- string(b)
		}
	})

	c := h.dial(dst)
	payload := strings.Repeat("x", 1<<20)
	if _, err := io.WriteString(c, "client-first\n"+payload); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if want := fmt.Sprintf("read %d bytes", len(payload)); err != nil || string(b) != want {
		t.Fatalf("after half-close read %q, %v; want %q", b, err, want)
	}

	c = h.dial(dst)
	io.WriteString(c, "server-first\n")
	if b, err := io.ReadAll(c); err != nil || string(b) != "bye" {
		t.Fatalf("read %q, %v; want the server's bytes then EOF", b, err)
	}
	if _, err := io.WriteString(c, "still sending"); err != nil {
		t.Fatalf("write after the server's EOF: %v", err)
	}
	c.CloseWrite()
	select {
	case got := <-after:
		if got != "still sending" {
			t.Fatalf("server read %q after its half-close", got)
		}
	case <-time.After(waitFor):
		t.Fatal("server never saw the client's bytes and EOF")
	}
}

func TestCloseAndLimits(t *testing.T) {
	t.Run("Close ends active connections", func(t *testing.T) {
		h := newHarness(t, nil)
		port, ls := listenSamePort(t, addrOther)
		serve(t, ls[0], echo)
		dst := netip.AddrPortFrom(addrOther, port)
		h.learned.learn("allowed.test", addrOther)
		c := h.dial(dst)
		io.WriteString(c, "\x00hi\n")
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "\x00hi\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
		if n := h.p.Active(); n != 1 {
			t.Fatalf("Active() = %d, want 1", n)
		}
		if err := h.p.Close(); err != nil {
			t.Fatal(err)
		}
		if n := h.p.Active(); n != 0 {
			t.Fatalf("Active() after Close = %d", n)
		}
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Fatalf("read %q after Close", b)
		}
	})
	t.Run("MaxConns", func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.MaxConns = 1 })
		port, ls := listenSamePort(t, addrOther)
		serve(t, ls[0], echo)
		dst := netip.AddrPortFrom(addrOther, port)
		h.learned.learn("allowed.test", addrOther)
		c := h.dial(dst)
		io.WriteString(c, "\x00hi\n")
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "\x00hi\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
		if c, err := h.tryDial(dst); err == nil {
			wantRefused(t, c)
		} else if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("dial: %v, want a reset", err)
		}
		if s := h.p.Stats(); s.Overloaded != 1 || s.Active != 1 {
			t.Fatalf("Stats() = %+v, want 1 overloaded and 1 active", s)
		}
	})
}
