package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/runtime/docker"
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
	metrics := lifecycle.NewMetrics()
	var rt sandbox.Runtime
	switch cfg.Runtime.Type {
	case "docker":
		dcfg := cfg.Runtime.Docker
		dcfg.Observer = metrics
		drt, err := docker.New(dcfg, log)
		if err != nil {
			return fmt.Errorf("docker runtime: %w", err)
		}
		rt = drt
	}
	defer rt.Close()

	mgr := lifecycle.NewManager(rt, lifecycle.ManagerConfig{MaxTimeout: cfg.Server.MaxSandboxTimeout, Logger: log, Observer: metrics})
	srv, err := lifecycle.New(mgr, lifecycle.Config{
		APIKey:            cfg.Server.APIKey,
		Insecure:          cfg.Server.Insecure,
		RuntimeName:       "DOCKER",
		PublicAddress:     cfg.Server.PublicAddress,
		MaxTimeout:        cfg.Server.MaxSandboxTimeout,
		MinTimeout:        cfg.Server.MinSandboxTimeout,
		HostPathAllowlist: cfg.Server.HostVolumeAllowlist,
		MaxBodyBytes:      cfg.Server.MaxBodyBytes,
		Logger:            log,
		Version:           version,
		Metrics:           metrics,
		MetricsPublic:     cfg.Server.MetricsAuth != nil && !*cfg.Server.MetricsAuth,
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
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	if cfg.Server.Insecure {
		log.Warn("running without an API key: every request is accepted")
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
	hs.Shutdown(shutdownCtx)
	stopLoop()
	<-loopDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
