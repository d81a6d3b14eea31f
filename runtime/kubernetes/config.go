package kubernetes

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/opensandbox/opensandbox/sandbox"
)

// Config configures the Kubernetes runtime. It is the [runtime.kubernetes]
// table of the server's configuration file; docs/configuration.md
// documents every key.
type Config struct {
	// Kubeconfig is the kubeconfig file to use. Default: KUBECONFIG, else
	// the pod's service account when the server runs in a cluster.
	Kubeconfig string `toml:"kubeconfig"`
	// Namespace holds the sandboxes' pods and everything made for them.
	// Default: the server's own namespace when it runs in a cluster, else
	// the kubeconfig context's, else "default".
	Namespace string `toml:"namespace"`
	// ExecdImage is the image the sandbox pods' init container copies
	// execd from (its /execd). Default "opensandbox/execd:latest".
	ExecdImage string `toml:"execd_image"`
	// ExecdHostDir, when set, is a directory present on every node that
	// holds the static execd (put there by node provisioning or a
	// DaemonSet): sandbox pods mount it read-only instead of copying
	// execd from ExecdImage with an init container, which saves the
	// kubelet's wait for the init container's exit (most of a cold
	// create). The node's execd must match the server's version.
	ExecdHostDir string `toml:"execd_host_dir"`
	// ImagePullPolicy applies to sandbox images: "IfNotPresent"
	// (default), "Always" or "Never".
	ImagePullPolicy string `toml:"image_pull_policy"`
	// RuntimeClassName is the RuntimeClass of sandbox pods ("" for the
	// cluster's default, "gvisor" for example). A sandbox may ask for
	// another with the extension "kubernetes.runtimeClassName".
	RuntimeClassName string `toml:"runtime_class_name"`
	// AllowedRuntimeClasses lists the RuntimeClasses a sandbox may ask
	// for. Default: only RuntimeClassName.
	AllowedRuntimeClasses []string `toml:"allowed_runtime_classes"`
	// ServiceAccount is the service account of sandbox pods. Default:
	// none is mounted (the pods cannot talk to the API server).
	ServiceAccount string `toml:"service_account"`
	// PodTemplateFile is a Pod manifest (YAML) that sandbox pods start
	// from: its labels, annotations and pod-level settings (node
	// selector, tolerations, affinity, priority class, image pull
	// secrets, security context, DNS) are kept; the runtime adds the
	// containers, volumes and its own labels.
	PodTemplateFile string `toml:"pod_template_file"`
	// DefaultCPU and DefaultMemory are the limits of a sandbox whose
	// request sets none ("1", "500m"; "2Gi"). Empty: no limit.
	DefaultCPU    string `toml:"default_cpu"`
	DefaultMemory string `toml:"default_memory"`
	// CPURequest and MemoryRequest are what the scheduler reserves for
	// each sandbox, at most its limit. Default "100m" and "128Mi":
	// sandboxes mostly idle, and a node holds many.
	CPURequest    string `toml:"cpu_request"`
	MemoryRequest string `toml:"memory_request"`
	// DefaultStorage is the ephemeral-storage limit of a sandbox whose
	// request sets none ("10Gi"): past it the kubelet evicts the pod.
	// Empty: no limit.
	DefaultStorage string `toml:"default_storage"`
	// StorageRequest is the ephemeral-storage the scheduler reserves for
	// a sandbox with a storage limit, at most that limit. Default
	// "256Mi". A sandbox without a limit reserves none.
	StorageRequest string `toml:"storage_request"`
	// LabelScope tells this server's objects from those of other servers
	// in the same namespace. Default "default".
	LabelScope string `toml:"label_scope"`
	// LeaseName is the Lease through which the server's replicas elect the
	// one that enforces expiry, removes orphans and fills the pools.
	// Default "opensandbox-<label_scope>".
	LeaseName string `toml:"lease_name"`
	// LeaseDuration is how long a replica that stopped renewing keeps the
	// lease; RenewDeadline how long the leader keeps trying to renew
	// before it steps down; RetryPeriod how often candidates try.
	// Defaults 8 s, 5 s, 1 s.
	LeaseDuration time.Duration `toml:"lease_duration"`
	RenewDeadline time.Duration `toml:"renew_deadline"`
	RetryPeriod   time.Duration `toml:"retry_period"`
	// Identity names this replica in the lease. Default: the host name
	// (the pod's name in a cluster) and a random suffix.
	Identity string `toml:"identity"`
	// StartTimeout is how long a sandbox may stay Pending, pulling its
	// image included, before it is reported Failed. Default 10 minutes.
	StartTimeout time.Duration `toml:"start_timeout"`
	// ScheduleTimeout is how long the scheduler may fail to find a node
	// for a sandbox before it is reported Failed (UNSCHEDULABLE). Default
	// 15 s; raise it where a cluster autoscaler adds nodes.
	ScheduleTimeout time.Duration `toml:"schedule_timeout"`

	// NetworkPolicy makes the runtime keep a NetworkPolicy that limits
	// where its sandbox pods may connect to (netpolicy.go). Default true;
	// false removes the one an earlier start made. Only network plugins
	// that implement NetworkPolicy enforce it.
	NetworkPolicy *bool `toml:"network_policy"`
	// BlockedCIDRs are the destinations sandbox pods may not reach:
	// ranges or addresses, IPv4 or IPv6. Default (absent): the private,
	// shared and link-local ranges (sandbox.DefaultBlockedCIDRs); []
	// blocks none of them. The metadata services stay blocked either way.
	BlockedCIDRs []string `toml:"blocked_cidrs"`
	// AllowedCIDRs are holes in what is blocked: an address or range,
	// with ":PORT" for one port of it. Default: NodeLocal DNSCache's
	// 169.254.20.10, port 53.
	AllowedCIDRs []string `toml:"allowed_cidrs"`

	// HostPathAllowlist is the server's host_volume_allowlist: host
	// volumes are mounted as the entry that contains them. It is not read
	// from this table; the server sets it.
	HostPathAllowlist []string `toml:"-"`

	// Egress is the server's [egress] section: how osb-egress runs beside
	// a sandbox created with a network policy (egress.go). It is not read
	// from this table; the server sets it.
	Egress sandbox.EgressConfig `toml:"-"`

	// Observer receives the runtime's measurements. It is not read from
	// the file; the server sets it. Default: sandbox.NopObserver.
	Observer sandbox.Observer `toml:"-"`

	// template is PodTemplateFile, read by Validate.
	template *corev1.Pod
	// blocked and allowed are BlockedCIDRs (with the metadata ranges)
	// and AllowedCIDRs, read by Validate.
	blocked []netip.Prefix
	allowed []sandbox.Destination
}

// extRuntimeClass is the extension that picks a sandbox's RuntimeClass.
const extRuntimeClass = "kubernetes.runtimeClassName"

func (c *Config) setDefaults() {
	c.ExecdImage = cmp.Or(c.ExecdImage, "opensandbox/execd:latest")
	c.ImagePullPolicy = cmp.Or(c.ImagePullPolicy, string(corev1.PullIfNotPresent))
	c.CPURequest = cmp.Or(c.CPURequest, "100m")
	c.MemoryRequest = cmp.Or(c.MemoryRequest, "128Mi")
	c.StorageRequest = cmp.Or(c.StorageRequest, "256Mi")
	c.LabelScope = cmp.Or(c.LabelScope, "default")
	c.LeaseName = cmp.Or(c.LeaseName, "opensandbox-"+c.LabelScope)
	c.LeaseDuration = cmp.Or(c.LeaseDuration, 8*time.Second)
	c.RenewDeadline = cmp.Or(c.RenewDeadline, 5*time.Second)
	c.RetryPeriod = cmp.Or(c.RetryPeriod, time.Second)
	c.StartTimeout = cmp.Or(c.StartTimeout, 10*time.Minute)
	c.ScheduleTimeout = cmp.Or(c.ScheduleTimeout, 15*time.Second)
	if len(c.AllowedRuntimeClasses) == 0 && c.RuntimeClassName != "" {
		c.AllowedRuntimeClasses = []string{c.RuntimeClassName}
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		c.Identity = cmp.Or(host, "opensandbox-server") + "-" + newToken()[:8]
	}
	if c.Observer == nil {
		c.Observer = sandbox.NopObserver{}
	}
	c.Egress.SetDefaults()
	c.setNetworkDefaults()
}

// Validate checks the configuration, naming the key at fault, and reads
// the pod template.
func (c *Config) Validate() error {
	switch corev1.PullPolicy(c.ImagePullPolicy) {
	case corev1.PullIfNotPresent, corev1.PullAlways, corev1.PullNever:
	default:
		return fmt.Errorf("runtime.kubernetes.image_pull_policy: %q is not IfNotPresent, Always or Never", c.ImagePullPolicy)
	}
	for key, v := range map[string]string{"default_cpu": c.DefaultCPU, "default_memory": c.DefaultMemory,
		"cpu_request": c.CPURequest, "memory_request": c.MemoryRequest,
		"default_storage": c.DefaultStorage, "storage_request": c.StorageRequest} {
		if v == "" {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return fmt.Errorf("runtime.kubernetes.%s: %q is not a quantity", key, v)
		}
		if strings.Contains(key, "storage") && q.Sign() <= 0 {
			return fmt.Errorf("runtime.kubernetes.%s: %q is not a positive size", key, v)
		}
	}
	if errs := validation.IsDNS1123Label(c.LabelScope); len(errs) > 0 {
		return fmt.Errorf("runtime.kubernetes.label_scope: %q: %s", c.LabelScope, strings.Join(errs, "; "))
	}
	if c.Namespace != "" {
		if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
			return fmt.Errorf("runtime.kubernetes.namespace: %q: %s", c.Namespace, strings.Join(errs, "; "))
		}
	}
	if c.ExecdHostDir != "" && !strings.HasPrefix(c.ExecdHostDir, "/") {
		return fmt.Errorf("runtime.kubernetes.execd_host_dir: %q is not an absolute path", c.ExecdHostDir)
	}
	if c.RuntimeClassName != "" && !slices.Contains(c.AllowedRuntimeClasses, c.RuntimeClassName) {
		return fmt.Errorf("runtime.kubernetes.runtime_class_name: %q is not in allowed_runtime_classes", c.RuntimeClassName)
	}
	// The election's own rules (client-go refuses other timings).
	switch {
	case c.LeaseDuration <= 0 || c.RenewDeadline <= 0 || c.RetryPeriod <= 0:
		return errors.New("runtime.kubernetes: lease_duration, renew_deadline and retry_period must be positive")
	case c.RenewDeadline >= c.LeaseDuration:
		return fmt.Errorf("runtime.kubernetes.renew_deadline (%v) must be shorter than lease_duration (%v)", c.RenewDeadline, c.LeaseDuration)
	case float64(c.RenewDeadline) <= 1.2*float64(c.RetryPeriod):
		return fmt.Errorf("runtime.kubernetes.renew_deadline (%v) must be more than 1.2 times retry_period (%v)", c.RenewDeadline, c.RetryPeriod)
	}
	if c.StartTimeout < 0 || c.ScheduleTimeout < 0 {
		return errors.New("runtime.kubernetes: start_timeout and schedule_timeout must not be negative")
	}
	if c.PodTemplateFile != "" {
		b, err := os.ReadFile(c.PodTemplateFile)
		if err != nil {
			return fmt.Errorf("runtime.kubernetes.pod_template_file: %w", err)
		}
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict(b, &pod); err != nil {
			return fmt.Errorf("runtime.kubernetes.pod_template_file %s: %w", c.PodTemplateFile, err)
		}
		if pod.Kind != "" && pod.Kind != "Pod" {
			return fmt.Errorf("runtime.kubernetes.pod_template_file %s: kind %q, want Pod", c.PodTemplateFile, pod.Kind)
		}
		c.template = &pod
	}
	if err := c.Egress.Validate(); err != nil {
		return err
	}
	return c.validateNetwork()
}

// Check validates the configuration as New will use it, defaults filled
// in, without connecting to a cluster.
func (c Config) Check() error {
	c.setDefaults()
	return c.Validate()
}
