package kubernetes

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/sandbox"
)

// TestEgressSidecar: a sandbox with a network policy gets osb-egress as
// the first init container, a native sidecar gated by its /healthz, with
// NET_ADMIN only, its token from the Secret and its state on a volume no
// other container mounts; no other container holds a network capability.
func TestEgressSidecar(t *testing.T) {
	cfg := testConfig(t, `
apiVersion: v1
kind: Pod
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000}
`)
	cfg.Egress.DNSUpstreams = []string{"192.0.2.53:5353"}
	cfg.Egress.AlwaysDeny = []string{"*.internal.test", "198.51.100.0/24"}
	policy := `{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`
	spec := sandbox.Spec{Image: "busybox", NetworkPolicy: []byte(policy)}
	pod, err := podFor(&cfg, "ns", "id-1", &spec, time.Now(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	inits := pod.Spec.InitContainers
	if len(inits) != 2 || inits[0].Name != containerEgress || inits[1].Name != containerInstall {
		t.Fatalf("init containers: %v", names(inits))
	}
	eg := inits[0]
	if eg.RestartPolicy == nil || *eg.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("osb-egress is not a native sidecar: restartPolicy %v", eg.RestartPolicy)
	}
	if eg.Image != "opensandbox/egress:latest" {
		t.Fatalf("image %q", eg.Image)
	}
	p := eg.StartupProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.IntValue() != sandbox.PortEgress ||
		p.PeriodSeconds != 1 || p.FailureThreshold < 60 {
		t.Fatalf("startup probe: %+v", p)
	}
	sc := eg.SecurityContext
	if sc == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) ||
		sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Fatalf("security context: %+v", sc)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range eg.Env {
		env[e.Name] = e
	}
	for name, want := range map[string]string{
		envEgressRules: policy, envEgressMode: "strict", envEgressPolicyFile: egressPolicyFile, envEgressMaxRules: "4096",
		envEgressUpstreams: "192.0.2.53:5353", envEgressAlwaysDeny: "*.internal.test,198.51.100.0/24",
	} {
		if env[name].Value != want {
			t.Errorf("%s = %q, want %q", name, env[name].Value, want)
		}
	}
	if _, ok := env[envEgressAlwaysAllow]; ok {
		t.Errorf("%s set with an empty list", envEgressAlwaysAllow)
	}
	if ref := env[envEgressToken].ValueFrom; ref == nil || ref.SecretKeyRef.Name != "osb-id-1" || ref.SecretKeyRef.Key != secretEgressKey {
		t.Errorf("token: %+v", env[envEgressToken])
	}
	if len(eg.VolumeMounts) != 1 || eg.VolumeMounts[0].Name != volumeEgress || eg.VolumeMounts[0].MountPath != egressStateDir {
		t.Fatalf("mounts: %+v", eg.VolumeMounts)
	}
	for _, c := range append(slices.Clone(pod.Spec.Containers), inits[1:]...) {
		for _, m := range c.VolumeMounts {
			if m.Name == volumeEgress {
				t.Errorf("container %s mounts osb-egress's state", c.Name)
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key != secretKey {
				t.Errorf("container %s reads %s from the secret", c.Name, e.ValueFrom.SecretKeyRef.Key)
			}
		}
		if caps := c.SecurityContext.Capabilities; slices.Contains(caps.Add, "NET_ADMIN") || slices.Contains(caps.Add, "NET_RAW") || !slices.Contains(caps.Drop, "ALL") {
			t.Errorf("container %s: capabilities %+v", c.Name, caps)
		}
	}
	if !hasEgress(pod) {
		t.Fatal("hasEgress is false")
	}

	// Pure: the same input gives the same pod.
	again, _ := podFor(&cfg, "ns", "id-1", &spec, pod.CreationTimestamp.Time, "", 0)
	a, _ := json.Marshal(pod.Spec)
	b, _ := json.Marshal(again.Spec)
	if string(a) != string(b) {
		t.Fatal("two builds of one pod differ")
	}

	// execd mounted from the node: osb-egress is the only init container.
	cfg.ExecdHostDir = "/opt/execd"
	pod, _ = podFor(&cfg, "ns", "id-1", &spec, time.Now(), "", 0)
	if got := names(pod.Spec.InitContainers); !slices.Equal(got, []string{containerEgress}) {
		t.Fatalf("init containers with execd_host_dir: %v", got)
	}
	// Without a policy, no sidecar.
	pod, _ = podFor(&cfg, "ns", "id-1", &sandbox.Spec{Image: "busybox"}, time.Now(), "", 0)
	if hasEgress(pod) {
		t.Fatal("a sandbox without a policy runs osb-egress")
	}

	sec := secretFor(&cfg, "ns", "id-1", "execd-token", "egress-token-value", "")
	if string(sec.Data[secretKey]) != "execd-token" || string(sec.Data[secretEgressKey]) != "egress-token-value" {
		t.Fatalf("secret: %v", sec.Data)
	}
	if _, ok := secretFor(&cfg, "ns", "id-1", "execd-token", "", "").Data[secretEgressKey]; ok {
		t.Fatal("a secret without egress holds an egress token")
	}
}

// TestEgressRefusedTemplates: templates under which the sidecar could not
// confine the sandbox are refused for sandboxes with a policy only.
func TestEgressRefusedTemplates(t *testing.T) {
	for name, tmpl := range map[string]string{
		"hostNetwork":           "apiVersion: v1\nkind: Pod\nspec: {hostNetwork: true}\n",
		"shareProcessNamespace": "apiVersion: v1\nkind: Pod\nspec: {shareProcessNamespace: true}\n",
	} {
		cfg := testConfig(t, tmpl)
		spec := sandbox.Spec{Image: "busybox", NetworkPolicy: []byte(`{"defaultAction":"deny"}`)}
		if _, err := podFor(&cfg, "ns", "id-1", &spec, time.Now(), "", 0); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want a refusal naming it", name, err)
		}
		spec.NetworkPolicy = nil
		if _, err := podFor(&cfg, "ns", "id-1", &spec, time.Now(), "", 0); err != nil {
			t.Errorf("%s without a policy: %v", name, err)
		}
	}
}

// TestEgressStatus: the sidecar's pull and start failures fail the
// sandbox with its own reasons, a sidecar not enforcing yet keeps it
// Pending, and once the sandbox runs the sidecar's restarts do not count.
func TestEgressStatus(t *testing.T) {
	now := time.Now()
	created := now.Add(-10 * time.Second)
	to := timeouts{start: time.Minute, schedule: time.Minute}
	started, notStarted := true, false
	pod := func(eg corev1.ContainerStatus, sandboxRunning bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
		p.Spec.NodeName = "node"
		p.Status.Phase = corev1.PodPending
		eg.Name = containerEgress
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{eg}
		if sandboxRunning {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSandbox,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created.Add(time.Second))}}}}
		}
		return p
	}
	waiting := func(reason string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "detail"}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	for _, c := range []struct {
		name   string
		pod    *corev1.Pod
		state  sandbox.State
		reason string
	}{
		{"pull", pod(corev1.ContainerStatus{State: waiting("ErrImagePull")}, false), sandbox.StateFailed, "EGRESS_IMAGE_PULL_FAILED"},
		{"crash loop", pod(corev1.ContainerStatus{State: waiting("CrashLoopBackOff"),
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "nftables: operation not permitted"}}}, false),
			sandbox.StateFailed, "EGRESS_START_FAILED"},
		{"config", pod(corev1.ContainerStatus{State: waiting("CreateContainerConfigError")}, false), sandbox.StateFailed, "EGRESS_START_FAILED"},
		{"starting", pod(corev1.ContainerStatus{State: running, Started: &notStarted}, false), sandbox.StatePending, "EGRESS_STARTING"},
		{"enforcing", pod(corev1.ContainerStatus{State: running, Started: &started}, false), sandbox.StatePending, "POD_PENDING"},
		{"restarting after the sandbox started", pod(corev1.ContainerStatus{State: waiting("CrashLoopBackOff")}, true), sandbox.StatePending, "EXECD_STARTING"},
		{"exited after the sandbox started", pod(corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}}, true),
			sandbox.StatePending, "EXECD_STARTING"},
	} {
		got := statusOf(c.pod, false, created, now, to)
		if got.State != c.state || got.Reason != c.reason {
			t.Errorf("%s: %s %s (%s), want %s %s", c.name, got.State, got.Reason, got.Message, c.state, c.reason)
		}
	}
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// TestPoolWithPolicyRefused: a pool whose template has a network policy
// is refused on Kubernetes (a warm pod's egress token is not handed over
// with its claim yet), never started without its token.
func TestPoolWithPolicyRefused(t *testing.T) {
	p := sandbox.Pool{Name: "egress", Template: sandbox.Spec{Image: "opensandbox/busybox", NetworkPolicy: []byte(`{"defaultAction":"deny","egress":[]}`)},
		Capacity: sandbox.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 1}}
	err := (&Runtime{}).checkPool(&p)
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "network policy") {
		t.Fatalf("checkPool: %v", err)
	}
}
