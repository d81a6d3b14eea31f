package lifecycle

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Config configures the HTTP API of the lifecycle server. Every field but
// APIKey/Insecure has a usable zero value.
type Config struct {
	// APIKey is the key every request must carry in OPEN-SANDBOX-API-KEY,
	// compared in constant time. GET /health needs none; the proxy route
	// also takes the sandbox's own execd token instead. New refuses an
	// empty key unless Insecure is set.
	APIKey string
	// Insecure allows an empty APIKey: every request is then accepted.
	Insecure bool

	// RuntimeName picks the runtime-specific error codes
	// (api.CodeDockerSandboxNotFound or api.CodeKubernetesSandboxNotFound,
	// ...): "DOCKER" or "KUBERNETES". Default "DOCKER".
	RuntimeName string

	// Egress is the runtime's egress settings when it enforces network
	// policies; nil when it does not, and a create with a networkPolicy is
	// refused.
	Egress *sandbox.EgressConfig

	// PublicAddress is this server's host:port as clients reach it,
	// without scheme or path; use_server_proxy endpoints are built on it.
	// Default: the Host header of the request asking for the endpoint.
	PublicAddress string

	// MaxTimeout bounds a sandbox's timeout (seconds on the wire). 0 means
	// no bound other than about 292 years, where durations overflow.
	MaxTimeout time.Duration
	// MinTimeout is the smallest timeout accepted. Default 60 s, as the
	// reference server.
	MinTimeout time.Duration

	// HostPathAllowlist lists the host directories under which host
	// volumes may be mounted (absolute paths). A volume's path must be
	// under one of them both after filepath.Clean and after resolving
	// symlinks on this host. Empty: host volumes are refused. The Docker
	// socket (/var/run/docker.sock, /run/docker.sock) and the directories
	// that contain it are refused whatever the list says.
	HostPathAllowlist []string

	// AllowedExtensions lists the extension keys a create may carry
	// besides those the server reads (poolRef,
	// access.renew.extend.seconds) and those its runtime reads
	// (sandbox.ExtensionReader): the runtime keeps them as they are. An
	// entry ending in "*" allows every key with that prefix ("team.*");
	// "*" alone allows any key. A key in none of these is a 400.
	AllowedExtensions []string

	// AllowLocalRegistries accepts image references whose registry is a
	// loopback, unspecified or link-local address or a localhost name.
	// Default: refused, since the engine pulling from them reaches
	// services on its own host (this server among them) or a cloud
	// metadata service.
	AllowLocalRegistries bool

	// MaxBodyBytes bounds the JSON body of an API request (never the
	// bodies the proxy route forwards). Default 1 MiB.
	MaxBodyBytes int64

	// Logger receives the server's log: 5xx answers at error level, 4xx
	// at debug, each with its request id. Default: discard.
	Logger *slog.Logger

	// Version is the server's version, reported by GET /health and in
	// opensandbox_build_info. Default "": /health leaves the field out.
	Version string

	// Metrics is the registry GET /metrics serves; New adds the series
	// read from the runtime at scrape time. Give the same Metrics to the
	// runtime and the manager as their Observer. Default: a Metrics of
	// the server's own, without what they report.
	Metrics *Metrics
	// Ingress says whether endpoints go through an ingress gateway and
	// how its routes are written; the zero value is direct endpoints.
	Ingress IngressConfig

	// MetricsPublic serves GET /metrics without the API key. By default
	// it needs the key, which it also takes as "Authorization: Bearer
	// KEY", the form Prometheus sends.
	MetricsPublic bool
}

// ErrNoAPIKey is returned by New for a config without an API key that is
// not marked insecure.
var ErrNoAPIKey = errors.New("no API key: configure one, or mark the server insecure to accept every request")

// setDefaults fills in the fields left zero.
func (c *Config) setDefaults() {
	c.RuntimeName = cmp.Or(c.RuntimeName, "DOCKER")
	c.MinTimeout = cmp.Or(c.MinTimeout, 60*time.Second)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, 1<<20)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
}

// validate reports the first field of c that cannot work, naming it.
func (c *Config) validate() error {
	if c.APIKey == "" && !c.Insecure {
		return ErrNoAPIKey
	}
	if _, ok := runtimeCodes[c.RuntimeName]; !ok {
		return fmt.Errorf("RuntimeName %q: want DOCKER or KUBERNETES", c.RuntimeName)
	}
	if strings.Contains(c.PublicAddress, "://") || strings.Contains(c.PublicAddress, "/") {
		return fmt.Errorf("PublicAddress %q: want host[:port], without scheme or path", c.PublicAddress)
	}
	if c.MinTimeout < time.Second || c.MaxTimeout < 0 || (c.MaxTimeout > 0 && c.MaxTimeout < c.MinTimeout) {
		return fmt.Errorf("MinTimeout %v / MaxTimeout %v: want 1s <= MinTimeout <= MaxTimeout (or MaxTimeout 0)", c.MinTimeout, c.MaxTimeout)
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("MaxBodyBytes %d: must not be negative", c.MaxBodyBytes)
	}
	for _, p := range c.HostPathAllowlist {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("HostPathAllowlist entry %q: not an absolute path", p)
		}
	}
	for _, k := range c.AllowedExtensions {
		if k == "" || strings.Contains(strings.TrimSuffix(k, "*"), "*") {
			return fmt.Errorf("AllowedExtensions entry %q: want a key, or a prefix followed by *", k)
		}
	}
	return c.Ingress.validate()
}

// Server is the lifecycle HTTP API: sandboxes, snapshots, endpoints,
// diagnostics, the server proxy and health, served at the root and under
// /v1 alike.
type Server struct {
	m       *Manager
	rt      sandbox.Runtime
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler
	proxy   *httputil.ReverseProxy
	renew   *renewThrottle
	// keyDigest is the SHA-256 of the API key; comparing digests keeps
	// even the key's length secret.
	keyDigest [sha256.Size]byte
	allow     []string // HostPathAllowlist, cleaned
	// allowResolved is allow with symbolic links resolved once, at
	// start: a link a sandbox swaps in later cannot widen it.
	allowResolved []string
	now           func() time.Time
	metrics       *Metrics
	scrape        http.Handler // GET /metrics
}

// New returns the API of m. It fails on a config that cannot work,
// such as one without an API key that is not marked Insecure.
func New(m *Manager, cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("lifecycle server config: %w", err)
	}
	if _, ok := runtimeCodes[m.cfg.RuntimeName]; !ok {
		return nil, fmt.Errorf("lifecycle manager config: RuntimeName %q: want DOCKER or KUBERNETES", m.cfg.RuntimeName)
	}
	s := &Server{
		m:         m,
		rt:        m.Runtime(),
		cfg:       cfg,
		log:       cfg.Logger,
		mux:       http.NewServeMux(),
		renew:     newRenewThrottle(),
		keyDigest: sha256.Sum256([]byte(cfg.APIKey)),
		now:       time.Now,
		metrics:   cfg.Metrics,
	}
	var err error
	if s.allow, s.allowResolved, err = hostAllowlist(cfg.HostPathAllowlist); err != nil {
		return nil, fmt.Errorf("lifecycle server config: %w", err)
	}
	scrape, err := cfg.Metrics.attach(s.rt, cfg.Version, s.log)
	if err != nil {
		return nil, err
	}
	s.scrape = scrape
	s.proxy = s.newProxy()
	s.routes()
	s.handler = http.HandlerFunc(s.serve)
	return s, nil
}

// KeyRequired reports whether requests need the API key: always, unless
// the server has no key (Insecure), when every request is accepted.
func (s *Server) KeyRequired() bool { return s.cfg.APIKey != "" }

// Handler returns the whole API: every route at the root and under /v1.
func (s *Server) Handler() http.Handler { return s.handler }

// Keys of the server's log attributes.
const (
	logRequestID = "requestId"
	logMethod    = "method"
	logPath      = "path"
	logStatus    = "status"
	logCode      = "code"
	logErr       = "err"
	logSandbox   = "sandbox"
)

// requestIDKey keys the request id in a request's context.
type requestIDKey struct{}

// requestIDOf returns the request id that serve gave r.
func requestIDOf(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// routeKey keys, in a request's context, the *routeSlot where the
// route's handler records its route label.
type routeKey struct{}

// routeSlot holds the route label of a request, "" until a route's
// handler ran.
type routeSlot struct{ label string }

// serve is the front of every request: it sets X-Request-ID, times the
// request for opensandbox_http_request_duration_seconds, turns a panic
// into a 500, sends the proxy route to the proxy (which authenticates on
// its own), lets /health through (and /metrics if MetricsPublic), and
// authenticates everything else before the route table.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := httpx.RequestID(r.Header.Get(api.HeaderRequestID))
	w.Header().Set(api.HeaderRequestID, id)
	route := &routeSlot{}
	r = r.WithContext(context.WithValue(context.WithValue(r.Context(), requestIDKey{}, id), routeKey{}, route))
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		s.metrics.observeRequest(cmp.Or(route.label, routeOther), r.Method, sw.status(), time.Since(start))
	}()
	defer s.recoverPanic(sw, r)

	if pr, ok := parseProxyPath(r.URL.EscapedPath()); ok {
		// Bypasses the mux, which would redirect paths it finds untidy
		// ("//", "/./") where the proxy must forward them as they are.
		route.label = routeProxy
		s.serveProxy(sw, r, pr)
		return
	}
	var err error
	switch p := r.URL.Path; {
	case p == "/health" || p == "/v1/health":
	case p == "/metrics" || p == "/v1/metrics":
		if !s.cfg.MetricsPublic {
			err = s.authenticateMetrics(r)
		}
	default:
		err = s.authenticate(r)
	}
	if err != nil {
		_, pattern := s.mux.Handler(r)
		route.label = routeLabel(pattern)
		s.writeError(sw, r, err)
		return
	}
	s.mux.ServeHTTP(sw, r)
}

// recoverPanic answers a panicking request with a 500 envelope and logs
// the stack. http.ErrAbortHandler, the proxy's way of dropping a
// connection mid-stream, passes through.
func (s *Server) recoverPanic(w http.ResponseWriter, r *http.Request) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		panic(v)
	}
	s.log.Error("handler panicked", logRequestID, requestIDOf(r), logMethod, r.Method, logPath, r.URL.Path,
		"panic", v, "stack", string(debug.Stack()))
	httpx.WriteJSON(w, http.StatusInternalServerError, api.ErrorResponse{
		Code: codeUnknownError, Message: "an unexpected error occurred (request id " + requestIDOf(r) + ")"})
}

// handle adapts a handler that returns an error; writeError answers the
// error. It records the request's route label from the mux pattern that
// matched.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slot, ok := r.Context().Value(routeKey{}).(*routeSlot); ok {
			slot.label = routeLabel(r.Pattern)
		}
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// Error codes of the lifecycle API that do not depend on the runtime.
const (
	codeInvalidParameter  = api.CodeSandboxInvalidParameter
	codeUnknownError      = api.CodeSandboxUnknownError
	codeConflict          = api.CodeSandboxConflict
	codeNotImplemented    = api.CodeSandboxNotImplemented
	codeUnavailable       = api.CodeSandboxUnavailable
	codeRequestTooLarge   = api.CodeSandboxRequestTooLarge
	codeAPINotSupported   = api.CodeSandboxAPINotSupported
	codeNotFound          = api.CodeSandboxRouteNotFound
	codeMethodNotAllowed  = api.CodeSandboxMethodNotAllowed
	codeBadGateway        = api.CodeSandboxBadGateway
	codeMetadataLabel     = api.CodeSandboxInvalidMetadataLabel
	codePatchLabel        = api.CodeInvalidMetadataLabel // the reference's code on PATCH .../metadata
	codeMetadataFormat    = api.CodeInvalidMetadataFormat
	codeUnsupportedPool   = api.CodeSandboxUnsupportedPoolRef
	codeSnapshotNotFound  = api.CodeSnapshotNotFound
	codeSnapshotNotImpl   = api.CodeSnapshotNotImplemented
	codePoolNotImpl       = api.CodePoolNotImplemented
	codeInvalidScope      = api.CodeDiagnosticsInvalidScope
	codeMissingAPIKey     = api.CodeMissingAPIKey
	codeInvalidAPIKey     = api.CodeInvalidAPIKey
	codeVolumeName        = api.CodeVolumeInvalidName
	codeVolumeDuplicate   = api.CodeVolumeDuplicateName
	codeVolumeBackend     = api.CodeVolumeInvalidBackend
	codeVolumeMountPath   = api.CodeVolumeInvalidMountPath
	codeVolumeSubPath     = api.CodeVolumeInvalidSubPath
	codeVolumeHostPath    = api.CodeVolumeInvalidHostPath
	codeVolumeNotAllowed  = api.CodeVolumeHostPathNotAllowed
	codeVolumePVCName     = api.CodeVolumeInvalidPVCName
	codeVolumeUnsupported = api.CodeVolumeUnsupportedBackend
)

// runtimeCodeSet holds the codes whose prefix names the runtime
// (RuntimeName).
type runtimeCodeSet struct {
	sandboxNotFound, invalidEntrypoint, invalidPort, invalidExpiration string
}

// runtimeCodes maps each RuntimeName to its codes.
var runtimeCodes = map[string]runtimeCodeSet{
	"DOCKER":     {api.CodeDockerSandboxNotFound, api.CodeDockerInvalidEntrypoint, api.CodeDockerInvalidPort, api.CodeDockerInvalidExpiration},
	"KUBERNETES": {api.CodeKubernetesSandboxNotFound, api.CodeKubernetesInvalidEntrypoint, api.CodeKubernetesInvalidPort, api.CodeKubernetesInvalidExpiration},
}

// codes returns the codes of the server's runtime.
func (s *Server) codes() runtimeCodeSet { return runtimeCodes[s.cfg.RuntimeName] }

// invalid returns a 400 answer with code and a formatted message.
func invalid(code, format string, args ...any) error {
	return httpx.Errorf(http.StatusBadRequest, code, format, args...)
}

// httpErr returns an answer with status, code and message.
func httpErr(status int, code, msg string) error {
	return &httpx.Error{Status: status, Code: code, Message: msg}
}

// errorAnswer is how writeError answers an error.
type errorAnswer struct {
	status        int
	code, message string
}

// classify decides the status, code and message of err: an *httpx.Error
// or a *sandbox.CodedError says so itself; the sandbox kinds map to their
// statuses; anything else is a 500 whose details stay in the log.
func (s *Server) classify(r *http.Request, err error) errorAnswer {
	var he *httpx.Error
	var ce *sandbox.CodedError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &he):
		return errorAnswer{he.Status, he.Code, he.Message}
	case errors.As(err, &mbe):
		return errorAnswer{http.StatusRequestEntityTooLarge, codeRequestTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit)}
	case errors.As(err, &ce):
		if st := statusOfKind(ce.Kind); st != http.StatusInternalServerError {
			return errorAnswer{st, ce.Code, ce.Msg}
		}
		return errorAnswer{http.StatusInternalServerError, ce.Code, "an unexpected error occurred (request id " + requestIDOf(r) + ")"}
	case errors.Is(err, sandbox.ErrNotFound):
		return errorAnswer{http.StatusNotFound, s.codes().sandboxNotFound, err.Error()}
	case errors.Is(err, sandbox.ErrInvalid):
		return errorAnswer{http.StatusBadRequest, codeInvalidParameter, err.Error()}
	case errors.Is(err, sandbox.ErrConflict):
		return errorAnswer{http.StatusConflict, codeConflict, err.Error()}
	case errors.Is(err, sandbox.ErrNotImplemented):
		return errorAnswer{http.StatusNotImplemented, codeNotImplemented, err.Error()}
	case errors.Is(err, sandbox.ErrUnavailable):
		return errorAnswer{http.StatusServiceUnavailable, codeUnavailable, err.Error()}
	}
	return errorAnswer{http.StatusInternalServerError, codeUnknownError, "an unexpected error occurred (request id " + requestIDOf(r) + ")"}
}

// statusOfKind returns the HTTP status of a sandbox error kind.
func statusOfKind(kind error) int {
	switch {
	case errors.Is(kind, sandbox.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(kind, sandbox.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(kind, sandbox.ErrConflict):
		return http.StatusConflict
	case errors.Is(kind, sandbox.ErrNotImplemented):
		return http.StatusNotImplemented
	case errors.Is(kind, sandbox.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// writeError answers err with the {code,message} envelope and logs it:
// server failures (500, 503) at error level unless the client has gone,
// the rest (4xx, 501, a sandbox that does not answer its port: 502) at
// debug.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	a := s.classify(r, err)
	attrs := []any{logRequestID, requestIDOf(r), logMethod, r.Method, logPath, r.URL.Path, logStatus, a.status, logCode, a.code, logErr, err}
	if (a.status == http.StatusInternalServerError || a.status == http.StatusServiceUnavailable) && r.Context().Err() == nil {
		s.log.Error("request failed", attrs...)
	} else {
		s.log.Debug("request rejected", attrs...)
	}
	httpx.WriteJSON(w, a.status, api.ErrorResponse{Code: a.code, Message: a.message})
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	httpx.WriteJSON(w, status, v)
	return nil
}

// decodeJSON decodes the request body into v, reading at most
// MaxBodyBytes. Unknown fields are ignored, as by the reference server.
// An empty body is an error unless optional is set, when it leaves v
// unchanged.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return httpx.Errorf(http.StatusRequestEntityTooLarge, codeRequestTooLarge, "request body larger than %d bytes", mbe.Limit)
		}
		return invalid(codeInvalidParameter, "read request body: %v", err)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		if optional {
			return nil
		}
		return invalid(codeInvalidParameter, "a JSON request body is required")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return invalid(codeInvalidParameter, "invalid JSON body: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}
