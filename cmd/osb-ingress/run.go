package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/opensandbox/opensandbox/ingress"
)

// A source is one way to find sandboxes, selected by its own flag.
// server.go adds the lifecycle server (--server); another file may add
// one more from its init() (kube.go: --kubernetes) without touching
// this one.
type source struct {
	// name is the flag that selects the source, for messages.
	name string
	// flags adds the source's flags.
	flags func(fs *flag.FlagSet, getenv func(string) string)
	// chosen reports whether the parsed flags select the source.
	chosen func() bool
	// open makes the resolver and, when the source can renew, the
	// renewer (nil otherwise). It runs once; ctx lasts as long as the
	// gateway runs.
	open func(ctx context.Context, log *slog.Logger) (ingress.Resolver, ingress.Renewer, error)
	// renewVia names a source that may be chosen with this one: this
	// one resolves, and the other's renewer renews (--kubernetes reads
	// pods, and asks the --server to move an expiry).
	renewVia string
	// where says, for the start-up log, what the source reads: "the
	// lifecycle server at URL". After open it may say more (the
	// namespaces a default resolved to).
	where func() string
}

// sources are the registered ways to find sandboxes.
var sources []*source

// registerSource adds s; call it from an init().
func registerSource(s *source) { sources = append(sources, s) }

// Main is the gateway program: flags in, Run until the context ends.
type Main struct {
	Listen          string
	MetricsListen   string
	SigningKeysFile string
	Domain          string
	TLSCert         string
	TLSKey          string
	RenewEvery      time.Duration
	ReloadEvery     time.Duration
	LogJSON         bool
	LogLevel        string

	source *source
	keys   *ingress.KeyFile
	log    *slog.Logger

	// renewSource is the source chosen beside source for its renewer
	// (source.renewVia), or nil.
	renewSource *source
}

// Defaults of the flags.
const (
	defaultListen      = ":8090"
	defaultReloadEvery = 5 * time.Second
)

// NewMain returns a program with the defaults.
func NewMain() *Main {
	return &Main{Listen: defaultListen, ReloadEvery: defaultReloadEvery, RenewEvery: ingress.DefaultRenewEvery,
		LogLevel: "info"}
}

// ParseFlags reads the command line; getenv gives the environment.
func (m *Main) ParseFlags(args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("osb-ingress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.Bool("version", false, "print the version and exit")
	fs.StringVar(&m.Listen, "listen", m.Listen, "address of the gateway (HTTP/1.1 and h2c, or HTTP/1.1 and HTTP/2 over TLS with --tls-cert)")
	fs.StringVar(&m.MetricsListen, "metrics-listen", "", "address of a separate listener for /metrics (Prometheus); empty: none")
	fs.StringVar(&m.SigningKeysFile, "signing-keys-file", "", `file of signing keys, one "ID:BASE64" per line, the signing key first (the server's [ingress] signing keys); reread on SIGHUP and when it changes`)
	fs.StringVar(&m.Domain, "domain", "", `serve subdomain routes "{sandboxId}-{port}.DOMAIN" (wildcard DNS points at the gateway); empty: no subdomain routes`)
	fs.StringVar(&m.TLSCert, "tls-cert", "", "TLS certificate (PEM, chain included); with --tls-key the gateway serves HTTPS and HTTP/2; reread on SIGHUP")
	fs.StringVar(&m.TLSKey, "tls-key", "", "TLS private key (PEM)")
	fs.DurationVar(&m.RenewEvery, "renew-every", m.RenewEvery, "at most one renew-on-access request per sandbox in this period")
	fs.DurationVar(&m.ReloadEvery, "reload-every", m.ReloadEvery, "how often to look whether the signing keys file changed")
	fs.BoolVar(&m.LogJSON, "log-json", false, "log JSON lines instead of text")
	fs.StringVar(&m.LogLevel, "log-level", m.LogLevel, "debug, info (the access log), warn or error")
	for _, s := range sources {
		s.flags(fs, getenv)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		return errVersion
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var names []string
	var chosen []*source
	for _, s := range sources {
		names = append(names, "--"+s.name)
		if s.chosen() {
			chosen = append(chosen, s)
		}
	}
	switch {
	case len(chosen) == 0:
		return fmt.Errorf("say where sandboxes are: one of %s", strings.Join(names, ", "))
	case len(chosen) == 1:
		m.source = chosen[0]
	case len(chosen) == 2 && chosen[0].renewVia == chosen[1].name:
		m.source, m.renewSource = chosen[0], chosen[1]
	case len(chosen) == 2 && chosen[1].renewVia == chosen[0].name:
		m.source, m.renewSource = chosen[1], chosen[0]
	default:
		return fmt.Errorf("choose one of %s", strings.Join(names, ", "))
	}
	if (m.TLSCert == "") != (m.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if m.RenewEvery <= 0 || m.ReloadEvery <= 0 {
		return errors.New("--renew-every and --reload-every must be positive")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(m.LogLevel)); err != nil {
		return fmt.Errorf("--log-level %q: %v", m.LogLevel, err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if m.LogJSON {
		m.log = slog.New(slog.NewJSONHandler(stderr, opts))
	} else {
		m.log = slog.New(slog.NewTextHandler(stderr, opts))
	}
	return nil
}

// Run serves until ctx ends, then shuts down within a few seconds.
func (m *Main) Run(ctx context.Context) error {
	if m.log == nil {
		return errors.New("ParseFlags first")
	}
	keys, err := ingress.NewKeyFile(m.SigningKeysFile, nil, m.log)
	if err != nil {
		return err
	}
	m.keys = keys
	if m.keys.Keys().Empty() {
		m.log.Warn("no signing keys: only public sandboxes can be reached; give --signing-keys-file")
	}
	var certs *certFile
	if m.TLSCert != "" {
		certs = &certFile{cert: m.TLSCert, key: m.TLSKey}
		if err := certs.load(); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res, ren, err := m.source.open(ctx, m.log)
	if err != nil {
		return err
	}
	renewer := m.source
	if m.renewSource != nil && ren == nil {
		if _, ren, err = m.renewSource.open(ctx, m.log); err != nil {
			return err
		}
		renewer = m.renewSource
	}
	if ren == nil {
		renewer = nil
	}
	if ren == nil && m.source.renewVia != "" {
		m.log.Warn("no --" + m.source.renewVia + ": sandboxes are not renewed on access")
	}
	m.log.Info("finding sandboxes", sourcesAttrs(m.source, renewer)...)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gw, err := ingress.New(ingress.Config{
		Keys:       m.keys.Keys,
		Resolver:   res,
		Renewer:    ren,
		RenewEvery: m.RenewEvery,
		Domain:     m.Domain,
		Logger:     m.log,
		Metrics:    reg,
	})
	if err != nil {
		return err
	}

	srv := gw.HTTPServer(gw, certs != nil, m.log)
	if certs != nil {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.get}
	}
	ln, err := net.Listen("tcp", m.Listen)
	if err != nil {
		return err
	}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	m.listening("gateway", ln.Addr().String(), certs != nil)
	go func() {
		if certs != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	if m.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("GET /healthz", gw.Health())
		mux.Handle("GET /readyz", gw.Health())
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		mln, err := net.Listen("tcp", m.MetricsListen)
		if err != nil {
			ln.Close()
			return err
		}
		servers = append(servers, ms)
		m.listening("metrics", mln.Addr().String(), false)
		go func() { errc <- ms.Serve(mln) }()
	}

	go m.reload(ctx, certs)

	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("serve", "err", err)
		}
	}
	shutdown, cancelShutdown := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancelShutdown()
	for _, s := range servers {
		if err := s.Shutdown(shutdown); err != nil {
			s.Close() // streams that outlive the grace period are cut
		}
	}
	m.log.Info("stopped")
	return nil
}

// sourcesAttrs are the attributes of the start-up line "finding
// sandboxes": from where the gateway finds them, and where
// renew-on-access goes (renew nil: nowhere).
func sourcesAttrs(find, renew *source) []any {
	renewals := "none: sandboxes are not renewed on access"
	if renew != nil {
		renewals = renew.where()
	}
	return []any{"from", find.where(), "renewals", renewals}
}

// listening logs a listener's address (tests read it there).
func (m *Main) listening(name, addr string, tls bool) {
	m.log.Info("listening", "listener", name, "addr", addr, "tls", tls)
}

// reload rereads the signing keys on SIGHUP and when their file
// changes, and the TLS certificate on SIGHUP.
func (m *Main) reload(ctx context.Context, certs *certFile) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(m.ReloadEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := m.keys.Load(); err != nil {
				m.log.Error("reload signing keys; keeping the ones in use", "err", err)
			}
			if certs != nil {
				if err := certs.load(); err != nil {
					m.log.Error("reload TLS certificate; keeping the one in use", "err", err)
				} else {
					m.log.Info("reloaded TLS certificate")
				}
			}
		case <-tick.C:
			m.keys.Reload()
		}
	}
}

// certFile holds a TLS certificate read from files.
type certFile struct {
	cert, key string
	current   atomic.Pointer[tls.Certificate]
}

func (c *certFile) load() error {
	crt, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return fmt.Errorf("TLS certificate: %w", err)
	}
	c.current.Store(&crt)
	return nil
}

func (c *certFile) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.current.Load(), nil }
