package kubernetes

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// missingEntrypoint is the entrypoint the reference clients give
// code-interpreter sandboxes; the test image has no such file.
const missingEntrypoint = "/opt/code-interpreter/code-interpreter.sh"

// TestEntrypointCannotStart: a sandbox whose entrypoint does not exist is
// Failed with reason ENTRYPOINT_FAILED and execd's error, never Running;
// the failure is recorded on its pod, which the kubelet then stops, so a
// second runtime (a restarted server, another replica) reports the same.
// An entrypoint that started and exited leaves the sandbox Running. A
// claim from a warm pool with an entrypoint that cannot start answers the
// same Failed sandbox.
func TestEntrypointCannotStart(t *testing.T) {
	env := newTestEnv(t)
	cfg := env.config("entry-" + randomSuffix())
	rt := env.runtime(t, cfg)
	ctx := context.Background()
	if _, err := rt.CreatePool(ctx, testPoolDef("entry", 1)); err != nil {
		t.Fatal(err)
	}

	bad, exits := sandbox.NewID(), sandbox.NewID()
	for id, argv := range map[sandbox.ID][]string{bad: {missingEntrypoint, "--port", "8888"}, exits: {"sh", "-c", "echo bye; exit 3"}} {
		if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: argv}); err != nil {
			t.Fatal(err)
		}
	}
	wantFailed := func(t *testing.T, who string, sb *sandbox.Sandbox) {
		t.Helper()
		st := sb.Status
		if st.State != sandbox.StateFailed || st.Reason != api.ReasonEntrypointFailed ||
			!strings.Contains(st.Message, "the entrypoint "+missingEntrypoint) || !strings.Contains(st.Message, "no such file") {
			t.Fatalf("%s: sandbox %s is %+v, want Failed/%s naming %s and execd's error", who, sb.ID, st, api.ReasonEntrypointFailed, missingEntrypoint)
		}
	}
	// Pending, then Failed: never Running.
	sb := waitFailed(t, rt, bad)
	wantFailed(t, "the runtime that made it", sb)
	t.Logf("status: %s: %s", sb.Status.Reason, sb.Status.Message)
	if !strings.Contains(sb.Status.Message, "last lines of its log") {
		t.Errorf("message %q: want the last lines of the pod's log", sb.Status.Message)
	}

	// Recorded on the pod, which the kubelet then stops.
	var pod *corev1.Pod
	waitFor(t, 1, "the failure is recorded on the pod and the pod stopped", func() bool {
		var err error
		pod, err = env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(bad), metav1.GetOptions{})
		return err == nil && strings.Contains(pod.Annotations[annFailure], api.ReasonEntrypointFailed) &&
			pod.Spec.ActiveDeadlineSeconds != nil && pod.Status.Phase == corev1.PodFailed
	})
	var rec failure
	if err := json.Unmarshal([]byte(pod.Annotations[annFailure]), &rec); err != nil || rec.Message != sb.Status.Message {
		t.Errorf("recorded failure %+v (%v), want the message %q", rec, err, sb.Status.Message)
	}
	if sb, err := rt.Get(ctx, bad); err != nil {
		t.Fatal(err)
	} else {
		wantFailed(t, "after the pod stopped", sb)
	}

	// The entrypoint that ran and exited: Running, and execd serves.
	waitState(t, rt, exits, sandbox.StateRunning)
	ep, err := rt.Endpoint(ctx, exits, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 1, "the entrypoint that exits has exited", func() bool {
		return strings.Contains(entrypointStatus(t, ep), `"running":false`)
	})
	if out := runCommand(t, ep, "echo still-serving"); !strings.Contains(out, "still-serving") {
		t.Fatalf("execd after its entrypoint exited: %q", out)
	}
	// /ready, without the token, says the sandbox serves.
	if resp, err := http.Get("http://" + ep.Address + api.ExecdReadyPath); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s of the sandbox whose entrypoint exited: %v %v, want 200", api.ExecdReadyPath, resp, err)
	} else {
		resp.Body.Close()
	}

	// A claim of a warm pod with an entrypoint that cannot start.
	waitPoolStatus(t, "entry", 1, func(st sandbox.PoolStatus) bool { return st.Available == 1 && st.Starting == 0 }, rt)
	claimed, err := rt.Claim(ctx, "entry", sandbox.Spec{Entrypoint: []string{missingEntrypoint}})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	wantFailed(t, "the claim's answer", claimed)
	cpod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(claimed.ID), metav1.GetOptions{})
	if err != nil || !strings.Contains(cpod.Annotations[annFailure], api.ReasonEntrypointFailed) || cpod.Annotations[annHandover] != "" ||
		cpod.Spec.ActiveDeadlineSeconds == nil {
		t.Fatalf("the claimed pod: %v %v, %v: want the failure recorded by the hand-over's patch", cpod.Annotations, cpod.Spec.ActiveDeadlineSeconds, err)
	}

	// Another runtime on the same cluster, as a restarted server would be,
	// reads the same from the pods.
	other := env.runtime(t, cfg)
	for _, id := range []sandbox.ID{bad, claimed.ID} {
		sb, err := other.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		wantFailed(t, "a second runtime", sb)
	}
	waitState(t, other, exits, sandbox.StateRunning)
}

// entrypointStatus returns execd's answer about the entrypoint.
func entrypointStatus(t *testing.T, ep sandbox.Endpoint) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+ep.Address+"/command/status/"+api.EntrypointCommandID, nil)
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
