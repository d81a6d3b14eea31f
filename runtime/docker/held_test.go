package docker

import (
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/sandbox"
)

// heldScript is the entrypoint of TestHeldEntrypoint's sandboxes: it
// counts its starts in its writable layer, which a restart keeps, and
// exits 0 on SIGTERM, so that a docker restart leaves it Terminated, not
// Failed, while the server looks on.
const heldScript = `trap "exit 0" TERM; echo started >> /tmp/starts; sleep 1000000 & wait`

// dockerExec runs sh -c script in a sandbox's container through the
// engine, not through execd, and returns its output.
func dockerExec(t *testing.T, id sandbox.ID, script string) string {
	t.Helper()
	out, err := exec.Command("docker", "exec", containerName(id), "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("docker exec %s %q: %v: %s", containerName(id), script, err, out)
	}
	return strings.TrimSpace(string(out))
}

// starts is how many times the held entrypoint of id started in its
// container's life.
func starts(t *testing.T, id sandbox.ID) string {
	t.Helper()
	return dockerExec(t, id, "cat /tmp/starts 2>/dev/null | wc -l")
}

// waitStarts waits until the entrypoint of id started want times, and
// for the sandbox to be Running.
func waitStarts(t *testing.T, rt *Runtime, id sandbox.ID, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := starts(t, id)
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			sb, _ := rt.Get(context.Background(), id)
			t.Fatalf("the entrypoint started %s times, want %s; the sandbox is %+v", got, want, sb)
		}
		time.Sleep(50 * time.Millisecond)
	}
	runtimetest.WaitState(t, rt, id, sandbox.StateRunning, 60*time.Second)
}

// restartContainer restarts a sandbox's container through the engine
// and waits until it runs again.
func restartContainer(t *testing.T, id sandbox.ID) {
	t.Helper()
	if out, err := exec.Command("docker", "restart", "-t", "20", containerName(id)).CombinedOutput(); err != nil {
		t.Fatalf("docker restart: %v: %s", err, out)
	}
}

// heldRestarts counts the times a sandbox waited for its entrypoint
// after its container started again.
func heldRestarts(t *testing.T, rt *Runtime, id sandbox.ID) int {
	t.Helper()
	evs, err := rt.Events(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if strings.Contains(e.Message, heldRestartMessage) {
			n++
		}
	}
	return n
}

// TestHeldEntrypoint: a measured sandbox starts with execd alone, and the
// server hands its entrypoint over once the disk watcher has measured it,
// once per start of its container: at create; after a restart of the
// container while the server runs; after one while no server ran, by the
// next server; and after a server stopped between the container's start
// and the hand-over. A server that finds the hand-over done does not do
// it again, and execd refuses a second one.
func TestHeldEntrypoint(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	mod := func(c *Config) { c.DataDir, c.LabelScope, c.StartTimeout = dir, scope, 60*time.Second }
	ctx := context.Background()
	t.Cleanup(func() {
		rt, err := New(Config{DataDir: t.TempDir(), ExecdPath: testExecd, LabelScope: scope}, nil)
		if err == nil {
			rt.RemoveScope(ctx)
			rt.Close()
		}
	})
	rt1 := newTestRuntimeNoCleanup(t, mod)
	needWatchMode(t, rt1)
	spec := sandbox.Spec{Image: testImage, Entrypoint: []string{"sh", "-c", heldScript}, Resources: sandbox.Resources{StorageBytes: 64 << 20}}

	id := start(t, rt1, spec)
	info, err := rt1.eng.inspect(ctx, containerName(id))
	if err != nil {
		t.Fatal(err)
	}
	cmd := dockerExec(t, id, "tr '\\0' ' ' < /proc/1/cmdline")
	if !isHeld(info.Labels) || !strings.Contains(cmd, "--claimable --") || strings.Contains(cmd, "trap") {
		t.Fatalf("a measured sandbox's container: label %s=%q, init %q; want its entrypoint held", labelHeld, info.Labels[labelHeld], cmd)
	}
	if got := starts(t, id); got != "1" {
		t.Fatalf("after the create the entrypoint started %s times, want 1", got)
	}
	rt1.disk.mu.Lock()
	measuredPid := rt1.disk.measured[id]
	rt1.disk.mu.Unlock()
	if measuredPid != info.Files.Pid {
		t.Fatalf("the watcher measured init %d, the container's is %d", measuredPid, info.Files.Pid)
	}
	// A hand-over made again (as by a server that stopped before it
	// recorded its own) is taken as done, and starts nothing.
	if err := rt1.handOverEntrypoint(ctx, id, info, info.Ports[api.ExecdPort], rt1.byID[id].token); err != nil {
		t.Fatalf("a second hand-over: %v", err)
	}
	if got := starts(t, id); got != "1" {
		t.Fatalf("after a second hand-over the entrypoint started %s times, want 1", got)
	}

	// The container restarts while the server runs: the engine's events
	// bring the hand-over.
	restartContainer(t, id)
	waitStarts(t, rt1, id, "2")
	if n := heldRestarts(t, rt1, id); n != 1 {
		t.Errorf("after a restart seen by the server: %d held restarts, want 1", n)
	}

	// The container restarts while no server runs: it waits, with execd
	// alone, for the next server.
	rt1.Close()
	restartContainer(t, id)
	time.Sleep(time.Second) // the entrypoint would have started by now
	if got := starts(t, id); got != "2" {
		t.Fatalf("with no server running, the restarted container started its entrypoint (%s starts, want 2)", got)
	}
	rt2 := newTestRuntimeNoCleanup(t, mod)
	waitStarts(t, rt2, id, "3")
	if n := heldRestarts(t, rt2, id); n != 2 {
		t.Errorf("after a restart while no server ran: %d held restarts, want 2", n)
	}

	// A server stops between a container's start and the hand-over: as
	// it leaves things, a record with the create's spec and a started
	// container whose entrypoint waits.
	cfg := rt2.cfg
	rt2.Close()
	cut := interruptedHeldCreate(t, &cfg, spec)

	// The next server hands over the interrupted one, and leaves alone the
	// one whose hand-over it finds done.
	rt3 := newTestRuntimeNoCleanup(t, mod)
	defer rt3.Close()
	if sb, err := rt3.Get(ctx, id); err != nil || sb.Status.State != sandbox.StateRunning {
		t.Fatalf("a sandbox whose hand-over was done, after a restart of the server: %+v, %v; want Running at once", sb, err)
	}
	waitStarts(t, rt3, cut, "1")
	if got, n := starts(t, id), heldRestarts(t, rt3, id); got != "3" || n != 2 {
		t.Fatalf("a restart of the server alone: %s starts, %d held restarts; want 3 and 2", got, n)
	}
	rec, err := rt3.st.record(cut)
	if err != nil || rec.Spec != nil || rec.HeldStart == "" {
		t.Fatalf("the interrupted create's record: %+v, %v; want it finished, its hand-over recorded", rec, err)
	}
}

// interruptedHeldCreate leaves what a server that stopped after starting a
// held sandbox's container, before the hand-over, leaves: the record with
// its spec, and the container running execd alone. The engine and the
// store are opened as that server had them.
func interruptedHeldCreate(t *testing.T, cfg *Config, spec sandbox.Spec) sandbox.ID {
	t.Helper()
	ctx := context.Background()
	eng, err := newEngine(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.close()
	st, err := openStore(filepath.Join(cfg.DataDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	id, token, now := sandbox.NewID(), newToken(), time.Now().UTC()
	stored := spec
	if err := st.putRecord(&record{ID: id, Image: spec.Image, Entrypoint: slices.Clone(spec.Entrypoint), CreatedAt: now, Token: token, Spec: &stored}); err != nil {
		t.Fatal(err)
	}
	cc, hc, platform, err := containerConfig(cfg, id, &spec, now, token, "")
	if err != nil {
		t.Fatal(err)
	}
	cid, err := eng.create(ctx, containerName(id), cc, hc, platform)
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.start(ctx, cid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the entrypoint would have started by now
	if got := starts(t, id); got != "0" {
		t.Fatalf("a held container started its entrypoint by itself (%s starts)", got)
	}
	return id
}

// holdTimes is a slog handler that keeps the "held" durations the runtime
// logs as it hands entrypoints over.
type holdTimes struct {
	mu sync.Mutex
	d  []time.Duration
}

func (h *holdTimes) Enabled(context.Context, slog.Level) bool { return true }
func (h *holdTimes) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *holdTimes) WithGroup(string) slog.Handler            { return h }
func (h *holdTimes) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "entrypoint handed over" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "held" {
			h.mu.Lock()
			h.d = append(h.d, a.Value.Duration())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkHeldCreate measures what holding the entrypoint adds to a
// create: the p50 of create → Running for sandboxes with a storage limit
// (held) and without (not held), one at a time, and the p50 of the hold
// itself (waiting for the first measurement, then the /claim). Run it
// with -benchtime=10x.
func BenchmarkHeldCreate(b *testing.B) {
	testenv.MustHaveImage(b, testImage)
	holds := &holdTimes{}
	cfg := Config{DataDir: b.TempDir(), ExecdPath: testExecd, LabelScope: testScope(), StartTimeout: 60 * time.Second}
	rt, err := New(cfg, slog.New(holds))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		rt.RemoveScope(context.Background())
		rt.Close()
	})
	if rt.cfg.storage.mode() != storageWatch {
		testenv.Missing(b, "storage limits are not measured by the server on this engine")
	}
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		limit int64
	}{{"not-held", 0}, {"held", 1 << 30}} {
		b.Run(c.name, func(b *testing.B) {
			var ready []time.Duration
			for b.Loop() {
				id := sandbox.NewID()
				t0 := time.Now()
				if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000000"},
					Resources: sandbox.Resources{StorageBytes: c.limit}}); err != nil {
					b.Fatal(err)
				}
				for {
					sb, err := rt.Get(ctx, id)
					if err != nil || sb.Status.State == sandbox.StateFailed {
						b.Fatalf("sandbox %s: %+v, %v", id, sb, err)
					}
					if sb.Status.State == sandbox.StateRunning {
						break
					}
					time.Sleep(time.Millisecond)
				}
				ready = append(ready, time.Since(t0))
				b.StopTimer()
				rt.Delete(ctx, id)
				b.StartTimer()
			}
			b.ReportMetric(float64(median(ready).Microseconds())/1000, "p50-ready-ms")
			holds.mu.Lock()
			if c.limit > 0 {
				b.ReportMetric(float64(median(holds.d).Microseconds())/1000, "p50-hold-ms")
			}
			holds.d = nil
			holds.mu.Unlock()
		})
	}
}

// TestHeldContainerConfig: only a sandbox whose limit the server measures,
// with an entrypoint, starts with it held; a warm one is claimable as
// before, and the others start their entrypoint as before.
func TestHeldContainerConfig(t *testing.T) {
	watch, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "extfs"}, true)
	quota, _ := storagePolicyFor(engineStorage{Driver: "overlay2", BackingFS: "xfs"}, true)
	for _, c := range []struct {
		name       string
		policy     *storagePolicy
		limit      int64
		entrypoint []string
		pool       string
		cmd        string
		held       bool
	}{
		{"measured", watch, 64 << 20, []string{"sh", "-c", "x"}, "", "--claimable --", true},
		{"no limit", watch, 0, []string{"sh", "-c", "x"}, "", "-- sh -c x", false},
		{"engine quota", quota, 64 << 20, []string{"sh", "-c", "x"}, "", "-- sh -c x", false},
		{"no entrypoint", watch, 64 << 20, nil, "", "--", false},
		{"warm pool", watch, 64 << 20, []string{"sh", "-c", "x"}, "p", "--claimable --", false},
	} {
		cfg := DefaultConfig()
		cfg.storage = c.policy
		spec := &sandbox.Spec{Image: "img", Entrypoint: c.entrypoint, Resources: sandbox.Resources{StorageBytes: c.limit}}
		cc, _, _, err := containerConfig(&cfg, "id", spec, time.Now(), "tok", c.pool)
		if err != nil {
			t.Fatal(err)
		}
		label, ok := cc.Labels[labelHeld]
		if got := strings.Join(cc.Cmd, " "); got != c.cmd || isHeld(cc.Labels) != c.held || !ok {
			t.Errorf("%s: command %q, label %s=%q (present %v); want %q, held %v", c.name, got, labelHeld, label, ok, c.cmd, c.held)
		}
	}
}
