package kubernetes

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestStorageLimitEviction: the kubelet evicts a sandbox's pod that
// writes past its ephemeral-storage limit, and the runtime says why
// (DISK_LIMIT_EXCEEDED); a sandbox below its limit keeps running.
func TestStorageLimitEviction(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("disk"))
	ctx := context.Background()
	const limit = 64 << 20
	create := func(script string) sandbox.ID {
		id := sandbox.NewID()
		if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sh", "-c", script},
			Resources: sandbox.Resources{StorageBytes: limit}}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// execd's own copy (an emptyDir of some 10 MB) counts toward the
	// pod's total too; 16 MB more stays below 64 MiB.
	under := create("dd if=/dev/zero of=/tmp/some bs=1M count=16; sleep 100000")
	over := create("dd if=/dev/zero of=/tmp/fill bs=1M count=256; sleep 100000")

	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(over), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0].Resources
	if lim := c.Limits[corev1.ResourceEphemeralStorage]; lim.Value() != limit {
		t.Fatalf("the pod's ephemeral-storage limit is %v, want 64Mi", lim.String())
	}

	// The kubelet looks every 10 s, from stats it refreshes about as
	// often.
	start := time.Now()
	var sb *sandbox.Sandbox
	testwait.Wait{What: "a sandbox writing 256 MB past its 64 MiB limit to be evicted", Starts: 3 * podStarts, Every: 200 * time.Millisecond,
		Describe: func() string { return describe(rt, over) }}.Until(t, func() bool {
		if sb, err = rt.Get(ctx, over); err != nil {
			t.Fatal(err)
		}
		return sb.Status.State == sandbox.StateFailed
	})
	t.Logf("evicted after %v: %s: %s", time.Since(start).Round(time.Second), sb.Status.Reason, sb.Status.Message)
	if sb.Status.Reason != "DISK_LIMIT_EXCEEDED" || !strings.Contains(sb.Status.Message, "64Mi") {
		t.Fatalf("status %+v, want DISK_LIMIT_EXCEEDED with the kubelet's message", sb.Status)
	}
	waitFor(t, podStarts, "the failure is recorded on the pod", func() bool {
		pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(over), metav1.GetOptions{})
		return err == nil && strings.Contains(pod.Annotations[annFailure], "DISK_LIMIT_EXCEEDED")
	})

	if sb, err := rt.Get(ctx, under); err != nil || sb.Status.State != sandbox.StateRunning {
		t.Fatalf("the sandbox below its limit: %+v, %v", sb, err)
	}
}
