package kubernetes

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/sandbox"
)

func testConfig(t *testing.T, template string) Config {
	t.Helper()
	cfg := Config{LabelScope: "unit", DefaultCPU: "1", DefaultMemory: "1Gi", HostPathAllowlist: []string{"/srv", "/srv/data/"}}
	if template != "" {
		cfg.PodTemplateFile = filepath.Join(t.TempDir(), "pod.yaml")
		if err := os.WriteFile(cfg.PodTemplateFile, []byte(template), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestPodFor(t *testing.T) {
	cfg := testConfig(t, `
apiVersion: v1
kind: Pod
metadata:
  labels: {team: agents}
spec:
  nodeSelector: {pool: sandboxes}
  tolerations: [{key: sandbox, operator: Exists}]
  dnsPolicy: Default
  containers: [{name: ignored, image: ignored}]
`)
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	spec := sandbox.Spec{
		Image: "python:3.11", Entrypoint: []string{"python3", "-m", "http.server"},
		Env:       map[string]string{"B": "2", "A": "1", envExecdToken: "smuggled"},
		Metadata:  map[string]string{"team": "x", "with space": "y"},
		Resources: sandbox.Resources{CPUMillis: 2000, MemoryBytes: 64 << 20},
		Volumes: []sandbox.Volume{{Name: "data", MountPath: "/data", SubPath: "a",
			// The server resolved a link of its own; the node does not share it.
			HostPath: "/mnt/elsewhere/data", HostPathAsWritten: "/srv/data"}},
		Platform:  &sandbox.Platform{OS: "linux", Arch: "arm64"},
		ExpiresAt: &exp,
	}
	pod, err := podFor(&cfg, "ns", "id-1", &spec, exp, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(pod)
	if strings.Contains(string(raw), "smuggled") {
		t.Fatal("a request's EXECD_ACCESS_TOKEN reached the pod")
	}
	c := pod.Spec.Containers[0]
	if len(pod.Spec.Containers) != 1 || c.Image != "python:3.11" || c.Command[0] != execdInSandbox ||
		strings.Join(c.Args, " ") != "-- python3 -m http.server" {
		t.Fatalf("container: %+v", c)
	}
	if len(c.Env) != 3 || c.Env[0].Name != "A" || c.Env[1].Name != "B" || c.Env[2].ValueFrom.SecretKeyRef.Name != "osb-id-1" {
		t.Fatalf("env: %+v", c.Env)
	}
	if pod.Labels["team"] != "agents" || pod.Labels[labelID] != "id-1" || pod.Labels[metaLabelPrefix+"team"] != "x" ||
		pod.Labels[labelScope] != "unit" || len(pod.Labels) != 5 {
		t.Fatalf("labels: %v", pod.Labels)
	}
	if pod.Annotations[annExpires] != "2030-01-02T03:04:05Z" || pod.Annotations[annEntrypoint] != `["python3","-m","http.server"]` {
		t.Fatalf("annotations: %v", pod.Annotations)
	}
	if pod.Spec.NodeSelector["pool"] != "sandboxes" || pod.Spec.NodeSelector[corev1.LabelArchStable] != "arm64" ||
		len(pod.Spec.Tolerations) != 1 || pod.Spec.DNSPolicy != corev1.DNSDefault {
		t.Fatalf("pod-level settings of the template lost: %+v", pod.Spec)
	}
	if *pod.Spec.AutomountServiceAccountToken || *c.SecurityContext.AllowPrivilegeEscalation || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatal("hardening missing")
	}
	lim, req := c.Resources.Limits, c.Resources.Requests
	if lim.Cpu().MilliValue() != 2000 || lim.Memory().Value() != 64<<20 || req.Cpu().MilliValue() != 100 || req.Memory().Value() != 64<<20 {
		t.Fatalf("resources: limits %v requests %v (the memory request is capped at the limit)", lim, req)
	}
	// Mounted as the outermost allow-list entry, the rest a subPath the
	// kubelet keeps inside it: /srv's sandboxes could make /srv/data a
	// link, which a hostPath of /srv/data would follow.
	if v := pod.Spec.Volumes[1]; v.HostPath == nil || v.HostPath.Path != "/srv" || c.VolumeMounts[1].SubPath != "data/a" {
		t.Fatalf("volume: %+v %+v", v, c.VolumeMounts)
	}

	// A warm pod starts execd without the entrypoint, claimable.
	warm, err := podFor(&cfg, "ns", "id-2", &sandbox.Spec{Image: "busybox"}, exp, "py", 7)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(warm.Spec.Containers[0].Args, " ") != "--claimable --" || warm.Labels[labelWarm] != "true" ||
		warm.Labels[labelPool] != "py" || warm.Annotations[annRevision] != "7" {
		t.Fatalf("warm pod: %v %v %v", warm.Spec.Containers[0].Args, warm.Labels, warm.Annotations)
	}

	// Registry credentials: a pull secret of the sandbox's own, named in
	// the pod, never the credentials themselves.
	authSpec := sandbox.Spec{Image: "registry.example:5000/team/img:1", ImageAuth: &sandbox.RegistryAuth{Username: "u", Password: "pw-secret"}}
	authed, err := podFor(&cfg, "ns", "id-3", &authSpec, exp, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if raw, _ := json.Marshal(authed); strings.Contains(string(raw), "pw-secret") || len(authed.Spec.ImagePullSecrets) != 1 ||
		authed.Spec.ImagePullSecrets[0].Name != "osb-id-3-pull" {
		t.Fatalf("pod of a create with credentials: pull secrets %v", authed.Spec.ImagePullSecrets)
	}
	for image, host := range map[string]string{"registry.example:5000/team/img:1": "registry.example:5000", "busybox": "https://index.docker.io/v1/"} {
		sec, err := pullSecretFor(&cfg, "ns", "id-3", image, authSpec.ImageAuth)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Auths map[string]struct{ Username, Password, Auth string }
		}
		json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &doc)
		if a := doc.Auths[host]; sec.Type != corev1.SecretTypeDockerConfigJson || a.Password != "pw-secret" || a.Auth != "dTpwdy1zZWNyZXQ=" {
			t.Fatalf("pull secret for %s: %s %+v", image, sec.Type, doc)
		}
	}

	// ephemeral-storage: the sandbox's limit, or the default, with a
	// request of at most the limit; none at all without a limit.
	for _, c := range []struct {
		def, req        string
		own             int64
		limit, reserved int64
	}{
		{"", "", 0, 0, 0},
		{"", "", 64 << 20, 64 << 20, 64 << 20},
		{"", "", 10 << 30, 10 << 30, 256 << 20},
		{"2Gi", "", 0, 2 << 30, 256 << 20},
		{"2Gi", "1Gi", 4 << 30, 4 << 30, 1 << 30},
	} {
		sc := cfg
		sc.DefaultStorage, sc.StorageRequest = c.def, c.req
		sc.setDefaults()
		p, err := podFor(&sc, "ns", "id-s", &sandbox.Spec{Image: "x", Resources: sandbox.Resources{StorageBytes: c.own}}, exp, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		r := p.Spec.Containers[0].Resources
		lim, limOK := r.Limits[corev1.ResourceEphemeralStorage]
		req, reqOK := r.Requests[corev1.ResourceEphemeralStorage]
		if limOK != (c.limit > 0) || reqOK != (c.reserved > 0) || lim.Value() != c.limit || req.Value() != c.reserved {
			t.Errorf("default %q request %q own %d: limit %v request %v, want %d and %d", c.def, c.req, c.own, lim.String(), req.String(), c.limit, c.reserved)
		}
		if c.limit == 64<<20 && (lim.String() != "64Mi" || req.String() != "64Mi") {
			t.Errorf("limit written %q, request %q: want 64Mi, as the kubelet then quotes it", lim.String(), req.String())
		}
	}

	// Refusals.
	for name, s := range map[string]sandbox.Spec{
		"gpu all":           {Image: "x", Resources: sandbox.Resources{GPUs: "all"}},
		"runtime class":     {Image: "x", Extensions: map[string]string{extRuntimeClass: "kata"}},
		"bad claim name":    {Image: "x", Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v", Claim: &sandbox.Claim{Name: "Not_Valid"}}}},
		"volume no backend": {Image: "x", Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v"}}},
		"host path outside": {Image: "x", Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v", HostPath: "/srvx"}}},
		"bad image":         {Image: "img@sha256:nothex", ImageAuth: &sandbox.RegistryAuth{Username: "u", Password: "p"}},
	} {
		if _, err := podFor(&cfg, "ns", "id", &s, exp, "", 0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]Config{
		"pull policy":   {ImagePullPolicy: "always"},
		"cpu":           {DefaultCPU: "lots"},
		"scope":         {LabelScope: "Not A Label"},
		"runtime class": {RuntimeClassName: "gvisor", AllowedRuntimeClasses: []string{"runc"}},
		"lease":         {LeaseDuration: time.Second, RenewDeadline: 2 * time.Second},
		"template":      {PodTemplateFile: "/nonexistent/pod.yaml"},
		"storage":       {DefaultStorage: "10GB"},
		"storage req":   {StorageRequest: "lots"},
		"storage neg":   {DefaultStorage: "-1Gi"},
	} {
		if err := c.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := (Config{}).Check(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "pod.yaml")
	os.WriteFile(bad, []byte("kind: Deployment\n"), 0o600)
	if err := (Config{PodTemplateFile: bad}).Check(); err == nil || !strings.Contains(err.Error(), "want Pod") {
		t.Fatalf("a template that is not a Pod: %v", err)
	}
}

func TestStatusOf(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created), Annotations: map[string]string{}},
			Spec: corev1.PodSpec{NodeName: "node"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	}
	waiting := func(reason, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: containerSandbox, Image: "img", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
	}
	running := corev1.ContainerStatus{Name: containerSandbox, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	cases := []struct {
		name   string
		mod    func(*corev1.Pod)
		up     bool
		now    time.Time
		state  sandbox.State
		reason string
	}{
		{"scheduling", func(p *corev1.Pod) { p.Spec.NodeName = "" }, false, created, sandbox.StatePending, "SCHEDULING"},
		{"unschedulable for now", func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes"}}
		}, false, created.Add(5 * time.Second), sandbox.StatePending, "UNSCHEDULABLE"},
		{"unschedulable", func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes"}}
		}, false, created.Add(15 * time.Second), sandbox.StateFailed, "UNSCHEDULABLE"},
		{"failure recorded", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			p.Annotations[annFailure] = `{"reason":"UNSCHEDULABLE","message":"no node"}`
		}, true, created, sandbox.StateFailed, "UNSCHEDULABLE"},
		{"never ready, container running", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{
				Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created.Add(time.Second))}}}}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(created)}}
		}, false, created.Add(time.Hour), sandbox.StateFailed, "START_TIMEOUT"},
		{"readiness lost a moment ago", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{
				Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created)}}}}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(created.Add(2 * time.Hour))}}
		}, false, created.Add(2*time.Hour + 5*time.Second), sandbox.StateRunning, "EXECD_NOT_READY"},
		{"readiness lost for long", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{
				Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created)}}}}
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(created.Add(time.Hour))}}
		}, false, created.Add(2 * time.Hour), sandbox.StateUnknown, "EXECD_NOT_READY"},
		{"unschedulable past the start timeout", func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes"}}
		}, false, created.Add(11 * time.Minute), sandbox.StateFailed, "START_TIMEOUT"},
		{"pulling", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting("ContainerCreating", "")}
		}, false, created, sandbox.StatePending, "CONTAINER_CREATING"},
		{"pull failed", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting("ErrImagePull", "connection refused")}
		}, false, created, sandbox.StateFailed, "IMAGE_PULL_FAILED"},
		{"config error", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{waiting("CreateContainerConfigError", "secret not found")}
		}, false, created, sandbox.StateFailed, "CONTAINER_START_FAILED"},
		{"execd image", func(p *corev1.Pod) {
			s := waiting("ImagePullBackOff", "")
			s.Name = containerInstall
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{s}
		}, false, created, sandbox.StateFailed, "EXECD_IMAGE_PULL_FAILED"},
		{"starting", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{running}
		}, false, created, sandbox.StatePending, "EXECD_STARTING"},
		{"probed up", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{running}
		}, true, created, sandbox.StateRunning, "EXECD_READY"},
		{"ready", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}, false, created, sandbox.StateRunning, "POD_READY"},
		{"claiming", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Annotations[annHandover] = "x"
		}, true, created, sandbox.StatePending, "CLAIMING"},
		{"oom", func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerSandbox, State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}}}
		}, false, created, sandbox.StateFailed, "OOM_KILLED"},
		{"exited", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }, false, created, sandbox.StateTerminated, "SANDBOX_EXITED"},
		// The kubelet's messages, as the test cluster's kubelet writes them.
		{"over its storage limit", func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
			p.Status.Message = "Pod ephemeral local storage usage exceeds the total limit of containers 64Mi. "
		}, false, created, sandbox.StateFailed, "DISK_LIMIT_EXCEEDED"},
		{"container over its storage limit", func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
			p.Status.Message = `Container sandbox exceeded its local ephemeral storage limit "64Mi". `
		}, false, created, sandbox.StateFailed, "DISK_LIMIT_EXCEEDED"},
		{"emptyDir over its size", func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
			p.Status.Message = `Usage of EmptyDir volume "data" exceeds the limit "1Gi". `
		}, false, created, sandbox.StateFailed, "DISK_LIMIT_EXCEEDED"},
		{"node short of disk", func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
			p.Status.Message = "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. "
		}, false, created, sandbox.StateFailed, "EVICTED"},
		{"start timeout", func(p *corev1.Pod) {}, false, created.Add(time.Hour), sandbox.StateFailed, "START_TIMEOUT"},
	}
	for _, c := range cases {
		pod := base()
		c.mod(pod)
		to := timeouts{start: 10 * time.Minute, schedule: 15 * time.Second}
		if strings.Contains(c.name, "past the start timeout") {
			to.schedule = time.Hour // a schedule timeout longer than the start timeout
		}
		st := statusOf(pod, c.up, created, c.now, to)
		if st.State != c.state || st.Reason != c.reason {
			t.Errorf("%s: %s %s (%s), want %s %s", c.name, st.State, st.Reason, st.Message, c.state, c.reason)
		}
	}
}

func TestOverlay(t *testing.T) {
	o := newOverlay[*corev1.Pod]()
	pod := func(rv string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: rv}}
	}
	o.wrote(pod("10"))
	if got, ok := o.resolve("p", nil, false); !ok || got.ResourceVersion != "10" {
		t.Fatal("a written pod the informer has not delivered is not found")
	}
	if got, _ := o.resolve("p", pod("9"), true); got.ResourceVersion != "10" {
		t.Fatal("an older informer copy wins over a write")
	}
	o.seen(pod("9"))
	if got, _ := o.resolve("p", pod("9"), true); got.ResourceVersion != "10" {
		t.Fatal("an older delivery dropped the write")
	}
	o.seen(pod("11"))
	if got, _ := o.resolve("p", pod("11"), true); got.ResourceVersion != "11" {
		t.Fatal("a newer delivery does not win")
	}
	o.removed("p", "")
	if _, ok := o.resolve("p", pod("11"), true); ok {
		t.Fatal("a deleted pod is found")
	}
	o.wrote(pod("12"))
	if _, ok := o.resolve("p", nil, false); ok {
		t.Fatal("a write that finished after the delete brought the pod back")
	}
	o.gone("p")
	if _, ok := o.resolve("p", nil, false); ok {
		t.Fatal("a gone pod is found")
	}
}

// TestPassThroughExtensions: extensions opensandbox.extensions.<suffix>
// become pod annotations opensandbox.io/extensions.<suffix>, as the
// reference server makes them; a suffix Kubernetes would refuse as an
// annotation key is a 400 at create.
func TestPassThroughExtensions(t *testing.T) {
	cfg := Config{LabelScope: "unit", DefaultCPU: "1", DefaultMemory: "1Gi"}
	spec := &sandbox.Spec{Image: "busybox", Extensions: map[string]string{
		"opensandbox.extensions.team": "agents", "opensandbox.extensions.cost-center.id": "42"}}
	pod, err := podFor(&cfg, "ns", "id-1", spec, time.Now(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Annotations["opensandbox.io/extensions.team"]; got != "agents" {
		t.Errorf("annotation extensions.team = %q", got)
	}
	if got := pod.Annotations["opensandbox.io/extensions.cost-center.id"]; got != "42" {
		t.Errorf("annotation extensions.cost-center.id = %q", got)
	}
	for _, bad := range []string{"opensandbox.extensions.", "opensandbox.extensions.no spaces", "opensandbox.extensions." + strings.Repeat("x", 60)} {
		_, err := podFor(&cfg, "ns", "id-2", &sandbox.Spec{Image: "busybox", Extensions: map[string]string{bad: "v"}}, time.Now(), "", 0)
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("extension %q: %v, want ErrInvalid", bad, err)
		}
	}
}

// TestFailurePatch: a failure is recorded as the annotation statusOf
// reads back, and ends the pod through activeDeadlineSeconds only when
// the pod has not finished and has no deadline of its own.
func TestFailurePatch(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := failure{Reason: "ENTRYPOINT_FAILED", Message: "the entrypoint /x could not start", Since: since}
	seven := int64(7)
	cases := []struct {
		name         string
		phase        corev1.PodPhase
		deadline     *int64
		wantDeadline bool
	}{
		{"running", corev1.PodRunning, nil, true},
		{"pending", corev1.PodPending, nil, true},
		{"has a deadline", corev1.PodRunning, &seven, false},
		{"failed", corev1.PodFailed, nil, false},
		{"succeeded", corev1.PodSucceeded, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{ActiveDeadlineSeconds: c.deadline}, Status: corev1.PodStatus{Phase: c.phase}}
			b, err := json.Marshal(failurePatch(pod, f))
			if err != nil {
				t.Fatal(err)
			}
			var patch struct {
				Metadata struct{ Annotations map[string]string }
				Spec     *struct {
					ActiveDeadlineSeconds int64 `json:"activeDeadlineSeconds"`
				}
			}
			if err := json.Unmarshal(b, &patch); err != nil {
				t.Fatal(err)
			}
			if got := patch.Spec != nil && patch.Spec.ActiveDeadlineSeconds == 1; got != c.wantDeadline {
				t.Errorf("patch %s: activeDeadlineSeconds 1 is %v, want %v", b, got, c.wantDeadline)
			}
			pod.Annotations = patch.Metadata.Annotations
			if c.phase == corev1.PodSucceeded {
				return // statusOf says Terminated whatever was recorded
			}
			st := statusOf(pod, false, since, since.Add(time.Minute), timeouts{start: time.Minute, schedule: time.Minute})
			if st.State != sandbox.StateFailed || st.Reason != f.Reason || st.Message != f.Message || !st.Since.Equal(since) {
				t.Errorf("status read back from %s: %+v, want Failed %s %q since %v", b, st, f.Reason, f.Message, since)
			}
		})
	}
}

// TestReadyFor: a sandbox is asked about its entrypoint until it has
// been Ready for freshStart.
func TestReadyFor(t *testing.T) {
	now := time.Now()
	ready := func(status corev1.ConditionStatus, ago time.Duration) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))},
			{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.NewTime(now.Add(-ago))},
		}}}
	}
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"no conditions", &corev1.Pod{}, false},
		{"not ready for an hour", ready(corev1.ConditionFalse, time.Hour), false},
		{"ready a moment ago", ready(corev1.ConditionTrue, time.Second), false},
		{"ready just under freshStart", ready(corev1.ConditionTrue, freshStart-time.Second), false},
		{"ready for freshStart", ready(corev1.ConditionTrue, freshStart), true},
		{"ready for an hour", ready(corev1.ConditionTrue, time.Hour), true},
	} {
		if got := readyFor(c.pod, freshStart, now); got != c.want {
			t.Errorf("%s: readyFor = %v, want %v", c.name, got, c.want)
		}
	}
}
