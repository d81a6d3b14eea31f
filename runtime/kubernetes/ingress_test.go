package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestTargetOf: the gateway reads a pod as the runtime does.
func TestTargetOf(t *testing.T) {
	cfg := testConfig(t, "")
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	exp := now.Add(time.Hour)
	to := timeouts{start: 10 * time.Minute, schedule: 15 * time.Second}
	mk := func(ext map[string]string, status corev1.PodStatus, expires *time.Time) *corev1.Pod {
		t.Helper()
		pod, err := podFor(&cfg, "ns", "sb-1", &sandbox.Spec{Image: "img", Extensions: ext, ExpiresAt: expires}, now.Add(-time.Minute), "", 0)
		if err != nil {
			t.Fatal(err)
		}
		pod.CreationTimestamp = metav1.NewTime(now.Add(-time.Minute))
		pod.Spec.NodeName = "node"
		pod.Status = status
		return pod
	}
	running := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.7",
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	starting := corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.7",
		ContainerStatuses: []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}
	pulling := corev1.PodStatus{Phase: corev1.PodPending,
		ContainerStatuses: []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}}}}

	cases := []struct {
		name string
		pod  *corev1.Pod
		want api.IngressTarget
	}{
		{"running, public, renewing", mk(map[string]string{api.ExtensionIngressPublic: "true", api.ExtensionRenewExtend: "600"}, running, &exp),
			api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Running", Reason: "POD_READY", Endpoint: "10.244.0.7:8080",
				Public: true, RenewExtendSeconds: 600, ExpiresAt: &exp}},
		{"renewing without an expiry: nothing to renew", mk(map[string]string{api.ExtensionRenewExtend: "600"}, running, nil),
			api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Running", Reason: "POD_READY", Endpoint: "10.244.0.7:8080"}},
		{"running, private, no expiry", mk(nil, running, nil),
			api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Running", Reason: "POD_READY", Endpoint: "10.244.0.7:8080"}},
		{"public only when true", mk(map[string]string{api.ExtensionIngressPublic: "yes", api.ExtensionRenewExtend: "soon"}, running, nil),
			api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Running", Reason: "POD_READY", Endpoint: "10.244.0.7:8080"}},
		{"execd not ready: no address yet", mk(nil, starting, nil),
			api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Pending", Reason: "EXECD_STARTING"}},
		{"image pull failed", mk(nil, pulling, &exp),
			api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Failed", Reason: "IMAGE_PULL_FAILED", ExpiresAt: &exp}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := targetOf(c.pod, 8080, now, to)
			if fmt.Sprintf("%+v", strip(got)) != fmt.Sprintf("%+v", strip(c.want)) ||
				(got.ExpiresAt == nil) != (c.want.ExpiresAt == nil) || (got.ExpiresAt != nil && !got.ExpiresAt.Equal(*c.want.ExpiresAt)) {
				t.Fatalf("targetOf = %+v (expires %v), want %+v (expires %v)", got, got.ExpiresAt, c.want, c.want.ExpiresAt)
			}
			// The same judgement as the runtime's.
			if sb := sandboxFrom(c.pod, false, now, to); string(sb.Status.State) != got.State {
				t.Fatalf("state %s, the runtime says %s", got.State, sb.Status.State)
			}
		})
	}
}

// strip drops the pointer field so that targets compare by value.
func strip(t api.IngressTarget) api.IngressTarget {
	t.ExpiresAt = nil
	return t
}

// TestPodResolver: a resolver on the test cluster finds the sandboxes of
// the runtime's scope in the namespaces it is told, with their state,
// address and extensions, and forgets them when they go.
func TestPodResolver(t *testing.T) {
	env := newTestEnv(t)
	cfg := env.config("gateway")
	rt := env.runtime(t, cfg)
	other := env.runtime(t, env.config("other-scope"))
	ctx := t.Context()

	res, err := NewPodResolver(PodResolverConfig{Kubeconfig: env.kubeconfig, Namespaces: []string{env.ns}, LabelScope: "gateway",
		StartTimeout: cfg.StartTimeout, ScheduleTimeout: cfg.ScheduleTimeout}, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	if err := res.Ready(ctx); err != nil {
		t.Fatalf("Ready after NewPodResolver: %v", err)
	}

	id := sandbox.NewID()
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	web := []string{"sh", "-c", "mkdir -p /www && echo hello from " + string(id) + " >/www/index.html && exec httpd -f -p 8080 -h /www"}
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: web, ExpiresAt: &exp,
		Extensions: map[string]string{api.ExtensionIngressPublic: "true", api.ExtensionRenewExtend: "900"}}); err != nil {
		t.Fatal(err)
	}
	hidden := sandbox.NewID()
	if _, err := other.Create(ctx, hidden, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint}); err != nil {
		t.Fatal(err)
	}

	var tg api.IngressTarget
	waitFor(t, podStarts, "the resolver sees the sandbox Running", func() bool {
		tg, err = res.Target(ctx, string(id), 8080)
		if err != nil && !errors.Is(err, ingress.ErrNotFound) {
			t.Fatalf("Target: %v", err)
		}
		return err == nil && tg.State == string(sandbox.StateRunning)
	})
	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tg.SandboxID != string(id) || tg.Port != 8080 || tg.Endpoint != pod.Status.PodIP+":8080" || !tg.Public ||
		tg.RenewExtendSeconds != 900 || tg.ExpiresAt == nil || !tg.ExpiresAt.Equal(exp) {
		t.Fatalf("target %+v (expires %v); pod IP %s, expiry %v", tg, tg.ExpiresAt, pod.Status.PodIP, exp)
	}
	if sb, err := rt.Get(ctx, id); err != nil || string(sb.Status.State) != tg.State {
		t.Fatalf("the runtime says %+v, %v; the resolver %s", sb, err, tg.State)
	}
	// The endpoint is where the web server answers.
	var body []byte
	waitFor(t, 1, "the sandbox's web server answers at "+tg.Endpoint, func() bool {
		resp, err := http.Get("http://" + tg.Endpoint + "/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(string(body), "hello from "+string(id)) {
		t.Fatalf("GET %s: %q", tg.Endpoint, body)
	}

	// A renewal through the runtime reaches the resolver.
	later := exp.Add(time.Hour)
	if err := rt.SetExpiry(ctx, id, &later); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 1, "the resolver sees the new expiry", func() bool {
		tg, err := res.Target(ctx, string(id), 8080)
		return err == nil && tg.ExpiresAt != nil && tg.ExpiresAt.Equal(later)
	})

	// Unknown: another scope's sandbox, an id never made, a bad port.
	for _, unknown := range []string{string(hidden), "no-such-sandbox"} {
		if _, err := res.Target(ctx, unknown, 8080); !errors.Is(err, ingress.ErrNotFound) {
			t.Errorf("Target(%s) = %v, want ErrNotFound", unknown, err)
		}
	}
	if _, err := res.Target(ctx, string(id), 0); err == nil || errors.Is(err, ingress.ErrNotFound) {
		t.Errorf("Target(port 0) = %v, want an error of its own", err)
	}

	// Gone once deleted.
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 1, "the resolver forgets the deleted sandbox", func() bool {
		_, err := res.Target(ctx, string(id), 8080)
		return errors.Is(err, ingress.ErrNotFound)
	})
}

// TestPodResolverBadNamespace: a malformed namespace is refused at once,
// named, rather than watched in vain.
func TestPodResolverBadNamespace(t *testing.T) {
	kc := testKubeconfig(t)
	start := time.Now()
	_, err := NewPodResolver(PodResolverConfig{Kubeconfig: kc, Namespaces: []string{"Not_A_Namespace"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "Not_A_Namespace") {
		t.Fatalf("NewPodResolver with a malformed namespace: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("refusing a malformed namespace took %v", time.Since(start))
	}
}

// TestRenewOnAccessLandsOnce: two servers (two runtimes, two lifecycle
// managers) are asked to renew the same sandbox at the same moment, as
// when two gateway replicas each send the renewal to a different server:
// exactly one write reaches the pod, every round; a renewal never
// shortens the expiry.
func TestRenewOnAccessLandsOnce(t *testing.T) {
	env := newTestEnv(t)
	cfg := env.config("renew")
	rts := []*Runtime{env.runtime(t, cfg), env.runtime(t, cfg)}
	managers := []*lifecycle.Manager{lifecycle.NewManager(rts[0], lifecycle.ManagerConfig{}), lifecycle.NewManager(rts[1], lifecycle.ManagerConfig{})}
	ctx := t.Context()

	id := sandbox.NewID()
	exp := time.Now().Add(10 * time.Minute)
	if _, err := rts[0].Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint, ExpiresAt: &exp}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 1, "both replicas see the sandbox's pod", func() bool { return rts[0].pod(id) != nil && rts[1].pod(id) != nil })

	// Every write of the expiry annotation, as the API server reports
	// them.
	w, err := env.cs.CoreV1().Pods(env.ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", podName(id)).String(),
		ResourceVersion: rts[0].pod(id).ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var (
		mu     sync.Mutex
		writes []string
	)
	last := rts[0].pod(id).Annotations[annExpires]
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			mu.Lock()
			if v := pod.Annotations[annExpires]; v != last {
				writes = append(writes, v)
				last = v
			}
			mu.Unlock()
		}
	}()
	countWrites := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(writes)
	}

	const rounds = 6
	for round := range rounds {
		// Each round asks for an expiry later than the one before by
		// more than the slack (n/10: 20+10r > 0.9*(30+10r) for r < 7), so
		// each round has one write to make.
		n := time.Duration(30+10*round) * time.Minute
		slack := n / 10
		start := make(chan struct{})
		var wg sync.WaitGroup
		results := make([]bool, len(managers))
		errs := make([]error, len(managers))
		for i, m := range managers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = m.RenewOnAccess(ctx, id, time.Now().Add(n), slack)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: replica %d: %v", round, i, err)
			}
		}
		if results[0] == results[1] {
			t.Fatalf("round %d: replicas report writes %v, want exactly one", round, results)
		}
		waitFor(t, 1, fmt.Sprintf("round %d's write reaches the watch", round), func() bool { return countWrites() >= round+1 })
	}
	// No write beyond one per round arrives late.
	time.Sleep(time.Second)
	if n := countWrites(); n != rounds {
		t.Fatalf("%d writes of the expiry in %d rounds: %v", n, rounds, writes)
	}

	// Never shorter: an earlier time, or one within the slack of the
	// current expiry, writes nothing.
	cur := rts[0].pod(id).Annotations[annExpires]
	for _, m := range managers {
		if wrote, err := m.RenewOnAccess(ctx, id, time.Now().Add(time.Minute), time.Second); err != nil || wrote {
			t.Fatalf("renew to a minute from now (expiry %s): wrote %v, %v", cur, wrote, err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n := countWrites(); n != rounds {
		t.Fatalf("a shorter renewal was written: %v", writes)
	}
	t.Logf("%d rounds of two concurrent renewals: %d writes", rounds, countWrites())
}

// Without an expiry there is nothing to extend.
func TestExtendExpiryWithoutExpiry(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("noexpiry"))
	id := sandbox.NewID()
	if _, err := rt.Create(context.Background(), id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint}); err != nil {
		t.Fatal(err)
	}
	if _, wrote, err := rt.ExtendExpiry(context.Background(), id, time.Now().Add(time.Hour), time.Minute); !errors.Is(err, sandbox.ErrConflict) || wrote {
		t.Fatalf("ExtendExpiry of a sandbox without expiry: wrote %v, %v", wrote, err)
	}
}
