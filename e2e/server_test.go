package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// server is an opensandbox-server process on loopback, with its own data
// directory and label scope on the local Docker engine.
type server struct {
	t       *testing.T
	base    string
	key     string
	scope   string
	dataDir string
	config  string
	listen  string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	logs    *syncBuffer
	hc      *http.Client
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// serverOptions adds TOML lines to the [server] and [runtime.docker]
// tables of the test server's configuration, and tables of their own
// after them (extra).
type serverOptions struct {
	server string
	docker string
	extra  string
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startServer writes a configuration and starts a server with it. The
// server and every container of its scope are removed when the test ends.
func startServer(t *testing.T, opts serverOptions) *server {
	t.Helper()
	testenv.MustHaveImage(t, busyboxImage)
	dir := t.TempDir()
	s := &server{t: t, key: randomHex(24), scope: "e2e-" + randomHex(6), dataDir: filepath.Join(dir, "data"),
		config: filepath.Join(dir, "sandbox.toml"), listen: "127.0.0.1:" + strconv.Itoa(freePort(t)),
		hc: &http.Client{Timeout: 2 * time.Minute}}
	cfg := fmt.Sprintf(`version = 1
[server]
listen = %q
api_key = %q
min_sandbox_timeout = "1s"
max_sandbox_timeout = "24h"
log_level = "debug"
%s
[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
start_timeout = %q
%s
%s
`, s.listen, s.key, opts.server, s.dataDir, s.scope, startTimeout().String(), opts.docker, opts.extra)
	if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s.base = "http://" + s.listen
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("server log (tail):\n%s", tail(s.logs.String(), 60))
		}
		removeScope(s.scope)
		// A server killed while it made a sandbox can leave a volume pin
		// mounted in its data directory: removing the directory would
		// then remove the pinned host directory's files.
		for _, m := range pinMounts(s.dataDir) {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", m, err)
			}
		}
	})
	s.start()
	return s
}

// startTimeout is the servers' start_timeout: twice what a test waits for
// a start, so that the test's wait, which says what the sandbox was
// doing, runs out before the server fails the sandbox. At least 30 s.
func startTimeout() time.Duration { return max(30*time.Second, testwait.TimeoutN(2)) }

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// removeScope removes every container, snapshot image and volume of a
// test server's scope. The engine finishes a create whose client was
// killed, so containers are swept twice, a moment apart.
func removeScope(scope string) {
	label := "label=opensandbox.scope=" + scope
	for i := range 2 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		// Sandboxes first, then the egress containers whose network
		// namespaces they joined.
		for _, l := range []string{label, "label=opensandbox.egress-scope=" + scope} {
			if ids, _ := exec.Command("docker", "ps", "-aq", "--filter", l).Output(); len(bytes.TrimSpace(ids)) > 0 {
				exec.Command("docker", append([]string{"rm", "-f"}, strings.Fields(string(ids))...)...).Run()
			}
		}
	}
	if ids, _ := exec.Command("docker", "images", "-q", "--filter", label).Output(); len(bytes.TrimSpace(ids)) > 0 {
		exec.Command("docker", append([]string{"rmi", "-f"}, strings.Fields(string(ids))...)...).Run()
	}
	if names, _ := exec.Command("docker", "volume", "ls", "-q", "--filter", label).Output(); len(bytes.TrimSpace(names)) > 0 {
		exec.Command("docker", append([]string{"volume", "rm", "-f"}, strings.Fields(string(names))...)...).Run()
	}
}

// start runs the server process and waits until /health answers.
func (s *server) start() {
	s.t.Helper()
	if s.logs == nil {
		s.logs = &syncBuffer{}
	}
	s.cmd = exec.Command(serverBin, "--config", s.config)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	s.cmd.Env = append(os.Environ(), "OPENSANDBOX_SERVER_API_KEY=")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { s.cmd.Wait(); close(exited) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(s.base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		select {
		case <-exited:
			s.t.Fatalf("server exited at start:\n%s", s.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("server did not answer /health:\n%s", s.logs.String())
		}
	}
}

// stop sends sig to the server and waits for it to exit.
func (s *server) stop(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// do sends a request with the API key (unless a header overrides it).
func (s *server) do(method, path string, body any, header ...string) (*http.Response, []byte) {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set(api.HeaderAPIKey, s.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, data
}

// call sends a request, checks the status and decodes the answer.
func (s *server) call(method, path string, body any, want int, out any) []byte {
	s.t.Helper()
	resp, data := s.do(method, path, body)
	if resp.StatusCode != want {
		s.t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			s.t.Fatalf("%s %s: %v in %s", method, path, err, data)
		}
	}
	return data
}

// wantError checks an error answer's status and code.
func (s *server) wantError(method, path string, body any, status int, code string) api.ErrorResponse {
	s.t.Helper()
	resp, data := s.do(method, path, body)
	var e api.ErrorResponse
	json.Unmarshal(data, &e)
	if resp.StatusCode != status || (code != "" && e.Code != code) || e.Message == "" {
		s.t.Fatalf("%s %s: %d %s, want %d %s", method, path, resp.StatusCode, data, status, code)
	}
	if resp.Header.Get(api.HeaderRequestID) == "" {
		s.t.Fatalf("%s %s: no X-Request-ID on an error", method, path)
	}
	return e
}

func sandboxRequest(image string, entrypoint ...string) api.CreateSandboxRequest {
	return api.CreateSandboxRequest{
		Image:          &api.ImageSpec{URI: image},
		Entrypoint:     entrypoint,
		ResourceLimits: map[string]string{"cpu": "1", "memory": "512Mi"},
	}
}

// create creates a sandbox and returns its id.
func (s *server) create(req api.CreateSandboxRequest) string {
	s.t.Helper()
	var resp api.CreateSandboxResponse
	s.call("POST", "/v1/sandboxes", req, 202, &resp)
	return resp.ID
}

// waitState polls GET until the sandbox is in state, for as long as one
// start may take on this machine (see testwait); a sandbox that fails
// instead fails the test at once.
func (s *server) waitState(id, state string) api.Sandbox {
	s.t.Helper()
	return s.waitStateN(id, state, 1)
}

// waitStateN is waitState for a wait that covers several starts (the
// sandbox waits behind others created at once, or its server restarts).
func (s *server) waitStateN(id, state string, starts int) api.Sandbox {
	s.t.Helper()
	var sb api.Sandbox
	testwait.Wait{What: "sandbox " + id + " to be " + state, Starts: starts, Every: 25 * time.Millisecond,
		Describe: func() string { return s.describe(id) }}.Until(s.t, func() bool {
		resp, data := s.do("GET", "/v1/sandboxes/"+id, nil)
		if resp.StatusCode != 200 {
			return false
		}
		json.Unmarshal(data, &sb)
		if sb.Status.State == "Failed" && state != "Failed" {
			s.t.Fatalf("sandbox %s failed: %+v\n%s", id, sb.Status, s.describe(id))
		}
		return sb.Status.State == state
	})
	return sb
}

// waitGone polls GET until the sandbox is 404. It returns when the last
// request that still found the sandbox was sent: the sandbox was there
// at that time, however slow the answers were.
func (s *server) waitGone(id string) (stillThere time.Time) {
	s.t.Helper()
	testwait.Wait{What: "sandbox " + id + " to be gone", Every: 20 * time.Millisecond,
		Describe: func() string { return s.describe(id) }}.Until(s.t, func() bool {
		sent := time.Now()
		if resp, _ := s.do("GET", "/v1/sandboxes/"+id, nil); resp.StatusCode == 404 {
			return true
		}
		stillThere = sent
		return false
	})
	return stillThere
}

// describe says what a sandbox is doing, for a wait that ran out: its
// status, its events, its container's log as the server has them, and
// the container as the engine has it.
func (s *server) describe(id string) string {
	var b strings.Builder
	get := func(path string) string {
		req, err := http.NewRequest("GET", s.base+path, nil)
		if err != nil {
			return err.Error()
		}
		req.Header.Set(api.HeaderAPIKey, s.key)
		resp, err := s.hc.Do(req)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var d api.DiagnosticContent
		if resp.StatusCode == 200 && json.Unmarshal(data, &d) == nil && d.Content != nil {
			return tail(*d.Content, 30)
		}
		return resp.Status + " " + strings.TrimSpace(string(data))
	}
	fmt.Fprintf(&b, "sandbox %s: %s\n", id, get("/v1/sandboxes/"+id))
	fmt.Fprintf(&b, "events:\n%s\n", get("/v1/sandboxes/"+id+"/diagnostics/events?scope=all"))
	fmt.Fprintf(&b, "container log:\n%s\n", get("/v1/sandboxes/"+id+"/diagnostics/logs?scope=container"))
	b.WriteString(testwait.Containers("label=opensandbox.id=" + id))
	return b.String()
}

// execd returns a client of a sandbox's execd, built from its endpoint
// the way the SDKs do.
func (s *server) execd(id string) *container {
	s.t.Helper()
	var ep api.Endpoint
	s.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+execdPort, nil, 200, &ep)
	if strings.Contains(ep.Endpoint, "://") || ep.Headers[api.HeaderExecdToken] == "" {
		s.t.Fatalf("execd endpoint %+v", ep)
	}
	c := &container{t: s.t, id: id, base: "http://" + ep.Endpoint, token: ep.Headers[api.HeaderExecdToken], hc: &http.Client{}}
	var last error
	testwait.Until(s.t, "execd of "+id+" to answer at "+c.base, func() bool {
		resp, err := c.hc.Do(mustRequest(c, "GET", "/ping"))
		if last = err; err != nil {
			return false
		}
		resp.Body.Close()
		last = fmt.Errorf("ping: %s", resp.Status)
		return resp.StatusCode == 200
	}, func() string { return fmt.Sprintf("last ping: %v\n%s", last, s.describe(id)) })
	return c
}

func mustRequest(c *container, method, path string) *http.Request {
	req, _ := http.NewRequest(method, c.base+path, nil)
	req.Header.Set(api.HeaderExecdToken, c.token)
	return req
}

// scopeContainers counts the containers of the server's scope.
func (s *server) scopeContainers() int {
	out, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=opensandbox.scope="+s.scope).Output()
	return len(strings.Fields(string(out)))
}
