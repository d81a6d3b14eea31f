package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/sdk"
)

// server is an opensandbox-server on the Kubernetes runtime, started by
// this harness on a throwaway configuration, and an SDK client for it and
// for the execd of its sandboxes.
type server struct {
	c    *sdk.Client
	dir  string // binaries and configuration
	proc *benchkit.Process

	stopOnce sync.Once
}

// startServer builds the server into a temporary directory and starts it
// on a free loopback port, on the Kubernetes runtime in the cluster's
// namespace. Its log goes to logTo at logLevel.
// With nodeExecd, it also builds execd beside the server and sets
// execd_host_dir to that directory (this machine is the node), under a
// label scope of its own.
func startServer(ctx context.Context, cl *cluster, logTo io.Writer, logLevel string, nodeExecd bool) (_ *server, retErr error) {
	dir, err := os.MkdirTemp("", "k8sbench-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	s := &server{dir: dir}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	if err := benchkit.Build(ctx, dir, "./cmd/opensandbox-server"); err != nil {
		return nil, err
	}
	scope, extra := "k8sbench", ""
	if nodeExecd {
		if err := benchkit.Build(ctx, dir, "./cmd/execd"); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, err
		}
		scope, extra = "k8sbench-node", fmt.Sprintf("execd_host_dir = %q\n", dir)
	}
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	key := benchkit.RandomHex(24)
	if s.c, err = benchkit.NewClient(addr, key, 16); err != nil {
		return nil, err
	}
	rt := fmt.Sprintf(`[runtime]
type = "kubernetes"
[runtime.kubernetes]
kubeconfig = %q
namespace = %q
label_scope = %q
image_pull_policy = "IfNotPresent"
cpu_request = %q
memory_request = %q
start_timeout = "2m"
%s`, cl.kubeconfig, cl.ns, scope, cpuRequest, memoryRequest, extra)
	s.proc, err = benchkit.StartServer(ctx, benchkit.ServerConfig{Dir: dir, Addr: addr, APIKey: key, LogLevel: logLevel,
		Runtime: rt, LogTo: logTo, HealthWithin: 60 * time.Second})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// stop stops the server and removes its directory; the namespace's
// deletion removes what it made. It may be called more than once.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		if s.proc != nil {
			s.proc.Stop()
		}
		if s.c != nil {
			s.c.Close()
		}
		os.RemoveAll(s.dir)
	})
}

// maxPoll is the longest pause between the polls of a sandbox that is
// not Running yet, so that the poll adds at most a few milliseconds to
// what it measures.
const maxPoll = 5 * time.Millisecond

// poolPoll is the pause between the polls of a pool that is not full.
const poolPoll = 100 * time.Millisecond

// coldRequest is a create of a busybox sandbox that sleeps.
func coldRequest() sdk.CreateOptions {
	return benchkit.Sandbox(image, entrypoint, limits)
}

// pooledRequest is a create from the pool named pool: image and limits
// come from its template.
func pooledRequest(pool string) sdk.CreateOptions {
	return benchkit.Pooled(pool, entrypoint)
}

// createToCommand creates a sandbox with opts, waits until it is Running
// and runs `true` in it, noting when the create was answered and when
// the sandbox was seen Running. It returns the sandbox's ID even on
// failure, when there is one.
func (s *server) createToCommand(ctx context.Context, opts sdk.CreateOptions) (id string, answered, running time.Time, err error) {
	sb, err := s.c.Create(ctx, opts)
	if err != nil {
		return "", time.Time{}, time.Time{}, err
	}
	answered = time.Now()
	err = benchkit.WaitRunning(ctx, s.c, sb.ID, maxPoll)
	running = time.Now()
	if err == nil {
		err = benchkit.RunTrue(ctx, sb)
	}
	return sb.ID, answered, running, err
}
