// Command execd is the daemon inside every sandbox. It serves the execd API
// and, given a command after "--", runs it as the sandbox's entrypoint:
//
//	execd [flags] [-- entrypoint args...]
//	execd --install-to PATH
//	execd --version
//
// With --install-to it copies its own executable to PATH and exits without
// serving: a Kubernetes sandbox pod's init container runs it to put execd
// on a volume that the sandbox container then starts it from.
//
// As a container's PID 1 it reaps every orphaned process, forwards SIGTERM,
// SIGINT and SIGHUP to the entrypoint, and keeps serving when the
// entrypoint exits. It is a static binary with no dependency on the image,
// so it works in any image, one without a shell included.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// A token given on the command line or in the environment would be
	// readable by every process of the sandbox in /proc/1/cmdline or
	// /proc/1/environ: move it into a descriptor and start over.
	if err := hideToken(os.Args, os.Environ()); err != nil {
		fmt.Fprintln(os.Stderr, "execd: cannot hide the access token:", err)
	}
	// Not dumpable: no process of the sandbox, root in it included, may
	// read execd's memory (/proc/1/mem), open its descriptors
	// (/proc/1/fd/*), read its environment or trace it, all of which
	// would show the token. An exec resets this, so it comes after the
	// re-execution above; the processes execd starts are dumpable again
	// after their own exec.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "execd: cannot make itself non-dumpable:", err)
	}
	m := NewMain()
	if err := m.ParseFlags(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "execd:", err)
		os.Exit(2)
	}
	switch {
	case m.ShowVersion:
		fmt.Println("execd", version)
		os.Exit(0)
	case m.InstallTo != "":
		if err := install(m.InstallTo); err != nil {
			fmt.Fprintln(os.Stderr, "execd:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code, err := m.Run(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "execd:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// Main is the execd program: flags, then Run.
type Main struct {
	Host       string
	Port       int
	Config     execd.Config
	Entrypoint []string
	// Grace is how long processes get between SIGTERM and SIGKILL when
	// execd shuts down.
	Grace time.Duration
	// Ready, when not nil, receives the listening address.
	Ready chan<- net.Addr
	// InstallTo, when set, asks for a copy of the executable at this path
	// instead of a server (see install).
	InstallTo string
	// ShowVersion asks for the version instead of a server.
	ShowVersion bool
}

// NewMain returns a Main with default settings.
func NewMain() *Main {
	return &Main{Port: api.ExecdPort, Grace: 5 * time.Second}
}

// ParseFlags reads flags from args; words after "--" are the entrypoint.
func (m *Main) ParseFlags(args []string) error {
	fs := flag.NewFlagSet("execd", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: execd [flags] [-- entrypoint args...]\n       execd --install-to PATH\n\nflags:\n")
		fs.PrintDefaults()
	}
	var tokenFile, logLevel string
	tokenFD := -1
	fs.StringVar(&m.Host, "host", "", "address to listen on (default: all)")
	fs.IntVar(&m.Port, "port", m.Port, "port to listen on")
	fs.StringVar(&m.Config.AccessToken, "access-token", os.Getenv("EXECD_ACCESS_TOKEN"), "token clients must send in X-EXECD-ACCESS-TOKEN (env EXECD_ACCESS_TOKEN)")
	fs.StringVar(&tokenFile, "access-token-file", "", "read the access token from this file")
	fs.IntVar(&tokenFD, tokenFDFlag, -1, "read the access token from this open descriptor (set by execd itself)")
	fs.BoolVar(&m.Config.Insecure, "insecure", false, "accept requests without a token when none is configured")
	fs.StringVar(&m.Config.EnvFile, "envs-file", os.Getenv("EXECD_ENVS"), "KEY=VALUE file merged into every command's environment (env EXECD_ENVS)")
	fs.DurationVar(&m.Config.RecordTTL, "record-ttl", time.Hour, "how long a finished command's status and log stay available")
	fs.IntVar(&m.Config.MaxRecords, "max-records", 1024, "most finished commands kept")
	fs.BoolVar(&m.Config.Claimable, "claimable", false, "accept one POST /claim (set by the server for warm pool sandboxes)")
	fs.IntVar(&m.Config.MaxCodeContexts, "max-code-contexts", 32, "most code contexts (interpreters) alive at once")
	fs.IntVar(&m.Config.ChildOOMScoreAdj, "child-oom-score-adj", 1000, "oom_score_adj (1-1000) of every process execd starts, so that the OOM killer takes them before execd; -1: leave them execd's own")
	fs.Int64Var(&m.Config.MaxLogBytes, "max-log-bytes", 64<<20, "log kept per background command; the oldest output gives way beyond it")
	fs.Int64Var(&m.Config.MaxLogBytesTotal, "max-log-bytes-total", 0, "logs kept for all background commands together; finished commands' logs give way first (0: 256 MiB, or an eighth of the memory limit where logs live in memory)")
	fs.Int64Var(&m.Config.MaxUploadBytes, "max-upload-bytes", 0, "largest upload request in bytes (0: no limit)")
	fs.DurationVar(&m.Grace, "shutdown-grace", m.Grace, "time processes get between SIGTERM and SIGKILL at shutdown")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error (or a syslog number 0-7)")
	fs.StringVar(&m.InstallTo, "install-to", "", "copy this executable to `PATH` (mode 0755, parents created) and exit without serving")
	fs.BoolVar(&m.ShowVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m.Entrypoint = fs.Args()
	if m.InstallTo != "" && len(m.Entrypoint) > 0 {
		return fmt.Errorf("--install-to takes no entrypoint")
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("read access token: %w", err)
		}
		m.Config.AccessToken = strings.TrimSpace(string(b))
	}
	if tokenFD >= 0 {
		token, err := readTokenFD(tokenFD)
		if err != nil {
			return fmt.Errorf("read access token: %w", err)
		}
		m.Config.AccessToken = token
	}
	level, err := parseLevel(logLevel)
	if err != nil {
		return err
	}
	m.Config.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if m.Port <= 0 || m.Port > 65535 {
		return fmt.Errorf("invalid port %d", m.Port)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 7 {
		switch {
		case n >= 7:
			return slog.LevelDebug, nil
		case n >= 5:
			return slog.LevelInfo, nil
		case n == 4:
			return slog.LevelWarn, nil
		default:
			return slog.LevelError, nil
		}
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("invalid log level %q", s)
	}
	return l, nil
}

// Run serves until a termination signal (or, with an entrypoint, until the
// entrypoint has stopped after one) and returns the exit code: the
// entrypoint's when there is one.
func (m *Main) Run(ctx context.Context) (int, error) {
	log := m.Config.Logger
	// Orphans of the commands execd starts are reparented to execd, which
	// reaps them, whether it is PID 1 or not.
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return 1, fmt.Errorf("become child subreaper: %w", err)
		}
	}
	m.Config.ReapAll = true
	m.Config.Port = m.Port
	// Every thread execd can need is made now, while the sandbox has pids
	// to spare: the runtime aborts if it cannot make one later.
	threads := execd.ReserveThreads(execd.ThreadsNeeded())
	os.Unsetenv("EXECD_ACCESS_TOKEN")

	srv, err := execd.New(m.Config)
	if err != nil {
		return 1, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(m.Host, strconv.Itoa(m.Port)))
	if err != nil {
		srv.Shutdown(0)
		return 1, err
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	// The entrypoint starts before requests are served (they wait in
	// the listener's queue meanwhile): whoever sees execd answer finds
	// the entrypoint's status.
	if len(m.Entrypoint) > 0 {
		if _, err = srv.StartEntrypoint(m.Entrypoint); err != nil {
			// The sandbox stays usable; the failure is visible in the
			// entrypoint's status.
			log.Error("entrypoint did not start", "argv", m.Entrypoint, "err", err)
		}
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	log.Info("execd listening", "addr", ln.Addr().String(), "pid", os.Getpid(), "insecure", m.Config.AccessToken == "", "threads", threads)
	if m.Ready != nil {
		m.Ready <- ln.Addr()
	}

	stopping := false
	for !stopping {
		select {
		case <-ctx.Done():
			stopping = true
		case err := <-serveErr:
			srv.Shutdown(m.Grace)
			return 1, fmt.Errorf("serve: %w", err)
		case sig := <-sigs:
			s := sig.(syscall.Signal)
			// The entrypoint may have been started since by a claim.
			if entry := srv.Entrypoint(); entry != nil && entry.Running() {
				entry.Signal(s)
			}
			if s == syscall.SIGTERM || s == syscall.SIGINT {
				stopping = true
				log.Info("stopping", "signal", s.String())
			}
		}
	}
	// Everything stops within one grace period: the entrypoint has its
	// signal, the other processes get SIGTERM now, and the stragglers
	// SIGKILL together, well within the 10 s docker stop allows.
	srv.Shutdown(m.Grace)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Second)
	hs.Shutdown(shutdownCtx)
	cancel()
	if entry := srv.Entrypoint(); entry != nil {
		return entry.ExitCode(), nil
	}
	return 0, nil
}
