package fake_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/sandbox"
)

func newPooled(t *testing.T) *fake.Pooled {
	rt := fake.NewPooled()
	rt.MissingImages["missing:latest"] = true
	t.Cleanup(func() { rt.Close() })
	return rt
}

// TestPooledConformance: with pools, the fake is still a conforming
// runtime.
func TestPooledConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) sandbox.Runtime { return newPooled(t) },
		runtimetest.Options{Image: "busybox", Entrypoint: []string{"sleep", "1000"}, MissingImage: "missing:latest",
			Hooks: runtimetest.Hooks{
				WarmLeft: func(t *testing.T, rt sandbox.Runtime, pool string) []sandbox.ID {
					return rt.(*fake.Pooled).WarmLeft(pool)
				},
				BreakWarm: func(t *testing.T, rt sandbox.Runtime, id sandbox.ID) { rt.(*fake.Pooled).BreakWarm(id) },
			}})
}

func pool(name, image string, min, max int) sandbox.Pool {
	return sandbox.Pool{Name: name, Template: sandbox.Spec{Image: image, Entrypoint: []string{"sleep", "1"}},
		Capacity: sandbox.Capacity{BufferMin: min, BufferMax: max, PoolMax: 2 * max}}
}

func waitPool(t *testing.T, rt *fake.Pooled, name string, cond func(sandbox.PoolStatus) bool) sandbox.PoolStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := rt.GetPool(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if cond(info.Status) {
			return info.Status
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for pool %s; its status: %+v", name, info.Status)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func full(n int) func(sandbox.PoolStatus) bool {
	return func(st sandbox.PoolStatus) bool { return st.Available == n && st.Starting == 0 }
}

// TestPooledFailingTemplate: a pool whose sandboxes fail reports why,
// starts one at a time with a growing delay, and a template change
// forgets its failures and fills the pool.
func TestPooledFailingTemplate(t *testing.T) {
	rt := newPooled(t)
	ctx := context.Background()
	p := pool("broken", "missing:latest", 3, 3)
	if _, err := rt.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	st := waitPool(t, rt, "broken", func(st sandbox.PoolStatus) bool { return st.Error != "" })
	if !strings.Contains(st.Error, "IMAGE_PULL_FAILED") {
		t.Errorf("error %q", st.Error)
	}
	// Backing off: never more than one start at a time.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		info, _ := rt.GetPool(ctx, "broken")
		if info.Status.Starting > 1 {
			t.Fatalf("%d starting while failing", info.Status.Starting)
		}
	}
	p.Template.Image = "busybox"
	info, err := rt.UpdatePool(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status.Error != "" {
		t.Errorf("the new revision reports the old one's error: %q", info.Status.Error)
	}
	waitPool(t, rt, "broken", full(3))
}

// TestPooledHandOver: a failed hand-over discards that sandbox and takes
// the next; two in a row send the create cold; a request "execd" refuses
// leaves the sandbox warm.
func TestPooledHandOver(t *testing.T) {
	rt := newPooled(t)
	ctx := context.Background()
	if _, err := rt.CreatePool(ctx, pool("h", "busybox", 3, 3)); err != nil {
		t.Fatal(err)
	}
	waitPool(t, rt, "h", full(3))
	rt.FailNext("HandOver", errors.New("execd unreachable"))
	if _, err := rt.Claim(ctx, "h", sandbox.Spec{}); err != nil {
		t.Fatalf("claim after one failed hand-over: %v", err)
	}
	if _, err := rt.Claim(ctx, "h", sandbox.Spec{Env: map[string]string{"": "x"}}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("claim with a bad variable: %v", err)
	}
	if st := waitPool(t, rt, "h", full(3)); st.Allocated != 1 {
		t.Errorf("status %+v", st)
	}
	if err := rt.DeletePool(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	if list, _ := rt.List(ctx); len(list) != 1 {
		t.Errorf("after the pool's deletion %d sandboxes, want the one handed out", len(list))
	}
}
