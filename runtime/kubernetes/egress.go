package kubernetes

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// The pod of a sandbox created with a network policy runs osb-egress
// (image cfg.Egress.Image) as a native sidecar: the first init container,
// with restartPolicy Always and a startup probe on its /healthz, which
// answers once the namespace's nftables rules are in force and its DNS
// and transparent proxies listen. The kubelet starts the next init
// container (execd's installer) and the sandbox's container only after
// that probe succeeds, so nothing of the sandbox runs unfiltered; and it
// restarts the sidecar if it stops, while the rules stay in the kernel.
//
// osb-egress holds CAP_NET_ADMIN and nothing else; the sandbox's
// containers hold neither NET_ADMIN nor NET_RAW. Its token is a second
// key of the sandbox's token Secret, given only to the sidecar. The
// egress API (port 18080) is reached on the pod's address, never through
// execd; the namespace's firewall drops what sandbox processes send to
// it.
//
// IPv6: the kubelet refuses net.ipv6.conf.*.disable_ipv6 (not a safe
// sysctl), so the namespace keeps whatever IPv6 the network plugin gives
// it. Strict mode's firewall refuses every IPv6 packet that leaves the
// namespace (only IPv4 TCP is redirected to the proxy; the rest that is
// neither DNS nor a reply is refused), and DNS sent over IPv6 is
// redirected to a port nothing listens on: IPv6 is closed, not open. The
// dns+nft mode enforces IPv6 with the same address sets as IPv4.

// Names of the sidecar and its state.
const (
	containerEgress = "osb-egress"
	// volumeEgress is the sidecar's own emptyDir, where osb-egress keeps
	// the policy in force: it survives the sidecar restarting, and no
	// other container mounts it.
	volumeEgress     = "osb-egress-state"
	egressStateDir   = "/var/lib/osb-egress"
	egressPolicyFile = egressStateDir + "/policy.json"
	// secretEgressKey holds the egress token in the sandbox's Secret.
	secretEgressKey = "egress-token"
	// secretVaultKey holds the key that seals the credential vault, in
	// the sandbox's Secret (given only to the sidecar).
	secretVaultKey = "vault-key"
	// volumeEgressCA is where osb-egress writes the credential proxy's
	// CA for the sandbox's container, which mounts it read-only at
	// sandbox.CredentialCADir.
	volumeEgressCA = "osb-egress-ca"
	egressCADir    = "/var/run/osb-egress-ca"
	// egressStartupSeconds bounds how long osb-egress may take to enforce
	// the policy (its image pulled) before the kubelet restarts it; the
	// sandbox's StartTimeout still bounds the whole start.
	egressStartupSeconds = 120
)

// The environment osb-egress reads (egress.md §6, and ours).
const (
	envEgressRules       = "OPENSANDBOX_EGRESS_RULES"
	envEgressMode        = "OPENSANDBOX_EGRESS_MODE"
	envEgressToken       = "OPENSANDBOX_EGRESS_TOKEN"
	envEgressPolicyFile  = "OPENSANDBOX_EGRESS_POLICY_FILE"
	envEgressMaxRules    = "OPENSANDBOX_EGRESS_MAX_RULES"
	envEgressUpstreams   = "OPENSANDBOX_EGRESS_DNS_UPSTREAMS"
	envEgressAlwaysDeny  = "OPENSANDBOX_EGRESS_ALWAYS_DENY"
	envEgressAlwaysAllow = "OPENSANDBOX_EGRESS_ALWAYS_ALLOW"
)

// egressSidecar is the osb-egress init container of sandbox id. Without
// configured upstreams osb-egress forwards allowed names to the
// nameservers of the pod's resolv.conf (the cluster's DNS).
func egressSidecar(cfg *Config, id sandbox.ID, spec *sandbox.Spec) corev1.Container {
	eg := &cfg.Egress
	env := []corev1.EnvVar{
		{Name: envEgressRules, Value: string(spec.NetworkPolicy)},
		{Name: envEgressMode, Value: eg.Mode},
		{Name: envEgressToken, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: podName(id)}, Key: secretEgressKey}}},
		{Name: envEgressPolicyFile, Value: egressPolicyFile},
		{Name: envEgressMaxRules, Value: strconv.Itoa(eg.RuleCap())},
	}
	for _, l := range []struct {
		name  string
		items []string
	}{{envEgressUpstreams, eg.DNSUpstreams}, {envEgressAlwaysDeny, eg.AlwaysDeny}, {envEgressAlwaysAllow, eg.AlwaysAllow}} {
		if len(l.items) > 0 {
			env = append(env, corev1.EnvVar{Name: l.name, Value: strings.Join(l.items, ",")})
		}
	}
	mounts := []corev1.VolumeMount{{Name: volumeEgress, MountPath: egressStateDir}}
	if spec.CredentialProxy {
		for _, kv := range eg.CredentialProxyEnv("", nil) {
			name, value, _ := strings.Cut(kv, "=")
			if name == sandbox.EnvEgressVaultKey {
				env = append(env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: podName(id)}, Key: secretVaultKey}}})
				continue
			}
			env = append(env, corev1.EnvVar{Name: name, Value: value})
		}
		env = append(env, corev1.EnvVar{Name: sandbox.EnvEgressCADir, Value: egressCADir})
		mounts = append(mounts, corev1.VolumeMount{Name: volumeEgressCA, MountPath: egressCADir})
	}
	always := corev1.ContainerRestartPolicyAlways
	no, yes := false, true
	root := int64(0)
	return corev1.Container{
		Name:            containerEgress,
		Image:           eg.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		RestartPolicy:   &always,
		Env:             env,
		Ports:           []corev1.ContainerPort{{Name: "egress-api", ContainerPort: sandbox.PortEgress, Protocol: corev1.ProtocolTCP}},
		StartupProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/healthz", Port: intstr.FromInt32(sandbox.PortEgress), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds:    1,
			TimeoutSeconds:   1,
			FailureThreshold: egressStartupSeconds,
		},
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		},
		VolumeMounts: mounts,
		// NET_ADMIN programs the namespace's nftables and marks
		// osb-egress's own sockets; nothing else is needed. Root, so
		// that the capability is effective; RunAsNonRoot false against a
		// pod template that asks for non-root users.
		SecurityContext: &corev1.SecurityContext{
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
			Privileged:               &no,
			AllowPrivilegeEscalation: &no,
			RunAsUser:                &root,
			RunAsNonRoot:             &no,
			ReadOnlyRootFilesystem:   &yes,
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// addEgress puts osb-egress first among the pod's init containers, with
// its state volume. It refuses pod templates under which the sidecar
// could not confine the sandbox: on the node's network the rules would
// be the node's, and with a shared process namespace the sandbox would
// see osb-egress's processes.
func addEgress(cfg *Config, pod *corev1.Pod, id sandbox.ID, spec *sandbox.Spec) error {
	ps := &pod.Spec
	if ps.HostNetwork {
		return invalid("networkPolicy: the server's pod template puts sandboxes on the node's network (hostNetwork), where no policy can be enforced")
	}
	if ps.ShareProcessNamespace != nil && *ps.ShareProcessNamespace {
		return invalid("networkPolicy: the server's pod template shares the process namespace between containers (shareProcessNamespace), which would expose osb-egress to the sandbox")
	}
	ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volumeEgress, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(16<<20, resource.BinarySI)}}})
	if spec.CredentialProxy {
		ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volumeEgressCA, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(4<<20, resource.BinarySI)}}})
	}
	ps.InitContainers = append([]corev1.Container{egressSidecar(cfg, id, spec)}, ps.InitContainers...)
	return nil
}

// egressRuntimeOK refuses a network policy for a pod whose RuntimeClass
// runs gVisor (handler runsc): its network stack is not filtered by the
// namespace's nftables, and osb-egress cannot even program them there.
// Where this server may not read RuntimeClasses (they are cluster-scoped)
// the class's name is judged instead; a gVisor class under another name
// is then let through, and the sandbox fails without having run: the
// sidecar never passes its probe.
func (r *Runtime) egressRuntimeOK(ctx context.Context, pod *corev1.Pod) error {
	rc := pod.Spec.RuntimeClassName
	if rc == nil || *rc == "" {
		return nil
	}
	handler := *rc
	if class, err := r.cs.NodeV1().RuntimeClasses().Get(ctx, *rc, metav1.GetOptions{}); err == nil {
		handler = class.Handler
	} else {
		r.log.Debug("read the RuntimeClass of a sandbox with a network policy", "runtimeClass", *rc, "err", err)
	}
	if strings.Contains(handler, "runsc") || strings.Contains(handler, "gvisor") {
		return invalid(fmt.Sprintf("networkPolicy: not enforced for sandboxes on the RuntimeClass %q (gVisor) yet; use a runc RuntimeClass", *rc))
	}
	return nil
}

// hasEgress reports whether pod runs osb-egress.
func hasEgress(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == containerEgress {
			return true
		}
	}
	return false
}

// egressEndpoint is the endpoint of the egress API of a pod that runs
// osb-egress: the pod's address, port 18080, with the egress token.
func (r *Runtime) egressEndpoint(ctx context.Context, id sandbox.ID, pod *corev1.Pod) (sandbox.Endpoint, error) {
	token, err := r.secretValue(ctx, id, secretEgressKey)
	if err != nil {
		return sandbox.Endpoint{}, err
	}
	return sandbox.Endpoint{
		Address: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(sandbox.PortEgress)),
		Headers: map[string]string{api.HeaderEgressAuth: token},
	}, nil
}

// secretValue returns one key of the sandbox's token Secret, from the API
// server when the informer does not have the Secret yet.
func (r *Runtime) secretValue(ctx context.Context, id sandbox.ID, key string) (string, error) {
	name := podName(id)
	cached, err := r.secrets.Get(name)
	if s, ok := r.secWrite.resolve(name, cached, err == nil); ok && len(s.Data[key]) > 0 {
		return string(s.Data[key]), nil
	}
	sec, err := r.cs.CoreV1().Secrets(r.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", apiError("read the sandbox's secret", err)
	}
	r.secWrite.wrote(sec)
	if v := string(sec.Data[key]); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("sandbox %s has no %s in its secret: %w", id, key, sandbox.ErrUnavailable)
}

// egressStatus judges the sidecar's state while the sandbox's container
// has not started: an image that cannot be pulled, or a sidecar that
// cannot start or keeps failing its probe, fails the sandbox; one that
// runs without enforcing yet keeps it Pending. ok is false when the
// sidecar says nothing the caller should report.
func egressStatus(cs *corev1.ContainerStatus) (failed bool, reason, msg string, ok bool) {
	if w := cs.State.Waiting; w != nil {
		switch {
		case slices.Contains(pullFailures, w.Reason):
			return true, "EGRESS_IMAGE_PULL_FAILED", fmt.Sprintf("the egress image %s: %s: %s", cs.Image, w.Reason, w.Message), true
		case slices.Contains(startFailures, w.Reason):
			msg := w.Reason + ": " + w.Message
			if t := cs.LastTerminationState.Terminated; t != nil {
				msg += fmt.Sprintf(" (last exit code %d %s: %s)", t.ExitCode, t.Reason, strings.TrimSpace(t.Message))
			}
			return true, "EGRESS_START_FAILED", "osb-egress did not start enforcing the policy: " + msg, true
		}
	}
	if cs.State.Running != nil && (cs.Started == nil || !*cs.Started) {
		return false, "EGRESS_STARTING", "waiting for osb-egress to enforce the network policy", true
	}
	return false, "", "", false
}

// credentialCAEnv is sandbox.CredentialCAEnv as the container's
// environment.
func credentialCAEnv() []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, kv := range sandbox.CredentialCAEnv() {
		name, value, _ := strings.Cut(kv, "=")
		out = append(out, corev1.EnvVar{Name: name, Value: value})
	}
	return out
}
