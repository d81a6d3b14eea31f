package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
)

// baselinePod is what `kubectl run NAME --image busybox --restart Never
// -- sleep infinity` makes, with the sandboxes' limits and requests: one
// container, no init container, no probe.
func (c *cluster) baselinePod(name string) *corev1.Pod {
	grace := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: map[string]string{"run": name}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: entrypoint,
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limits["cpu"]),
						corev1.ResourceMemory: resource.MustParse(limits["memory"])},
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuRequest),
						corev1.ResourceMemory: resource.MustParse(memoryRequest)},
				},
			}},
		},
	}
}

// baselineCreateToCommand creates a bare pod, waits until the watch sees
// its container running (what `kubectl run` + `kubectl wait` wait for),
// and runs `true` in it through the API server as `kubectl exec` does.
// It returns the pod's name once the pod exists, so that the caller can
// delete it.
func (b *bench) baselineCreateToCommand(ctx context.Context, name string) (string, error) {
	if _, err := b.cl.cs.CoreV1().Pods(b.cl.ns).Create(ctx, b.cl.baselinePod(name), metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create pod %s: %w", name, err)
	}
	if _, err := b.watch.wait(ctx, name, stepStarted, 2*time.Minute); err != nil {
		return name, err
	}
	return name, b.cl.exec(ctx, name, "main", "true")
}

// exec runs argv in the pod's container through the API server, as
// kubectl exec does: WebSocket first, SPDY if the server refuses it.
func (c *cluster) exec(ctx context.Context, pod, container string, argv ...string) error {
	req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(c.ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(c.rest, http.MethodGet, req.URL().String())
	if err != nil {
		return fmt.Errorf("exec in %s: %w", pod, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(c.rest, http.MethodPost, req.URL())
	if err != nil {
		return fmt.Errorf("exec in %s: %w", pod, err)
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return fmt.Errorf("exec in %s: %w", pod, err)
	}
	var out bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out}); err != nil {
		return fmt.Errorf("exec %s in %s: %w: %s", strings.Join(argv, " "), pod, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
