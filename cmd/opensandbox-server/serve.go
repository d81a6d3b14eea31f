package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/runtime/docker"
	"github.com/opensandbox/opensandbox/runtime/kubernetes"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Main is the server program: Load, then Run. Tests drive it in-process.
type Main struct {
	ConfigPath string
	Insecure   bool
	Listen     string

	Config *fileConfig
	Logger *slog.Logger
	// Ready, when not nil, receives the address the API listens on.
	Ready chan<- net.Addr
	// GatewayReady, when not nil, receives the address of the in-process
	// ingress gateway ([ingress] listen) before Ready does.
	GatewayReady chan<- net.Addr
}

// Load finds and reads the configuration.
func (m *Main) Load() error {
	path, err := findConfig(m.ConfigPath)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(path, m.Insecure)
	if err != nil {
		return err
	}
	if m.Listen != "" {
		cfg.Server.Listen = m.Listen
	}
	m.Config = cfg
	return nil
}

func (m *Main) logger() *slog.Logger {
	if m.Logger != nil {
		return m.Logger
	}
	var level slog.Level
	level.UnmarshalText([]byte(m.Config.Server.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if m.Config.Server.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// Run starts the runtime, the manager's reconcile loop and the API, and
// serves until ctx ends; then it stops accepting requests, lets running
// ones finish for up to 10 s, and closes the runtime. Sandboxes keep
// running: the next start finds them again.
func (m *Main) Run(ctx context.Context) error {
	cfg := m.Config
	log := m.logger()
	for _, n := range cfg.Notes {
		log.Warn("configuration key of the existing OpenSandbox server's format: no effect here, or adjusted", "key", n.Key, "why", n.Why)
	}
	metrics := lifecycle.NewMetrics()
	var rt sandbox.Runtime
	// egress is set when the runtime enforces network policies.
	var egress *sandbox.EgressConfig
	switch cfg.Runtime.Type {
	case "docker":
		dcfg := cfg.Runtime.Docker
		dcfg.Observer = metrics
		dcfg.Egress = cfg.Egress
		egress = &dcfg.Egress
		drt, err := docker.New(dcfg, log)
		if err != nil {
			return fmt.Errorf("docker runtime: %w", err)
		}
		rt = drt
	case "kubernetes":
		kcfg := cfg.Runtime.Kubernetes
		kcfg.Observer = metrics
		kcfg.HostPathAllowlist = cfg.Server.HostVolumeAllowlist
		kcfg.Egress = cfg.Egress
		egress = &kcfg.Egress
		krt, err := kubernetes.New(kcfg, log)
		if err != nil {
			return fmt.Errorf("kubernetes runtime: %w", err)
		}
		rt = krt
	}
	defer rt.Close()
	if err := syncPools(ctx, rt, cfg.Pools, log); err != nil {
		return err
	}

	keys := newKeySource(&cfg.Ingress, log)
	// The gateway's listener is bound first, so that endpoints name the
	// address it got.
	in := cfg.Ingress
	var gln net.Listener
	if in.Mode == ingressGateway && in.Listen != "" {
		var err error
		if gln, err = net.Listen("tcp", in.Listen); err != nil {
			return fmt.Errorf("ingress.listen: %w", err)
		}
		defer gln.Close()
		if in.addressFromListen {
			in.Address = gln.Addr().String()
		}
	}
	runtimeName := strings.ToUpper(cfg.Runtime.Type)
	mgr := lifecycle.NewManager(rt, lifecycle.ManagerConfig{MaxTimeout: cfg.Server.MaxSandboxTimeout, Logger: log, Observer: metrics, RuntimeName: runtimeName})
	srv, err := lifecycle.New(mgr, lifecycle.Config{
		APIKey:               cfg.Server.APIKey,
		Insecure:             cfg.Server.Insecure,
		RuntimeName:          runtimeName,
		PublicAddress:        cfg.Server.PublicAddress,
		MaxTimeout:           cfg.Server.MaxSandboxTimeout,
		MinTimeout:           cfg.Server.MinSandboxTimeout,
		HostPathAllowlist:    cfg.Server.HostVolumeAllowlist,
		AllowedExtensions:    cfg.Server.AllowedExtensions,
		AllowLocalRegistries: cfg.Server.AllowLocalRegistries,
		MaxBodyBytes:         cfg.Server.MaxBodyBytes,
		Logger:               log,
		Version:              version,
		Metrics:              metrics,
		MetricsPublic:        cfg.Server.MetricsAuth != nil && !*cfg.Server.MetricsAuth,
		Egress:               egress,
		Ingress:              in.lifecycle(keys),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	loopCtx, stopLoop := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		mgr.Run(loopCtx)
	}()
	serveErr := make(chan error, 2)
	go func() { serveErr <- hs.Serve(ln) }()
	go keys.Watch(loopCtx, keyReloadEvery)
	var gs *http.Server
	if in.Mode == ingressGateway && keys.Keys().Empty() {
		log.Warn("[ingress] has no signing keys: endpoints carry no access token, expires is refused, and a gateway serves public sandboxes only; make a key with opensandbox-server gen-signing-key")
	}
	if gln != nil {
		if gs, err = gatewayServer(&in, keys, srv, metrics, log.With("component", "ingress")); err != nil {
			hs.Close()
			stopLoop()
			<-loopDone
			return err
		}
		go func() {
			if in.TLSCert != "" {
				serveErr <- gs.ServeTLS(gln, in.TLSCert, in.TLSKey)
			} else {
				serveErr <- gs.Serve(gln)
			}
		}()
		log.Info("ingress gateway listening", "addr", gln.Addr().String(), "tls", in.TLSCert != "", "routeMode", in.RouteMode, "address", in.Address)
		if m.GatewayReady != nil {
			m.GatewayReady <- gln.Addr()
		}
	}
	// The warning says what the server does, not what it was told:
	// insecure with a key still wants the key.
	if !srv.KeyRequired() {
		log.Warn("running without an API key: every request is accepted")
	} else if cfg.Server.Insecure {
		log.Info("server.insecure is set, but so is an API key: every request still needs the key")
	}
	log.Info("opensandbox-server listening", "addr", ln.Addr().String(), "runtime", cfg.Runtime.Type, "version", version)
	if m.Ready != nil {
		m.Ready <- ln.Addr()
	}
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	log.Info("stopping")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if gs != nil {
		gs.Shutdown(shutdownCtx)
	}
	hs.Shutdown(shutdownCtx)
	stopLoop()
	<-loopDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// syncPools makes the runtime's pools from the configuration what the
// configuration says: new ones created, changed ones updated, and those no
// longer in it deleted. Pools made through the API are left alone.
func syncPools(ctx context.Context, rt sandbox.Runtime, pools []poolConfig, log *slog.Logger) error {
	p, ok := rt.(sandbox.Pooler)
	if !ok {
		if len(pools) > 0 {
			return errors.New("pools: this runtime has no warm pools")
		}
		return nil
	}
	want := map[string]bool{}
	for i := range pools {
		def, err := pools[i].definition()
		if err != nil {
			return fmt.Errorf("pools[%d]: %w", i, err)
		}
		want[def.Name] = true
		if _, err := p.GetPool(ctx, def.Name); errors.Is(err, sandbox.ErrNotFound) {
			_, err = p.CreatePool(ctx, def)
			if err == nil {
				continue
			}
			// Another replica of the server created it meanwhile: update it.
			if !errors.Is(err, sandbox.ErrConflict) {
				return fmt.Errorf("pool %s: %w", def.Name, err)
			}
		}
		if _, err := p.UpdatePool(ctx, def); err != nil {
			return fmt.Errorf("pool %s: %w", def.Name, err)
		}
	}
	have, err := p.ListPools(ctx)
	if err != nil {
		return err
	}
	for _, info := range have {
		if info.FromConfig && !want[info.Name] {
			log.Info("deleting a pool no longer in the configuration", "pool", info.Name)
			if err := p.DeletePool(ctx, info.Name); err != nil {
				return fmt.Errorf("pool %s: %w", info.Name, err)
			}
		}
	}
	return nil
}
