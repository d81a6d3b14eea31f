package docker

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestDeleteDuringCreateLeavesNothing: deletes racing creates, at every
// step of provisioning, leave no container and no sandbox behind, even
// after a reconcile.
func TestDeleteDuringCreateLeavesNothing(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	for i := range 15 {
		id := sandbox.NewID()
		if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%10) * 4 * time.Millisecond)
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	if err := rt.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // engine events of the last removals
	if err := rt.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if all, _ := rt.List(ctx); len(all) != 0 {
		t.Fatalf("%d sandboxes came back after their delete", len(all))
	}
	if cs, _ := rt.eng.list(ctx, rt.scopeLabel()); len(cs) != 0 {
		t.Fatalf("%d containers left behind", len(cs))
	}
}

// TestImageWithNonRootUser: an image whose USER is not root starts, and
// its commands run as that user, as with the reference daemon.
func TestImageWithNonRootUser(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+testImage+"\nUSER 65534:65534\n"), 0o644)
	tag := "opensandbox/test-nonroot:" + testScope()
	if out, err := exec.Command("docker", "build", "-q", "-t", tag, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })
	rt := newTestRuntime(t, nil)
	id := start(t, rt, sandbox.Spec{Image: tag})
	if got := mustRun(t, rt, id, "id -u; cat /proc/1/status | grep '^Uid' | cut -f2"); got != "65534\n65534" {
		t.Fatalf("as the image's user: %q", got)
	}
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
	evs, _ := rt.Events(ctx, id)
	found := false
	for _, e := range evs {
		found = found || e.Type == "oom"
	}
	if !found {
		t.Fatalf("no oom event: %+v", evs)
	}
}

// TestSnapshotInterruptedByRestart: a snapshot caught Creating by a
// restart ends Ready or Failed, never Creating for ever.
func TestSnapshotInterruptedByRestart(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	rt1 := newTestRuntimeNoCleanup(t, func(c *Config) { c.DataDir, c.LabelScope = dir, scope })
	done := sandbox.NewSnapshotID()
	lost := sandbox.NewSnapshotID()
	now := time.Now().UTC()
	for _, id := range []sandbox.SnapshotID{done, lost} {
		rt1.st.putSnapshot(&snapshotRecord{Snapshot: sandbox.Snapshot{ID: id, State: sandbox.SnapshotCreating, Since: now, CreatedAt: now}})
	}
	exec.Command("docker", "tag", testImage, snapshotRef(done)).Run()
	t.Cleanup(func() { exec.Command("docker", "rmi", snapshotRef(done)).Run() })
	rt1.Close()
	rt2 := newTestRuntime(t, func(c *Config) { c.DataDir, c.LabelScope = dir, scope })
	ctx := context.Background()
	if s, _ := rt2.GetSnapshot(ctx, done); s == nil || s.State != sandbox.SnapshotReady {
		t.Fatalf("finished commit: %+v", s)
	}
	if s, _ := rt2.GetSnapshot(ctx, lost); s == nil || s.State != sandbox.SnapshotFailed {
		t.Fatalf("unfinished commit: %+v", s)
	}
}

// stalledRegistry accepts connections and never answers.
func stalledRegistry(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
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
	return ln.Addr().String()
}

// TestDeleteAbandonsStalledPull: deleting the only sandbox waiting for a
// pull cancels the pull, and an endpoint request waiting for its ports
// returns.
func TestDeleteAbandonsStalledPull(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: stalledRegistry(t) + "/x/y:z", Entrypoint: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pull", func() bool { sb, _ := rt.Get(ctx, id); return sb.Status.Reason == "PULLING_IMAGE" })
	endpointErr := make(chan error, 1)
	go func() {
		_, err := rt.Endpoint(ctx, id, api.ExecdPort)
		endpointErr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-endpointErr:
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("endpoint of a deleted sandbox: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an endpoint request still waits for a deleted sandbox")
	}
	waitFor(t, "the pull to be abandoned", func() bool {
		rt.pulls.mu.Lock()
		defer rt.pulls.mu.Unlock()
		return len(rt.pulls.inflight) == 0
	})
}

// TestRestoredSandboxDoesNotInheritLabels: a sandbox made from a
// snapshot has its own labels, not the source's (expiry included).
func TestRestoredSandboxDoesNotInheritLabels(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	exp := time.Now().Add(time.Hour).UTC()
	src := start(t, rt, sandbox.Spec{ExpiresAt: &exp, SecureAccess: true})
	snap := sandbox.NewSnapshotID()
	rt.CreateSnapshot(ctx, src, snap, "")
	waitFor(t, "the snapshot", func() bool { s, _ := rt.GetSnapshot(ctx, snap); return s.State == sandbox.SnapshotReady })
	image, _ := rt.SnapshotImage(ctx, snap)
	restored := start(t, rt, sandbox.Spec{Image: image, SnapshotID: string(snap)})
	info, err := rt.eng.inspect(ctx, containerName(restored))
	if err != nil {
		t.Fatal(err)
	}
	if info.Labels[labelExpires] != "" || info.Labels[labelSecure] != "false" || info.Labels[labelID] != string(restored) {
		t.Fatalf("restored container labels: %v", info.Labels)
	}
}

// TestSandboxesCannotReachEachOther: on the runtime's network, one
// sandbox cannot open a connection to another's address.
func TestSandboxesCannotReachEachOther(t *testing.T) {
	testenv.MustHaveImage(t, "opensandbox/python:3.11")
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	a := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"python3", "-m", "http.server", "8080"}})
	b := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"sleep", "infinity"}})
	ipA := mustRun(t, rt, a, "hostname -i")
	// A reaches itself: the server is up.
	fetch := `python3 -c "import urllib.request; print(urllib.request.urlopen('http://%s:8080/', timeout=3).status)"`
	if got := mustRun(t, rt, a, strings.Replace(fetch, "%s", ipA, 1)); got != "200" {
		t.Fatalf("a to itself: %q", got)
	}
	if out, exit := run(t, rt, b, strings.Replace(fetch, "%s", ipA, 1)+" 2>&1"); exit == "0" {
		t.Fatalf("sandbox b reached sandbox a at %s: %q", ipA, out)
	}
	_ = ctx
}

// TestForeignNamedVolumesRefused: a named volume this server did not
// make is refused unless allowlisted.
func TestForeignNamedVolumesRefused(t *testing.T) {
	name := "osb-foreign-" + testScope()
	if out, err := exec.Command("docker", "volume", "create", name).CombinedOutput(); err != nil {
		t.Fatalf("docker volume create: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "volume", "rm", "-f", name).Run() })
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	spec := sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"},
		Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v", Claim: &sandbox.Claim{Name: name, CreateIfNotExists: true}}}}
	if _, err := rt.Create(ctx, sandbox.NewID(), spec); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("foreign volume: %v, want ErrInvalid", err)
	}
	allowed := newTestRuntime(t, func(c *Config) { c.NamedVolumeAllowlist = []string{"osb-foreign-"} })
	id := sandbox.NewID()
	if _, err := allowed.Create(ctx, id, spec); err != nil {
		t.Fatalf("allowlisted volume: %v", err)
	}
	waitState(t, allowed, id, sandbox.StateRunning)
}
