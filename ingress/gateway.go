package ingress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// Config configures a Gateway.
type Config struct {
	// Keys returns the current signing keys (a key file may be reloaded
	// between calls). nil, or an empty set: signed routes and access
	// tokens cannot be checked, and requests that carry them get 503
	// CodeIngressUnavailable; public sandboxes are still served.
	Keys func() *Keys
	// Resolver finds sandboxes. Required.
	Resolver Resolver
	// Renewer, optional, receives renew-on-access requests for served
	// traffic to sandboxes that opted in.
	Renewer Renewer
	// RenewEvery is the per-sandbox throttle of Renewer calls; default
	// 60s.
	RenewEvery time.Duration
	// Domain makes "{route}.{Domain}" hosts subdomain routes; "" turns
	// subdomain routes off. A port and a leading "*." are ignored.
	Domain string
	// Logger receives the access log (Info) and errors; default discard.
	Logger *slog.Logger
	// Metrics, optional, registers the gateway's Prometheus collectors.
	Metrics prometheus.Registerer
	// CacheTTL is how long a resolver answer is reused; default 1s, a
	// negative value turns the cache off. Answers of "not found" and
	// failures are kept a quarter of it.
	CacheTTL time.Duration
	// Transport carries requests to sandboxes; default a shared pool of
	// HTTP/1.1 connections (DefaultTransport).
	Transport http.RoundTripper
}

// Defaults of Config.
const (
	DefaultRenewEvery = time.Minute
	DefaultCacheTTL   = time.Second
)

// Bounds of the gateway's work on the side.
const (
	// maxRenewsInFlight bounds the concurrent Renewer calls; beyond it a
	// renew is skipped and tried on the next request.
	maxRenewsInFlight = 64
	// renewTimeout bounds one Renewer call.
	renewTimeout = 10 * time.Second
	// copyBufferSize is the size of the buffers that copy bodies.
	copyBufferSize = 256 << 10
)

// DefaultTransport is the gateway's default pool of connections to
// sandboxes: plain HTTP/1.1 (upgrades pass), no proxy from the
// environment, no response timeout (streams and long polls last as long
// as they last), encodings left to client and sandbox, large socket
// buffers for downloads.
var DefaultTransport http.RoundTripper = &http.Transport{
	DialContext: (&net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
	}).DialContext,
	MaxIdleConns:          1024,
	MaxIdleConnsPerHost:   64,
	IdleConnTimeout:       90 * time.Second,
	ExpectContinueTimeout: time.Second,
	DisableCompression:    true,
	WriteBufferSize:       64 << 10,
	ReadBufferSize:        64 << 10,
}

// Gateway is the ingress reverse proxy. It is an http.Handler.
type Gateway struct {
	cfg      Config
	log      *slog.Logger
	proxy    *httputil.ReverseProxy
	cache    *targetCache
	renew    renewThrottle
	renewing atomic.Int32
	metrics  *metrics
	health   http.Handler
}

// New returns a gateway; it fails when the configuration is incomplete
// or the metrics cannot be registered.
func New(cfg Config) (*Gateway, error) {
	if cfg.Resolver == nil {
		return nil, errors.New("ingress: Config.Resolver is required")
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = DefaultRenewEvery
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.Keys == nil {
		cfg.Keys = func() *Keys { return nil }
	}
	if cfg.Transport == nil {
		cfg.Transport = DefaultTransport
	}
	cfg.Domain = normalizeDomain(cfg.Domain)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("ingress metrics: %w", err)
	}
	g := &Gateway{
		cfg:     cfg,
		log:     log,
		cache:   newTargetCache(cfg.Resolver, cfg.CacheTTL),
		renew:   renewThrottle{next: map[string]time.Time{}},
		metrics: m,
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      cfg.Transport,
		FlushInterval:  -1,
		BufferPool:     bufferPool{},
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ModifyResponse: modifyResponse,
		ErrorHandler:   g.proxyError,
	}
	g.health = g.newHealth()
	return g, nil
}

// normalizeDomain reads "*.example.com", "example.com." and
// "example.com:8443" all as "example.com": routes are matched on the
// host without its port.
func normalizeDomain(d string) string {
	d = strings.TrimPrefix(strings.TrimSpace(strings.ToLower(d)), "*.")
	if h, _, err := net.SplitHostPort(d); err == nil {
		d = h
	}
	return strings.Trim(d, ".")
}

// Keys of the gateway's log attributes.
const (
	logRequestID = "requestId"
	logMethod    = "method"
	logPath      = "path"
	logStatus    = "status"
	logCode      = "code"
	logSandbox   = "sandbox"
	logPort      = "port"
	logMode      = "mode"
	logAuth      = "auth"
	logBytesIn   = "bytesIn"
	logBytesOut  = "bytesOut"
	logDuration  = "duration"
	logRemote    = "remote"
	logErr       = "err"
)

// How a request was let through, for the access log.
const (
	authToken  = "token"
	authSigned = "signed"
	authPublic = "public"
)

// forward is what the rewrite function needs of an accepted request; it
// travels in the request's context.
type forward struct {
	host      string // host:port
	path      string // escaped
	headers   map[string]string
	requestID string
	x         *exchange
}

type forwardKey struct{}

// exchange is one request's record for the log and the metrics.
type exchange struct {
	route Route
	code  string // the gateway's error code, when it answered itself
	auth  string
	err   error
}

// ServeHTTP routes r to a sandbox's port. A request without a route gets
// the health answers on /healthz and /readyz and 400 elsewhere. The
// caller's right to reach the sandbox is decided before anything about
// the sandbox is looked up or told: without a valid token or signed
// route the answer is 401, whether or not the sandbox exists, unless
// the sandbox is public.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	g.metrics.activeReqs.Inc()
	defer g.metrics.activeReqs.Dec()

	reqID := httpx.RequestID(r.Header.Get(api.HeaderRequestID))
	w.Header().Set(api.HeaderRequestID, reqID)
	var in atomic.Int64
	rw := &respWriter{ResponseWriter: w, in: &in}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countBody{ReadCloser: r.Body, n: &in}
	}
	x := &exchange{}
	defer func() {
		status := rw.status()
		class := statusClass(status)
		g.metrics.requests.WithLabelValues(class).Inc()
		g.metrics.duration.WithLabelValues(class).Observe(time.Since(start).Seconds())
		g.metrics.bytesIn.Add(float64(in.Load()))
		g.metrics.bytesOut.Add(float64(rw.out.Load()))
		g.accessLog(r, x, reqID, status, in.Load(), rw.out.Load(), time.Since(start))
	}()

	rt, err := ParseRoute(r, g.cfg.Domain)
	if errors.Is(err, ErrNoRoute) && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz") {
		g.health.ServeHTTP(rw, r)
		return
	}
	if err != nil {
		g.fail(rw, x, missInvalidRoute, http.StatusBadRequest, api.CodeIngressInvalidRoute, err.Error(), nil)
		return
	}
	x.route = rt
	if rt.Mode == ModePath && rt.Path == "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		// A browser opening ".../{port}" or ".../{signature}" would
		// resolve the page's relative links one level up, outside the
		// route: send it to the same route with a slash.
		loc := r.URL.EscapedPath() + "/"
		if r.URL.RawQuery != "" {
			loc += "?" + r.URL.RawQuery
		}
		http.Redirect(rw, r, loc, http.StatusTemporaryRedirect)
		return
	}

	keys := g.cfg.Keys()
	token := r.Header.Get(api.HeaderSecureAccess)
	authErr := g.authenticate(keys, rt, token, x)

	t, err := g.cache.get(r.Context(), rt.SandboxID, rt.Port)
	if authErr != nil {
		// Only a public sandbox may be reached without credentials;
		// any other answer is 401, so that nothing about the sandbox
		// leaks.
		if err == nil && t.Public {
			x.auth = authPublic
		} else if err != nil && !errors.Is(err, ErrNotFound) && r.Context().Err() == nil {
			g.fail(rw, x, missUnavailable, http.StatusServiceUnavailable, api.CodeIngressUnavailable,
				"the gateway cannot find sandboxes right now", err)
			return
		} else if errors.Is(authErr, ErrNoKeys) {
			g.fail(rw, x, missUnavailable, http.StatusServiceUnavailable, api.CodeIngressUnavailable,
				"the gateway has no signing keys to check tokens and signed routes with", authErr)
			return
		} else {
			g.fail(rw, x, missUnauthorized, http.StatusUnauthorized, api.CodeIngressUnauthorized,
				"send the sandbox's "+api.HeaderSecureAccess+" token or use a valid, unexpired signed route", authErr)
			return
		}
	}
	switch {
	case errors.Is(err, ErrNotFound):
		g.fail(rw, x, missNotFound, http.StatusNotFound, api.CodeIngressSandboxNotFound,
			fmt.Sprintf("sandbox %s not found", rt.SandboxID), nil)
		return
	case err != nil:
		if r.Context().Err() != nil {
			x.err = err
			return // the client has gone
		}
		g.fail(rw, x, missUnavailable, http.StatusServiceUnavailable, api.CodeIngressUnavailable,
			"the gateway cannot find sandboxes right now", err)
		return
	case t.State != "Running":
		msg := fmt.Sprintf("sandbox %s is %s", rt.SandboxID, t.State)
		if t.Reason != "" {
			msg += ": " + t.Reason
		}
		g.fail(rw, x, missNotRunning, http.StatusServiceUnavailable, api.CodeIngressSandboxNotRunning, msg, nil)
		return
	case t.Endpoint == "":
		g.fail(rw, x, missUpstream, http.StatusBadGateway, api.CodeIngressBadGateway,
			fmt.Sprintf("sandbox %s has no address for port %d", rt.SandboxID, rt.Port), nil)
		return
	}

	g.maybeRenew(t, rt)
	host, prefix, _ := strings.Cut(t.Endpoint, "/")
	if prefix != "" {
		prefix = "/" + prefix
	}
	path := prefix + rt.Path
	if path == "" {
		path = "/"
	}
	f := &forward{host: host, path: path, headers: t.Headers, requestID: reqID, x: x}
	g.proxy.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), forwardKey{}, f)))
}

// authenticate checks the request's credentials for rt: a valid signed
// route, or the sandbox's access token. It returns nil and sets x.auth
// when one holds; ErrNoKeys when there are credentials but no keys to
// check them with; another error otherwise (no credentials included).
func (g *Gateway) authenticate(keys *Keys, rt Route, token string, x *exchange) error {
	if !rt.Signed() && token == "" {
		return errors.New("no credentials")
	}
	if keys.Empty() {
		return ErrNoKeys
	}
	if rt.Signed() {
		if err := keys.Verify(rt.SandboxID, rt.Port, rt.Expires, rt.Signature, time.Now()); err == nil {
			x.auth = authSigned
			return nil
		} else if token == "" {
			return err
		}
	}
	if keys.CheckAccessToken(rt.SandboxID, token) {
		x.auth = authToken
		return nil
	}
	return errors.New("wrong access token")
}

// fail answers r with the gateway's own error.
func (g *Gateway) fail(w http.ResponseWriter, x *exchange, miss string, status int, code, msg string, err error) {
	g.metrics.misses.WithLabelValues(miss).Inc()
	x.code, x.err = code, err
	httpx.WriteJSON(w, status, api.ErrorResponse{Code: code, Message: msg})
}

// proxyError answers a request the sandbox did not answer: 502, unless
// the client has gone.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	f := r.Context().Value(forwardKey{}).(*forward)
	f.x.err = err
	if r.Context().Err() != nil {
		return
	}
	g.metrics.misses.WithLabelValues(missUpstream).Inc()
	f.x.code = api.CodeIngressBadGateway
	httpx.WriteJSON(w, http.StatusBadGateway, api.ErrorResponse{Code: api.CodeIngressBadGateway,
		Message: "the sandbox did not answer on this port"})
}

// maybeRenew asks for a renew-on-access of t's sandbox when it opted in
// and was not renewed within RenewEvery, on the side: the request never
// waits for it.
func (g *Gateway) maybeRenew(t api.IngressTarget, rt Route) {
	if g.cfg.Renewer == nil || t.RenewExtendSeconds <= 0 {
		return
	}
	now := time.Now()
	if !g.renew.claim(rt.SandboxID, now, now.Add(g.cfg.RenewEvery)) {
		return
	}
	if g.renewing.Add(1) > maxRenewsInFlight {
		g.renewing.Add(-1)
		g.renew.forget(rt.SandboxID)
		return
	}
	go func() {
		defer g.renewing.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
		defer cancel()
		if err := g.cfg.Renewer.Renew(ctx, rt.SandboxID, rt.Port); err != nil {
			g.log.Warn("renew on access", logSandbox, rt.SandboxID, logErr, err)
			return
		}
		g.log.Debug("renewed on access", logSandbox, rt.SandboxID)
	}()
}

// rewrite aims an accepted request at its sandbox: the target's address
// and path prefix plus the route's path, the query as sent; the route
// headers and the access token removed (the token must never reach the
// sandbox), the target's headers added, Host the target's, and
// X-Forwarded-For/-Host/-Proto describing this hop's client (those the
// client sent are dropped by httputil.ReverseProxy before rewrite).
// Hop-by-hop headers are removed by httputil.ReverseProxy.
func rewrite(pr *httputil.ProxyRequest) {
	f := pr.In.Context().Value(forwardKey{}).(*forward)
	u := pr.Out.URL
	u.Scheme, u.Host = "http", f.host
	if p, err := url.PathUnescape(f.path); err == nil {
		u.Path, u.RawPath = p, f.path
	} else {
		u.Path, u.RawPath = f.path, ""
	}
	pr.Out.Host = ""
	pr.SetXForwarded()
	h := pr.Out.Header
	h.Del(api.HeaderIngressTo)
	h.Del(api.HeaderIngressLegacy)
	h.Del(api.HeaderSecureAccess)
	h.Del(api.HeaderAPIKey)
	for k, v := range f.headers {
		h.Set(k, v)
	}
	h.Set(api.HeaderRequestID, f.requestID)
}

// modifyResponse keeps the gateway's X-Request-ID the only one.
func modifyResponse(resp *http.Response) error {
	resp.Header.Del(api.HeaderRequestID)
	return nil
}

// accessLog writes one line per request: never a token, a signature or
// a query string, and the path only once the route is known (in path
// mode, what follows the route).
func (g *Gateway) accessLog(r *http.Request, x *exchange, reqID string, status int, in, out int64, d time.Duration) {
	attrs := make([]slog.Attr, 0, 14)
	attrs = append(attrs,
		slog.String(logRequestID, reqID),
		slog.String(logMethod, r.Method),
		slog.Int(logStatus, status),
		slog.String(logRemote, r.RemoteAddr),
		slog.Int64(logBytesIn, in),
		slog.Int64(logBytesOut, out),
		slog.Duration(logDuration, d),
	)
	if x.route.SandboxID != "" {
		attrs = append(attrs,
			slog.String(logSandbox, x.route.SandboxID),
			slog.Int(logPort, x.route.Port),
			slog.String(logMode, x.route.Mode),
			slog.String(logPath, logPathOf(x.route.Path)))
	}
	if x.auth != "" {
		attrs = append(attrs, slog.String(logAuth, x.auth))
	}
	if x.code != "" {
		attrs = append(attrs, slog.String(logCode, x.code))
	}
	if x.err != nil {
		attrs = append(attrs, slog.String(logErr, x.err.Error()))
	}
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelWarn
	}
	g.log.LogAttrs(context.Background(), level, "ingress", attrs...)
}

func logPathOf(p string) string {
	if p == "" {
		return "/"
	}
	return truncate(p, 256)
}

// ConnState reports client connections to the active-connections gauge;
// set it as the http.Server's ConnState.
func (g *Gateway) ConnState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		g.metrics.activeConns.Inc()
	case http.StateClosed, http.StateHijacked:
		g.metrics.activeConns.Dec()
	}
}

// Health returns the health routes: GET /healthz answers 200 while the
// process serves; GET /readyz answers 200 when the resolver answers
// (a resolver with a Ready(ctx) error method is asked that instead) and
// 503 otherwise.
func (g *Gateway) Health() http.Handler { return g.health }

// readyTimeout bounds a readiness check.
const readyTimeout = 3 * time.Second

// readinessProbeID is the sandbox a readiness check asks the resolver
// about: any answer, "not found" included, shows that it answers.
const readinessProbeID = "osb-ingress-readiness-probe"

func (g *Gateway) newHealth() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := g.ready(ctx); err != nil {
			// The cause (addresses, credentials trouble) goes to the log,
			// not to whoever asks.
			g.log.Warn("not ready", logErr, err)
			httpx.WriteJSON(w, http.StatusServiceUnavailable, api.ErrorResponse{Code: api.CodeIngressUnavailable,
				Message: "the gateway cannot find sandboxes right now"})
			return
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready", "keys": g.cfg.Keys().IDs()})
	})
	return mux
}

func (g *Gateway) ready(ctx context.Context) error {
	if rd, ok := g.cfg.Resolver.(interface{ Ready(context.Context) error }); ok {
		return rd.Ready(ctx)
	}
	_, err := g.cfg.Resolver.Target(ctx, readinessProbeID, 1)
	if err == nil || errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// bufferPool lends the reverse proxy its copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// HTTPServer returns the http.Server a gateway listens with, serving h
// (the gateway, or a handler around it): HTTP/1.1, with HTTP/2 over TLS
// when withTLS and h2c otherwise, bounded header reads, idle connections
// closed after two minutes, the gateway's connection gauge, and the
// server's own errors at debug level in log.
func (g *Gateway) HTTPServer(h http.Handler, withTLS bool, log *slog.Logger) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	if withTLS {
		protos.SetHTTP2(true)
	} else {
		protos.SetUnencryptedHTTP2(true)
	}
	return &http.Server{
		Handler:           h,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnState:         g.ConnState,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}
