package kubernetes

import (
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Label keys. Labels select (scope, id, pool, warm); annotations carry
// the rest of what the runtime knows about a sandbox, so the cluster is
// the only record and any replica of the server can serve any sandbox.
const (
	labelScope = "opensandbox.io/scope"
	labelID    = "opensandbox.io/id"
	// labelKind tells a sandbox's pod ("sandbox"), its token Secret
	// ("token") and a pool's definition ("pool") apart.
	labelKind = "opensandbox.io/kind"
	// labelPool names the warm pool a pod was started for; it stays after
	// the pod is handed out.
	labelPool = "opensandbox.io/pool"
	// labelWarm marks a warm pod not handed out yet. A claim removes it,
	// with the pod's resourceVersion as precondition, so that only one
	// claim can win.
	labelWarm = "opensandbox.io/warm"
	// labelOwner marks a PersistentVolumeClaim made for a sandbox and
	// deleted with it.
	labelOwner = "opensandbox.io/volume-owner"
	// metaLabelPrefix mirrors the sandbox's metadata into labels where
	// key and value are valid label parts, for kubectl selectors.
	metaLabelPrefix = "metadata.opensandbox.io/"
)

// Annotation keys.
const (
	annCreated    = "opensandbox.io/created"
	annImage      = "opensandbox.io/image"
	annSnapshot   = "opensandbox.io/snapshot"
	annEntrypoint = "opensandbox.io/entrypoint"
	annMetadata   = "opensandbox.io/metadata"
	annExtensions = "opensandbox.io/extensions"
	// extPassThrough prefixes the extensions copied to pod annotations
	// annExtensions + "." + suffix, as the reference server does.
	extPassThrough = "opensandbox.extensions."
	annExpires     = "opensandbox.io/expires-at"
	annSecure      = "opensandbox.io/secure-access"
	annPlatform    = "opensandbox.io/platform"
	// annRevision is the revision of the pool template a warm pod was
	// made from.
	annRevision = "opensandbox.io/pool-revision"
	// annHandover is set while a claim hands a warm pod over: the pod is
	// the claimer's, but its execd has not taken the new token yet. A
	// handover older than handoverTimeout was interrupted, and the pod is
	// removed.
	annHandover = "opensandbox.io/handover"
	// annFailure records, as JSON, the failure the leader saw first, so
	// that a sandbox once reported Failed stays Failed even if the
	// cluster later manages to run its pod.
	annFailure = "opensandbox.io/failure"
)

// Kinds of the runtime's objects.
const (
	kindSandbox = "sandbox"
	kindToken   = "token"
	kindPool    = "pool"
	// kindPull is a Secret holding the registry credentials of one
	// create, removed once the image is pulled.
	kindPull = "pull"
)

// Container and volume names of a sandbox pod.
const (
	containerSandbox = "sandbox"
	containerInstall = "install-execd"
	volumeExecd      = "opensandbox-execd"
	execdDir         = "/opt/opensandbox/bin"
	execdInSandbox   = execdDir + "/execd"
	// envExecdToken carries the token to execd, which moves it out of its
	// environment at start.
	envExecdToken = "EXECD_ACCESS_TOKEN"
	secretKey     = "token"
)

// defaultCaps is the capability set of a sandbox, as on Docker: what root
// needs to install packages and run services, without NET_RAW, MKNOD,
// SETFCAP and AUDIT_WRITE.
var defaultCaps = []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT"}

func podName(id sandbox.ID) string { return "osb-" + string(id) }

func newToken() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func invalid(msg string) error {
	return sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, msg)
}

// podFor builds the pod of a sandbox. It is pure: the same input gives the
// same pod. pool names the warm pool the pod is started for, if any: such
// a pod starts execd without the entrypoint, which a claim brings.
func podFor(cfg *Config, ns string, id sandbox.ID, spec *sandbox.Spec, created time.Time, pool string, revision int64) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if cfg.template != nil {
		pod.ObjectMeta.Labels = maps.Clone(cfg.template.Labels)
		pod.ObjectMeta.Annotations = maps.Clone(cfg.template.Annotations)
		pod.Spec = *cfg.template.Spec.DeepCopy()
	}
	pod.Name, pod.Namespace = podName(id), ns
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	maps.Copy(pod.Labels, map[string]string{labelScope: cfg.LabelScope, labelID: string(id), labelKind: kindSandbox})
	ann := pod.Annotations
	ann[annCreated] = created.UTC().Format(time.RFC3339Nano)
	ann[annImage] = spec.Image
	if spec.SnapshotID != "" {
		ann[annSnapshot] = spec.SnapshotID
	}
	setJSON(ann, annEntrypoint, spec.Entrypoint)
	setJSON(ann, annMetadata, spec.Metadata)
	setJSON(ann, annExtensions, spec.Extensions)
	for _, k := range slices.Sorted(maps.Keys(spec.Extensions)) {
		suffix, ok := strings.CutPrefix(k, extPassThrough)
		if !ok {
			continue
		}
		key := annExtensions + "." + suffix
		if errs := validation.IsQualifiedName(key); suffix == "" || len(errs) > 0 {
			return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter,
				fmt.Sprintf("extensions[%q]: becomes pod annotation %q, which Kubernetes refuses: %s", k, key, strings.Join(errs, "; ")))
		}
		ann[key] = spec.Extensions[k]
	}
	if spec.ExpiresAt != nil {
		ann[annExpires] = spec.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	ann[annSecure] = strconv.FormatBool(spec.SecureAccess)
	setMetadataLabels(pod.Labels, spec.Metadata)
	args := append([]string{"--"}, spec.Entrypoint...)
	if pool != "" {
		pod.Labels[labelPool], pod.Labels[labelWarm] = pool, "true"
		ann[annRevision] = strconv.FormatInt(revision, 10)
		args = []string{"--claimable", "--"}
	}

	ps := &pod.Spec
	ps.RestartPolicy = corev1.RestartPolicyNever
	ps.ServiceAccountName = cfg.ServiceAccount
	automount := cfg.ServiceAccount != ""
	ps.AutomountServiceAccountToken = &automount
	noLinks := false
	ps.EnableServiceLinks = &noLinks
	if ps.TerminationGracePeriodSeconds == nil {
		grace := int64(10)
		ps.TerminationGracePeriodSeconds = &grace
	}
	rc := cfg.RuntimeClassName
	if rc == "" && ps.RuntimeClassName != nil {
		rc = *ps.RuntimeClassName // the template's
	}
	ps.RuntimeClassName = nil
	if r, ok := spec.Extensions[extRuntimeClass]; ok {
		if !slices.Contains(cfg.AllowedRuntimeClasses, r) {
			return nil, invalid(fmt.Sprintf("extension %s: RuntimeClass %q is not allowed (allowed: %v)", extRuntimeClass, r, cfg.AllowedRuntimeClasses))
		}
		rc = r
	}
	if rc != "" {
		ps.RuntimeClassName = &rc
	}
	if p := spec.Platform; p != nil {
		ann[annPlatform] = p.OS + "/" + p.Arch
		if ps.NodeSelector == nil {
			ps.NodeSelector = map[string]string{}
		}
		ps.NodeSelector[corev1.LabelOSStable] = p.OS
		ps.NodeSelector[corev1.LabelArchStable] = p.Arch
	}

	if spec.ImageAuth != nil {
		if _, err := registryHost(spec.Image); err != nil {
			return nil, err
		}
		ps.ImagePullSecrets = append(ps.ImagePullSecrets, corev1.LocalObjectReference{Name: pullSecretName(id)})
	}
	res, err := resources(cfg, spec.Resources)
	if err != nil {
		return nil, err
	}
	env := make([]corev1.EnvVar, 0, len(spec.Env)+1)
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if k != envExecdToken {
			env = append(env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
		}
	}
	env = append(env, corev1.EnvVar{Name: envExecdToken, ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: podName(id)}, Key: secretKey},
	}})
	noEscalation := false
	seccomp := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	mounts := []corev1.VolumeMount{{Name: volumeExecd, MountPath: execdDir, ReadOnly: true}}
	execdSource := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	if cfg.ExecdHostDir != "" {
		dir := corev1.HostPathDirectory
		execdSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: cfg.ExecdHostDir, Type: &dir}}
	}
	ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volumeExecd, VolumeSource: execdSource})
	for i, v := range spec.Volumes {
		vol, mount, err := volumeFor(i, cfg.HostPathAllowlist, &v)
		if err != nil {
			return nil, err
		}
		ps.Volumes = append(ps.Volumes, vol)
		mounts = append(mounts, mount)
	}
	ps.InitContainers = []corev1.Container{{
		Name:            containerInstall,
		Image:           cfg.ExecdImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/execd", "--install-to", execdInSandbox},
		VolumeMounts:    []corev1.VolumeMount{{Name: volumeExecd, MountPath: execdDir}},
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &noEscalation,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           seccomp,
		},
	}}
	if cfg.ExecdHostDir != "" {
		ps.InitContainers = nil // execd is on the node already
	}
	if spec.NetworkPolicy != nil {
		if err := addEgress(cfg, pod, id, spec); err != nil {
			return nil, err
		}
		if spec.CredentialProxy {
			env = append(env, credentialCAEnv()...)
			mounts = append(mounts, corev1.VolumeMount{Name: volumeEgressCA, MountPath: sandbox.CredentialCADir, ReadOnly: true})
		}
	}
	ps.Containers = []corev1.Container{{
		Name:            containerSandbox,
		Image:           spec.Image,
		ImagePullPolicy: corev1.PullPolicy(cfg.ImagePullPolicy),
		Command:         []string{execdInSandbox},
		Args:            args,
		Env:             env,
		Ports:           []corev1.ContainerPort{{Name: "execd", ContainerPort: api.ExecdPort, Protocol: corev1.ProtocolTCP}},
		// The kubelet's view of "execd answers": execd listens once it
		// serves (every route, /ping too, wants the token, which the
		// kubelet has not). The runtime also asks execd's /ping itself,
		// so a sandbox is Running before the probe's next period.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(api.ExecdPort)}},
			PeriodSeconds:    1,
			TimeoutSeconds:   1,
			FailureThreshold: 3,
		},
		Resources:    res,
		VolumeMounts: mounts,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &noEscalation,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: slices.Clone(defaultCaps)},
			SeccompProfile:           seccomp,
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}}
	return pod, nil
}

// secretFor is the Secret holding a sandbox's execd token and, when it
// runs osb-egress, its egress token.
func secretFor(cfg *Config, ns string, id sandbox.ID, token, egressToken, vaultKey string) *corev1.Secret {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: podName(id), Namespace: ns,
			Labels: map[string]string{labelScope: cfg.LabelScope, labelID: string(id), labelKind: kindToken},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{secretKey: []byte(token)},
	}
	if egressToken != "" {
		sec.Data[secretEgressKey] = []byte(egressToken)
	}
	if vaultKey != "" {
		sec.Data[secretVaultKey] = []byte(vaultKey)
	}
	return sec
}

func pullSecretName(id sandbox.ID) string { return podName(id) + "-pull" }

// registryHost returns the registry an image reference names, as the
// kubelet matches pull secrets: Docker Hub is "docker.io".
func registryHost(image string) (string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", invalid(fmt.Sprintf("image %q: %v", image, err))
	}
	return reference.Domain(named), nil
}

// pullSecretFor is the Secret of registry credentials for one create of
// image: a dockerconfigjson the kubelet uses to pull it.
func pullSecretFor(cfg *Config, ns string, id sandbox.ID, image string, auth *sandbox.RegistryAuth) (*corev1.Secret, error) {
	host, err := registryHost(image)
	if err != nil {
		return nil, err
	}
	entry := map[string]string{
		"username": auth.Username, "password": auth.Password,
		"auth": base64.StdEncoding.EncodeToString([]byte(auth.Username + ":" + auth.Password)),
	}
	auths := map[string]any{host: entry}
	if host == "docker.io" {
		auths["https://index.docker.io/v1/"] = entry
	}
	data, _ := json.Marshal(map[string]any{"auths": auths})
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: pullSecretName(id), Namespace: ns,
			Labels: map[string]string{labelScope: cfg.LabelScope, labelID: string(id), labelKind: kindPull},
		},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: data},
	}, nil
}

func setJSON(ann map[string]string, key string, v any) {
	b, _ := json.Marshal(v)
	ann[key] = string(b)
}

// setMetadataLabels mirrors metadata into labels, replacing earlier
// mirrors; entries that are not valid label parts are kept in the
// annotation only.
func setMetadataLabels(labels map[string]string, md map[string]string) {
	for k := range labels {
		if strings.HasPrefix(k, metaLabelPrefix) {
			delete(labels, k)
		}
	}
	for k, v := range md {
		key := metaLabelPrefix + k
		if len(validation.IsQualifiedName(key)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			labels[key] = v
		}
	}
}

// resources turns a sandbox's limits, or the configured defaults, into
// the pod's. Requests are the configured ones, at most the limits.
func resources(cfg *Config, r sandbox.Resources) (corev1.ResourceRequirements, error) {
	req := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	limit := func(name corev1.ResourceName, value int64, def string, scale resource.Scale, request string) {
		var q resource.Quantity
		switch {
		case value > 0:
			q = *resource.NewScaledQuantity(value, scale)
		case def != "":
			q = resource.MustParse(def)
		}
		if !q.IsZero() {
			req.Limits[name] = q
		}
		if request == "" {
			return
		}
		rq := resource.MustParse(request)
		if !q.IsZero() && rq.Cmp(q) > 0 {
			rq = q
		}
		req.Requests[name] = rq
	}
	limit(corev1.ResourceCPU, r.CPUMillis, cfg.DefaultCPU, resource.Milli, cfg.CPURequest)
	limit(corev1.ResourceMemory, r.MemoryBytes, cfg.DefaultMemory, 0, cfg.MemoryRequest)
	if r.StorageBytes > 0 || cfg.DefaultStorage != "" {
		// Only a sandbox with a storage limit reserves storage: without
		// a request of its own, Kubernetes would reserve the whole limit.
		limit(corev1.ResourceEphemeralStorage, r.StorageBytes, cfg.DefaultStorage, 0, cfg.StorageRequest)
		// Written in binary units ("64Mi"), as people write sizes and
		// as the kubelet's eviction message then quotes it.
		for _, l := range []corev1.ResourceList{req.Limits, req.Requests} {
			if q, ok := l[corev1.ResourceEphemeralStorage]; ok {
				l[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(q.Value(), resource.BinarySI)
			}
		}
	}
	switch r.GPUs {
	case "":
	case "all":
		return req, invalid(`gpu "all": Kubernetes needs a count of GPUs`)
	default:
		n, err := strconv.Atoi(r.GPUs)
		if err != nil || n < 1 {
			return req, invalid(fmt.Sprintf("gpu %q: want a count", r.GPUs))
		}
		req.Limits["nvidia.com/gpu"] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	}
	return req, nil
}

// volumeFor turns the i-th volume of a sandbox into a pod volume and its
// mount. A host path is mounted as the outermost allow-list entry that
// contains it with the rest as the mount's subPath: the kubelet resolves a
// subPath inside its volume and refuses one that leaves it through a
// symbolic link, which a check on the server's own file system could not
// promise for the node's. The outermost, because the hostPath itself is
// followed through links: an inner entry could be redirected by the
// sandboxes of an outer one.
func volumeFor(i int, allow []string, v *sandbox.Volume) (corev1.Volume, corev1.VolumeMount, error) {
	name := fmt.Sprintf("volume-%d", i)
	mount := corev1.VolumeMount{Name: name, MountPath: v.MountPath, ReadOnly: v.ReadOnly, SubPath: v.SubPath}
	switch {
	case v.HostPath != "":
		full := path.Join(cmp.Or(v.HostPathAsWritten, v.HostPath), v.SubPath)
		root := ""
		for _, a := range allow {
			a = path.Clean(a)
			if (full == a || a == "/" || strings.HasPrefix(full, a+"/")) && (root == "" || len(a) < len(root)) {
				root = a
			}
		}
		if root == "" {
			return corev1.Volume{}, mount, sandbox.Coded(sandbox.ErrInvalid, api.CodeVolumeHostPathNotAllowed,
				fmt.Sprintf("volume %s: host path %s is not under the server's host_volume_allowlist", v.Name, full))
		}
		mount.SubPath = strings.TrimPrefix(strings.TrimPrefix(full, root), "/")
		t := corev1.HostPathDirectory
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: root, Type: &t}}}, mount, nil
	case v.Claim != nil:
		if errs := validation.IsDNS1123Subdomain(v.Claim.Name); len(errs) > 0 {
			return corev1.Volume{}, mount, sandbox.Coded(sandbox.ErrInvalid, api.CodeVolumeInvalidName,
				fmt.Sprintf("volume %s: claim name %q: %s", v.Name, v.Claim.Name, strings.Join(errs, "; ")))
		}
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: v.Claim.Name, ReadOnly: v.ReadOnly}}}, mount, nil
	}
	return corev1.Volume{}, mount, invalid("volume " + v.Name + " has no backend")
}

// sandboxFrom reads a sandbox from its pod. up says whether the runtime
// has seen the pod's execd answer.
func sandboxFrom(pod *corev1.Pod, up bool, now time.Time, to timeouts) *sandbox.Sandbox {
	ann := pod.Annotations
	sb := &sandbox.Sandbox{
		ID:           sandbox.ID(pod.Labels[labelID]),
		Image:        ann[annImage],
		SnapshotID:   ann[annSnapshot],
		SecureAccess: ann[annSecure] == "true",
		Metadata:     map[string]string{},
	}
	json.Unmarshal([]byte(ann[annEntrypoint]), &sb.Entrypoint)
	json.Unmarshal([]byte(ann[annMetadata]), &sb.Metadata)
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	json.Unmarshal([]byte(ann[annExtensions]), &sb.Extensions)
	if p, ok := ann[annPlatform]; ok {
		if os, arch, ok := strings.Cut(p, "/"); ok {
			sb.Platform = &sandbox.Platform{OS: os, Arch: arch}
		}
	}
	sb.CreatedAt = pod.CreationTimestamp.UTC()
	if t, err := time.Parse(time.RFC3339Nano, ann[annCreated]); err == nil {
		sb.CreatedAt = t
	}
	if t, err := time.Parse(time.RFC3339Nano, ann[annExpires]); err == nil {
		sb.ExpiresAt = &t
	}
	sb.Status = statusOf(pod, up, sb.CreatedAt, now, to)
	return sb
}

// Image pull failures and container start failures, by the kubelet's
// waiting reasons.
var (
	pullFailures  = []string{"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageInspectError", "RegistryUnavailable"}
	startFailures = []string{"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff", "PreStartHookError", "PostStartHookError"}
)

// failure is what annFailure records.
type failure struct {
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Since   time.Time `json:"since"`
}

// overStorageLimit reports whether the kubelet's message for an eviction
// says that the pod went over its own storage limit: its
// ephemeral-storage (the pod's total, or its container's) or an
// emptyDir's size limit, rather than that the node ran short.
func overStorageLimit(msg string) bool {
	for _, s := range []string{
		"ephemeral local storage usage exceeds the total limit", // the pod's
		"exceeded its local ephemeral storage limit",            // a container's
		"Usage of EmptyDir volume",                              // an emptyDir's size limit
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// timeouts bound how long statusOf lets a sandbox wait.
type timeouts struct {
	// start bounds Pending, from the creation until execd first answers.
	start time.Duration
	// schedule bounds how long the scheduler may fail to place the pod
	// before the sandbox is Failed (UNSCHEDULABLE).
	schedule time.Duration
}

// notReadyGrace is how long execd of a sandbox that has run may fail the
// kubelet's probe before the sandbox is Unknown.
const notReadyGrace = time.Minute

// statusOf derives a sandbox's status from its pod. A sandbox is Running
// once its execd answers (the pod is Ready, or the runtime saw it answer:
// up); Failed when its pod cannot be scheduled for longer than the
// schedule timeout, its image cannot be pulled, a container cannot start
// or has stopped, or it has been Pending longer than the start timeout. A
// failure recorded on the pod (annFailure) is final.
func statusOf(pod *corev1.Pod, up bool, created, now time.Time, to timeouts) sandbox.Status {
	since := pod.CreationTimestamp.UTC()
	st := func(state sandbox.State, reason, msg string, at time.Time) sandbox.Status {
		if at.IsZero() {
			at = since
		}
		return sandbox.Status{State: state, Reason: reason, Message: msg, Since: at}
	}
	if f := pod.Annotations[annFailure]; f != "" && pod.Status.Phase != corev1.PodSucceeded {
		var rec failure
		if json.Unmarshal([]byte(f), &rec) == nil && rec.Reason != "" {
			return st(sandbox.StateFailed, rec.Reason, rec.Message, rec.Since)
		}
	}
	if pod.Annotations[annHandover] != "" {
		return st(sandbox.StatePending, "CLAIMING", "the sandbox is being handed out by its warm pool", time.Time{})
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return st(sandbox.StateTerminated, "SANDBOX_EXITED", "execd exited: "+terminatedText(pod), finishedAt(pod))
	case corev1.PodFailed:
		reason := "POD_FAILED"
		if pod.Status.Reason == "Evicted" {
			reason = "EVICTED"
			if overStorageLimit(pod.Status.Message) {
				reason = "DISK_LIMIT_EXCEEDED"
			}
		}
		msg := pod.Status.Message
		if t := terminatedText(pod); t != "" {
			if strings.Contains(t, "OOMKilled") {
				reason = "OOM_KILLED"
			}
			msg = strings.TrimPrefix(msg+"; "+t, "; ")
		}
		return st(sandbox.StateFailed, reason, msg, finishedAt(pod))
	case corev1.PodUnknown:
		return st(sandbox.StateUnknown, "NODE_UNREACHABLE", pod.Status.Message, time.Time{})
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			// The scheduler retries: capacity may be freed, a node added,
			// a volume bound. Past the schedule timeout (or the start
			// timeout) it is a failure.
			if to.start > 0 && now.Sub(created) > to.start {
				return st(sandbox.StateFailed, "START_TIMEOUT", fmt.Sprintf("the sandbox did not start within %v: no node can run it: %s", to.start, c.Message), created.Add(to.start))
			}
			if now.Sub(created) >= to.schedule {
				return st(sandbox.StateFailed, "UNSCHEDULABLE", "no node can run the sandbox: "+c.Message, c.LastTransitionTime.Time)
			}
			return st(sandbox.StatePending, "UNSCHEDULABLE", "no node can run the sandbox yet: "+c.Message, c.LastTransitionTime.Time)
		}
	}
	sandboxStarted := !containerStarted(pod).IsZero()
	egressReason, egressMsg := "", ""
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == containerEgress {
			// A sidecar: it restarts in place, and once the sandbox runs
			// its restarts are no failure of the sandbox's.
			if sandboxStarted {
				continue
			}
			failed, reason, msg, ok := egressStatus(&cs)
			if failed {
				return st(sandbox.StateFailed, reason, msg, time.Time{})
			}
			if ok {
				egressReason, egressMsg = reason, msg
			}
			continue
		}
		if w := cs.State.Waiting; w != nil && slices.Contains(pullFailures, w.Reason) {
			return st(sandbox.StateFailed, "EXECD_IMAGE_PULL_FAILED", fmt.Sprintf("the execd image %s: %s: %s", cs.Image, w.Reason, w.Message), time.Time{})
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return st(sandbox.StateFailed, "EXECD_INSTALL_FAILED", fmt.Sprintf("installing execd failed (exit %d): %s %s", t.ExitCode, t.Reason, t.Message), t.FinishedAt.Time)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != containerSandbox {
			continue
		}
		if w := cs.State.Waiting; w != nil {
			switch {
			case slices.Contains(pullFailures, w.Reason):
				return st(sandbox.StateFailed, "IMAGE_PULL_FAILED", fmt.Sprintf("image %s: %s: %s", cs.Image, w.Reason, w.Message), time.Time{})
			case slices.Contains(startFailures, w.Reason):
				return st(sandbox.StateFailed, "CONTAINER_START_FAILED", w.Reason+": "+w.Message, time.Time{})
			}
		}
		if t := cs.State.Terminated; t != nil {
			return st(sandbox.StateFailed, "SANDBOX_EXITED", "execd exited: "+terminatedText(pod), t.FinishedAt.Time)
		}
	}
	if pod.Status.Phase == corev1.PodRunning {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return st(sandbox.StateRunning, "POD_READY", "", c.LastTransitionTime.Time)
			}
		}
		if up {
			return st(sandbox.StateRunning, "EXECD_READY", "", time.Time{})
		}
		// A sandbox that was Ready and stops answering the probe is not
		// declared dead: its node may be unreachable, or execd busy. It
		// stays Running for a grace period, then is Unknown.
		if lost := readinessLost(pod); !lost.IsZero() {
			if now.Sub(lost) < notReadyGrace {
				return st(sandbox.StateRunning, "EXECD_NOT_READY", "execd does not answer the kubelet's probe since "+lost.UTC().Format(time.RFC3339), lost)
			}
			return st(sandbox.StateUnknown, "EXECD_NOT_READY", "execd does not answer the kubelet's probe since "+lost.UTC().Format(time.RFC3339), lost)
		}
	}
	if to.start > 0 && now.Sub(created) > to.start {
		return st(sandbox.StateFailed, "START_TIMEOUT", fmt.Sprintf("the sandbox did not start within %v", to.start), created.Add(to.start))
	}
	reason, msg := "POD_PENDING", ""
	switch {
	case pod.Spec.NodeName == "":
		reason, msg = "SCHEDULING", "waiting for a node"
	case egressReason != "":
		reason, msg = egressReason, egressMsg
	case pod.Status.Phase == corev1.PodRunning:
		reason, msg = "EXECD_STARTING", "waiting for execd to answer"
	default:
		for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
			if w := cs.State.Waiting; w != nil && w.Reason != "" {
				reason, msg = "CONTAINER_CREATING", cs.Name+": "+w.Reason
				if w.Message != "" {
					msg += ": " + w.Message
				}
			}
		}
	}
	return st(sandbox.StatePending, reason, msg, time.Time{})
}

// terminatedText describes how the sandbox container ended.
func terminatedText(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && cs.Name == containerSandbox {
			s := fmt.Sprintf("exit code %d", t.ExitCode)
			if t.Signal != 0 {
				s += fmt.Sprintf(", signal %d", t.Signal)
			}
			if t.Reason != "" {
				s += " (" + t.Reason + ")"
			}
			if m := strings.TrimSpace(t.Message); m != "" {
				if len(m) > 512 {
					m = m[len(m)-512:]
				}
				s += ": " + m
			}
			return s
		}
	}
	return ""
}

// readinessLost returns when a pod that was Ready stopped being so, or
// zero: the Ready condition is False since after the sandbox container
// started (a pod never Ready has been not Ready since before).
func readinessLost(pod *corev1.Pod) time.Time {
	started := containerStarted(pod)
	if started.IsZero() {
		return time.Time{}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionFalse && c.LastTransitionTime.After(started) {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// containerStarted returns when the sandbox container started running,
// zero if it never has.
func containerStarted(pod *corev1.Pod) time.Time {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != containerSandbox {
			continue
		}
		if r := cs.State.Running; r != nil {
			return r.StartedAt.Time
		}
		if t := cs.State.Terminated; t != nil {
			return t.StartedAt.Time
		}
	}
	return time.Time{}
}

func finishedAt(pod *corev1.Pod) time.Time {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return t.FinishedAt.Time
		}
	}
	return time.Time{}
}

// podStarted reports whether the pod's execd can be reached: the pod runs
// on an address and its sandbox container has started.
func podStarted(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == containerSandbox && cs.State.Running != nil {
			return true
		}
	}
	return false
}

// podIsReady reports the pod's Ready condition.
func podIsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
