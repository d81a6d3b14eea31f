package mitm

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// waitFor bounds every wait in these tests; generous for a loaded machine.
const waitFor = 30 * time.Second

// The names of the tests' small internet. Every upstream is a server on
// loopback that the interceptor's Dial reaches by name.
const (
	providerName = "api.provider.test"
	otherName    = "other.test"
	secretKey    = "sk-live-0123456789abcdef"
	secretUser   = "dXNlcjpodW50ZXIy" // user:hunter2
)

// dst is the original destination the tests pretend the client used.
var dst = netip.MustParseAddrPort("198.51.100.7:443")

// rule is one binding of testBinder: requests to host whose path starts
// with prefix get headers.
type rule struct {
	name    string
	host    string
	prefix  string
	headers []egress.InjectedHeader
	// path, when set, is the normalised path the binding reports.
	path string
}

// testBinder is a small egress.Binder: rules match on host and path
// prefix; two matches are ambiguous.
type testBinder struct {
	rules   []rule
	secrets []string
}

var _ egress.Binder = (*testBinder)(nil)

func (b *testBinder) Intercepts(host string, port uint16, scheme string) bool {
	return b.HostBound(host)
}

func (b *testBinder) HostBound(host string) bool {
	for _, r := range b.rules {
		if r.host == host {
			return true
		}
	}
	return false
}

func (b *testBinder) Bind(req egress.BindRequest) (egress.Injection, error) {
	var got []rule
	for _, r := range b.rules {
		if r.host == req.Host && strings.HasPrefix(req.Path, r.prefix) {
			got = append(got, r)
		}
	}
	switch len(got) {
	case 0:
		return egress.Injection{}, fmt.Errorf("%s %s %s: %w", req.Method, req.Host, req.Path, egress.ErrNoBinding)
	case 1:
		p := req.Path
		if got[0].path != "" {
			p = got[0].path
		}
		return egress.Injection{Binding: got[0].name, Headers: got[0].headers, Path: p}, nil
	default:
		return egress.Injection{}, fmt.Errorf("%s and %s: %w", got[0].name, got[1].name, egress.ErrAmbiguous)
	}
}

func (b *testBinder) Secrets() []string { return b.secrets }

// bearerBinder injects the bearer secretKey into every request to the
// provider under /v1/.
func bearerBinder() *testBinder {
	return &testBinder{
		rules: []rule{{
			name: "provider", host: providerName, prefix: "/v1/",
			headers: []egress.InjectedHeader{{Name: "Authorization", Value: "Bearer " + secretKey}},
		}},
		secrets: []string{secretKey},
	}
}

// upstreamCA issues the upstreams' certificates; the interceptor trusts
// it through RootCAs.
type upstreamCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newUpstreamCA(t testing.TB) *upstreamCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "upstream test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &upstreamCA{cert: cert, key: key, pool: pool}
}

// leaf issues a server certificate for names.
func (u *upstreamCA) leaf(t testing.TB, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, u.cert, key.Public(), u.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// upstream is a provider server and what it saw.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request // clones, bodies not kept
}

func (u *upstream) seen() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

// startUpstream starts a TLS server for the provider's name with cert,
// speaking h2 when h2 is set; handler answers after the request is
// recorded.
func startUpstream(t testing.TB, cert tls.Certificate, h2 bool, handler http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.reqs = append(u.reqs, r.Clone(context.Background()))
		u.mu.Unlock()
		handler(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	if h2 {
		srv.TLS.NextProtos = []string{"h2", "http/1.1"}
		srv.EnableHTTP2 = true
	}
	srv.Config.ErrorLog = slog.NewLogLogger(slog.DiscardHandler, slog.LevelDebug)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u.Server = srv
	return u
}

// harness is an Interceptor with a front listener that hands it every
// connection as the transparent proxy would, having read the start of
// the ClientHello.
type harness struct {
	ic     *Interceptor
	front  net.Listener
	sni    string            // the name the "proxy" decided on
	routes map[string]string // name -> upstream address
	plain  bool              // hand connections to ServeHTTP1

	mu     sync.Mutex
	events []egress.Denial
	dialed []string
}

type harnessOpt func(*harness, *Config)

func withBinder(b egress.Binder) harnessOpt {
	return func(_ *harness, c *Config) { c.Binder = func() egress.Binder { return b } }
}

func withRedactBytes(n int64) harnessOpt {
	return func(_ *harness, c *Config) { c.RedactBodyBytes = n }
}

func newHarness(t testing.TB, roots *x509.CertPool, routes map[string]string, opts ...harnessOpt) *harness {
	t.Helper()
	ca, err := NewCA(time.Now(), 24*time.Hour, "sandbox test CA")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{sni: providerName, routes: routes}
	cfg := Config{
		CA:      ca,
		Binder:  func() egress.Binder { return bearerBinder() },
		RootCAs: roots,
		Dial: func(ctx context.Context, name string, port uint16) (net.Conn, error) {
			h.mu.Lock()
			h.dialed = append(h.dialed, fmt.Sprintf("%s:%d", name, port))
			addr, ok := h.routes[name]
			h.mu.Unlock()
			if !ok {
				return nil, fmt.Errorf("no route to %s", name)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		Event: func(d egress.Denial) {
			h.mu.Lock()
			h.events = append(h.events, d)
			h.mu.Unlock()
		},
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, o := range opts {
		o(h, &cfg)
	}
	h.ic, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.front, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := h.front.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The proxy has read the first bytes; here a few of
				// them, so the interceptor must replay them.
				buf := make([]byte, 16)
				n, err := c.Read(buf)
				if err != nil {
					c.Close()
					return
				}
				h.mu.Lock()
				sni, plain := h.sni, h.plain
				h.mu.Unlock()
				if plain {
					h.ic.ServeHTTP1(c, buf[:n], sni, netip.AddrPortFrom(dst.Addr(), 80))
				} else {
					h.ic.ServeTLS(c, buf[:n], sni, dst)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		h.front.Close()
		h.ic.Close()
		wg.Wait()
	})
	return h
}

// caPool is the pool a sandbox trusts: the interceptor's CA.
func (h *harness) caPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.ic.cfg.CA.CertPEM())
	return pool
}

// client returns a client whose every connection goes to the front
// listener, trusting the interceptor's CA; h2 selects HTTP/2.
func (h *harness) client(t testing.TB, h2 bool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", h.front.Addr().String())
		},
		TLSClientConfig:     &tls.Config{RootCAs: h.caPool()},
		MaxIdleConnsPerHost: 100,
		DisableCompression:  true,
	}
	var p http.Protocols
	p.SetHTTP1(true)
	if h2 {
		p = http.Protocols{}
		p.SetHTTP2(true)
	}
	tr.Protocols = &p
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: waitFor}
}

func (h *harness) eventList() []egress.Denial {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]egress.Denial(nil), h.events...)
}

func (h *harness) dialedList() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.dialed...)
}
