package docker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	ready  []time.Duration // cold creates
	pulls  []error
	recons []error // runtime reconciliations
}

func (r *recorder) SandboxReady(mode sandbox.CreateMode, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if mode == sandbox.CreateCold {
		r.ready = append(r.ready, d)
	}
}

func (r *recorder) ImagePulled(image string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pulls = append(r.pulls, err)
}

func (r *recorder) Reconciled(loop string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if loop == sandbox.LoopRuntime {
		r.recons = append(r.recons, err)
	}
}

func (r *recorder) PoolClaim(pool string, hit bool) {}

func (r *recorder) snapshot() (ready []time.Duration, pulls, recons []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.ready...), append([]error(nil), r.pulls...), append([]error(nil), r.recons...)
}

// TestObserverCreateAndReconcile: a create is reported once, when execd
// answers, with the time since Create; a reconcile pass is reported; a
// sandbox found again after a restart is not reported as created.
func TestObserverCreateAndReconcile(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	rec := &recorder{}
	rt1 := newTestRuntimeNoCleanup(t, func(c *Config) { c.DataDir, c.LabelScope, c.Observer = dir, scope, rec })
	began := time.Now()
	id := start(t, rt1, sandbox.Spec{})
	took := time.Since(began)
	ready, _, _ := rec.snapshot()
	if len(ready) != 1 || ready[0] <= 0 || ready[0] > took {
		t.Fatalf("cold creates reported: %v, want one within %v", ready, took)
	}
	if err := rt1.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, recons := rec.snapshot(); len(recons) != 1 || recons[0] != nil {
		t.Fatalf("reconciliations reported: %v, want one success", recons)
	}
	rt1.Close()

	rec2 := &recorder{}
	rt2 := newTestRuntime(t, func(c *Config) { c.DataDir, c.LabelScope, c.Observer = dir, scope, rec2 })
	waitState(t, rt2, id, sandbox.StateRunning)
	if ready, _, _ := rec2.snapshot(); len(ready) != 0 {
		t.Fatalf("a sandbox found again at start was reported as created: %v", ready)
	}
}

// TestObserverPulls: a failed pull and a pull every caller abandoned are
// reported, the latter as canceled.
func TestObserverPulls(t *testing.T) {
	rec := &recorder{}
	rt := newTestRuntime(t, func(c *Config) { c.Observer = rec })
	ctx := context.Background()

	refused := sandbox.NewID()
	if _, err := rt.Create(ctx, refused, sandbox.Spec{Image: "127.0.0.1:1/opensandbox/missing:latest", Entrypoint: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, refused, sandbox.StateFailed)
	if _, pulls, _ := rec.snapshot(); len(pulls) != 1 || pulls[0] == nil || errors.Is(pulls[0], context.Canceled) {
		t.Fatalf("pulls reported after a refused pull: %v, want one error", pulls)
	}

	stalled := sandbox.NewID()
	if _, err := rt.Create(ctx, stalled, sandbox.Spec{Image: stalledRegistry(t) + "/x/y:z", Entrypoint: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pull", func() bool { sb, _ := rt.Get(ctx, stalled); return sb.Status.Reason == "PULLING_IMAGE" })
	if err := rt.Delete(ctx, stalled); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the abandoned pull to be reported", func() bool { _, pulls, _ := rec.snapshot(); return len(pulls) == 2 })
	if _, pulls, _ := rec.snapshot(); !errors.Is(pulls[1], context.Canceled) {
		t.Fatalf("abandoned pull reported as %v, want context.Canceled", pulls[1])
	}
}
