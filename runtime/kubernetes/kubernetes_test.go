package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testregistry"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestConformance(t *testing.T) {
	env := newTestEnv(t)
	runtimetest.Run(t, func(t *testing.T) sandbox.Runtime {
		return env.runtime(t, env.config("conf-"+randomSuffix()))
	}, runtimetest.Options{
		Image:        testImage,
		Entrypoint:   testEntrypoint,
		MissingImage: missingImage,
		Reach:        runtimetest.ReachExecd,
		StartTimeout: max(2*time.Minute, testwait.TimeoutN(podStarts)),
	})
}

// TestNoTokenInPodSpec: the token is only in the Secret; the pod refers
// to it.
func TestNoTokenInPodSpec(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("token"))
	id := sandbox.NewID()
	if _, err := rt.Create(context.Background(), id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint}); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	ep, err := rt.Endpoint(context.Background(), id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	token := ep.Headers[sandbox.HeaderExecdToken]
	pod, err := env.cs.CoreV1().Pods(env.ns).Get(context.Background(), podName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := pod.Marshal()
	if len(token) < 32 || strings.Contains(string(raw), token) {
		t.Fatalf("the pod's spec holds the token %q (or the token is short)", token)
	}
	sec, err := env.cs.CoreV1().Secrets(env.ns).Get(context.Background(), podName(id), metav1.GetOptions{})
	if err != nil || string(sec.Data[secretKey]) != token {
		t.Fatalf("token secret: %v, %v", sec, err)
	}
	// The token works, and a wrong one does not.
	for tok, want := range map[string]int{token: http.StatusOK, "wrong-token-wrong-token": http.StatusUnauthorized} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+ep.Address+"/files/info?path=/", nil)
		req.Header.Set(sandbox.HeaderExecdToken, tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("execd with token %q: %s, want %d", tok[:5], resp.Status, want)
		}
	}
	// Deleting the sandbox removes its Secret too.
	if err := rt.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cs.CoreV1().Secrets(env.ns).Get(context.Background(), podName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("token secret after delete: %v", err)
	}
}

// TestFailuresHaveReasons: a sandbox no node can hold, and one whose image
// cannot be pulled, become Failed with the cluster's reason.
func TestFailuresHaveReasons(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("fail"))
	ctx := context.Background()
	// The node is amd64 (or whichever it is): no node has the other.
	arch := "arm64"
	if goruntime.GOARCH == "arm64" {
		arch = "amd64"
	}
	huge := sandbox.NewID()
	if _, err := rt.Create(ctx, huge, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint,
		Platform: &sandbox.Platform{OS: "linux", Arch: arch}}); err != nil {
		t.Fatal(err)
	}
	missing := sandbox.NewID()
	if _, err := rt.Create(ctx, missing, sandbox.Spec{Image: missingImage, Entrypoint: testEntrypoint}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[sandbox.ID][2]string{
		huge:    {"UNSCHEDULABLE", "node affinity/selector"},
		missing: {"IMAGE_PULL_FAILED", "127.0.0.1:1"},
	} {
		sb := waitFailed(t, rt, id)
		if sb.Status.Reason != want[0] || !strings.Contains(sb.Status.Message, want[1]) {
			t.Errorf("sandbox %s: %s: %s; want %s mentioning %q", id, sb.Status.Reason, sb.Status.Message, want[0], want[1])
		}
		evs, err := rt.Events(ctx, id)
		if err != nil || len(evs) < 2 {
			t.Errorf("events of %s: %v, %v", id, evs, err)
		}
		// The leader records the failure on the pod, so it is final.
		waitFor(t, 1, "the failure is recorded on the pod", func() bool {
			pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
			return err == nil && strings.Contains(pod.Annotations[annFailure], want[0])
		})
	}
	// Endpoint does not wait for an address a failed sandbox never gets.
	if _, err := rt.Endpoint(ctx, huge, api.ExecdPort); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("Endpoint of a failed sandbox: %v, want ErrConflict", err)
	}
}

// TestStaleDiscardSparesClaimed: the leader judging a warm pod from a
// copy older than a claim that took it meanwhile does not delete the
// user's sandbox.
func TestStaleDiscardSparesClaimed(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("stale"))
	ctx := context.Background()
	if _, err := rt.CreatePool(ctx, sandbox.Pool{Name: "one", Template: sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint},
		Capacity: sandbox.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 2}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podStarts, "a warm pod is ready", func() bool {
		info, _ := rt.GetPool(ctx, "one")
		return info != nil && info.Status.Available == 1
	})
	var stale *corev1.Pod
	for _, pod := range rt.allPods() {
		if pod.Labels[labelWarm] != "" {
			stale = pod.DeepCopy()
		}
	}
	sb, err := rt.Claim(ctx, "one", sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	rt.discard(ctx, stale, "judged from a stale copy")
	if got, err := rt.Get(ctx, sb.ID); err != nil || got.Status.State != sandbox.StateRunning {
		t.Fatalf("the claimed sandbox after a stale discard: %+v, %v", got, err)
	}
	if pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(sb.ID), metav1.GetOptions{}); err != nil || pod.DeletionTimestamp != nil {
		t.Fatalf("the claimed sandbox's pod: %v (deleting: %v)", err, pod != nil && pod.DeletionTimestamp != nil)
	}
}

// podStarts is how many cold container starts one sandbox pod's start
// is worth: the pod's sandbox, the init container that copies execd and
// the sandbox's own container, each behind a turn of the kubelet.
const podStarts = 6

// waitState waits until a sandbox is in state, for as long as a pod's
// start may take on this machine (see testwait); a sandbox that fails
// instead fails the test at once. Either way the failure says what the
// sandbox and its pod were doing.
func waitState(t *testing.T, rt *Runtime, id sandbox.ID, want sandbox.State) *sandbox.Sandbox {
	t.Helper()
	var sb *sandbox.Sandbox
	testwait.Wait{What: fmt.Sprintf("sandbox %s to be %s", id, want), Starts: podStarts,
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

// waitFailed waits until a sandbox is Failed; it must stay Pending until
// then.
func waitFailed(t *testing.T, rt *Runtime, id sandbox.ID) *sandbox.Sandbox {
	t.Helper()
	var sb *sandbox.Sandbox
	testwait.Wait{What: fmt.Sprintf("sandbox %s to fail", id), Starts: podStarts,
		Describe: func() string { return describe(rt, id) }}.Until(t, func() bool {
		var err error
		if sb, err = rt.Get(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if sb.Status.State != sandbox.StatePending && sb.Status.State != sandbox.StateFailed {
			t.Fatalf("sandbox %s is %+v, want Pending then Failed\n%s", id, sb.Status, describe(rt, id))
		}
		return sb.Status.State == sandbox.StateFailed
	})
	return sb
}

// describe says what a sandbox is doing: its status and events as the
// runtime has them, its log, and its pod and the pod's events as the
// cluster has them.
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
	pod, err := rt.cs.CoreV1().Pods(rt.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(&b, "pod %s: %v\n", podName(id), err)
		return b.String()
	}
	fmt.Fprintf(&b, "pod %s on %q: %s, deleting %v\n", pod.Name, pod.Spec.NodeName, pod.Status.Phase, pod.DeletionTimestamp != nil)
	for _, c := range pod.Status.Conditions {
		fmt.Fprintf(&b, "    condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		fmt.Fprintf(&b, "    container %s ready=%v restarts=%d state=%+v\n", cs.Name, cs.Ready, cs.RestartCount, cs.State)
	}
	kevs, err := rt.cs.CoreV1().Events(rt.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
	if err != nil {
		fmt.Fprintf(&b, "pod events: %v\n", err)
		return b.String()
	}
	for _, e := range kevs.Items {
		fmt.Fprintf(&b, "    event %s %s %s: %s\n", e.LastTimestamp.Format(time.StampMilli), e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// waitLeader waits until exactly one of rts leads, and returns it.
func waitLeader(t *testing.T, timeout time.Duration, rts ...*Runtime) *Runtime {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var leaders []*Runtime
		for _, rt := range rts {
			if rt.Leading() {
				leaders = append(leaders, rt)
			}
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		if len(leaders) > 1 {
			t.Fatalf("%d replicas lead at once", len(leaders))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica leads after %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplicas: two replicas serve the same sandboxes; one leads and
// enforces expiry; when it goes away the other takes over, and the timers
// survive.
func TestReplicas(t *testing.T) {
	env := newTestEnv(t)
	cfg := env.config("replicas")
	a := env.runtime(t, cfg)
	b := env.runtime(t, cfg)
	leader := waitLeader(t, 20*time.Second, a, b)
	follower := a
	if leader == a {
		follower = b
	}
	// Each replica runs a lifecycle manager, as each server would.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaderCtx, stopLeader := context.WithCancel(ctx)
	go lifecycle.NewManager(leader, lifecycle.ManagerConfig{}).Run(leaderCtx)
	go lifecycle.NewManager(follower, lifecycle.ManagerConfig{}).Run(ctx)

	// Made on one replica, seen and changed on the other.
	id := sandbox.NewID()
	exp := time.Now().Add(time.Hour)
	if _, err := leader.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint, ExpiresAt: &exp}); err != nil {
		t.Fatal(err)
	}
	// The follower finds it at once: what its informer has not delivered
	// yet, it asks the API server for.
	if _, err := follower.Get(ctx, id); err != nil {
		t.Fatalf("the other replica, right after the create: %v", err)
	}
	waitState(t, follower, id, sandbox.StateRunning)
	v := "b"
	if _, err := follower.PatchMetadata(ctx, id, map[string]*string{"by": &v}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 1, "the leader sees the follower's patch", func() bool {
		sb, err := leader.Get(ctx, id)
		return err == nil && sb.Metadata["by"] == "b"
	})
	// The expiry, set through the follower, is enforced by the leader.
	soon := time.Now().Add(3 * time.Second)
	if err := follower.SetExpiry(ctx, id, &soon); err != nil {
		t.Fatal(err)
	}
	// The leader goes away before the sandbox expires; the follower takes
	// over and deletes it on time.
	stopLeader()
	leader.Close()
	handover := time.Now()
	waitLeader(t, 10*time.Second, follower)
	t.Logf("the follower leads %v after the leader closed", time.Since(handover).Round(time.Millisecond))
	waitFor(t, 2, "the expired sandbox is deleted by the new leader", func() bool {
		_, err := follower.Get(ctx, id)
		return errors.Is(err, sandbox.ErrNotFound)
	})
	if late := time.Since(soon); late < 0 {
		t.Fatalf("deleted %v before its expiry", -late)
	} else {
		t.Logf("deleted %v after its expiry, across a change of leader", late.Round(time.Millisecond))
	}
}

// waitFor waits until ok holds, for as long as starts cold container
// starts may take on this machine (see testwait).
func waitFor(t *testing.T, starts int, what string, ok func() bool) {
	t.Helper()
	testwait.Wait{What: what, Starts: starts}.Until(t, ok)
}

// TestPoolAcrossReplicas: 100 creates at once, on two replicas, against a
// pool of 10 ready pods: exactly 10 are served from the pool, each pod
// once, each with its own token; the pool then refills.
func TestPoolAcrossReplicas(t *testing.T) {
	env := newTestEnv(t)
	cfg := env.config("pool")
	a := env.runtime(t, cfg)
	b := env.runtime(t, cfg)
	ctx := context.Background()
	const size = 10
	def := sandbox.Pool{Name: "busy", Template: sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint},
		Capacity: sandbox.Capacity{BufferMin: size, BufferMax: size, PoolMin: 0, PoolMax: 3 * size}}
	if _, err := a.CreatePool(ctx, def); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreatePool(ctx, def); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("second CreatePool: %v, want ErrConflict", err)
	}
	waitFor(t, 3*podStarts, "the pool holds 10 ready pods on both replicas", func() bool {
		ia, _ := a.GetPool(ctx, "busy")
		ib, _ := b.GetPool(ctx, "busy")
		return ia != nil && ib != nil && ia.Status.Available == size && ib.Status.Available == size
	})
	// Creates that could still be served are never missed: the 100
	// claims are made at once, half on each replica.
	var mu sync.Mutex
	got := map[sandbox.ID]int{}
	empty := 0
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 100 {
		rt := a
		if i%2 == 1 {
			rt = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			v := "claim"
			sb, err := rt.Claim(ctx, "busy", sandbox.Spec{Metadata: map[string]string{"by": v}, Env: map[string]string{"CLAIMED": "yes"},
				Entrypoint: []string{"sleep", "12345"}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				got[sb.ID]++
			case errors.Is(err, sandbox.ErrPoolEmpty):
				empty++
			default:
				t.Errorf("Claim: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(got) != size || empty != 100-size {
		t.Fatalf("claims: %d sandboxes handed out, %d empty; want %d and %d", len(got), empty, size, 100-size)
	}
	tokens := map[string]bool{}
	for id, n := range got {
		if n != 1 {
			t.Fatalf("sandbox %s handed out %d times", id, n)
		}
		// The other replica may still see the hand-over under way.
		sb := waitState(t, b, id, sandbox.StateRunning)
		if sb.Metadata["by"] != "claim" || len(sb.Entrypoint) != 2 {
			t.Fatalf("claimed sandbox %s: %+v", id, sb)
		}
		ep, err := a.Endpoint(ctx, id, api.ExecdPort)
		if err != nil {
			t.Fatal(err)
		}
		tok := ep.Headers[sandbox.HeaderExecdToken]
		if tokens[tok] {
			t.Fatalf("two claimed sandboxes share a token")
		}
		tokens[tok] = true
	}
	// One claimed sandbox, checked in depth: the user's environment and
	// entrypoint, the new token only.
	var one sandbox.ID
	for id := range got {
		one = id
		break
	}
	ep, _ := b.Endpoint(ctx, one, api.ExecdPort)
	out := runCommand(t, ep, "echo $CLAIMED; ps")
	if !strings.Contains(out, "yes") || !strings.Contains(out, "sleep 12345") {
		t.Fatalf("claimed sandbox: env or entrypoint missing:\n%s", out)
	}
	waitFor(t, 3*podStarts, "the pool refills to 10 ready pods", func() bool {
		info, _ := b.GetPool(ctx, "busy")
		return info != nil && info.Status.Available == size && info.Status.Allocated == size
	})
	// Deleting the pool removes the waiting pods, not the handed-out ones.
	if err := b.DeletePool(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podStarts, "only the handed-out pods are left", func() bool {
		pods, _ := env.cs.CoreV1().Pods(env.ns).List(ctx, metav1.ListOptions{LabelSelector: labelWarm})
		live := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				live++
			}
		}
		return live == 0
	})
	if _, err := a.Get(ctx, one); err != nil {
		t.Fatalf("handed-out sandbox after the pool's deletion: %v", err)
	}
}

// runCommand runs a shell command through execd and returns its output.
func runCommand(t *testing.T, ep sandbox.Endpoint, cmd string) string {
	t.Helper()
	body := strings.NewReader(`{"command":` + quoteJSON(cmd) + `}`)
	req, _ := http.NewRequest(http.MethodPost, "http://"+ep.Address+"/command", body)
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("command: %s: %s", resp.Status, b)
	}
	return string(b)
}

func quoteJSON(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// TestGVisor: a sandbox asks for the gvisor RuntimeClass (which make
// k8s-up wires to runsc) and runs under gVisor's kernel; a class that is
// not allowed is refused.
func TestGVisor(t *testing.T) {
	env := newTestEnv(t)
	if _, err := env.cs.NodeV1().RuntimeClasses().Get(context.Background(), "gvisor", metav1.GetOptions{}); err != nil {
		testenv.Missing(t, "the test cluster has no RuntimeClass gvisor (%v); make k8s-up makes it", err)
	}
	cfg := env.config("gvisor")
	cfg.AllowedRuntimeClasses = []string{"gvisor"}
	rt := env.runtime(t, cfg)
	ctx := context.Background()
	if _, err := rt.Create(ctx, sandbox.NewID(), sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint,
		Extensions: map[string]string{extRuntimeClass: "kata"}}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("a RuntimeClass not allowed: %v, want ErrInvalid", err)
	}
	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint,
		Extensions: map[string]string{extRuntimeClass: "gvisor"}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	ep, err := rt.Endpoint(ctx, id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	if out := runCommand(t, ep, "dmesg"); !strings.Contains(out, "gVisor") {
		t.Fatalf("dmesg in a gvisor sandbox does not mention gVisor:\n%s", out)
	}
}

// TestPoolRefillsPastOnePass: a refill that needs more pods than one pass
// starts (warmpool.MaxStarting) goes on until BufferMax.
func TestPoolRefillsPastOnePass(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("wide"))
	ctx := context.Background()
	n := warmpool.MaxStarting + 4
	if _, err := rt.CreatePool(ctx, sandbox.Pool{Name: "wide", Template: sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint},
		Capacity: sandbox.Capacity{BufferMin: 1, BufferMax: n, PoolMax: n}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*podStarts, "the pool fills to BufferMax", func() bool {
		info, _ := rt.GetPool(ctx, "wide")
		return info != nil && info.Status.Available == n
	})
}

// TestExecdFromHostDir: with execd_host_dir, pods mount execd from the
// node and have no init container.
func TestExecdFromHostDir(t *testing.T) {
	env := newTestEnv(t)
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/execd", "./cmd/execd")
	build.Dir = moduleRoot()
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build execd: %v\n%s", err, out)
	}
	cfg := env.config("hostdir")
	cfg.ExecdHostDir = dir // this machine is the node
	rt := env.runtime(t, cfg)
	ctx := context.Background()
	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint}); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil || len(pod.Spec.InitContainers) != 0 {
		t.Fatalf("pod: %v, init containers %d", err, len(pod.Spec.InitContainers))
	}
	ep, err := rt.Endpoint(ctx, id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	if out := runCommand(t, ep, "echo from-node-execd"); !strings.Contains(out, "from-node-execd") {
		t.Fatalf("command: %s", out)
	}
}

// TestPullWithCredentials: an image from a registry that wants a password
// is pulled with the credentials of the create, kept in a Secret of the
// sandbox's own only until the image is pulled; without them the sandbox
// fails with the registry's reason.
func TestPullWithCredentials(t *testing.T) {
	env := newTestEnv(t)
	ref := testregistry.Start(t, "opensandbox/busybox", "osb", "s3cret-pass")
	rt := env.runtime(t, env.config("pull"))
	ctx := context.Background()

	noAuth := sandbox.NewID()
	if _, err := rt.Create(ctx, noAuth, sandbox.Spec{Image: ref, Entrypoint: testEntrypoint}); err != nil {
		t.Fatal(err)
	}
	if sb := waitFailed(t, rt, noAuth); sb.Status.Reason != "IMAGE_PULL_FAILED" ||
		!strings.Contains(strings.ToLower(sb.Status.Message), "unauthorized") {
		t.Fatalf("pull without credentials: %+v", sb.Status)
	}

	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: ref, Entrypoint: testEntrypoint,
		ImageAuth: &sandbox.RegistryAuth{Username: "osb", Password: "s3cret-pass"}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	ep, err := rt.Endpoint(ctx, id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	if out := runCommand(t, ep, "echo pulled"); !strings.Contains(out, "pulled") {
		t.Fatalf("command: %s", out)
	}
	waitFor(t, podStarts, "the registry credentials are removed once the image is pulled", func() bool {
		_, err := env.cs.CoreV1().Secrets(env.ns).Get(ctx, pullSecretName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := pod.Marshal(); strings.Contains(string(raw), "s3cret-pass") {
		t.Fatal("the registry password is in the pod")
	}
}
