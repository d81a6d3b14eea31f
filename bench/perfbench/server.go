package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/lcclient"
)

// scopePrefix starts the label scope of every server this harness runs,
// so that the containers of a killed run are found by the next.
const scopePrefix = "perfbench-"

// server is an opensandbox-server started by this harness on a
// throwaway configuration, and a client for it and for the execd of its
// sandboxes.
type server struct {
	lcclient.Client
	dir   string // binaries, configuration, data
	scope string
	proc  *lcclient.Process

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
	s := &server{dir: dir, scope: scopePrefix + lcclient.RandomHex(4), Client: lcclient.Client{Key: lcclient.RandomHex(24),
		// The timeout only keeps a wedged engine from hanging the run; the
		// longest request, an upload, takes seconds.
		HC: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256}}}}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	if err := lcclient.Build(ctx, dir, "./cmd/execd", "./cmd/opensandbox-server"); err != nil {
		return nil, err
	}
	addr, err := lcclient.FreeAddr()
	if err != nil {
		return nil, err
	}
	s.Base = "http://" + addr
	rt := fmt.Sprintf(`[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
`, filepath.Join(dir, "data"), s.scope)
	if s.proc, err = lcclient.Start(ctx, &s.Client, dir, addr, logLevel, rt, logTo, 30*time.Second); err != nil {
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
		removeLabelled("opensandbox.scope=" + s.scope)
		os.RemoveAll(s.dir)
	})
}

// deleteAll deletes the sandboxes, a few at a time.
func (s *server) deleteAll(ctx context.Context, ids []string) error {
	var mu sync.Mutex
	var first error
	forEach(len(ids), 8, func(i int) {
		if ids[i] == "" {
			return
		}
		if err := s.Delete(ctx, ids[i]); err != nil {
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
