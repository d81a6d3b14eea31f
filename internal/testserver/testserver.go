// Package testserver runs a real lifecycle server in the test process,
// on the local Docker engine, for the tests of its clients (the SDK, the
// CLI). Each server has its own data directory and label scope, and
// removes every container it made when closed. Only tests import it.
package testserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/runtime/docker"
)

// Server is a lifecycle server on loopback.
type Server struct {
	// URL is the server's root, http://127.0.0.1:PORT.
	URL string
	// Addr is URL without its scheme: what OPEN_SANDBOX_DOMAIN takes.
	Addr string
	// APIKey is the key the server requires.
	APIKey string
	// Scope is the Docker label scope of the server's containers.
	Scope string
	// GatewayURL is the root of the ingress gateway served beside the
	// API when Options.Gateway asks for one, http://127.0.0.1:PORT.
	GatewayURL string
	// Keys are that gateway's signing keys.
	Keys *ingress.Keys

	gw *httptest.Server

	hs      *httptest.Server
	rt      *docker.Runtime
	stop    context.CancelFunc
	done    chan struct{}
	dataDir string
}

var (
	buildOnce sync.Once
	execdPath string
	buildErr  error
)

// ModuleRoot is the directory of the module's go.mod.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// BuildExecd builds the static execd binary once per test process and
// returns its path.
func BuildExecd() (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "osb-testserver-")
		if err != nil {
			buildErr = err
			return
		}
		execdPath = filepath.Join(dir, "execd")
		cmd := exec.Command("go", "build", "-trimpath", "-o", execdPath, "./cmd/execd")
		cmd.Dir = ModuleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build execd: %v\n%s", err, out)
		}
	})
	return execdPath, buildErr
}

// Options adjusts a server.
type Options struct {
	// Logger receives the server's log; default discard.
	Logger *slog.Logger
	// Docker adjusts the runtime's configuration.
	Docker func(*docker.Config)
	// Lifecycle adjusts the HTTP API's configuration.
	Lifecycle func(*lifecycle.Config)
	// Gateway, when set, serves an ingress gateway beside the API, with a
	// signing key of its own, and the endpoint API answers its routes in
	// this route mode (lifecycle.RouteHeader, RouteURI).
	Gateway string
}

// New starts a server. The caller must Close it.
func New(opts Options) (*Server, error) {
	execd, err := BuildExecd()
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "osb-testserver-data-")
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{Scope: "t-" + randomHex(6), APIKey: randomHex(24), dataDir: dataDir, done: make(chan struct{})}
	cfg := docker.Config{DataDir: dataDir, ExecdPath: execd, LabelScope: s.Scope,
		// Twice what a test waits for a start on this machine, so that the
		// test's wait, which says what the sandbox was doing, runs out first.
		StartTimeout: max(30*time.Second, testwait.TimeoutN(2))}
	if opts.Docker != nil {
		opts.Docker(&cfg)
	}
	rt, err := docker.New(cfg, log)
	if err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	s.rt = rt
	mgr := lifecycle.NewManager(rt, lifecycle.ManagerConfig{Logger: log})
	// Clients' tests create from images on closed loopback ports to see
	// pulls fail without a packet leaving the machine.
	lcfg := lifecycle.Config{APIKey: s.APIKey, MinTimeout: time.Second, Logger: log, AllowLocalRegistries: true}
	var gwLn net.Listener
	if opts.Gateway != "" {
		if gwLn, err = s.gatewayConfig(&lcfg, opts.Gateway); err != nil {
			rt.Close()
			os.RemoveAll(dataDir)
			return nil, err
		}
	}
	if opts.Lifecycle != nil {
		opts.Lifecycle(&lcfg)
	}
	srv, err := lifecycle.New(mgr, lcfg)
	if err == nil && gwLn != nil {
		err = s.startGateway(srv, gwLn, log)
	}
	if err != nil {
		if gwLn != nil {
			gwLn.Close()
		}
		rt.Close()
		os.RemoveAll(dataDir)
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	go func() {
		defer close(s.done)
		mgr.Run(ctx)
	}()
	s.hs = httptest.NewServer(srv.Handler())
	s.URL = s.hs.URL
	s.Addr = strings.TrimPrefix(s.URL, "http://")
	return s, nil
}

// Start starts a server for one test, which needs Docker; it is closed
// when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	testenv.MustHaveDocker(t)
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and removes every container, image and volume
// of its scope.
func (s *Server) Close() {
	if s.gw != nil {
		s.gw.Close()
	}
	s.hs.Close()
	s.stop()
	<-s.done
	s.rt.Close()
	RemoveScope(s.Scope)
	os.RemoveAll(s.dataDir)
}

// RemoveScope removes every container, snapshot image and volume of a
// label scope. The engine finishes a create whose client has gone, so
// containers are swept twice, a moment apart.
func RemoveScope(scope string) {
	label := "label=opensandbox.scope=" + scope
	for i := range 2 {
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		if ids, _ := exec.Command("docker", "ps", "-aq", "--filter", label).Output(); len(bytes.TrimSpace(ids)) > 0 {
			exec.Command("docker", append([]string{"rm", "-f"}, strings.Fields(string(ids))...)...).Run()
		}
	}
	if ids, _ := exec.Command("docker", "images", "-q", "--filter", label).Output(); len(bytes.TrimSpace(ids)) > 0 {
		exec.Command("docker", append([]string{"rmi", "-f"}, strings.Fields(string(ids))...)...).Run()
	}
	if names, _ := exec.Command("docker", "volume", "ls", "-q", "--filter", label).Output(); len(bytes.TrimSpace(names)) > 0 {
		exec.Command("docker", append([]string{"volume", "rm", "-f"}, strings.Fields(string(names))...)...).Run()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// gatewayConfig makes the server's signing key and the gateway's
// listener, and sets lcfg to answer the gateway's routes on it.
func (s *Server) gatewayConfig(lcfg *lifecycle.Config, routeMode string) (net.Listener, error) {
	spec, err := ingress.GenerateKey('t')
	if err != nil {
		return nil, err
	}
	if s.Keys, err = ingress.ParseKeys([]string{spec}); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	keys := s.Keys
	lcfg.Ingress = lifecycle.IngressConfig{Gateway: true, RouteMode: routeMode, Address: ln.Addr().String(),
		Keys: func() lifecycle.IngressSigner { return keys }}
	return ln, nil
}

// startGateway serves the ingress gateway on ln, finding sandboxes
// through srv.
func (s *Server) startGateway(srv *lifecycle.Server, ln net.Listener, log *slog.Logger) error {
	res := lifecycle.InProcessGateway{Server: srv}
	gw, err := ingress.New(ingress.Config{Keys: func() *ingress.Keys { return s.Keys }, Resolver: res, Renewer: res, Logger: log})
	if err != nil {
		return err
	}
	s.gw = httptest.NewUnstartedServer(gw)
	s.gw.Listener.Close()
	s.gw.Listener = ln
	s.gw.Start()
	s.GatewayURL = s.gw.URL
	return nil
}
