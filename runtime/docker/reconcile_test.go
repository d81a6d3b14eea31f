package docker

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sandbox"
)

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

// TestOOMKill: a sandbox whose container is killed for memory says so.
func TestOOMKill(t *testing.T) {
	testenv.MustHaveImage(t, "opensandbox/python:3.11")
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	id := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"sleep", "infinity"},
		Resources: sandbox.Resources{MemoryBytes: 64 << 20}})
	// Everything in the container competes for the 64 MiB; the kernel
	// may pick execd itself, which ends the container.
	run(t, rt, id, `python3 -c "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"`)
	sb, _ := rt.Get(ctx, id)
	if sb.Status.State == sandbox.StateFailed && sb.Status.Reason != "OOM_KILLED" {
		t.Fatalf("failed for memory, but reported %+v", sb.Status)
	}
	// The engine reports the kill by an event, which reaches the
	// sandbox's events some time after the command has returned.
	testwait.Wait{What: "the engine's oom event", Every: 50 * time.Millisecond, Describe: func() string { return describe(rt, id) }}.Until(t, func() bool {
		evs, _ := rt.Events(ctx, id)
		return slices.ContainsFunc(evs, func(e sandbox.Event) bool { return e.Type == "oom" })
	})
}

// TestFailedSandboxKeepsItsLog: a sandbox whose container stopped is
// Failed with the reason, and its log stays readable until it is deleted.
func TestFailedSandboxKeepsItsLog(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	id := start(t, rt, sandbox.Spec{Entrypoint: []string{"sh", "-c", "echo the-entrypoint-spoke; sleep 1000"}})
	exec.Command("docker", "kill", containerName(id)).Run()
	waitState(t, rt, id, sandbox.StateFailed)
	rt.Reconcile(ctx)
	logs, err := rt.Logs(ctx, id, 0, time.Time{})
	if err != nil || !strings.Contains(logs, "the-entrypoint-spoke") || !strings.Contains(logs, "execd listening") {
		t.Fatalf("log of the failed sandbox: %q, %v", logs, err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.eng.inspect(ctx, containerName(id)); !errors.Is(err, errNoSuchObject) {
		t.Fatalf("container after delete: %v", err)
	}
}
