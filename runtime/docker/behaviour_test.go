package docker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sandbox"
)

// start creates a sandbox from spec and waits until it runs.
func start(t *testing.T, rt *Runtime, spec sandbox.Spec) sandbox.ID {
	t.Helper()
	if spec.Image == "" {
		spec.Image = testImage
	}
	if spec.Entrypoint == nil {
		spec.Entrypoint = []string{"sleep", "1000000"}
	}
	id := sandbox.NewID()
	if _, err := rt.Create(context.Background(), id, spec); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	return id
}

// run runs a shell command in a sandbox through its execd endpoint and
// returns its stdout and exit status ("0" on success).
func run(t *testing.T, rt *Runtime, id sandbox.ID, command string) (string, string) {
	t.Helper()
	ep, err := rt.Endpoint(context.Background(), id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"command":%q}`, command)
	req, _ := http.NewRequest("POST", "http://"+ep.Address+"/command", strings.NewReader(body))
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("run %q: %v", command, err)
	}
	defer resp.Body.Close()
	var out []string
	exit := ""
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			return strings.Join(out, "\n"), exit
		}
		if err != nil {
			t.Fatalf("run %q: %v", command, err)
		}
		switch ev.Type {
		case api.EventStdout:
			out = append(out, ev.Text)
		case api.EventComplete:
			exit = "0"
		case api.EventError:
			exit = ev.Error.EValue
		}
	}
}

func mustRun(t *testing.T, rt *Runtime, id sandbox.ID, command string) string {
	t.Helper()
	out, exit := run(t, rt, id, command)
	if exit != "0" {
		t.Fatalf("%q exited %s: %s", command, exit, out)
	}
	return out
}

// TestRestartRecovers: a new runtime on the same data directory finds
// every sandbox in the state it was in, reachable with its token, with
// its renewed expiry; finishes a delete and a create that a restart
// interrupted; and forgets nothing else.
func TestRestartRecovers(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	mod := func(c *Config) { c.DataDir, c.LabelScope = dir, scope }
	ctx := context.Background()
	rt1 := newTestRuntimeNoCleanup(t, mod)
	defer func() {
		rt, err := New(Config{DataDir: t.TempDir(), ExecdPath: testExecd, LabelScope: scope}, nil)
		if err == nil {
			rt.RemoveScope(ctx)
			rt.Close()
		}
	}()

	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	running := start(t, rt1, sandbox.Spec{ExpiresAt: &exp})
	renewed := exp.Add(30 * time.Minute)
	rt1.SetExpiry(ctx, running, &renewed)
	mustRun(t, rt1, running, "echo state > /tmp/kept")
	paused := start(t, rt1, sandbox.Spec{})
	if err := rt1.Pause(ctx, paused); err != nil {
		t.Fatal(err)
	}
	failed := sandbox.NewID()
	rt1.Create(ctx, failed, sandbox.Spec{Image: "127.0.0.1:1/missing:latest", Entrypoint: []string{"x"}})
	waitState(t, rt1, failed, sandbox.StateFailed)
	halfDeleted := start(t, rt1, sandbox.Spec{})
	rt1.st.updateRecord(halfDeleted, func(r *record) { r.Deleting = true })
	// A create the restart caught before its container existed.
	interrupted := sandbox.NewID()
	rt1.st.putRecord(&record{ID: interrupted, Image: testImage, Entrypoint: []string{"sleep", "1000"}, CreatedAt: time.Now().UTC(),
		Token: newToken(), Spec: &sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"}}})
	rt1.Close()

	rt2, err := New(Config{DataDir: dir, ExecdPath: testExecd, LabelScope: scope}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	sb, err := rt2.Get(ctx, running)
	if err != nil || sb.Status.State != sandbox.StateRunning || sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(renewed) {
		t.Fatalf("running sandbox after restart: %+v, %v", sb, err)
	}
	if got := mustRun(t, rt2, running, "cat /tmp/kept"); got != "state" {
		t.Fatalf("file written before the restart: %q", got)
	}
	if sb, _ := rt2.Get(ctx, paused); sb == nil || sb.Status.State != sandbox.StatePaused {
		t.Fatalf("paused sandbox after restart: %+v", sb)
	}
	if sb, _ := rt2.Get(ctx, failed); sb == nil || sb.Status.State != sandbox.StateFailed || sb.Status.Reason != "IMAGE_PULL_FAILED" {
		t.Fatalf("failed sandbox after restart: %+v", sb)
	}
	if _, err := rt2.Get(ctx, halfDeleted); err == nil {
		t.Fatal("a half-deleted sandbox came back")
	}
	if _, err := rt2.eng.inspect(ctx, containerName(halfDeleted)); err == nil {
		t.Fatal("the half-deleted sandbox's container was left behind")
	}
	waitState(t, rt2, interrupted, sandbox.StateRunning)
	if err := rt2.Resume(ctx, paused); err != nil {
		t.Fatal(err)
	}
	mustRun(t, rt2, paused, "true")
}

func newTestRuntimeNoCleanup(t *testing.T, mod func(*Config)) *Runtime {
	t.Helper()
	cfg := Config{ExecdPath: testExecd}
	mod(&cfg)
	rt, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// TestAdoptsContainersTheStoreLost: with its state database gone, the
// runtime rebuilds its sandboxes from their containers' labels.
func TestAdoptsContainersTheStoreLost(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	rt1 := newTestRuntimeNoCleanup(t, func(c *Config) { c.DataDir, c.LabelScope = dir, scope })
	id := start(t, rt1, sandbox.Spec{Metadata: map[string]string{"k": "v"}})
	rt1.Close()
	os.Remove(filepath.Join(dir, "state.db"))
	rt2 := newTestRuntime(t, func(c *Config) { c.DataDir, c.LabelScope = dir, scope })
	sb, err := rt2.Get(context.Background(), id)
	if err != nil || sb.Status.State != sandbox.StateRunning || sb.Metadata["k"] != "v" || sb.Image != testImage {
		t.Fatalf("adopted sandbox %+v, %v", sb, err)
	}
	mustRun(t, rt2, id, "true")
}

// TestEngineEventsUpdateState: what happens to a container behind the
// server's back shows in the sandbox's state.
func TestEngineEventsUpdateState(t *testing.T) {
	rt := newTestRuntime(t, nil)
	id := start(t, rt, sandbox.Spec{})
	exec.Command("docker", "pause", containerName(id)).Run()
	waitState(t, rt, id, sandbox.StatePaused)
	exec.Command("docker", "unpause", containerName(id)).Run()
	waitState(t, rt, id, sandbox.StateRunning)
	exec.Command("docker", "kill", containerName(id)).Run()
	waitState(t, rt, id, sandbox.StateFailed)
	evs, _ := rt.Events(context.Background(), id)
	var types []string
	for _, e := range evs {
		types = append(types, e.Source+":"+e.Type)
	}
	if s := strings.Join(types, " "); !strings.Contains(s, "runtime:pause") || !strings.Contains(s, "runtime:die") || !strings.Contains(s, "lifecycle:CONTAINER_RUNNING") {
		t.Fatalf("events %s", s)
	}
}

// waitFor waits until cond holds, for as long as one sandbox start may
// take on this machine (see testwait).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Wait{What: what, Every: 20 * time.Millisecond}.Until(t, cond)
}

// waitState waits until a sandbox is in state, for as long as one start
// may take on this machine; a sandbox that fails instead fails the test
// at once. Either way the failure says what the sandbox was doing.
func waitState(t *testing.T, rt *Runtime, id sandbox.ID, want sandbox.State) *sandbox.Sandbox {
	t.Helper()
	var sb *sandbox.Sandbox
	testwait.Wait{What: fmt.Sprintf("sandbox %s to be %s", id, want), Every: 20 * time.Millisecond,
		Describe: func() string { return describe(rt, id) }}.Until(t, func() bool {
		var err error
		if sb, err = rt.Get(context.Background(), id); err != nil {
			t.Fatalf("Get(%s) while waiting for %s: %v\n%s", id, want, err, describe(rt, id))
		}
		if sb.Status.State == sandbox.StateFailed && want != sandbox.StateFailed {
			t.Fatalf("sandbox %s failed while waiting for %s: %s: %s\n%s", id, want, sb.Status.Reason, sb.Status.Message, describe(rt, id))
		}
		return sb.Status.State == want
	})
	return sb
}

// describe says what a sandbox is doing: its status, events and log as
// the runtime has them, and its container as the engine has it.
func describe(rt *Runtime, id sandbox.ID) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	if sb, err := rt.Get(ctx, id); err != nil {
		fmt.Fprintf(&b, "sandbox %s: %v\n", id, err)
	} else {
		fmt.Fprintf(&b, "sandbox %s: %s (%s) since %v: %s\n", id, sb.Status.State, sb.Status.Reason, sb.Status.Since, sb.Status.Message)
	}
	evs, err := rt.Events(ctx, id)
	fmt.Fprintf(&b, "events (%v):\n", err)
	for _, e := range evs {
		fmt.Fprintf(&b, "    %s %s:%s %s\n", e.Time.Format(time.StampMilli), e.Source, e.Type, e.Message)
	}
	logs, err := rt.Logs(ctx, id, 30, time.Time{})
	fmt.Fprintf(&b, "log (%v):\n%s\n", err, logs)
	b.WriteString(testwait.Containers("label=" + labelID + "=" + string(id)))
	return b.String()
}

// TestPauseKeepsProcesses: a paused sandbox's processes are frozen, not
// restarted: after resume a counter carries on from where it stopped.
func TestPauseKeepsProcesses(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	id := start(t, rt, sandbox.Spec{})
	mustRun(t, rt, id, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done) >/dev/null 2>&1 &
echo $! > /tmp/pid`)
	time.Sleep(300 * time.Millisecond)
	pid := mustRun(t, rt, id, "cat /tmp/pid")
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(mustRun(t, rt, id, "cat /tmp/n"))
	if got := mustRun(t, rt, id, "cat /tmp/pid; kill -0 $(cat /tmp/pid) && echo alive"); got != pid+"\nalive" {
		t.Fatalf("counter process after resume: %q, want %s alive", got, pid)
	}
	// Running 1.3 s at 20 per second would pass 26; frozen for 1 s, it
	// cannot have gone much past 6 plus the time before and after.
	if n < 3 || n > 20 {
		t.Fatalf("counter at %d after 0.3 s running and 1 s paused", n)
	}
}

// TestHardening: the container runs with the reduced capability set,
// no-new-privileges, a pids limit, no engine socket, and still lets root
// install a package.
func TestHardening(t *testing.T) {
	testenv.MustHaveImage(t, "opensandbox/python:3.11")
	testenv.MustHaveCommand(t, "dpkg-deb")
	rt := newTestRuntime(t, nil)
	id := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"sleep", "infinity"},
		Resources: sandbox.Resources{MemoryBytes: 256 << 20, CPUMillis: 500}})
	status := mustRun(t, rt, id, "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
	capEff, _ := strconv.ParseUint(strings.Fields(strings.Split(status, "\n")[0])[1], 16, 64)
	const netRaw, mknod, sysAdmin, netAdmin = 13, 27, 21, 12
	for _, c := range []uint{netRaw, mknod, sysAdmin, netAdmin} {
		if capEff&(1<<c) != 0 {
			t.Errorf("capability %d is effective: %s", c, status)
		}
	}
	if !strings.Contains(status, "NoNewPrivs:\t1") {
		t.Errorf("no-new-privileges is off: %s", status)
	}
	if got := mustRun(t, rt, id, "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"); got != "4096" {
		t.Errorf("pids.max = %q", got)
	}
	if got := mustRun(t, rt, id, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"); got != strconv.Itoa(256<<20) {
		t.Errorf("memory limit = %q", got)
	}
	if out, _ := run(t, rt, id, "ls /var/run/docker.sock /run/docker.sock"); out != "" {
		t.Errorf("engine socket inside: %q", out)
	}

	// A package whose installation needs chown and a maintainer script.
	pkg := t.TempDir()
	os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755)
	os.MkdirAll(filepath.Join(pkg, "usr/share/osb-test"), 0o755)
	os.WriteFile(filepath.Join(pkg, "usr/share/osb-test/file"), []byte("installed\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: osb-test\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "DEBIAN/postinst"), []byte("#!/bin/sh\nchown nobody:nogroup /usr/share/osb-test/file\n"), 0o755)
	deb := filepath.Join(t.TempDir(), "osb-test.deb")
	if out, err := exec.Command("dpkg-deb", "--build", "--root-owner-group", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, out)
	}
	if out, err := exec.Command("docker", "cp", deb, containerName(id)+":/tmp/osb-test.deb").CombinedOutput(); err != nil {
		t.Fatalf("docker cp: %v: %s", err, out)
	}
	mustRun(t, rt, id, "dpkg -i /tmp/osb-test.deb >/dev/null")
	if got := mustRun(t, rt, id, "stat -c '%U %s' /usr/share/osb-test/file"); got != "nobody 10" {
		t.Fatalf("installed file: %q", got)
	}
}

// TestGVisor runs a sandbox under gVisor, asked for per sandbox.
func TestGVisor(t *testing.T) {
	testenv.MustHaveDocker(t)
	rt := newTestRuntime(t, nil)
	info, err := rt.eng.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !info.runtimes["runsc"] {
		testenv.Missing(t, "runsc is not a runtime of the engine (run make docker)")
	}
	id := start(t, rt, sandbox.Spec{Extensions: map[string]string{extRuntime: "runsc"}})
	if got := mustRun(t, rt, id, "dmesg | head -n 1"); !strings.Contains(got, "gVisor") {
		t.Fatalf("dmesg in a runsc sandbox: %q", got)
	}
	if _, err := rt.Create(context.Background(), sandbox.NewID(), sandbox.Spec{Image: testImage, Entrypoint: []string{"x"},
		Extensions: map[string]string{extRuntime: "kata"}}); err == nil {
		t.Fatal("a runtime outside allowed_runtimes was accepted")
	}
}

// TestVolumes: a host directory and a named volume, the latter removed
// with its sandbox when asked.
func TestVolumes(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "in"), []byte("from host\n"), 0o644)
	volName := "osb-test-" + testScope()
	id := start(t, rt, sandbox.Spec{Volumes: []sandbox.Volume{
		{Name: "h", MountPath: "/data", HostPath: host},
		{Name: "n", MountPath: "/named", Claim: &sandbox.Claim{Name: volName, CreateIfNotExists: true, DeleteOnTermination: true}},
	}})
	if got := mustRun(t, rt, id, "cat /data/in; echo out > /data/out; echo v > /named/f; cat /named/f"); got != "from host\nv" {
		t.Fatalf("volumes: %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(host, "out")); string(b) != "out\n" {
		t.Fatalf("written to the host volume: %q", b)
	}
	if _, ok, _ := rt.eng.volumeExists(ctx, volName); !ok {
		t.Fatal("named volume not created")
	}
	rt.Delete(ctx, id)
	if _, ok, _ := rt.eng.volumeExists(ctx, volName); ok {
		t.Fatal("named volume marked deleteOnSandboxTermination survived its sandbox")
	}
	_, err := rt.Create(ctx, sandbox.NewID(), sandbox.Spec{Image: testImage, Entrypoint: []string{"x"}, Volumes: []sandbox.Volume{
		{Name: "n", MountPath: "/x", Claim: &sandbox.Claim{Name: "osb-no-such-volume"}}}})
	if err == nil {
		t.Fatal("a missing volume without createIfNotExists was accepted")
	}
}

// TestImageRemovedAfterUse: an image the runtime saw a moment ago and
// that was removed since is looked at again, not taken to be there.
func TestImageRemovedAfterUse(t *testing.T) {
	rt := newTestRuntime(t, func(c *Config) { c.PullPolicy = "never" })
	tag := "opensandbox/test-vanishing:" + testScope()
	if out, err := exec.Command("docker", "tag", testImage, tag).CombinedOutput(); err != nil {
		t.Fatalf("docker tag: %v: %s", err, out)
	}
	defer exec.Command("docker", "rmi", tag).Run()
	start(t, rt, sandbox.Spec{Image: tag})
	if out, err := exec.Command("docker", "rmi", tag).CombinedOutput(); err != nil {
		t.Fatalf("docker rmi: %v: %s", err, out)
	}
	id := sandbox.NewID()
	if _, err := rt.Create(context.Background(), id, sandbox.Spec{Image: tag, Entrypoint: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	sb := waitState(t, rt, id, sandbox.StateFailed)
	if sb.Status.Reason != "IMAGE_NOT_FOUND" {
		t.Fatalf("status %+v", sb.Status)
	}
}
