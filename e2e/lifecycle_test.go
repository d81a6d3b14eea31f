package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// TestLifecycle drives one sandbox through everything a client does with
// it, the way the OpenSandbox SDKs do.
func TestLifecycle(t *testing.T) {
	s := startServer(t, serverOptions{})
	req := sandboxRequest(pythonImage, "sleep", "infinity")
	req.Metadata = map[string]string{"team": "ml", "purpose": "e2e"}
	req.Env = map[string]*string{"GREETING": ptr("hello")}
	timeout := int64(600)
	req.Timeout = &timeout
	var created api.CreateSandboxResponse
	resp, data := s.do("POST", "/v1/sandboxes", req)
	if resp.StatusCode != 202 || json.Unmarshal(data, &created) != nil || resp.Header.Get(api.HeaderRequestID) == "" {
		t.Fatalf("create: %d %s (X-Request-ID %q)", resp.StatusCode, data, resp.Header.Get(api.HeaderRequestID))
	}
	if created.Status.State != "Pending" && created.Status.State != "Running" {
		t.Fatalf("create answered %+v", created)
	}
	// The Python and JavaScript SDKs resolve both endpoints at once.
	s.call("GET", "/v1/sandboxes/"+created.ID+"/endpoints/"+execdPort, nil, 200, nil)
	s.call("GET", "/v1/sandboxes/"+created.ID+"/endpoints/18080", nil, 200, nil)
	sb := s.waitState(created.ID, "Running")
	if sb.Image == nil || sb.Image.URI != pythonImage || sb.Metadata["team"] != "ml" || sb.ExpiresAt == nil ||
		strings.Join(sb.Entrypoint, " ") != "sleep infinity" {
		t.Fatalf("sandbox %+v", sb)
	}

	c := s.execd(created.ID)
	if out := c.mustRun(`python3 -c "print(1 + 1)"; echo $GREETING`); out != "2\nhello" {
		t.Fatalf("python through execd: %q", out)
	}

	// Root mount works the same as /v1.
	s.call("GET", "/sandboxes/"+created.ID, nil, 200, nil)

	// List with filters and pagination.
	var list api.ListSandboxesResponse
	s.call("GET", "/v1/sandboxes?state=running&state=Paused&metadata="+url.QueryEscape("team=ml&purpose=e2e"), nil, 200, &list)
	if len(list.Items) != 1 || list.Items[0].ID != created.ID || list.Pagination.TotalItems != 1 {
		t.Fatalf("filtered list: %+v", list)
	}
	s.call("GET", "/v1/sandboxes?metadata="+url.QueryEscape("team=other"), nil, 200, &list)
	if len(list.Items) != 0 {
		t.Fatalf("list with a non-matching filter: %+v", list)
	}

	// Metadata patch.
	var patched api.Sandbox
	s.call("PATCH", "/v1/sandboxes/"+created.ID+"/metadata", map[string]any{"purpose": nil, "owner": "ci"}, 200, &patched)
	if _, ok := patched.Metadata["purpose"]; ok || patched.Metadata["owner"] != "ci" {
		t.Fatalf("patched metadata: %v", patched.Metadata)
	}

	// Renew.
	at := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	var renewed api.RenewExpirationRequest
	s.call("POST", "/v1/sandboxes/"+created.ID+"/renew-expiration", map[string]string{"expiresAt": at.Format(time.RFC3339)}, 200, &renewed)
	if !renewed.ExpiresAt.Equal(at) {
		t.Fatalf("renewed to %v, want %v", renewed.ExpiresAt, at)
	}

	// Pause and resume with a process running inside.
	c.mustRun(`(i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done) >/dev/null 2>&1 & echo $! > /tmp/pid`)
	pid := c.mustRun("cat /tmp/pid")
	s.call("POST", "/v1/sandboxes/"+created.ID+"/pause", nil, 202, nil)
	if sb := s.waitState(created.ID, "Paused"); sb.Status.State != "Paused" {
		t.Fatal("not paused")
	}
	s.wantError("POST", "/v1/sandboxes/"+created.ID+"/pause", nil, 409, api.CodeDockerSandboxNotRunning)
	time.Sleep(500 * time.Millisecond)
	s.call("POST", "/v1/sandboxes/"+created.ID+"/resume", nil, 202, nil)
	s.waitState(created.ID, "Running")
	if got := c.mustRun("cat /tmp/pid; kill -0 $(cat /tmp/pid) && echo alive"); got != pid+"\nalive" {
		t.Fatalf("process after resume: %q", got)
	}

	// Diagnostics: the container's output and the lifecycle.
	var diag api.DiagnosticContent
	s.call("GET", "/v1/sandboxes/"+created.ID+"/diagnostics/logs?scope=container", nil, 200, &diag)
	if diag.Content == nil || !strings.Contains(*diag.Content, "execd listening") {
		t.Fatalf("container logs: %+v", diag)
	}
	s.call("GET", "/v1/sandboxes/"+created.ID+"/diagnostics/events?scope=all", nil, 200, &diag)
	if diag.Content == nil || !strings.Contains(*diag.Content, "CONTAINER_PAUSED") || !strings.Contains(*diag.Content, "unpause") {
		t.Fatalf("events: %s", *diag.Content)
	}
	legacy, body := s.do("GET", "/v1/sandboxes/"+created.ID+"/diagnostics/logs", nil)
	if legacy.StatusCode != 200 || legacy.Header.Get("Deprecation") != "true" || !strings.Contains(string(body), "execd listening") {
		t.Fatalf("legacy logs: %d %s", legacy.StatusCode, body)
	}

	// Delete.
	s.call("DELETE", "/v1/sandboxes/"+created.ID, nil, 204, nil)
	s.wantError("GET", "/v1/sandboxes/"+created.ID, nil, 404, api.CodeDockerSandboxNotFound)
	if n := s.scopeContainers(); n != 0 {
		t.Fatalf("%d containers left after delete", n)
	}
}

func ptr[T any](v T) *T { return &v }

// TestExpiry: a sandbox goes within a second of its expiry; a renewed one
// stays until its new expiry.
func TestExpiry(t *testing.T) {
	s := startServer(t, serverOptions{})
	// The timeout is as long as a start may take here: a shorter one
	// could pass while the sandbox still starts, and it would be gone
	// before it ever ran.
	short := sandboxRequest(busyboxImage, "sleep", "1000000")
	short.Timeout = ptr(int64(math.Ceil(testwait.Timeout().Seconds())))
	a := s.create(short)
	b := s.create(short)
	s.waitState(a, "Running")
	sb := s.waitState(b, "Running")
	var sa api.Sandbox
	s.call("GET", "/v1/sandboxes/"+a, nil, 200, &sa)
	if !time.Now().Before(*sa.ExpiresAt) {
		t.Fatalf("sandbox %s was Running only after its expiry %v; the machine is slower than its measured pace", a, sa.ExpiresAt)
	}
	renewed := sb.ExpiresAt.Add(3 * time.Second)
	s.call("POST", "/v1/sandboxes/"+b+"/renew-expiration", map[string]string{"expiresAt": renewed.UTC().Format(time.RFC3339Nano)}, 200, nil)
	if late := s.waitGone(a).Sub(*sa.ExpiresAt); late > time.Second+200*time.Millisecond {
		t.Fatalf("sandbox still there %v after its expiry", late)
	}
	// Past the renewed sandbox's old expiry, with the server's margin.
	time.Sleep(time.Until(sb.ExpiresAt.Add(1500 * time.Millisecond)))
	if resp, _ := s.do("GET", "/v1/sandboxes/"+b, nil); resp.StatusCode != 200 {
		t.Fatal("the renewed sandbox went at its old expiry")
	}
	if late := s.waitGone(b).Sub(renewed); late > time.Second+200*time.Millisecond {
		t.Fatalf("the renewed sandbox still there %v after its new expiry", late)
	}
	// A sandbox without timeout has no expiry, and cannot be renewed.
	forever := s.create(sandboxRequest(busyboxImage, "sleep", "1000000"))
	var sf api.Sandbox
	s.call("GET", "/v1/sandboxes/"+forever, nil, 200, &sf)
	if sf.ExpiresAt != nil {
		t.Fatalf("a sandbox without timeout has expiresAt %v", sf.ExpiresAt)
	}
	s.wantError("POST", "/v1/sandboxes/"+forever+"/renew-expiration", map[string]string{"expiresAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, 409, "")
}

// TestSnapshotRoundTrip: a file written in a sandbox is in a sandbox
// created from its snapshot.
func TestSnapshotRoundTrip(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := s.create(sandboxRequest(busyboxImage, "sleep", "1000000"))
	s.waitState(id, "Running")
	s.execd(id).mustRun("echo from-the-snapshot > /root/kept")
	var snap api.Snapshot
	resp, data := s.do("POST", "/v1/sandboxes/"+id+"/snapshots", map[string]string{"name": "e2e"})
	if resp.StatusCode != 202 || !strings.HasPrefix(resp.Header.Get("Location"), "/v1/snapshots/") {
		t.Fatalf("snapshot: %d %s %v", resp.StatusCode, data, resp.Header)
	}
	json.Unmarshal(data, &snap)
	testwait.Wait{What: "snapshot " + snap.ID + " to be Ready", Starts: 2,
		Describe: func() string { return fmt.Sprintf("snapshot %+v\n%s", snap, s.describe(id)) }}.Until(t, func() bool {
		s.call("GET", "/v1/snapshots/"+snap.ID, nil, 200, &snap)
		if snap.Status.State == "Failed" {
			t.Fatalf("snapshot %+v", snap)
		}
		return snap.Status.State == "Ready"
	})
	s.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
	restored := s.create(api.CreateSandboxRequest{SnapshotID: snap.ID, ResourceLimits: map[string]string{"cpu": "1", "memory": "256Mi"}})
	sb := s.waitState(restored, "Running")
	if sb.SnapshotID != snap.ID || sb.Image != nil {
		t.Fatalf("restored sandbox %+v", sb)
	}
	if got := s.execd(restored).mustRun("cat /root/kept"); got != "from-the-snapshot" {
		t.Fatalf("restored file: %q", got)
	}
	var list api.ListSnapshotsResponse
	s.call("GET", "/v1/snapshots?sandboxId="+id, nil, 200, &list)
	if len(list.Items) != 1 {
		t.Fatalf("snapshots of %s: %+v", id, list)
	}
	s.call("DELETE", "/v1/snapshots/"+snap.ID, nil, 204, nil)
	s.wantError("GET", "/v1/snapshots/"+snap.ID, nil, 404, api.CodeSnapshotNotFound)
}

// TestVolumesThroughAPI: a host directory under the allowlist mounts; one
// outside it is refused before anything is made.
func TestVolumesThroughAPI(t *testing.T) {
	allowed := t.TempDir()
	s := startServer(t, serverOptions{server: fmt.Sprintf("host_volume_allowlist = [%q]", allowed)})
	os.WriteFile(filepath.Join(allowed, "hello"), []byte("from the host\n"), 0o644)
	req := sandboxRequest(busyboxImage, "sleep", "1000000")
	req.Volumes = []api.Volume{{Name: "work", MountPath: "/work", Host: &api.HostVolume{Path: allowed}},
		{Name: "cache", MountPath: "/cache", PVC: &api.PVCVolume{ClaimName: "osb-e2e-" + s.scope, DeleteOnSandboxTermination: true}}}
	id := s.create(req)
	s.waitState(id, "Running")
	if got := s.execd(id).mustRun("cat /work/hello; touch /cache/x && echo named-ok"); got != "from the host\nnamed-ok" {
		t.Fatalf("volumes: %q", got)
	}
	before := s.scopeContainers()
	outside := sandboxRequest(busyboxImage, "sleep", "1")
	outside.Volumes = []api.Volume{{Name: "etc", MountPath: "/host-etc", Host: &api.HostVolume{Path: "/etc"}}}
	s.wantError("POST", "/v1/sandboxes", outside, 400, api.CodeVolumeHostPathNotAllowed)
	sock := sandboxRequest(busyboxImage, "sleep", "1")
	sock.Volumes = []api.Volume{{Name: "sock", MountPath: "/sock", Host: &api.HostVolume{Path: "/var/run/docker.sock"}}}
	s.wantError("POST", "/v1/sandboxes", sock, 400, "")
	if after := s.scopeContainers(); after != before {
		t.Fatalf("refused creates left containers: %d then %d", before, after)
	}
}

// TestGVisorSandbox runs a sandbox under gVisor through the API.
func TestGVisorSandbox(t *testing.T) {
	s := startServer(t, serverOptions{})
	req := sandboxRequest(busyboxImage, "sleep", "1000000")
	req.Extensions = map[string]string{"docker.runtime": "runsc"}
	id := s.create(req)
	s.waitState(id, "Running")
	if got := s.execd(id).mustRun("dmesg | head -n 1"); !strings.Contains(got, "gVisor") {
		t.Fatalf("dmesg: %q", got)
	}
}

// TestParallelCreates: 50 creates at once all come up.
func TestParallelCreates(t *testing.T) {
	s := startServer(t, serverOptions{})
	const n = 50
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp api.CreateSandboxResponse
			r, data := s.do("POST", "/v1/sandboxes", sandboxRequest(busyboxImage, "sleep", "1000000"))
			if r.StatusCode == 202 && json.Unmarshal(data, &resp) == nil {
				ids[i] = resp.ID
			}
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if id == "" {
			t.Fatalf("create %d failed", i)
		}
	}
	// All wait behind one another on two cores: each wait may take as
	// long as the starts not yet seen Running.
	for i, id := range ids {
		s.waitStateN(id, "Running", n-i)
	}
	var list api.ListSandboxesResponse
	s.call("GET", "/v1/sandboxes?pageSize=200", nil, 200, &list)
	if list.Pagination.TotalItems != n || s.scopeContainers() != n {
		t.Fatalf("%d sandboxes listed, %d containers; want %d", list.Pagination.TotalItems, s.scopeContainers(), n)
	}
}

// TestRestart: a graceful stop and a kill -9, the latter in the middle of
// creates, lose nothing: sandboxes, endpoints, tokens and expiry timers
// are back, and no container is left orphaned.
func TestRestart(t *testing.T) {
	s := startServer(t, serverOptions{})
	keep := s.create(sandboxRequest(busyboxImage, "sleep", "1000000"))
	s.waitState(keep, "Running")
	s.execd(keep).mustRun("echo before > /tmp/state")
	// The expiring sandbox gets its short expiry right before the kill:
	// a short timeout at create could pass while it still starts, or
	// before the kill, on a busy machine.
	expiring := sandboxRequest(busyboxImage, "sleep", "1000000")
	expiring.Timeout = ptr(int64(3600))
	exp := s.create(expiring)
	s.waitState(exp, "Running")

	s.stop(syscall.SIGTERM)
	s.start()
	s.waitState(keep, "Running")
	s.waitState(exp, "Running")
	if got := s.execd(keep).mustRun("cat /tmp/state"); got != "before" {
		t.Fatalf("after a graceful restart: %q", got)
	}

	// Creates in flight, then kill -9.
	var inflight []string
	for range 5 {
		inflight = append(inflight, s.create(sandboxRequest(busyboxImage, "sleep", "1000000")))
	}
	expiresAt := time.Now().Add(2 * time.Second)
	s.call("POST", "/v1/sandboxes/"+exp+"/renew-expiration", map[string]string{"expiresAt": expiresAt.UTC().Format(time.RFC3339Nano)}, 200, nil)
	s.stop(syscall.SIGKILL)
	if killed := time.Now(); !killed.Before(expiresAt) {
		t.Fatalf("the server was killed %v after the expiry it was to miss", killed.Sub(expiresAt))
	}
	time.Sleep(time.Until(expiresAt.Add(time.Second))) // the expiry passes while no server runs
	s.start()
	s.waitGone(exp)
	for i, id := range append(inflight, keep) {
		s.waitStateN(id, "Running", len(inflight)+1-i)
		s.execd(id).mustRun("true")
	}
	if got := s.execd(keep).mustRun("cat /tmp/state"); got != "before" {
		t.Fatalf("after kill -9: %q", got)
	}
	var list api.ListSandboxesResponse
	s.call("GET", "/v1/sandboxes", nil, 200, &list)
	if list.Pagination.TotalItems != 6 || s.scopeContainers() != 6 {
		t.Fatalf("after kill -9: %d sandboxes, %d containers, want 6 of each", list.Pagination.TotalItems, s.scopeContainers())
	}
}

// TestAuth: every route but /health wants the key.
func TestAuth(t *testing.T) {
	s := startServer(t, serverOptions{})
	resp, data := s.do("GET", "/v1/sandboxes", nil, api.HeaderAPIKey, "")
	if resp.StatusCode != 401 || !strings.Contains(string(data), "MISSING_API_KEY") || resp.Header.Get(api.HeaderRequestID) == "" {
		t.Fatalf("without key: %d %s", resp.StatusCode, data)
	}
	resp, data = s.do("GET", "/v1/sandboxes", nil, api.HeaderAPIKey, "wrong-key-0123456789")
	if resp.StatusCode != 401 || !strings.Contains(string(data), "INVALID_API_KEY") {
		t.Fatalf("wrong key: %d %s", resp.StatusCode, data)
	}
	if resp, _ := s.do("GET", "/health", nil, api.HeaderAPIKey, ""); resp.StatusCode != 200 {
		t.Fatalf("/health without key: %d", resp.StatusCode)
	}
	resp, _ = s.do("GET", "/v1/sandboxes", nil, api.HeaderRequestID, "my-request-42")
	if resp.Header.Get(api.HeaderRequestID) != "my-request-42" {
		t.Fatalf("X-Request-ID not echoed: %q", resp.Header.Get(api.HeaderRequestID))
	}
}

// TestBadInput: each bad request gets its status and a message, and none
// leaves a container behind.
func TestBadInput(t *testing.T) {
	// The missing image below is on a closed loopback port, so that its
	// pull fails without a packet leaving the machine: the server must
	// allow local registries for it.
	s := startServer(t, serverOptions{server: "allow_local_registries = true"})
	img := func(uri string) api.CreateSandboxRequest { return sandboxRequest(uri, "sleep", "1") }
	neg := img(busyboxImage)
	neg.Timeout = ptr(int64(-5))
	absurd := img(busyboxImage)
	absurd.Timeout = ptr(int64(1) << 62)
	badMeta := img(busyboxImage)
	badMeta.Metadata = map[string]string{"bad key!": "x"}
	reserved := img(busyboxImage)
	reserved.Metadata = map[string]string{"opensandbox.io/owner": "x"}
	badMem := img(busyboxImage)
	badMem.ResourceLimits = map[string]string{"memory": "lots"}
	cases := []struct {
		name   string
		method string
		path   string
		body   any
		status int
	}{
		{"invalid image reference", "POST", "/v1/sandboxes", img("Not A Valid::Ref"), 400},
		{"no image", "POST", "/v1/sandboxes", api.CreateSandboxRequest{Entrypoint: []string{"x"}, ResourceLimits: map[string]string{"cpu": "1"}}, 400},
		{"negative timeout", "POST", "/v1/sandboxes", neg, 400},
		{"absurd timeout", "POST", "/v1/sandboxes", absurd, 400},
		{"malformed metadata", "POST", "/v1/sandboxes", badMeta, 400},
		{"reserved metadata", "POST", "/v1/sandboxes", reserved, 400},
		{"bad memory", "POST", "/v1/sandboxes", badMem, 400},
		{"malformed json", "POST", "/v1/sandboxes", `{"image":`, 400},
		{"oversized body", "POST", "/v1/sandboxes", `{"env":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`, 413},
		{"unknown sandbox", "GET", "/v1/sandboxes/00000000-0000-4000-8000-000000000000", nil, 404},
		{"unknown sandbox delete", "DELETE", "/v1/sandboxes/nope", nil, 404},
		{"malformed filter", "GET", "/v1/sandboxes?metadata=" + url.QueryEscape("novalue"), nil, 400},
		{"page size", "GET", "/v1/sandboxes?pageSize=500", nil, 400},
		{"bad port", "GET", "/v1/sandboxes/nope/endpoints/70000", nil, 400},
		{"unknown snapshot", "POST", "/v1/sandboxes", api.CreateSandboxRequest{SnapshotID: "nope", ResourceLimits: map[string]string{"cpu": "1"}}, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.t = t
			resp, data := s.do(c.method, c.path, c.body)
			var e api.ErrorResponse
			if resp.StatusCode != c.status || json.Unmarshal(data, &e) != nil || e.Code == "" || e.Message == "" {
				t.Fatalf("%s %s: %d %.300s, want %d with {code,message}", c.method, c.path, resp.StatusCode, data, c.status)
			}
		})
	}
	// A missing image fails the sandbox with a reason, and leaves nothing.
	missing := s.create(img("127.0.0.1:1/opensandbox/missing:latest"))
	sb := s.waitState(missing, "Failed")
	if sb.Status.Reason == "" || !strings.Contains(sb.Status.Message, "127.0.0.1:1") {
		t.Fatalf("failed sandbox status %+v", sb.Status)
	}
	if n := s.scopeContainers(); n != 0 {
		t.Fatalf("%d containers left by bad requests", n)
	}
	s.call("DELETE", "/v1/sandboxes/"+missing, nil, 204, nil)
}

// TestServerProxy reaches an app in a sandbox through the server's proxy
// route, which wants the API key or the sandbox's token.
func TestServerProxy(t *testing.T) {
	s := startServer(t, serverOptions{server: `public_address = ""`})
	id := s.create(sandboxRequest(pythonImage, "python3", "-m", "http.server", "8080", "--directory", "/etc"))
	s.waitState(id, "Running")
	var direct, viaProxy api.Endpoint
	s.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080", nil, 200, &direct)
	s.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?use_server_proxy=true", nil, 200, &viaProxy)
	get := func(endpoint string, headers map[string]string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+endpoint+"/hostname", nil)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				defer resp.Body.Close()
				b := make([]byte, 256)
				n, _ := resp.Body.Read(b)
				if resp.StatusCode != 502 || time.Now().After(deadline) {
					return resp.StatusCode, strings.TrimSpace(string(b[:n]))
				}
			} else if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
	}
	code, hostname := get(direct.Endpoint, direct.Headers)
	if code != 200 || hostname == "" {
		t.Fatalf("app port directly: %d %q", code, hostname)
	}
	if code, body := get(viaProxy.Endpoint, viaProxy.Headers); code != 200 || body != hostname {
		t.Fatalf("app port through the server proxy with the endpoint's headers: %d %q", code, body)
	}
	if code, _ := get(viaProxy.Endpoint, map[string]string{api.HeaderAPIKey: s.key}); code != 200 {
		t.Fatalf("through the proxy with the API key: %d", code)
	}
	if code, _ := get(viaProxy.Endpoint, nil); code != 401 {
		t.Fatalf("through the proxy without credentials: %d, want 401", code)
	}

	// execd itself through the server proxy: a terminal over WebSocket,
	// with only the endpoint's headers, as an SDK in proxy mode does.
	var execdEP api.Endpoint
	s.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+execdPort+"?use_server_proxy=true", nil, 200, &execdEP)
	c := &container{t: t, base: "http://" + execdEP.Endpoint, token: execdEP.Headers[api.HeaderExecdToken], hc: &http.Client{}}
	var sess api.PTYSession
	c.call("POST", "/pty", nil, 201, &sess)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	h := http.Header{}
	for k, v := range execdEP.Headers {
		h.Set(k, v)
	}
	conn, _, err := websocket.Dial(ctx, "ws://"+execdEP.Endpoint+"/pty/"+sess.SessionID+"/ws", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("terminal through the server proxy: %v", err)
	}
	defer conn.CloseNow()
	conn.Write(ctx, websocket.MessageBinary, append([]byte{api.PTYFrameStdin}, "echo through-$((40+2))\n"...))
	var screen strings.Builder
	for !strings.Contains(screen.String(), "through-42") {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("terminal output: %v (so far %q)", err, screen.String())
		}
		if typ == websocket.MessageBinary && len(data) > 0 && data[0] == api.PTYFrameStdout {
			screen.Write(data[1:])
		}
	}
}

// TestServerRefusesWithoutKey: without an API key the server does not
// start unless told it runs insecure, and says how to make a key.
func TestServerRefusesWithoutKey(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	os.WriteFile(cfg, []byte("version = 1\n[server]\nlisten = \"127.0.0.1:0\"\n[runtime.docker]\ndata_dir = \""+dir+"\"\n"), 0o600)
	cmd := exec.Command(serverBin, "--config", cfg)
	cmd.Env = append(os.Environ(), "OPENSANDBOX_SERVER_API_KEY=")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "gen-key") || !strings.Contains(string(out), "insecure") {
		t.Fatalf("server without a key: %v\n%s", err, out)
	}
	key, err := exec.Command(serverBin, "gen-key").Output()
	if err != nil || len(strings.TrimSpace(string(key))) < 40 {
		t.Fatalf("gen-key: %q, %v", key, err)
	}
}

// TestSlowPullDoesNotBlock: while one create waits on a registry that
// never answers, other sandboxes are created and served at full speed.
func TestSlowPullDoesNotBlock(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accept and hold every connection: a registry that stalls
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	s := startServer(t, serverOptions{server: "allow_local_registries = true"}) // the stalling registry is on loopback
	stalled := s.create(sandboxRequest(ln.Addr().String()+"/stalled/image:latest", "sleep", "1"))
	testwait.Until(t, "the stalled create to be pulling", func() bool {
		var sb api.Sandbox
		s.call("GET", "/v1/sandboxes/"+stalled, nil, 200, &sb)
		if sb.Status.State != "Pending" {
			t.Fatalf("stalled create: %+v", sb.Status)
		}
		return sb.Status.Reason == "PULLING_IMAGE"
	}, func() string { return s.describe(stalled) })
	// The pull never ends: a create waiting behind it would never run,
	// so the wait's deadline (one start on this machine) is the bound.
	start := time.Now()
	other := s.create(sandboxRequest(busyboxImage, "sleep", "1000000"))
	s.waitState(other, "Running")
	s.execd(other).mustRun("true")
	t.Logf("another sandbox ran in %v while a pull stalled", time.Since(start).Round(time.Millisecond))
	s.call("DELETE", "/v1/sandboxes/"+stalled, nil, 204, nil)
	s.wantError("GET", "/v1/sandboxes/"+stalled, nil, 404, "")
}

// TestSecureAccess: a sandbox created with secureAccess publishes no
// port without the token, the app port included.
func TestSecureAccess(t *testing.T) {
	s := startServer(t, serverOptions{})
	req := sandboxRequest(busyboxImage, "sleep", "1000000")
	req.SecureAccess = true
	id := s.create(req)
	s.waitState(id, "Running")
	var ep api.Endpoint
	s.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080", nil, 200, &ep)
	if !strings.HasSuffix(ep.Endpoint, "/proxy/8080") || ep.Headers[api.HeaderExecdToken] == "" {
		t.Fatalf("app endpoint of a secure sandbox: %+v", ep)
	}
	ports := docker(t, "port", "osb-"+id)
	if strings.Contains(ports, "8080") {
		t.Fatalf("secure sandbox publishes 8080: %s", ports)
	}
}
