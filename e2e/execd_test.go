package e2e

import (
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

const (
	pythonImage  = "opensandbox/python:3.11"
	busyboxImage = "opensandbox/busybox"
	noShellImage = "opensandbox/noshell"
)

func TestPythonImage(t *testing.T) {
	c := startContainer(t, pythonImage, nil, "sleep", "infinity")

	r := c.run(`python3 -c 'import sys; print("out"); print("err", file=sys.stderr); sys.exit(3)'`)
	if r.stdout != "out" || r.stderr != "err" || r.exit != "3" {
		t.Fatalf("python command: %+v", r)
	}
	// Docker-style endpoints reach execd through its own port proxy.
	c.call("GET", "/proxy/"+execdPort+"/ping", nil, 200, nil)
	if got := c.mustRun("echo $$"); got == "1" {
		t.Fatal("command ran as PID 1")
	}
	if got := c.mustRun("cat /proc/1/cmdline | tr '\\0' ' '"); !strings.HasPrefix(got, execdPath) {
		t.Fatalf("PID 1 is %q, want execd", got)
	}
	uid := uint32(65534)
	// The token was given on execd's command line; no process of the
	// sandbox may find it in PID 1's arguments or environment (which, execd
	// being non-dumpable, it may not even read).
	for _, cmd := range []string{"tr '\\0' ' ' < /proc/1/cmdline", "tr '\\0' ' ' < /proc/1/environ", "env"} {
		r := c.run(cmd)
		if strings.Contains(r.stdout, c.token) {
			t.Fatalf("%s shows the token: %s", cmd, r.stdout)
		}
		if r.exit != "0" && !strings.Contains(r.stderr, "Permission denied") {
			t.Fatalf("%s: exit %q, %s", cmd, r.exit, r.stderr)
		}
	}
	if out := c.stream("/command", api.RunCommandRequest{Command: "tr '\\0' ' ' < /proc/1/cmdline", UID: &uid}); out.exit != "0" || strings.Contains(out.stdout, c.token) {
		t.Fatalf("as nobody, /proc/1/cmdline: %+v", out)
	}
	r = c.stream("/command", api.RunCommandRequest{Command: `id -un; echo "$HOME"`, UID: &uid, Cwd: "/tmp"})
	if r.stdout != "nobody\n/nonexistent" {
		t.Fatalf("as nobody: %+v", r)
	}

	// A session keeps Python-made state in the shell.
	var s api.CreateSessionResponse
	c.call("POST", "/session", api.CreateSessionRequest{Cwd: "/work"}, 200, &s)
	c.stream("/session/"+s.SessionID+"/run", api.RunInSessionRequest{Command: `v=$(python3 -c 'print(6*7)'); f() { echo "v=$v in $PWD"; }`})
	if got := c.stream("/session/"+s.SessionID+"/run", api.RunInSessionRequest{Command: "f"}); got.stdout != "v=42 in /work" {
		t.Fatalf("session: %+v", got)
	}

	// Background command with log tailing.
	bg := c.stream("/command", api.RunCommandRequest{Command: "for i in 1 2 3; do echo $i; sleep 0.1; done", Background: true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st api.CommandStatus
		c.call("GET", "/command/status/"+bg.id, nil, 200, &st)
		if !st.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("background command did not finish")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if logs := string(c.call("GET", "/command/"+bg.id+"/logs?cursor=0", nil, 200, nil)); logs != "1\n2\n3\n" {
		t.Fatalf("logs %q", logs)
	}
}

func TestBusyboxImage(t *testing.T) {
	c := startContainer(t, busyboxImage, nil, "sleep", "1000000")
	if got := c.mustRun("echo hello from $(readlink /bin/sh)"); got != "hello from busybox" {
		t.Fatalf("got %q", got)
	}
	// Sessions fall back to sh where there is no bash.
	var s api.CreateSessionResponse
	c.call("POST", "/session", nil, 200, &s)
	c.stream("/session/"+s.SessionID+"/run", api.RunInSessionRequest{Command: "x=1; cd /tmp"})
	if got := c.stream("/session/"+s.SessionID+"/run", api.RunInSessionRequest{Command: "echo $x $PWD"}); got.stdout != "1 /tmp" {
		t.Fatalf("sh session: %+v", got)
	}
}

func TestImageWithoutShell(t *testing.T) {
	c := startContainer(t, noShellImage, nil, "busybox", "sleep", "1000000")
	if r := c.run("busybox echo 'no shell' here"); r.stdout != "no shell here" || r.exit != "0" {
		t.Fatalf("direct exec: %+v", r)
	}
	r := c.run("busybox echo a | busybox cat")
	if r.exit == "0" || !strings.Contains(r.exit, "no shell") {
		t.Fatalf("shell syntax without a shell: %+v", r)
	}
	c.call("POST", "/session", nil, 500, nil)
}

// TestInitReapsOrphans: commands that leave orphans behind must not fill
// the container with zombies.
func TestInitReapsOrphans(t *testing.T) {
	c := startContainer(t, busyboxImage, nil, "sleep", "1000000")
	for i := 0; i < 20; i++ {
		c.mustRun("sleep 0.2 & sleep 0.1 & echo spawned")
	}
	time.Sleep(500 * time.Millisecond)
	zombies := c.mustRun(`for f in /proc/[0-9]*/stat; do read -r line < "$f" 2>/dev/null && case "$line" in *") Z "*) echo "$line";; esac; done; true`)
	if zombies != "" {
		t.Fatalf("zombies in the container:\n%s", zombies)
	}
}

// TestEntrypointSignals: docker stop's SIGTERM reaches the entrypoint, and
// the container ends with the entrypoint's status.
func TestEntrypointSignals(t *testing.T) {
	c := startContainer(t, busyboxImage, nil, "sh", "-c", `trap 'echo got TERM; exit 42' TERM; echo started; while :; do sleep 0.1; done`)
	var st api.CommandStatus
	c.call("GET", "/command/status/entrypoint", nil, 200, &st)
	if !st.Running || !strings.HasPrefix(st.Content, "sh -c") {
		t.Fatalf("entrypoint status %+v", st)
	}
	start := time.Now()
	docker(t, "stop", "-t", "10", c.id)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("docker stop took %v: SIGTERM was not forwarded", d)
	}
	code := strings.TrimSpace(docker(t, "inspect", "-f", "{{.State.ExitCode}}", c.id))
	if code != "42" {
		t.Fatalf("container exit code %s, want 42", code)
	}
	logs, _ := exec.Command("docker", "logs", c.id).CombinedOutput()
	if !strings.Contains(string(logs), "got TERM") {
		t.Fatalf("entrypoint did not see SIGTERM; log:\n%s", logs)
	}
}

// TestEntrypointExitKeepsSandbox: execd serves on after its entrypoint
// has exited, and reports how it ended.
func TestEntrypointExitKeepsSandbox(t *testing.T) {
	c := startContainer(t, busyboxImage, nil, "sh", "-c", "echo bye; exit 3")
	var st api.CommandStatus
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c.call("GET", "/command/status/entrypoint", nil, 200, &st)
		if !st.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("entrypoint still running")
		}
	}
	if st.ExitCode == nil || *st.ExitCode != 3 {
		t.Fatalf("entrypoint status %+v", st)
	}
	if got := c.mustRun("echo alive"); got != "alive" {
		t.Fatalf("after entrypoint exit: %q", got)
	}
	// A missing entrypoint program is reported the same way.
	c2 := startContainer(t, busyboxImage, nil, "/no/such/program")
	c2.call("GET", "/command/status/entrypoint", nil, 200, &st)
	if st.ExitCode == nil || *st.ExitCode != 255 || !strings.Contains(st.Error, "no such file") {
		t.Fatalf("missing entrypoint status %+v", st)
	}
	// Without any entrypoint, docker stop ends the container at once.
	c3 := startContainer(t, busyboxImage, nil)
	start := time.Now()
	docker(t, "stop", c3.id)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("docker stop took %v", d)
	}
	if code := strings.TrimSpace(docker(t, "inspect", "-f", "{{.State.ExitCode}}", c3.id)); code != "0" {
		t.Fatalf("exit code %s", code)
	}
}

func TestConcurrentCommandsInContainer(t *testing.T) {
	c := startContainer(t, busyboxImage, nil, "sleep", "1000000")
	const n = 200
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		go func() {
			r := c.run("echo " + strconv.Itoa(i))
			if r.stdout != strconv.Itoa(i) || r.exit != "0" {
				errs <- r.stdout + "/" + r.exit
				return
			}
			errs <- ""
		}()
	}
	for i := 0; i < n; i++ {
		if e := <-errs; e != "" {
			t.Errorf("command: %s", e)
		}
	}
}

// TestMetricsFromContainerCgroup: the figures are the container's limits
// and use, not the host's.
func TestMetricsFromContainerCgroup(t *testing.T) {
	c := startContainer(t, pythonImage, []string{"--memory", "256m", "--cpus", "0.5"}, "sleep", "infinity")
	var m api.Metrics
	start := time.Now()
	c.call("GET", "/metrics", nil, 200, &m)
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("/metrics took %v", d)
	}
	if m.MemTotalMiB != 256 || m.CPUCount != 0.5 || m.MemUsedMiB <= 0 || m.MemUsedMiB > 256 {
		t.Fatalf("metrics %+v, want 256 MiB total and 0.5 CPU", m)
	}
	// Allocate 100 MiB inside the container and watch the figure follow.
	bg := c.stream("/command", api.RunCommandRequest{Command: `python3 -c 'import time; b = bytearray(100 << 20); b[::4096] = b"x" * len(b[::4096]); time.sleep(30)'`, Background: true})
	defer c.call("DELETE", "/command?id="+bg.id, nil, 200, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var after api.Metrics
		c.call("GET", "/metrics", nil, 200, &after)
		if after.MemUsedMiB >= m.MemUsedMiB+90 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory used stayed at %.1f MiB (from %.1f) with 100 MiB allocated", after.MemUsedMiB, m.MemUsedMiB)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestProxyToServerInContainer reaches an HTTP server inside the
// container through execd's port proxy.
func TestProxyToServerInContainer(t *testing.T) {
	c := startContainer(t, pythonImage, nil, "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/etc")
	var body []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp := c.request("GET", "/proxy/8000/hostname", nil)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy: %d %s", resp.StatusCode, body)
		}
	}
	if want := c.mustRun("cat /etc/hostname"); strings.TrimSpace(string(body)) != want {
		t.Fatalf("proxied body %q, want %q", body, want)
	}
}

// TestShutdownWithinGrace: docker stop ends a sandbox whose processes all
// ignore SIGTERM well within its 10 s, and reports the entrypoint's fate.
func TestShutdownWithinGrace(t *testing.T) {
	c := startContainer(t, busyboxImage, nil, "sh", "-c", "trap '' TERM; while :; do sleep 0.1; done")
	c.stream("/command", api.RunCommandRequest{Command: "trap '' TERM; while :; do sleep 0.1; done", Background: true})
	start := time.Now()
	docker(t, "stop", "-t", "20", c.id)
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("docker stop took %v", d)
	}
	if code := strings.TrimSpace(docker(t, "inspect", "-f", "{{.State.ExitCode}}", c.id)); code != "137" {
		t.Fatalf("exit code %s, want 137 (entrypoint SIGKILLed)", code)
	}
}
