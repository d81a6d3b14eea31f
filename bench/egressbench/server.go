package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/sdk"
)

// scopePrefix starts the label scope of every server this harness runs
// and the name of its Docker network.
const scopePrefix = "egressbench-"

// server is an opensandbox-server started by this harness on a
// throwaway configuration: the Docker runtime on a network of its own,
// whose sandboxes resolve names through the local internet's name
// server, and [egress] in strict mode forwarding to that server too.
type server struct {
	c       *sdk.Client
	dir     string // binaries (netprobe among them), configuration, data
	scope   string
	network string
	proc    *benchkit.Process

	stopOnce sync.Once
}

// startServer builds execd, the server and netprobe into a temporary
// directory, makes the Docker network, and starts the server on a free
// loopback port. Its log goes to logTo at logLevel.
func startServer(ctx context.Context, in *internet, logTo io.Writer, logLevel string) (_ *server, retErr error) {
	dir, err := os.MkdirTemp("", "egressbench-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	s := &server{dir: dir, scope: scopePrefix + benchkit.RandomHex(4)}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	if err := benchkit.Build(ctx, dir, "./cmd/execd", "./cmd/opensandbox-server", "./internal/netprobe"); err != nil {
		return nil, err
	}
	// On a network of its own, the server's guard chain (which lets its
	// sandboxes reach the name server) is no other server's.
	if _, err := docker(ctx, "network", "create", "-o", "com.docker.network.bridge.enable_icc=false", s.scope); err != nil {
		return nil, err
	}
	s.network = s.scope
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	key := benchkit.RandomHex(24)
	if s.c, err = benchkit.NewClient(addr, key, 64); err != nil {
		return nil, err
	}
	rt := fmt.Sprintf(`[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
network = %q
dns = [%q]
[egress]
mode = "strict"
dns_upstreams = [%q]
max_rules = 5000
`, filepath.Join(dir, "data"), s.scope, s.network, in.dns, in.dns)
	s.proc, err = benchkit.StartServer(ctx, benchkit.ServerConfig{Dir: dir, Addr: addr, APIKey: key, LogLevel: logLevel,
		Runtime: rt, LogTo: logTo, HealthWithin: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// stop stops the server and removes its containers (egress containers
// too), its network with the network's guard chain, and its directory.
// It may be called more than once.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		if s.proc != nil {
			s.proc.Stop()
		}
		if s.c != nil {
			s.c.Close()
		}
		removeLabelled("opensandbox.scope=" + s.scope)
		removeLabelled("opensandbox.egress-scope=" + s.scope)
		if s.network != "" {
			ctx := context.Background()
			id, err := docker(ctx, "network", "inspect", "-f", "{{.Id}}", s.network)
			docker(ctx, "network", "rm", s.network)
			if err == nil && len(id) >= 12 {
				removeGuardChain("OSB-GUARD-" + id[:12]) // the runtime's name for the network's chain
			}
		}
		os.RemoveAll(s.dir)
	})
}

// removeGuardChain removes a network's guard chain and the jumps to it.
func removeGuardChain(chain string) {
	out, _ := exec.Command("iptables", "-S", "OPENSANDBOX-GUARD").Output()
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == "-A" && strings.HasSuffix(line, "-j "+chain+"\n") {
			exec.Command("iptables", append([]string{"-D"}, f[1:]...)...).Run()
		}
	}
	exec.Command("iptables", "-F", chain).Run()
	exec.Command("iptables", "-X", chain).Run()
}

// removeLabelled removes every container that carries label.
func removeLabelled(label string) {
	out, err := docker(context.Background(), "ps", "-aq", "--filter", "label="+label)
	if err != nil || out == "" {
		return
	}
	docker(context.Background(), append([]string{"rm", "-f"}, strings.Fields(out)...)...)
}

// docker runs the docker CLI, for at most two minutes.
func docker(ctx context.Context, args ...string) (string, error) {
	return benchkit.Docker(ctx, 2*time.Minute, args...)
}

// createToCommand creates a sandbox with opts and runs its first command
// (see benchkit.CreateToCommand). It returns the sandbox even on failure,
// when there is one, so that the caller can delete it.
func (s *server) createToCommand(ctx context.Context, opts sdk.CreateOptions) (*sdk.Sandbox, error) {
	return benchkit.CreateToCommand(ctx, s.c, opts, 5*time.Millisecond)
}

// delete deletes a sandbox; one already gone is not an error.
func (s *server) delete(ctx context.Context, sb *sdk.Sandbox) error {
	if sb == nil {
		return nil
	}
	return benchkit.Kill(ctx, s.c, sb.ID)
}
