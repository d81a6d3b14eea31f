package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/lcclient"
)

// server is an opensandbox-server on the Kubernetes runtime, started by
// this harness on a throwaway configuration, and a client for it and for
// the execd of its sandboxes that speaks HTTP as the SDK does.
type server struct {
	lcclient.Client
	dir  string // binaries and configuration
	proc *lcclient.Process

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
	s := &server{dir: dir, Client: lcclient.Client{Key: lcclient.RandomHex(24),
		HC: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}}}}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	if err := lcclient.Build(ctx, dir, "./cmd/opensandbox-server"); err != nil {
		return nil, err
	}
	scope, extra := "k8sbench", ""
	if nodeExecd {
		if err := lcclient.Build(ctx, dir, "./cmd/execd"); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, err
		}
		scope, extra = "k8sbench-node", fmt.Sprintf("execd_host_dir = %q\n", dir)
	}
	addr, err := lcclient.FreeAddr()
	if err != nil {
		return nil, err
	}
	s.Base = "http://" + addr
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
	if s.proc, err = lcclient.Start(ctx, &s.Client, dir, addr, logLevel, rt, logTo, 60*time.Second); err != nil {
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
func coldRequest() api.CreateSandboxRequest {
	return lcclient.CreateRequest(image, entrypoint, limits)
}

// pooledRequest is a create from the pool named pool: image and limits
// come from its template.
func pooledRequest(pool string) api.CreateSandboxRequest {
	return lcclient.PooledRequest(pool, entrypoint)
}
