package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/sdk"
)

// scopePrefix starts the label scope of every server this harness runs,
// so that the containers of a killed run are found by the next.
const scopePrefix = "perfbench-"

// server is an opensandbox-server started by this harness on a
// throwaway configuration, and an SDK client for it and the execd of its
// sandboxes.
type server struct {
	c     *sdk.Client
	dir   string // binaries, configuration, data
	scope string
	proc  *benchkit.Process

	stopOnce sync.Once
}

// startServer builds execd (static) and the server into a temporary
// directory and starts the server on a free loopback port, with its own
// data directory and label scope. Its log goes to logTo at logLevel.
func startServer(ctx context.Context, logTo io.Writer, logLevel string) (_ *server, retErr error) {
	dir, err := os.MkdirTemp("", "perfbench-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	s := &server{dir: dir, scope: scopePrefix + benchkit.RandomHex(4)}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	if err := benchkit.Build(ctx, dir, "./cmd/execd", "./cmd/opensandbox-server"); err != nil {
		return nil, err
	}
	addr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, err
	}
	key := benchkit.RandomHex(24)
	if s.c, err = benchkit.NewClient(addr, key, 256); err != nil {
		return nil, err
	}
	rt := fmt.Sprintf(`[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
`, filepath.Join(dir, "data"), s.scope)
	s.proc, err = benchkit.StartServer(ctx, benchkit.ServerConfig{Dir: dir, Addr: addr, APIKey: key, LogLevel: logLevel,
		Runtime: rt, LogTo: logTo, HealthWithin: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// stop stops the server and removes its containers and directory. It
// may be called more than once, from any goroutine.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		if s.proc != nil {
			s.proc.Stop()
		}
		if s.c != nil {
			s.c.Close()
		}
		removeLabelled("opensandbox.scope=" + s.scope)
		os.RemoveAll(s.dir)
	})
}

// createToCommand creates a sandbox with opts and runs its first command
// (see benchkit.CreateToCommand). It returns the sandbox's ID even on
// failure, when there is one, so that the caller can delete it.
func (s *server) createToCommand(ctx context.Context, opts sdk.CreateOptions, maxPoll time.Duration) (string, error) {
	sb, err := benchkit.CreateToCommand(ctx, s.c, opts, maxPoll)
	if sb == nil {
		return "", err
	}
	return sb.ID, err
}

// delete deletes a sandbox; one already gone is not an error.
func (s *server) delete(ctx context.Context, id string) error {
	return benchkit.Kill(ctx, s.c, id)
}

// deleteAll deletes the sandboxes, a few at a time.
func (s *server) deleteAll(ctx context.Context, ids []string) error {
	var mu sync.Mutex
	var first error
	forEach(len(ids), 8, func(i int) {
		if ids[i] == "" {
			return
		}
		if err := s.delete(ctx, ids[i]); err != nil {
			mu.Lock()
			first = cmp.Or(first, err)
			mu.Unlock()
		}
	})
	return first
}

// containersOf is the IDs of the sandboxes' containers, in their order.
func (s *server) containersOf(ctx context.Context, ids []string) ([]string, error) {
	out, err := docker(ctx, "ps", "--no-trunc", "--filter", "label=opensandbox.scope="+s.scope,
		"--format", `{{.Label "opensandbox.id"}} {{.ID}}`)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]string)
	for _, line := range strings.Split(out, "\n") {
		if id, cid, ok := strings.Cut(line, " "); ok {
			byID[id] = cid
		}
	}
	cids := make([]string, len(ids))
	for i, id := range ids {
		if cids[i] = byID[id]; cids[i] == "" {
			return nil, fmt.Errorf("sandbox %s has no running container", id)
		}
	}
	return cids, nil
}

// forEach calls f(0..n-1), at most par at a time, and waits for them.
func forEach(n, par int, f func(i int)) {
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}
