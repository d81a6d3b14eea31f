package benchkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RandomHex is n random bytes in hexadecimal.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Build compiles the packages pkgs (./cmd/...) static and stripped into
// dir, from the module at the working directory.
func Build(ctx context.Context, dir string, pkgs ...string) error {
	build := exec.CommandContext(ctx, "go", append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + "/"}, pkgs...)...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	return nil
}

// FreeAddr is a loopback address (127.0.0.1:PORT) whose port was free a
// moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ServerConfig is an opensandbox-server process to start.
type ServerConfig struct {
	// Dir holds the binary opensandbox-server (see Build); the
	// configuration is written there.
	Dir string
	// Addr is where the server listens (see FreeAddr).
	Addr string
	// APIKey is the key it requires.
	APIKey string
	// LogLevel is its log_level.
	LogLevel string
	// Runtime is the [runtime] tables of the configuration.
	Runtime string
	// LogTo receives the server's stdout and stderr.
	LogTo io.Writer
	// Env is added to the server's environment.
	Env []string
	// HealthWithin bounds the wait for its /health.
	HealthWithin time.Duration
}

// Process is an opensandbox-server process started by StartServer.
type Process struct {
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	stopOnce sync.Once
}

// StartServer writes Dir/sandbox.toml — a [server] table listening on
// Addr with APIKey and LogLevel, then Runtime — and starts
// Dir/opensandbox-server on it, in a process group of its own (a Ctrl-C
// reaches the harness only, which then stops the server and removes what
// it made). It returns once the server answers /health, and fails if it
// exits first or does not answer within HealthWithin; on failure the
// process is stopped.
func StartServer(ctx context.Context, cfg ServerConfig) (*Process, error) {
	config := fmt.Sprintf("version = 1\n[server]\nlisten = %q\napi_key = %q\nlog_level = %q\n", cfg.Addr, cfg.APIKey, cfg.LogLevel) + cfg.Runtime
	cfgPath := filepath.Join(cfg.Dir, "sandbox.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		return nil, fmt.Errorf("write the server's configuration: %w", err)
	}
	cmd := exec.Command(filepath.Join(cfg.Dir, "opensandbox-server"), "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = cfg.LogTo, cfg.LogTo
	cmd.Env = append(os.Environ(), cfg.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the server: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	hc := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(cfg.HealthWithin); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := hc.Get("http://" + cfg.Addr + "/health"); err == nil {
			resp.Body.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("the server exited at start: %v", cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.Stop()
			return nil, fmt.Errorf("the server did not answer /health within %v", cfg.HealthWithin)
		}
	}
}

// PID is the server's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Stop interrupts the server and waits for it to exit, killing it after
// 10 s. It may be called more than once, from any goroutine.
func (p *Process) Stop() {
	p.stopOnce.Do(func() {
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	})
}
