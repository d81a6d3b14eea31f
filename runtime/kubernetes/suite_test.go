package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/sandbox"
)

// suiteHooks are the conformance suite's hooks: what it needs done behind
// the runtime's API, done through the cluster's API.
func (e *testEnv) suiteHooks() runtimetest.Hooks {
	return runtimetest.Hooks{
		WarmLeft: func(t *testing.T, srt sandbox.Runtime, pool string) []sandbox.ID {
			var out []sandbox.ID
			for _, pod := range srt.(*Runtime).allPods() {
				if pod.Labels[labelPool] == pool && pod.Labels[labelWarm] != "" {
					out = append(out, sandbox.ID(pod.Labels[labelID]))
				}
			}
			return out
		},
		// The sandbox's Secret no longer holds the token its execd was
		// started with: execd refuses the hand-over with 401.
		BreakWarm: func(t *testing.T, srt sandbox.Runtime, id sandbox.ID) {
			rt := srt.(*Runtime)
			wrong := newToken()
			patch, _ := json.Marshal(map[string]any{"data": map[string]string{secretKey: base64.StdEncoding.EncodeToString([]byte(wrong))}})
			if _, err := e.cs.CoreV1().Secrets(e.ns).Patch(context.Background(), podName(id), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatalf("patch the token of %s: %v", id, err)
			}
			waitFor(t, 1, "the runtime sees the patched token of "+string(id), func() bool { return rt.token(id) == wrong })
		},
		Reopen: func(t *testing.T, srt sandbox.Runtime) sandbox.Runtime {
			rt := srt.(*Runtime)
			cfg := e.config(rt.cfg.LabelScope)
			rt.Close()
			next := e.runtime(t, cfg)
			waitLeader(t, 30*time.Second, next)
			return next
		},
		Vanish: func(t *testing.T, srt sandbox.Runtime, id sandbox.ID) {
			zero := int64(0)
			if err := e.cs.CoreV1().Pods(e.ns).Delete(context.Background(), podName(id), metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatalf("delete the pod of %s: %v", id, err)
			}
		},
		Output: func(line string) []string {
			return []string{"sh", "-c", "echo " + line + "; exec sleep 100000"}
		},
	}
}
