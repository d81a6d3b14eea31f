package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
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

	"github.com/opensandbox/opensandbox/api"
)

// scopePrefix starts the label scope of every server this harness runs,
// so that the containers of a killed run are found by the next.
const scopePrefix = "perfbench-"

// execdPort is execd's port in every sandbox.
const execdPort = "44772"

// server is an opensandbox-server started by this harness on a
// throwaway configuration, and a client for it and for the execd of its
// sandboxes.
type server struct {
	dir   string // binaries, configuration, data
	scope string
	key   string
	base  string // http://127.0.0.1:PORT
	cmd   *exec.Cmd
	hc    *http.Client

	stopOnce sync.Once
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startServer builds execd (static) and the server into a temporary
// directory and starts the server on a free loopback port, with its own
// data directory and label scope. Its log goes to logTo at logLevel.
func startServer(ctx context.Context, logTo io.Writer, logLevel string) (_ *server, retErr error) {
	dir, err := os.MkdirTemp("", "perfbench-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	s := &server{dir: dir, scope: scopePrefix + randomHex(4), key: randomHex(24),
		// The timeout only keeps a wedged engine from hanging the run; the
		// longest request, an upload, takes seconds.
		hc: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256}}}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+"/", "./cmd/execd", "./cmd/opensandbox-server")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build execd and the server: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s.base = "http://" + addr
	cfg := fmt.Sprintf(`version = 1
[server]
listen = %q
api_key = %q
log_level = %q
[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
`, addr, s.key, logLevel, filepath.Join(dir, "data"), s.scope)
	cfgPath := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("write the server's configuration: %w", err)
	}
	s.cmd = exec.Command(filepath.Join(dir, "opensandbox-server"), "--config", cfgPath)
	s.cmd.Stdout, s.cmd.Stderr = logTo, logTo
	// Its own process group: a Ctrl-C reaches this harness only, which
	// then stops the server and removes what it made.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the server: %w", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := s.hc.Get(s.base + "/health"); err == nil {
			resp.Body.Close()
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errors.New("the server did not answer /health within 30 s")
		}
	}
}

// stop stops the server and removes its containers and directory. It
// may be called more than once, from any goroutine.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			s.cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { s.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				s.cmd.Process.Kill()
				<-done
			}
		}
		removeLabelled("opensandbox.scope=" + s.scope)
		os.RemoveAll(s.dir)
	})
}

// do sends a request to the server and returns the status and body.
func (s *server) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set(api.HeaderAPIKey, s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// timeoutSeconds is the timeout of every sandbox: long enough for the
// longest run, short enough that a leak expires.
var timeoutSeconds int64 = 1800

// createRequest is a normal create of a busybox sandbox that sleeps, with
// the pool template's limits.
func createRequest(image string, limits map[string]string) api.CreateSandboxRequest {
	return api.CreateSandboxRequest{Image: &api.ImageSpec{URI: image}, Entrypoint: []string{"sleep", "infinity"},
		ResourceLimits: limits, Timeout: &timeoutSeconds}
}

// pooledRequest is a create from the pool named pool: image, entrypoint
// and limits come from its template.
func pooledRequest(pool string) api.CreateSandboxRequest {
	return api.CreateSandboxRequest{Timeout: &timeoutSeconds, Extensions: map[string]string{"poolRef": pool}}
}

// create posts req and returns the new sandbox's ID and state.
func (s *server) create(ctx context.Context, req api.CreateSandboxRequest) (id, state string, err error) {
	code, data, err := s.do(ctx, "POST", "/v1/sandboxes", req)
	if err != nil {
		return "", "", fmt.Errorf("create sandbox: %w", err)
	}
	if code != http.StatusAccepted {
		return "", "", fmt.Errorf("create sandbox: %d %s", code, bytes.TrimSpace(data))
	}
	var resp api.CreateSandboxResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return "", "", fmt.Errorf("create sandbox: %w", err)
	}
	return resp.ID, resp.Status.State, nil
}

// waitRunning polls the sandbox until it is Running, first every
// millisecond, then half as often again each time up to maxDelay, so that
// a fast start is seen at once and a hundred slow ones do not flood the
// server.
func (s *server) waitRunning(ctx context.Context, id string, maxDelay time.Duration) error {
	delay := time.Millisecond
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		code, data, err := s.do(ctx, "GET", "/v1/sandboxes/"+id, nil)
		if err != nil {
			return fmt.Errorf("get sandbox %s: %w", id, err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("get sandbox %s: %d %s", id, code, bytes.TrimSpace(data))
		}
		var sb api.Sandbox
		if err := json.Unmarshal(data, &sb); err != nil {
			return fmt.Errorf("get sandbox %s: %w", id, err)
		}
		switch sb.Status.State {
		case "Running":
			return nil
		case "Failed", "Terminated":
			return fmt.Errorf("sandbox %s is %s: %s %s", id, sb.Status.State, sb.Status.Reason, sb.Status.Message)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*3/2+time.Millisecond/2, maxDelay)
	}
	return fmt.Errorf("sandbox %s was not Running within 2 minutes", id)
}

// execd is a client for the execd of one sandbox.
type execd struct {
	base    string
	headers map[string]string
	hc      *http.Client
}

// execd asks the server for the sandbox's execd endpoint.
func (s *server) execd(ctx context.Context, id string) (*execd, error) {
	code, data, err := s.do(ctx, "GET", "/v1/sandboxes/"+id+"/endpoints/"+execdPort, nil)
	if err != nil || code != http.StatusOK {
		return nil, fmt.Errorf("execd endpoint of %s: %d %s %v", id, code, bytes.TrimSpace(data), err)
	}
	var ep api.Endpoint
	if err := json.Unmarshal(data, &ep); err != nil {
		return nil, fmt.Errorf("execd endpoint of %s: %w", id, err)
	}
	return &execd{base: "http://" + ep.Endpoint, headers: ep.Headers, hc: s.hc}, nil
}

func (e *execd) request(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range e.headers {
		req.Header.Set(k, v)
	}
	return req, nil
}

// command runs cmd in the foreground through execd and consumes its
// event stream to the end. It returns the bytes of output (each line
// with its newline) and fails unless the command completed with status
// 0.
func (e *execd) command(ctx context.Context, cmd string) (int64, error) {
	body, _ := json.Marshal(api.RunCommandRequest{Command: cmd})
	req, err := e.request(ctx, "POST", "/command", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("command %q: %w", cmd, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("command %q: %d %s", cmd, resp.StatusCode, bytes.TrimSpace(data))
	}
	dec := api.NewEventDecoder(resp.Body)
	var n int64
	for {
		ev, err := dec.Next()
		if err != nil {
			return n, fmt.Errorf("command %q: the stream ended without completing: %v", cmd, err)
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			n += int64(len(ev.Text)) + 1
		case api.EventComplete:
			return n, nil
		case api.EventError:
			return n, fmt.Errorf("command %q: %s %s", cmd, ev.Error.EName, ev.Error.EValue)
		}
	}
}

// createToCommand creates a sandbox with req, waits until it is Running
// and runs `true` in it through execd: what a client waits for before
// its first command has run. It returns the sandbox's ID even on failure,
// when there is one, so that the caller can delete it.
func (s *server) createToCommand(ctx context.Context, req api.CreateSandboxRequest, maxPoll time.Duration) (string, error) {
	id, state, err := s.create(ctx, req)
	if err != nil {
		return "", err
	}
	if state != "Running" {
		if err := s.waitRunning(ctx, id, maxPoll); err != nil {
			return id, err
		}
	}
	e, err := s.execd(ctx, id)
	if err != nil {
		return id, err
	}
	_, err = e.command(ctx, "true")
	return id, err
}

// delete deletes a sandbox; a sandbox already gone is not an error.
func (s *server) delete(ctx context.Context, id string) error {
	code, data, err := s.do(ctx, "DELETE", "/v1/sandboxes/"+id, nil)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if code != http.StatusNoContent && code != http.StatusNotFound {
		return fmt.Errorf("delete sandbox %s: %d %s", id, code, bytes.TrimSpace(data))
	}
	return nil
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
