// Package execd is the daemon that runs inside every sandbox: commands,
// background jobs, bash sessions, terminals, files, metrics and a port
// proxy, served over HTTP as the OpenSandbox execd API describes.
//
// Only cmd/execd imports it.
package execd

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// Config configures a Server. The zero value of every field but
// AccessToken/Insecure has a usable default.
type Config struct {
	// AccessToken is the value clients must send in X-EXECD-ACCESS-TOKEN.
	// New refuses an empty token unless Insecure is set.
	AccessToken string
	// Insecure allows an empty AccessToken: every request is accepted.
	Insecure bool

	// Port is the port execd listens on. /proxy/{Port}/... is served by
	// execd itself. 0: none.
	Port int

	// ReapAll makes execd reap every child process, orphans included; set
	// it when execd is PID 1 or a child subreaper, never in a program that
	// waits for children of its own.
	ReapAll bool

	// EnvFile is a KEY=VALUE file merged into every command's environment
	// (the reference daemon's EXECD_ENVS). Empty: none.
	EnvFile string

	// RecordTTL is how long the status of a finished command stays
	// queryable. Default 1 hour.
	RecordTTL time.Duration
	// MaxRecords bounds the number of finished commands kept; the oldest
	// go first. Default 1024.
	MaxRecords int

	// PTYIdleTimeout ends a terminal session that has had no client
	// attached for this long. Default 30 minutes.
	PTYIdleTimeout time.Duration
	// PTYExitedTTL removes a terminal session this long after its process
	// exited while no client was attached. Default 5 minutes.
	PTYExitedTTL time.Duration

	// MaxLogBytes bounds the log kept for each background command; beyond
	// it the oldest output gives way. Default 64 MiB.
	MaxLogBytes int64
	// MaxLogBytesTotal bounds the logs of all background commands
	// together; beyond it the logs of finished commands give way first,
	// then the oldest output of the command writing (down to its last
	// 64 KiB). Default 256 MiB, or where the logs live in memory (a tmpfs
	// or memory files) an eighth of the sandbox's memory limit if that is
	// less.
	MaxLogBytesTotal int64

	// MaxUploadBytes bounds the body of one upload request; 0 means no
	// bound other than the file system's.
	MaxUploadBytes int64

	// TempDir holds execd's private working files (a 0700 directory is
	// made inside it). Default: the system temporary directory.
	TempDir string

	// Claimable lets POST /claim hand the sandbox to a user once: set for
	// the pre-started sandboxes of warm pools only.
	Claimable bool

	// MaxCodeContexts bounds the code contexts (interpreters) alive at
	// once, default contexts included. Default 32.
	MaxCodeContexts int

	// ChildOOMScoreAdj is the oom_score_adj (1 to 1000) of every process
	// execd starts, set before the process runs its first instruction, so
	// that the kernel's OOM killer takes them, and what they start, before
	// execd. Default 1000; -1 leaves them execd's own score.
	ChildOOMScoreAdj int

	// PingInterval is the keep-alive period of event streams. Default 3 s.
	PingInterval time.Duration

	// Logger receives the daemon's log. Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	c.RecordTTL = cmp.Or(c.RecordTTL, time.Hour)
	c.MaxRecords = cmp.Or(c.MaxRecords, 1024)
	c.MaxLogBytes = cmp.Or(c.MaxLogBytes, 64<<20)
	c.PTYIdleTimeout = cmp.Or(c.PTYIdleTimeout, 30*time.Minute)
	c.PTYExitedTTL = cmp.Or(c.PTYExitedTTL, 5*time.Minute)
	c.MaxCodeContexts = cmp.Or(c.MaxCodeContexts, 32)
	c.PingInterval = cmp.Or(c.PingInterval, 3*time.Second)
	c.ChildOOMScoreAdj = cmp.Or(c.ChildOOMScoreAdj, 1000)
	c.TempDir = cmp.Or(c.TempDir, os.TempDir())
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// ErrNoToken is returned by New for a config without an access token that
// is not marked insecure.
var ErrNoToken = errors.New("no access token: set --access-token or EXECD_ACCESS_TOKEN, or pass --insecure to accept every request")

// Server is the execd HTTP API.
type Server struct {
	cfg  Config
	log  *slog.Logger
	sup  *process.Supervisor
	mux  *http.ServeMux
	env  *environment
	priv string // private working directory, 0700

	spools *process.Spools // background commands' logs
	// fileOps holds a token for each file-system request being served.
	fileOps chan struct{}

	commands *commandTable
	sessions *sessionTable
	code     *codeTable
	ptys     *ptyTable
	metrics  *metricsSampler

	proxyHandler http.Handler

	requests atomic.Uint64 // requests served, for the janitor

	// tokenDigest is the SHA-256 of the access token clients must send.
	tokenDigest atomic.Pointer[[32]byte]
	// claim serializes claims; claimed is set by the first.
	claim   sync.Mutex
	claimed bool
	// entry is the entrypoint, once started.
	entry atomic.Pointer[Entrypoint]
	// entryFailed is set when the entrypoint could not start: /ready
	// answers 503 from then on.
	entryFailed atomic.Bool

	stop chan struct{}
}

// New returns a server for cfg.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if cfg.AccessToken == "" && !cfg.Insecure {
		return nil, ErrNoToken
	}
	if a := cfg.ChildOOMScoreAdj; a != -1 && (a < 1 || a > 1000) {
		return nil, fmt.Errorf("child OOM score adjustment %d: want 1 to 1000, or -1 to leave it alone", a)
	}
	env, err := newEnvironment(cfg.EnvFile)
	if err != nil {
		return nil, err
	}
	priv, err := os.MkdirTemp(cfg.TempDir, "execd-")
	if err != nil {
		return nil, fmt.Errorf("create private directory: %w", err)
	}
	if cfg.MaxLogBytesTotal == 0 {
		cfg.MaxLogBytesTotal = defaultLogBudget(priv)
	}
	spools, err := process.NewSpools(priv, cfg.MaxLogBytes, cfg.MaxLogBytesTotal, spoolWriters)
	if err != nil {
		os.RemoveAll(priv)
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		spools:  spools,
		fileOps: make(chan struct{}, fileOps),
		log:     cfg.Logger,
		sup:     process.NewSupervisor(cfg.ReapAll),
		mux:     http.NewServeMux(),
		env:     env,
		priv:    priv,
		stop:    make(chan struct{}),
	}
	s.setUpOOMScores()
	digest := sha256.Sum256([]byte(cfg.AccessToken))
	s.tokenDigest.Store(&digest)
	s.commands = newCommandTable(cfg.RecordTTL, cfg.MaxRecords)
	s.sessions = newSessionTable()
	s.code = newCodeTable(cfg.MaxCodeContexts)
	s.ptys = newPTYTable()
	s.metrics = newMetricsSampler()
	s.routes()
	go s.janitor()
	return s, nil
}

// Handler returns the API with authentication in front of every route
// but one: GET and HEAD of exactly api.ExecdReadyPath (see ready), which
// is served here, ahead of the token check and outside the route table,
// so that neither the /proxy/{port} forwarder nor a path written another
// way ("//ready", "/ready/") reaches it.
func (s *Server) Handler() http.Handler {
	authed := s.authenticate(http.HandlerFunc(s.serve))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == api.ExecdReadyPath && r.URL.RawPath == "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			s.ready(w, r)
			return
		}
		authed.ServeHTTP(w, r)
	})
}

// serve counts a request and dispatches it.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.dispatch(w, r)
}

// dispatch sends /proxy/... to the port proxy (which hands requests for
// execd's own port back here, the prefix stripped) and everything else to
// the route table. Like the reference daemon it answers 404 both for an
// unknown path and for a known path with another method.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/proxy" || strings.HasPrefix(r.URL.Path, "/proxy/") {
		s.proxyHandler.ServeHTTP(w, r)
		return
	}
	if _, pattern := s.mux.Handler(r); pattern == "" {
		http.NotFound(w, r)
		return
	}
	// Only ServeHTTP sets the request's path values (r.PathValue); the
	// handler returned by Handler would see them empty.
	s.mux.ServeHTTP(w, r)
}

// handle adapts a handler that returns an error: errors become JSON
// {code,message} answers, and only server-side failures are logged.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			status := httpx.StatusOf(err)
			if status >= 500 {
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			} else {
				s.log.Debug("request rejected", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
			}
			httpx.WriteError(w, err)
		}
	})
}

// janitor evicts finished records and idle sessions, and gives memory
// back to the system once a burst of requests is over, so an idle sandbox
// costs its host as little as possible.
func (s *Server) janitor() {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	var seen, busy uint64
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.commands.evict(now)
			s.ptys.evict(now, s.cfg.PTYIdleTimeout, s.cfg.PTYExitedTTL)
			n := s.requests.Load()
			if n == seen && busy != seen {
				// A whole tick without requests after some: return the
				// heap the burst left (a few milliseconds for this heap).
				debug.FreeOSMemory()
				busy = seen
			}
			seen = n
		}
	}
}

// Shutdown stops every process execd started and releases the server's
// resources. Sessions and terminals are killed; every other process gets
// SIGTERM at once, except the entrypoint, to which the caller forwards
// the signal it received itself; whatever still runs after grace is
// SIGKILLed. It returns within grace and a second.
func (s *Server) Shutdown(grace time.Duration) {
	select {
	case <-s.stop:
		return
	default:
		close(s.stop)
	}
	s.sessions.closeAll()
	s.code.closeAll()
	s.ptys.closeAll()
	live := s.sup.Live()
	entry := s.commands.get(EntrypointID)
	for _, p := range live {
		if entry == nil || entry.proc != p {
			p.Signal(syscall.SIGTERM)
		}
	}
	done := make(chan struct{})
	go func() {
		for _, p := range live {
			<-p.Done()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		for _, p := range live {
			p.Signal(syscall.SIGKILL)
		}
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
	s.commands.closeAll()
	os.RemoveAll(s.priv)
}

// newID returns a random 32-hex-digit id, the form of the reference
// daemon's command and context ids.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newUUID returns a random RFC 4122 version 4 UUID, the form of session ids.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return strings.Join([]string{h[0:8], h[8:12], h[12:16], h[16:20], h[20:32]}, "-")
}
