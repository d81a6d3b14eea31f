package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"

	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/egress/dnsproxy"
	"github.com/opensandbox/opensandbox/egress/mitm"
	"github.com/opensandbox/opensandbox/egress/nft"
	"github.com/opensandbox/opensandbox/egress/proxy"
)

// run programs the namespace's firewall for the policy in force, starts
// the DNS proxy, the transparent proxy (strict mode) and the API, and
// serves until ctx ends. /healthz answers 200 only once all of them are
// in place. The firewall's rules stay when it returns.
func run(ctx context.Context, cfg config) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	policy := cfg.Initial
	var store egress.Store
	if cfg.PolicyFile != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.PolicyFile), 0o700); err != nil {
			return fmt.Errorf("policy file: %w", err)
		}
		fs := egress.NewFileStore(cfg.PolicyFile)
		var err error
		if policy, err = fs.LoadOr(cfg.Initial); err != nil {
			return fmt.Errorf("policy file: %w", err)
		}
		store = fs
	}
	matcher, err := egress.NewMatcher(cfg.Overlay, policy)
	if err != nil {
		return err
	}
	live := egress.NewLive(matcher)

	upstreams := cfg.Upstreams
	if len(upstreams) == 0 {
		if upstreams, err = resolvConfServers("/etc/resolv.conf"); err != nil || len(upstreams) == 0 {
			return fmt.Errorf("no DNS upstreams configured and none in /etc/resolv.conf (%v)", err)
		}
	}
	var nameservers []netip.Addr
	for _, u := range upstreams {
		nameservers = append(nameservers, netip.MustParseAddrPort(u).Addr())
	}

	tbl, err := nft.Open()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer tbl.Close() // the rules stay in the kernel
	apply := func(p egress.Policy) error {
		return tbl.Apply(firewallConfig(cfg.Mode, cfg.Overlay, p, nameservers))
	}
	if err := apply(policy); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}

	m := newMetrics()
	denials := egress.NewDenials(1000)
	logLimit := rate.NewLimiter(20, 50)
	deny := func(d egress.Denial) {
		denials.Add(d)
		m.denied.WithLabelValues(d.Kind).Inc()
		if logLimit.Allow() {
			log.Info("denied", "kind", d.Kind, "name", d.Name, "addr", d.Addr, "port", d.Port, "reason", d.Reason)
		}
	}
	learned := dnsproxy.NewTable(dnsproxy.DefaultTableSize)
	learn := func(name string, addrs []netip.Addr, ttl time.Duration) {
		learned.Learn(name, addrs, ttl)
		if cfg.Mode == egress.ModeDNSNft {
			if err := tbl.Learn(addrs, ttl); err != nil {
				log.Warn("learn addresses", "name", name, "err", err)
			}
		}
	}

	dnsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(egress.DNSPort))
	listens := []string{dnsAddr}
	if cfg.Mode != egress.ModeStrict {
		// The firewall sends IPv6 queries to ::1 (strict mode has no IPv6).
		listens = append(listens, net.JoinHostPort("::1", strconv.Itoa(egress.DNSPort)))
	}
	for _, l := range listens {
		dns, err := dnsproxy.New(dnsproxy.Config{
			Listen: l, Upstreams: upstreams, Decider: live, Learn: learn, Deny: deny,
			Control: nft.MarkControl, Logger: log,
		})
		if err != nil {
			return fmt.Errorf("DNS proxy: %w", err)
		}
		if err := dns.Start(); err != nil {
			if l != dnsAddr {
				log.Warn("no IPv6 DNS proxy", "err", err)
				continue
			}
			return fmt.Errorf("DNS proxy: %w", err)
		}
		defer dns.Close()
	}

	var ready atomic.Bool
	readiness := func() error {
		if !ready.Load() {
			return errors.New("starting")
		}
		return nil
	}
	var px *proxy.Proxy
	vs, err := setupVault(cfg, live, deny, func(ctx context.Context, name string, port uint16) (net.Conn, error) {
		return px.DialName(ctx, name, port)
	}, readiness, log)
	if err != nil {
		return err
	}
	defer vs.close()
	if vs.interceptor != nil {
		m.vault(vs.interceptor)
	}
	if cfg.Mode == egress.ModeStrict {
		dialer := &net.Dialer{Control: nft.MarkControl}
		px, err = proxy.New(proxy.Config{
			Listen:  net.JoinHostPort("127.0.0.1", strconv.Itoa(egress.ProxyPort)),
			Decider: live,
			Learned: learned,
			// Names are resolved through the DNS proxy, so that what the
			// proxy dials passed the same filter and was learned.
			Resolver: &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, dnsAddr)
			}},
			Dial:        dialer.DialContext,
			OriginalDst: nft.OriginalDst,
			Intercept:   vs.intercept,
			Deny:        deny,
			Logger:      log,
		})
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		if err := px.Start(); err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		defer px.Close()
		m.proxy(px)
	}

	h, err := egress.NewHandler(egress.HandlerConfig{
		Token:           cfg.Token,
		EnforcementMode: cfg.Mode,
		MaxRules:        cfg.MaxRules,
		Store:           store,
		Apply:           apply,
		Ready:           readiness,
		Denials:         denials,
		Logger:          log,
		Vault:           vs.handler,
		// A policy change may not take away a bound host: the binding
		// would stop working without anyone being told.
		CheckPolicy: func(m *egress.Matcher) error {
			if v := vs.live.Load(); v != nil {
				return v.CheckHosts(m.BindingHostAllowed)
			}
			return nil
		},
	}, live)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("egress API: %w", err)
	}
	srv := &http.Server{Handler: withExtras(h, m.handler(), vs, cfg.Token), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ready.Store(true)
	log.Info("enforcing", "mode", cfg.Mode, "policy", policy.Mode(), "rules", len(policy.Egress), "upstreams", upstreams,
		"credential_proxy", vs.interceptor != nil, "vault", vs.live.Load() != nil, "version", version)

	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("egress API: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// firewallConfig is what the namespace's firewall enforces for policy p.
// Only the dns+nft mode reads the address rules: strict mode's proxy
// judges addresses itself, by the policy's first match. In the firewall a
// denied range wins over an allowed address inside it, so an address rule
// shadowed by an earlier one of the other action is left out; and with a
// default of allow, the special ranges (loopback, private, link-local,
// metadata) are denied unless an allow rule reaches into them.
func firewallConfig(mode string, o egress.Overlay, p egress.Policy, nameservers []netip.Addr) nft.Config {
	c := nft.Config{Mode: mode, DefaultAllow: p.DefaultAction == egress.ActionAllow, Nameservers: nameservers}
	type rule struct {
		allow  bool
		prefix netip.Prefix
	}
	var rules []rule
	add := func(target string, allow bool) {
		if pf, ok := targetPrefix(target); ok {
			rules = append(rules, rule{allow, pf})
		}
	}
	for _, t := range o.Deny {
		add(t, false)
	}
	for _, t := range o.Allow {
		add(t, true)
	}
	for _, r := range p.Egress {
		add(r.Target, r.Action == egress.ActionAllow)
	}
	for i, r := range rules {
		shadowed := false
		for _, earlier := range rules[:i] {
			if earlier.prefix.Bits() <= r.prefix.Bits() && earlier.prefix.Contains(r.prefix.Addr()) {
				shadowed = true
				break
			}
		}
		switch {
		case shadowed:
		case r.allow:
			c.AllowPrefixes = append(c.AllowPrefixes, r.prefix)
		default:
			c.DenyPrefixes = append(c.DenyPrefixes, r.prefix)
		}
	}
	if c.DefaultAllow {
	special:
		for _, s := range egress.SpecialPrefixes() {
			for _, a := range c.AllowPrefixes {
				if a.Overlaps(s) {
					continue special
				}
			}
			c.DenyPrefixes = append(c.DenyPrefixes, s)
		}
	}
	return c
}

// targetPrefix reads a normalised rule target that is an address or a
// range.
func targetPrefix(t string) (netip.Prefix, bool) {
	if pf, err := netip.ParsePrefix(t); err == nil {
		return pf.Masked(), true
	}
	if a, err := netip.ParseAddr(t); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	return netip.Prefix{}, false
}

// metrics are osb-egress's Prometheus metrics, served at /metrics with
// the API's token.
type metrics struct {
	reg    *prometheus.Registry
	denied *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "osb_egress_denied_total",
		Help: "Outbound attempts the policy refused, by kind (dns, tcp, tls, http).",
	}, []string{"kind"})
	m.reg.MustRegister(m.denied, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// proxy adds the transparent proxy's counters.
func (m *metrics) proxy(px *proxy.Proxy) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "osb_egress_proxy_active_connections", Help: "Connections the proxy handles now."},
			func() float64 { return float64(px.Stats().Active) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "osb_egress_proxy_accepted_total", Help: "Connections the proxy accepted."},
			func() float64 { return float64(px.Stats().Accepted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "osb_egress_proxy_overloaded_total", Help: "Connections reset because the proxy was full."},
			func() float64 { return float64(px.Stats().Overloaded) }),
	)
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// vault adds the credential proxy's counters.
func (m *metrics) vault(ic *mitm.Interceptor) {
	for _, c := range []struct {
		name, help string
		get        func(mitm.Stats) uint64
	}{
		{"osb_egress_vault_connections_total", "Connections the credential proxy intercepted.", func(s mitm.Stats) uint64 { return s.Connections }},
		{"osb_egress_vault_requests_total", "Requests on intercepted connections.", func(s mitm.Stats) uint64 { return s.Requests }},
		{"osb_egress_vault_injected_total", "Requests a binding's credential was added to.", func(s mitm.Stats) uint64 { return s.Injected }},
		{"osb_egress_vault_refused_total", "Requests refused (Host not the SNI, an ambiguous binding).", func(s mitm.Stats) uint64 { return s.Refused }},
		{"osb_egress_vault_upstream_errors_total", "Requests whose upstream failed (unreachable, certificate not trusted).", func(s mitm.Stats) uint64 { return s.UpstreamErrors }},
	} {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help},
			func() float64 { return float64(c.get(ic.Stats())) }))
	}
}

// withExtras serves /metrics and the credential proxy's CA (also under
// the API's /proxy/18080 prefix) beside the egress API, with the same
// token.
func withExtras(apiHandler, metrics http.Handler, vs *vaultSetup, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimPrefix(r.URL.Path, egress.ProxyPrefix)
		if path == caRoute && r.Method == http.MethodGet {
			vs.serveCA(w, r, token)
			return
		}
		if path != "/metrics" {
			apiHandler.ServeHTTP(w, r)
			return
		}
		if !egress.Authorized(r, token) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		metrics.ServeHTTP(w, r)
	})
}
