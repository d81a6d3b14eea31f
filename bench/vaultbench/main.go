// Command vaultbench prints the credential vault's table of the
// performance section: what a request pays for passing through a binding
// (TLS terminated by the interceptor, the binding matched, the key
// injected, the request sent on over TLS verified upstream, the response
// redacted) against the same request through the same transparent proxy
// without a binding (the connection spliced, TLS end to end), in the same
// run:
//
//   - request latency, keep-alive: a small GET on a connection already
//     open, p50 (p99);
//   - request latency on a new connection each time: TCP connect, TLS
//     handshake and the GET;
//   - streaming throughput: one large download through the binding.
//
// Everything is in this process, on loopback: a provider (HTTPS, HTTP/1.1
// and HTTP/2, a test CA), the transparent proxy of egress/proxy with the
// interceptor of egress/mitm and a vault of egress/vault, and a client
// that connects to the proxy as a sandbox's redirected connection would.
// The firewall's redirect and the sandbox's namespace are left out: they
// cost both sides the same (bench/egressbench measures them).
//
//	go run ./bench/vaultbench [-mode full|quick] [-out bench/results]
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/egress/mitm"
	"github.com/opensandbox/opensandbox/egress/proxy"
	"github.com/opensandbox/opensandbox/egress/vault"
)

// settings are the sizes of one mode.
type settings struct {
	keepAlive int   // requests timed on one connection, each side
	newConns  int   // requests timed on new connections, each side
	download  int64 // bytes of the large download
	downloads int   // downloads each side; the median counts
}

var modes = map[string]settings{
	"full":  {keepAlive: 5000, newConns: 1000, download: 1 << 30, downloads: 3},
	"quick": {keepAlive: 1000, newConns: 200, download: 256 << 20, downloads: 1},
}

// The names of the bench's small internet.
const (
	bound   = "provider.bench.test" // a binding covers it
	unbound = "plain.bench.test"    // no binding: spliced
)

type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	flag.Parse()
	set := benchkit.Mode("vaultbench", *mode, modes)
	start := time.Now()
	rows, err := run(set)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vaultbench:", err)
		os.Exit(1)
	}
	rep := report.Report{Benchmark: "vault", Subject: "through a binding", Mode: *mode, Rows: rows,
		RatioNote:   "through a binding / through the proxy without one (the baseline): above 1 costs more time, below 1 moves fewer bytes",
		RatioFormat: "%.2fx"}
	rep.Print(os.Stdout)
	fmt.Printf("run time %.0f s\n", time.Since(start).Seconds())
	if err := rep.Write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "vaultbench:", err)
		os.Exit(1)
	}
}

// bench is the bench's provider, proxy and clients.
type bench struct {
	providerAddr string // where the provider listens
	proxyAddr    string // where the transparent proxy listens
	roots        *x509.CertPool
	key          string
	seen         chan string // Authorization of the provider's first request
}

func run(set settings) ([]row, error) {
	b, cleanup, err := setup()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// The binding injects: checked once, before any timing.
	if err := b.checkInjected(); err != nil {
		return nil, err
	}
	var rows []row
	ka, kaBase, err := b.pair(func(name string) ([]time.Duration, error) { return b.keepAlive(name, set.keepAlive) })
	if err != nil {
		return nil, err
	}
	rows = append(rows, latencyRow("request through a binding, keep-alive (small GET), p50 (p99)", ka, kaBase,
		"< 2 ms added at p50", func(added float64) bool { return added < 2 }))
	nc, ncBase, err := b.pair(func(name string) ([]time.Duration, error) { return b.newConns(name, set.newConns) })
	if err != nil {
		return nil, err
	}
	rows = append(rows, latencyRow("request through a binding, new connection each (connect + TLS + GET), p50 (p99)", nc, ncBase, "", nil))
	var rates [2][]float64
	for range set.downloads {
		for i, name := range []string{bound, unbound} {
			mbs, err := b.downloadRate(name, set.download)
			if err != nil {
				return nil, err
			}
			rates[i] = append(rates[i], mbs)
		}
	}
	ours, base := median(rates[0]), median(rates[1])
	rows = append(rows, row{
		Name: fmt.Sprintf("one %d MiB download through a binding", set.download>>20), Unit: "MB/s",
		Value: ours, Baseline: base, BaseName: "without a binding", Ratio: ours / base,
	})
	return rows, nil
}

// pair measures f through the binding and without it, alternating
// halves so that neither side runs only while the machine is busier.
func (b *bench) pair(f func(name string) ([]time.Duration, error)) (ours, base []time.Duration, err error) {
	for range 2 {
		for _, name := range []string{bound, unbound} {
			ds, err := f(name)
			if err != nil {
				return nil, nil, err
			}
			if name == bound {
				ours = append(ours, ds...)
			} else {
				base = append(base, ds...)
			}
		}
	}
	return ours, base, nil
}

func latencyRow(name string, ours, base []time.Duration, target string, met func(addedMS float64) bool) row {
	ms := report.Percentile // milliseconds
	r := row{Name: name, Unit: "ms", Value: ms(ours, 0.5), P99: ms(ours, 0.99), Baseline: ms(base, 0.5), BaseP99: ms(base, 0.99),
		BaseName: "the proxy without a binding (spliced)"}
	r.Ratio = r.Value / r.Baseline
	added := r.Value - r.Baseline
	r.Note = fmt.Sprintf("%+.3f ms at p50", added)
	if target != "" {
		r.Target = target
		r = r.Judge(met(added))
	}
	return r
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// client is an HTTPS client whose every connection goes to the proxy, as
// a sandbox's connections are redirected there; it trusts the provider's
// CA and the interceptor's.
func (b *bench) client(keepAlive bool) *http.Client {
	d := &net.Dialer{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", b.proxyAddr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: b.roots},
		ForceAttemptHTTP2: false,
		DisableKeepAlives: !keepAlive,
		MaxIdleConns:      4,
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

func get(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

func (b *bench) checkInjected() error {
	c := b.client(false)
	if err := get(c, "https://"+bound+"/v1/check"); err != nil {
		return err
	}
	if got := <-b.seen; got != "Bearer "+b.key {
		return fmt.Errorf("the provider did not get the key through the binding")
	}
	if err := get(c, "https://"+unbound+"/v1/check"); err != nil {
		return err
	}
	if got := <-b.seen; got != "" {
		return fmt.Errorf("a request without a binding carried a key")
	}
	return nil
}

func (b *bench) keepAlive(name string, n int) ([]time.Duration, error) {
	c := b.client(true)
	defer c.CloseIdleConnections()
	url := "https://" + name + "/v1/small"
	if err := get(c, url); err != nil { // the connection, outside the timing
		return nil, err
	}
	ds := make([]time.Duration, 0, n/2)
	for range n / 2 {
		t := time.Now()
		if err := get(c, url); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t))
	}
	return ds, nil
}

func (b *bench) newConns(name string, n int) ([]time.Duration, error) {
	c := b.client(false)
	url := "https://" + name + "/v1/small"
	ds := make([]time.Duration, 0, n/2)
	for range n / 2 {
		t := time.Now()
		if err := get(c, url); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t))
	}
	return ds, nil
}

func (b *bench) downloadRate(name string, size int64) (float64, error) {
	c := b.client(false)
	t := time.Now()
	resp, err := c.Get(fmt.Sprintf("https://%s/v1/big?bytes=%d", name, size))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return 0, err
	}
	if got != size {
		return 0, fmt.Errorf("download through %s: %d bytes of %d", name, got, size)
	}
	return float64(size) / time.Since(t).Seconds() / 1e6, nil
}

// setup starts the provider, the vault, the interceptor and the proxy.
func setup() (_ *bench, cleanup func(), err error) {
	var closers []func()
	cleanup = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	caPEM, leaf, err := providerCert(bound, unbound)
	if err != nil {
		return nil, nil, err
	}
	b := &bench{roots: x509.NewCertPool(), seen: make(chan string, 1)}
	b.roots.AppendCertsFromPEM(caPEM)
	chunk := []byte(strings.Repeat("0123456789abcdef", 4096))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/check":
				b.seen <- r.Header.Get("Authorization")
				io.WriteString(w, "ok")
			case "/v1/big":
				var n int64
				fmt.Sscan(r.URL.Query().Get("bytes"), &n)
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Header().Set("Content-Length", fmt.Sprint(n))
				for n > 0 {
					k := min(n, int64(len(chunk)))
					if _, err := w.Write(chunk[:k]); err != nil {
						return
					}
					n -= k
				}
			default:
				io.WriteString(w, `{"ok":true}`)
			}
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}},
		ErrorLog:  nil,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	b.providerAddr = ln.Addr().String()
	go srv.ServeTLS(ln, "", "")
	closers = append(closers, func() { srv.Close() })

	policy, err := egress.ParsePolicy([]byte(fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":%q},{"action":"allow","target":%q},{"action":"allow","target":"127.0.0.1"}]}`, bound, unbound)))
	if err != nil {
		return nil, nil, err
	}
	matcher, err := egress.NewMatcher(egress.Overlay{}, policy)
	if err != nil {
		return nil, nil, err
	}
	live := egress.NewLive(matcher)
	b.key = "sk-bench-" + rand.Text()
	v, err := vault.Create(api.CredentialVaultCreateRequest{
		Credentials: []api.Credential{{Name: "key", Source: api.CredentialSource{Value: b.key}}},
		Bindings: []api.CredentialBinding{{Name: "provider", Match: api.CredentialMatch{Hosts: []string{bound}, Paths: []string{"/v1/*"}},
			Auth: api.CredentialAuth{Type: "bearer", Credential: "key"}}},
	}, vault.Options{HostAllowed: matcher.BindingHostAllowed})
	if err != nil {
		return nil, nil, err
	}
	var vl vault.Live
	vl.Store(v)

	ca, err := mitm.NewCA(time.Now(), 24*time.Hour, "vaultbench")
	if err != nil {
		return nil, nil, err
	}
	b.roots.AppendCertsFromPEM(ca.CertPEM())
	// Every name of the bench is the provider; the port in a connection's
	// original destination is 443.
	var dialer net.Dialer
	dialProvider := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dialer.DialContext(ctx, "tcp", b.providerAddr)
	}
	var px *proxy.Proxy
	ic, err := mitm.New(mitm.Config{
		CA: ca, Binder: vl.Binder, RootCAs: b.roots,
		Dial: func(ctx context.Context, name string, port uint16) (net.Conn, error) {
			return px.DialName(ctx, name, port)
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { ic.Close() })
	dst := netip.MustParseAddrPort("127.0.0.1:443")
	px, err = proxy.New(proxy.Config{
		Listen:      "127.0.0.1:0",
		Decider:     live,
		Resolver:    fixedResolver{},
		Dial:        dialProvider,
		OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil },
		Intercept: func(scheme, name string, dst netip.AddrPort) func(net.Conn, []byte) {
			if scheme == "https" && v.Intercepts(name, dst.Port(), scheme) {
				return func(c net.Conn, peeked []byte) { ic.ServeTLS(c, peeked, name, dst) }
			}
			return nil
		},
	})
	if err != nil {
		return nil, nil, err
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	b.proxyAddr = pl.Addr().String()
	go px.Serve(pl)
	closers = append(closers, func() { px.Close() })
	return b, cleanup, nil
}

// fixedResolver resolves every name to 127.0.0.1, where the provider is.
type fixedResolver struct{}

func (fixedResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// providerCert makes a CA and a leaf for names signed by it.
func providerCert(names ...string) ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vaultbench provider CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return pemCert(caDER), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
