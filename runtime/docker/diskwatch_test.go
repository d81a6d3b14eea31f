package docker

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sandbox"
)

// storageMode skips a test of measured limits where the engine bounds
// layers itself, or where limits cannot be enforced at all.
func needWatchMode(t *testing.T, rt *Runtime) {
	t.Helper()
	if m := rt.cfg.storage.mode(); m != storageWatch {
		testenv.Missing(t, "storage limits are not measured by the server on this engine (%s: %s)", m, rt.cfg.storage.why)
	}
}

// createLimited creates a sandbox limited to limit bytes of disk, running
// sh -c script, without waiting for it.
func createLimited(t *testing.T, rt *Runtime, limit int64, script string, vols ...sandbox.Volume) sandbox.ID {
	t.Helper()
	id := sandbox.NewID()
	_, err := rt.Create(context.Background(), id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sh", "-c", script},
		Resources: sandbox.Resources{StorageBytes: limit, MemoryBytes: 256 << 20}, Volumes: vols})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// diskOf measures a sandbox's files as the watcher does, from its
// container.
func diskOf(t *testing.T, rt *Runtime, id sandbox.ID) diskUsage {
	t.Helper()
	info, err := rt.eng.inspect(context.Background(), containerName(id))
	if err != nil {
		t.Fatal(err)
	}
	f := info.Files
	var c usageCounter
	if err := c.addTree(f.UpperDir); err != nil {
		t.Fatal(err)
	}
	for _, v := range f.Volumes {
		c.addTree(v.Source)
	}
	for _, p := range f.EtcFiles {
		c.addFile(p)
	}
	return c.total
}

// wantStopped waits for a sandbox to fail for its disk, and checks that
// its container was stopped but kept, and how much it holds.
func wantStopped(t *testing.T, rt *Runtime, id sandbox.ID, limit int64, maxOver int64) diskUsage {
	t.Helper()
	ctx := context.Background()
	// Filling the disk and measuring it take about as long as a start.
	var sb *sandbox.Sandbox
	testwait.Wait{What: "the sandbox over its limit to fail", Starts: 2, Every: 20 * time.Millisecond,
		Describe: func() string { return describe(rt, id) }}.Until(t, func() bool {
		var err error
		if sb, err = rt.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		return sb.Status.State == sandbox.StateFailed
	})
	if sb.Status.Reason != "DISK_LIMIT_EXCEEDED" || !strings.Contains(sb.Status.Message, formatBytes(limit)) {
		t.Fatalf("status %+v, want DISK_LIMIT_EXCEEDED naming the limit %s", sb.Status, formatBytes(limit))
	}
	testwait.Wait{What: "the container of a sandbox over its limit to stop", Every: 20 * time.Millisecond,
		Describe: func() string { return describe(rt, id) }}.Until(t, func() bool {
		info, err := rt.eng.inspect(ctx, containerName(id))
		if err != nil {
			t.Fatalf("the container of a sandbox stopped for its disk: %v (it should be kept)", err)
		}
		return info.State != "running"
	})
	u := diskOf(t, rt, id)
	t.Logf("stopped: %s; it holds %s now", sb.Status.Message, formatBytes(u.Bytes))
	if u.Bytes-limit > maxOver {
		t.Errorf("it holds %s, more than %s over its limit %s", formatBytes(u.Bytes), formatBytes(maxOver), formatBytes(limit))
	}
	// The state survives a look at the engine: the engine's "die" event
	// and a reconcile leave the reason alone.
	if err := rt.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if sb, _ := rt.Get(ctx, id); sb.Status.Reason != "DISK_LIMIT_EXCEEDED" {
		t.Fatalf("after the container stopped and a reconcile: %+v", sb.Status)
	}
	return u
}

// maxOvershoot bounds how far past its limit a sandbox writing as fast
// as it can gets on this machine before it is stopped (measured: see
// docs/configuration.md); well past what was seen, far below what an
// unbounded writer reaches (the writers here write gigabytes).
const maxOvershoot = 512 << 20

// TestStorageLimit: a sandbox that fills its disk past its limit, in any
// of the places it can write, is stopped and keeps what it wrote; one
// below its limit keeps running.
func TestStorageLimit(t *testing.T) {
	rt := newTestRuntime(t, nil)
	needWatchMode(t, rt)
	const limit = 64 << 20
	ctx := context.Background()

	t.Run("writable layer", func(t *testing.T) {
		id := createLimited(t, rt, limit, "dd if=/dev/zero of=/tmp/fill bs=1M count=2048; sleep 1000000")
		wantStopped(t, rt, id, limit, maxOvershoot)
	})
	t.Run("under the limit keeps running", func(t *testing.T) {
		id := start(t, rt, sandbox.Spec{Resources: sandbox.Resources{StorageBytes: limit}})
		mustRun(t, rt, id, "dd if=/dev/zero of=/tmp/half bs=1M count=40 && sync")
		time.Sleep(2 * time.Second) // measured several times meanwhile
		if got := mustRun(t, rt, id, "ls -l /tmp/half | wc -l"); got != "1" {
			t.Fatalf("ls: %q", got)
		}
		if sb, _ := rt.Get(ctx, id); sb.Status.State != sandbox.StateRunning {
			t.Fatalf("a sandbox under its limit is %+v", sb.Status)
		}
		// It may delete what it wrote and write again.
		mustRun(t, rt, id, "rm /tmp/half && dd if=/dev/zero of=/tmp/again bs=1M count=40 && sync")
		time.Sleep(time.Second)
		if sb, _ := rt.Get(ctx, id); sb.Status.State != sandbox.StateRunning {
			t.Fatalf("a sandbox that freed and reused its space is %+v", sb.Status)
		}
	})
	t.Run("named volume", func(t *testing.T) {
		vol := sandbox.Volume{Name: "v", MountPath: "/data",
			Claim: &sandbox.Claim{Name: "osb-test-" + testScope(), CreateIfNotExists: true, DeleteOnTermination: true}}
		id := createLimited(t, rt, limit, "dd if=/dev/zero of=/data/fill bs=1M count=2048; sleep 1000000", vol)
		wantStopped(t, rt, id, limit, maxOvershoot)
		info, _ := rt.eng.inspect(ctx, containerName(id))
		var layer usageCounter
		layer.addTree(info.Files.UpperDir)
		if layer.total.Bytes > limit/2 {
			t.Errorf("the writable layer holds %s: the writes did not go to the volume", formatBytes(layer.total.Bytes))
		}
	})
	t.Run("named volume at a sub path", func(t *testing.T) {
		// Reaches the container as a bind of its pin, not as a volume:
		// counted all the same.
		vol := sandbox.Volume{Name: "v", MountPath: "/data", SubPath: "work/a",
			Claim: &sandbox.Claim{Name: "osb-test-sub-" + testScope(), CreateIfNotExists: true, DeleteOnTermination: true}}
		id := createLimited(t, rt, limit, "dd if=/dev/zero of=/data/fill bs=1M count=2048; sleep 1000000", vol)
		wantStopped(t, rt, id, limit, maxOvershoot)
	})
	t.Run("deleted while open", func(t *testing.T) {
		id := createLimited(t, rt, limit, "exec 3>/tmp/hidden; rm /tmp/hidden; dd if=/dev/zero bs=1M count=2048 >&3; sleep 1000000")
		wantStopped(t, rt, id, limit, maxOvershoot)
		sb, _ := rt.Get(ctx, id)
		if !strings.Contains(sb.Status.Message, "deleted but still open") {
			t.Errorf("message %q does not say where the space went", sb.Status.Message)
		}
	})
	t.Run("engine's /etc files", func(t *testing.T) {
		id := createLimited(t, rt, limit, "dd if=/dev/zero of=/etc/hosts bs=1M count=2048; sleep 1000000")
		wantStopped(t, rt, id, limit, maxOvershoot)
	})
	t.Run("fallocate", func(t *testing.T) {
		// fallocate fails with EOPNOTSUPP; the C library then writes
		// the blocks, at the speed of writing, and is stopped. Without
		// that, 4 GiB would be reserved at once.
		id := createLimited(t, rt, limit, "fallocate -l 4G /tmp/reserved; sleep 1000000")
		wantStopped(t, rt, id, limit, maxOvershoot)
	})
	t.Run("gVisor without its seccomp is refused", func(t *testing.T) {
		if !rt.runtimes["runsc"] {
			testenv.Missing(t, "the engine has no runsc")
		}
		_, err := rt.Create(ctx, sandbox.NewID(), sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1"},
			Resources: sandbox.Resources{StorageBytes: limit}, Extensions: map[string]string{extRuntime: "runsc"}})
		switch {
		case rt.cfg.storage.runscSeccomp:
			// runsc applies the profile here: measured like others.
			if err != nil {
				t.Fatalf("create under a runsc with --oci-seccomp: %v", err)
			}
		case !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "ephemeral-storage"):
			t.Fatalf("create: %v, want a refusal naming ephemeral-storage", err)
		}
	})
}

// TestStorageOvershoot measures how far past a 64 MiB limit a sandbox
// writing as fast as it can gets before it is stopped, for several
// writers and memory limits (a sandbox's page cache takes writes at
// memory speed until its memory limit forces writeback), and holds each
// to maxOvershoot. docs/configuration.md quotes its figures.
func TestStorageOvershoot(t *testing.T) {
	rt := newTestRuntime(t, nil)
	needWatchMode(t, rt)
	const limit = 64 << 20
	ctx := context.Background()
	var worst int64
	for _, w := range []struct{ name, script string }{
		{"dd 1M", "dd if=/dev/zero of=/tmp/fill bs=1M count=4096"},
		{"4 dd at once", "for i in 1 2 3 4; do dd if=/dev/zero of=/tmp/fill$i bs=1M count=2048 & done; wait"},
		{"dd 16M", "dd if=/dev/zero of=/tmp/fill bs=16M count=256"},
		{"posix_fallocate", "fallocate -l 4G /tmp/reserved"},
	} {
		for _, mem := range []int64{256 << 20, 2 << 30} {
			id := sandbox.NewID()
			// The entrypoint writes from its first instant: it is held
			// until the first measurement (held.go), so it is bounded as
			// a sandbox that starts writing later is.
			if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sh", "-c", w.script + "; sleep 1000000"},
				Resources: sandbox.Resources{StorageBytes: limit, MemoryBytes: mem}}); err != nil {
				t.Fatal(err)
			}
			u := wantStopped(t, rt, id, limit, maxOvershoot)
			over := u.Bytes - limit
			worst = max(worst, over)
			t.Logf("%s, %s of memory: stopped holding %s, %s past its limit", w.name, formatBytes(mem), formatBytes(u.Bytes), formatBytes(max(over, 0)))
			rt.Delete(ctx, id)
		}
	}
	t.Logf("worst: %s past the limit", formatBytes(worst))
}

// TestStorageLimitDefault: the configured default applies to a sandbox
// that asks for none, and holds across a restart of the server.
func TestStorageLimitDefault(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	mod := func(c *Config) {
		c.DataDir, c.LabelScope, c.DefaultStorage, c.StartTimeout = dir, scope, "32Mi", startTimeout()
	}
	rt1 := newTestRuntimeNoCleanup(t, mod)
	needWatchMode(t, rt1)
	id := start(t, rt1, sandbox.Spec{})
	rt1.Close()

	rt := newTestRuntime(t, mod)
	waitState(t, rt, id, sandbox.StateRunning)
	// Started by the engine, detached: the sandbox is stopped within
	// milliseconds of passing its limit, which would cut a request to
	// execd still answering.
	if out, err := exec.Command("docker", "exec", "-d", containerName(id), "dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=1024").CombinedOutput(); err != nil {
		t.Fatalf("docker exec: %v: %s", err, out)
	}
	wantStopped(t, rt, id, 32<<20, maxOvershoot)
}

// BenchmarkDiskWatch measures what watching costs: n idle sandboxes with
// a limit, watched for the benchmark's seconds. It reports measurements
// per second and the share of one CPU the watcher spent measuring.
// Run it with -benchtime=5x (each iteration is one second).
func BenchmarkDiskWatch(b *testing.B) {
	for _, n := range []int{10, 100} {
		for _, limit := range []int64{64 << 20, 10 << 30} {
			b.Run(fmt.Sprintf("sandboxes=%d/limit=%s", n, strings.ReplaceAll(formatBytes(limit), " ", "")), func(b *testing.B) {
				rt := newTestRuntime(b, nil)
				if rt.disk == nil || rt.cfg.storage.mode() != storageWatch {
					testenv.Missing(b, "storage limits are not measured by the server on this engine")
				}
				ids := make([]sandbox.ID, n)
				for i := range ids {
					ids[i] = sandbox.NewID()
					if _, err := rt.Create(context.Background(), ids[i], sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000000"},
						Resources: sandbox.Resources{StorageBytes: limit}}); err != nil {
						b.Fatal(err)
					}
				}
				for _, id := range ids {
					for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
						sb, err := rt.Get(context.Background(), id)
						if err == nil && sb.Status.State == sandbox.StateRunning {
							break
						}
						if err != nil || sb.Status.State == sandbox.StateFailed || time.Now().After(deadline) {
							b.Fatalf("sandbox %s: %+v, %v", id, sb, err)
						}
					}
				}
				time.Sleep(2 * time.Second) // every sandbox measured once, costs known
				m0, busy0, t0 := rt.disk.measurements.Load(), rt.disk.busy.Load(), time.Now()
				for b.Loop() {
					time.Sleep(time.Second)
				}
				secs := time.Since(t0).Seconds()
				m, busy := rt.disk.measurements.Load()-m0, time.Duration(rt.disk.busy.Load()-busy0)
				b.ReportMetric(float64(m)/secs, "measurements/s")
				b.ReportMetric(100*busy.Seconds()/secs, "cpu-%")
				if m > 0 {
					b.ReportMetric(float64(busy.Microseconds())/float64(m), "µs/measurement")
				}
			})
		}
	}
}
