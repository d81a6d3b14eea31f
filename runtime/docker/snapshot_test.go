package docker

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

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
