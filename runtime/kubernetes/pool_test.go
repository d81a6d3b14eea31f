package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

// testPoolDef is a busybox pool of n ready pods.
func testPoolDef(name string, n int) sandbox.Pool {
	return sandbox.Pool{Name: name, Template: sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint},
		Capacity: sandbox.Capacity{BufferMin: n, BufferMax: n, PoolMax: 2 * n}}
}

// waitPoolStatus polls every runtime's view of the pool until cond holds
// on all, as long as starting n pods may take on this machine, and says
// what they saw when it gives up.
func waitPoolStatus(t *testing.T, name string, n int, cond func(sandbox.PoolStatus) bool, rts ...*Runtime) {
	t.Helper()
	var seen []sandbox.PoolStatus
	testwait.Wait{What: "pool " + name, Starts: n * podStarts, Every: 100 * time.Millisecond,
		Describe: func() string { return fmt.Sprintf("the replicas see pool %s as %+v", name, seen) },
	}.Until(t, func() bool {
		seen = seen[:0]
		ok := true
		for _, rt := range rts {
			info, err := rt.GetPool(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, info.Status)
			ok = ok && cond(info.Status)
		}
		return ok
	})
}

// warmPods returns the warm pods of pool, oldest first, as rt sees them.
func warmPods(rt *Runtime, pool string) []sandbox.ID {
	members, _ := rt.members(rt.allPods(), pool)
	slices.SortFunc(members, func(a, b warmpool.Member) int { return a.Created.Compare(b.Created) })
	var out []sandbox.ID
	for _, m := range members {
		if !m.HandedOut {
			out = append(out, m.ID)
		}
	}
	return out
}

// TestPoolThirtyClaimsOnFive: 30 claims at once, on two replicas, on a
// pool of 5 ready pods hand out exactly 5, each once; 25 find the pool
// empty. Claims on the two replicas go for the same (oldest) pod, so
// most takes meet a conflict and must read the pod again.
func TestPoolThirtyClaimsOnFive(t *testing.T) {
	env := newTestEnv(t)
	cfg := env.config("thirty")
	a, b := env.runtime(t, cfg), env.runtime(t, cfg)
	ctx := context.Background()
	if _, err := a.CreatePool(ctx, testPoolDef("five", 5)); err != nil {
		t.Fatal(err)
	}
	waitPoolStatus(t, "five", 5, func(st sandbox.PoolStatus) bool { return st.Available == 5 && st.Starting == 0 }, a, b)
	var (
		mu    sync.Mutex
		got   = map[sandbox.ID]int{}
		empty int
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range 30 {
		rt := a
		if i%2 == 1 {
			rt = b
		}
		wg.Go(func() {
			<-start
			sb, err := rt.Claim(ctx, "five", sandbox.Spec{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, sandbox.ErrPoolEmpty):
				empty++
			case err != nil:
				t.Errorf("claim: %v", err)
			default:
				got[sb.ID]++
			}
		})
	}
	close(start)
	wg.Wait()
	if len(got) != 5 || empty != 25 {
		info, _ := a.GetPool(ctx, "five")
		t.Fatalf("%d pods handed out, %d empty answers; want 5 and 25 (pool now %+v)", len(got), empty, info.Status)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("sandbox %s handed out %d times", id, n)
		}
		ep, err := a.Endpoint(ctx, id, api.ExecdPort)
		if err != nil {
			t.Fatal(err)
		}
		runCommand(t, ep, "true")
	}
}

// setToken writes token into the Secret of sandbox id and waits until rt
// reads it, as if the pool's token were lost: execd refuses the hand-over.
func setToken(t *testing.T, env *testEnv, rt *Runtime, id sandbox.ID, token string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"data": map[string]string{secretKey: base64.StdEncoding.EncodeToString([]byte(token))}})
	if _, err := env.cs.CoreV1().Secrets(env.ns).Patch(context.Background(), podName(id), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 1, "the runtime reads the changed token", func() bool { return rt.token(id) == token })
}

// TestPoolFailedHandOver: a warm pod whose execd refuses the hand-over is
// removed and the claim takes the next; after two such failures the create
// goes cold, the pool reports why, and the pod not tried stays warm.
func TestPoolFailedHandOver(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("handover"))
	ctx := context.Background()
	if _, err := rt.CreatePool(ctx, testPoolDef("handover", 3)); err != nil {
		t.Fatal(err)
	}
	ready := func(st sandbox.PoolStatus) bool { return st.Available == 3 && st.Starting == 0 }
	waitPoolStatus(t, "handover", 3, ready, rt)
	warm := warmPods(rt, "handover")
	setToken(t, env, rt, warm[0], "not-the-pool-token-0")
	sb, err := rt.Claim(ctx, "handover", sandbox.Spec{})
	if err != nil {
		t.Fatalf("claim after one failed hand-over: %v", err)
	}
	if sb.ID != warm[1] {
		t.Errorf("handed out %s; want %s, the next oldest", sb.ID, warm[1])
	}
	if _, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(warm[0]), metav1.GetOptions{}); err == nil {
		waitFor(t, 1, "the pod whose hand-over failed is deleted", func() bool {
			p, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(warm[0]), metav1.GetOptions{})
			return err != nil || p.DeletionTimestamp != nil
		})
	}
	waitPoolStatus(t, "handover", 3, ready, rt)

	warm = warmPods(rt, "handover")
	setToken(t, env, rt, warm[0], "not-the-pool-token-1")
	setToken(t, env, rt, warm[1], "not-the-pool-token-2")
	if _, err := rt.Claim(ctx, "handover", sandbox.Spec{}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Fatalf("claim after two failed hand-overs: %v, want ErrPoolEmpty", err)
	}
	info, _ := rt.GetPool(ctx, "handover")
	if !strings.Contains(info.Status.Error, "hand-over failed") {
		t.Errorf("pool error %q", info.Status.Error)
	}
	if left := warmPods(rt, "handover"); !slices.Contains(left, warm[2]) {
		t.Errorf("the pod not tried, %s, is not warm: %v", warm[2], left)
	}
	if _, err := rt.Claim(ctx, "handover", sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	if info, _ := rt.GetPool(ctx, "handover"); info.Status.Error != "" {
		t.Errorf("pool error after a claim: %q", info.Status.Error)
	}
}

// TestPoolBadClaimStaysWarm: a claim execd refuses as bad (an invalid
// variable name) is answered with ErrInvalid, and the pod is put back,
// warm, for the next claim.
func TestPoolBadClaimStaysWarm(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("bad"))
	ctx := context.Background()
	if _, err := rt.CreatePool(ctx, testPoolDef("bad", 1)); err != nil {
		t.Fatal(err)
	}
	waitPoolStatus(t, "bad", 1, func(st sandbox.PoolStatus) bool { return st.Available == 1 && st.Starting == 0 }, rt)
	warm := warmPods(rt, "bad")
	_, err := rt.Claim(ctx, "bad", sandbox.Spec{Env: map[string]string{"": "x"}, Metadata: map[string]string{"who": "bad"}})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("claim with a bad variable: %v, want ErrInvalid", err)
	}
	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(warm[0]), metav1.GetOptions{})
	if err != nil || pod.Labels[labelWarm] == "" || pod.Annotations[annHandover] != "" || strings.Contains(pod.Annotations[annMetadata], "bad") {
		t.Fatalf("pod after the refused claim: %v, %v", pod, err)
	}
	sb, err := rt.Claim(ctx, "bad", sandbox.Spec{Env: map[string]string{"OK": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != warm[0] {
		t.Errorf("claimed %s, want %s, put back", sb.ID, warm[0])
	}
	ep, err := rt.Endpoint(ctx, sb.ID, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	if out := runCommand(t, ep, "echo $OK"); !strings.Contains(out, `"stdout","text":"1"`) {
		t.Errorf("environment: %q", out)
	}
}
