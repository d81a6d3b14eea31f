package lcclient

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

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

// Process is an opensandbox-server process started by Start.
type Process struct {
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	stopOnce sync.Once
}

// Start writes dir/sandbox.toml — a [server] table listening on addr with
// c's key and logLevel, then runtime (the [runtime] tables) — and starts
// dir/opensandbox-server on it, in a process group of its own (a Ctrl-C reaches the harness
// only, which then stops the server and removes what it made), with its
// output to logTo. It returns once the server answers /health through c,
// and fails if it exits first or does not answer within healthWithin;
// on failure the process is stopped.
func Start(ctx context.Context, c *Client, dir, addr, logLevel, runtime string, logTo io.Writer, healthWithin time.Duration) (*Process, error) {
	config := fmt.Sprintf("version = 1\n[server]\nlisten = %q\napi_key = %q\nlog_level = %q\n", addr, c.Key, logLevel) + runtime
	cfgPath := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		return nil, fmt.Errorf("write the server's configuration: %w", err)
	}
	cmd := exec.Command(filepath.Join(dir, "opensandbox-server"), "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logTo, logTo
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the server: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	for deadline := time.Now().Add(healthWithin); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := c.HC.Get(c.Base + "/health"); err == nil {
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
			return nil, fmt.Errorf("the server did not answer /health within %v", healthWithin)
		}
	}
}

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
