package main

import (
	"bytes"
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
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// execdPort is execd's port in every sandbox.
const execdPort = 44772

// server is an opensandbox-server on the Kubernetes runtime, started by
// this harness on a throwaway configuration, and a client for it and for
// the execd of its sandboxes that speaks HTTP as the SDK does.
type server struct {
	dir  string // binary and configuration
	key  string
	base string // http://127.0.0.1:PORT
	cmd  *exec.Cmd
	done chan struct{} // closed when the server has exited
	hc   *http.Client

	stopOnce sync.Once
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
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
	s := &server{dir: dir, key: randomHex(24),
		hc: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}}}
	defer func() {
		if retErr != nil {
			s.stop()
		}
	}()
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+"/", "./cmd/opensandbox-server")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the server: %v\n%s", err, out)
	}
	scope, extra := "k8sbench", ""
	if nodeExecd {
		execd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+"/", "./cmd/execd")
		execd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := execd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build execd: %v\n%s", err, out)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, err
		}
		scope, extra = "k8sbench-node", fmt.Sprintf("execd_host_dir = %q\n", dir)
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
type = "kubernetes"
[runtime.kubernetes]
kubeconfig = %q
namespace = %q
label_scope = %q
image_pull_policy = "IfNotPresent"
cpu_request = %q
memory_request = %q
start_timeout = "2m"
%s`, addr, s.key, logLevel, cl.kubeconfig, cl.ns, scope, cpuRequest, memoryRequest, extra)
	cfgPath := filepath.Join(dir, "sandbox.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("write the server's configuration: %w", err)
	}
	s.cmd = exec.Command(filepath.Join(dir, "opensandbox-server"), "--config", cfgPath)
	s.cmd.Stdout, s.cmd.Stderr = logTo, logTo
	// Its own process group: a Ctrl-C reaches this harness only, which
	// then stops the server and deletes the namespace.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the server: %w", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := s.hc.Get(s.base + "/health"); err == nil {
			resp.Body.Close()
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("the server exited at start: %v", s.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errors.New("the server did not answer /health within 60 s")
		}
	}
}

// stop stops the server and removes its directory; the namespace's
// deletion removes what it made. It may be called more than once.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		if s.done != nil {
			s.cmd.Process.Signal(os.Interrupt)
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				s.cmd.Process.Kill()
				<-s.done
			}
		}
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

// coldRequest is a create of a busybox sandbox that sleeps.
func coldRequest() api.CreateSandboxRequest {
	return api.CreateSandboxRequest{Image: &api.ImageSpec{URI: image}, Entrypoint: entrypoint,
		ResourceLimits: limits, Timeout: &timeoutSeconds}
}

// pooledRequest is a create from the pool named pool: image and limits
// come from its template.
func pooledRequest(pool string) api.CreateSandboxRequest {
	return api.CreateSandboxRequest{Entrypoint: entrypoint, Timeout: &timeoutSeconds,
		Extensions: map[string]string{"poolRef": pool}}
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
// millisecond, then half as often again each time up to 5 ms, so that the
// poll adds at most a few milliseconds to what it measures.
func (s *server) waitRunning(ctx context.Context, id string) error {
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
		delay = min(delay*3/2+time.Millisecond/2, 5*time.Millisecond)
	}
	return fmt.Errorf("sandbox %s was not Running within 2 minutes: %w", id, errTimeout)
}

// command asks the server for the sandbox's execd endpoint and runs cmd
// in the foreground through execd, consuming its event stream to the
// end; it fails unless the command completed.
func (s *server) command(ctx context.Context, id, cmd string) error {
	code, data, err := s.do(ctx, "GET", "/v1/sandboxes/"+id+"/endpoints/"+strconv.Itoa(execdPort), nil)
	if err != nil || code != http.StatusOK {
		return fmt.Errorf("execd endpoint of %s: %d %s %v", id, code, bytes.TrimSpace(data), err)
	}
	var ep api.Endpoint
	if err := json.Unmarshal(data, &ep); err != nil {
		return fmt.Errorf("execd endpoint of %s: %w", id, err)
	}
	body, _ := json.Marshal(api.RunCommandRequest{Command: cmd})
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+ep.Endpoint+"/command", bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("command %q: %w", cmd, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("command %q: %d %s", cmd, resp.StatusCode, bytes.TrimSpace(data))
	}
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err != nil {
			return fmt.Errorf("command %q: the stream ended without completing: %v", cmd, err)
		}
		switch ev.Type {
		case api.EventComplete:
			return nil
		case api.EventError:
			return fmt.Errorf("command %q: %s %s", cmd, ev.Error.EName, ev.Error.EValue)
		}
	}
}

// createToCommand creates a sandbox with req, waits until it is Running
// and runs `true` in it through execd: what a client waits for before its
// first command has run. It returns the sandbox's ID even on failure,
// when there is one, so that the caller can delete it.
func (s *server) createToCommand(ctx context.Context, req api.CreateSandboxRequest) (string, error) {
	id, state, err := s.create(ctx, req)
	if err != nil {
		return "", err
	}
	if state != "Running" {
		if err := s.waitRunning(ctx, id); err != nil {
			return id, err
		}
	}
	return id, s.command(ctx, id, "true")
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

// The wire types of /v1/pools (protocol/lifecycle.md).
type (
	poolCapacity struct {
		BufferMax int `json:"bufferMax"`
		BufferMin int `json:"bufferMin"`
		PoolMax   int `json:"poolMax"`
		PoolMin   int `json:"poolMin"`
	}
	poolRequest struct {
		Name         string                   `json:"name"`
		Template     api.CreateSandboxRequest `json:"template"`
		CapacitySpec poolCapacity             `json:"capacitySpec"`
	}
	poolStatus struct {
		Total     int `json:"total"`
		Allocated int `json:"allocated"`
		Available int `json:"available"`
	}
	poolResponse struct {
		Status *poolStatus `json:"status,omitempty"`
	}
)

// createPool creates a pool of the cold create's sandbox with capacity c.
func (s *server) createPool(ctx context.Context, name string, c poolCapacity) error {
	tmpl := coldRequest()
	tmpl.Timeout = nil
	code, data, err := s.do(ctx, "POST", "/v1/pools", poolRequest{Name: name, Template: tmpl, CapacitySpec: c})
	if err != nil {
		return fmt.Errorf("create pool: %w", err)
	}
	if code != http.StatusCreated {
		return fmt.Errorf("create pool: %d %s", code, bytes.TrimSpace(data))
	}
	return nil
}

// waitPool polls the pool until at least n of its sandboxes are
// available, for at most timeout.
func (s *server) waitPool(ctx context.Context, name string, n int, timeout time.Duration) error {
	var last poolStatus
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		code, data, err := s.do(ctx, "GET", "/v1/pools/"+name, nil)
		if err != nil {
			return fmt.Errorf("get pool: %w", err)
		}
		if code != http.StatusOK {
			return fmt.Errorf("get pool: %d %s", code, bytes.TrimSpace(data))
		}
		var p poolResponse
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("get pool: %w", err)
		}
		if p.Status != nil {
			last = *p.Status
			if last.Available >= n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("pool %s: %d of %d available after %v (total %d, allocated %d): %w", name, last.Available, n, timeout, last.Total, last.Allocated, errTimeout)
}

// deletePool deletes the pool and its waiting sandboxes.
func (s *server) deletePool(ctx context.Context, name string) error {
	code, data, err := s.do(ctx, "DELETE", "/v1/pools/"+name, nil)
	if err != nil {
		return fmt.Errorf("delete pool: %w", err)
	}
	if code != http.StatusNoContent && code != http.StatusNotFound {
		return fmt.Errorf("delete pool: %d %s", code, bytes.TrimSpace(data))
	}
	return nil
}
