package kubernetes

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/sandbox"
)

var _ ingress.Resolver = (*PodResolver)(nil)

// PodResolverConfig configures a PodResolver. Its defaults are the
// runtime's, so that the gateway and the servers of one installation
// judge a pod alike.
type PodResolverConfig struct {
	// Kubeconfig is the kubeconfig file to use. Default: KUBECONFIG, else
	// the pod's service account when the gateway runs in a cluster.
	Kubeconfig string
	// Namespaces are the namespaces whose sandbox pods the gateway
	// serves: those of the servers' runtime.kubernetes.namespace.
	// Default: the kubeconfig context's namespace (in a cluster, the
	// gateway's own).
	Namespaces []string
	// LabelScope is the servers' runtime.kubernetes.label_scope. Default
	// "default".
	LabelScope string
	// StartTimeout and ScheduleTimeout are the servers' start_timeout and
	// schedule_timeout: how long a sandbox may be Pending before it is
	// Failed. Defaults 10 minutes and 15 s, as the runtime's.
	StartTimeout    time.Duration
	ScheduleTimeout time.Duration
	// SyncTimeout bounds the first listing of the pods. Default 30 s.
	SyncTimeout time.Duration
}

// indexSandboxID indexes the sandbox pods by sandbox id.
const indexSandboxID = "sandbox-id"

// PodResolver is an ingress.Resolver that finds sandboxes in the cluster
// itself: it watches the sandbox pods of its namespaces (one informer per
// namespace, so that it needs to read pods only there), and answers from
// memory. It needs no lifecycle server: the gateway keeps routing while
// the servers restart, and every gateway replica sees the same pods.
type PodResolver struct {
	scope      string
	namespaces []string
	to         timeouts
	cancel     context.CancelFunc
	factories  []informers.SharedInformerFactory
	// indexers are the namespaces' pod caches, in the order of the
	// configuration.
	indexers []cache.Indexer
	synced   []cache.InformerSynced
	log      *slog.Logger
}

// NewPodResolver connects to the cluster and lists the sandbox pods of
// every namespace before it returns, so that a gateway is ready when it
// answers its first request.
func NewPodResolver(cfg PodResolverConfig, logger *slog.Logger) (*PodResolver, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.LabelScope = cmp.Or(cfg.LabelScope, "default")
	cfg.StartTimeout = cmp.Or(cfg.StartTimeout, 10*time.Minute)
	cfg.ScheduleTimeout = cmp.Or(cfg.ScheduleTimeout, 15*time.Second)
	cfg.SyncTimeout = cmp.Or(cfg.SyncTimeout, 30*time.Second)
	if errs := validation.IsDNS1123Label(cfg.LabelScope); len(errs) > 0 {
		return nil, fmt.Errorf("label scope %q: %v", cfg.LabelScope, errs)
	}
	routeKlog(logger)
	cc, rc, err := clientConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	namespaces := slices.Clone(cfg.Namespaces)
	if len(namespaces) == 0 {
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, fmt.Errorf("kubernetes namespace: %w", err)
		}
		namespaces = []string{ns}
	}
	slices.Sort(namespaces)
	namespaces = slices.Compact(namespaces)
	for _, ns := range namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("namespace %q: %v", ns, errs)
		}
	}
	rc.UserAgent = "osb-ingress"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return newPodResolver(cs, namespaces, cfg, logger)
}

func newPodResolver(cs kubernetes.Interface, namespaces []string, cfg PodResolverConfig, logger *slog.Logger) (*PodResolver, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &PodResolver{
		scope:      cfg.LabelScope,
		namespaces: namespaces,
		to:         timeouts{start: cfg.StartTimeout, schedule: cfg.ScheduleTimeout},
		cancel:     cancel,
		log:        logger.With("resolver", "kubernetes", "namespaces", namespaces),
	}
	// The runtime's own selector, narrowed to sandbox pods: token
	// Secrets and pool ConfigMaps are none of the gateway's business.
	selector := labels.SelectorFromSet(labels.Set{labelScope: cfg.LabelScope, labelKind: kindSandbox}).String()
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
		inf := f.Core().V1().Pods().Informer()
		if err := inf.SetTransform(stripManagedFields); err != nil {
			cancel()
			return nil, err
		}
		if err := inf.AddIndexers(cache.Indexers{indexSandboxID: podSandboxID}); err != nil {
			cancel()
			return nil, err
		}
		p.factories = append(p.factories, f)
		p.indexers = append(p.indexers, inf.GetIndexer())
		p.synced = append(p.synced, inf.HasSynced)
		f.Start(ctx.Done())
	}
	syncCtx, syncCancel := context.WithTimeout(ctx, cfg.SyncTimeout)
	defer syncCancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), p.synced...) {
		p.Close()
		return nil, fmt.Errorf("watch the sandbox pods of namespaces %v: %w (is the API server reachable, and may the gateway list and watch pods there?)",
			namespaces, sandbox.ErrUnavailable)
	}
	p.log.Info("watching sandbox pods", "scope", cfg.LabelScope)
	return p, nil
}

// podSandboxID is the indexer of indexSandboxID.
func podSandboxID(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[labelID] == "" {
		return nil, nil
	}
	return []string{pod.Labels[labelID]}, nil
}

// Namespaces are the namespaces whose sandbox pods p watches, sorted:
// the configured ones, or the kubeconfig context's.
func (p *PodResolver) Namespaces() []string { return slices.Clone(p.namespaces) }

// LabelScope is the label scope of the sandbox pods p watches.
func (p *PodResolver) LabelScope() string { return p.scope }

// Close stops the informers.
func (p *PodResolver) Close() error {
	p.cancel()
	for _, f := range p.factories {
		f.Shutdown()
	}
	return nil
}

// Ready reports an error until every namespace's pods have been listed.
func (p *PodResolver) Ready(context.Context) error {
	for _, synced := range p.synced {
		if !synced() {
			return fmt.Errorf("the sandbox pods are not listed yet: %w", sandbox.ErrUnavailable)
		}
	}
	return nil
}

// Target answers where port of sandbox id is: the pod's address, and its
// state as the servers' runtime judges it (a pod whose execd the kubelet
// has not yet found ready is Pending here a moment longer than on the
// server that probes it itself). Warm pods not handed out and pods being
// deleted are unknown, as they are to the servers.
func (p *PodResolver) Target(ctx context.Context, id string, port int) (api.IngressTarget, error) {
	if port < 1 || port > 65535 {
		return api.IngressTarget{}, fmt.Errorf("port %d is not in 1..65535", port)
	}
	pod := p.pod(id)
	if pod == nil {
		return api.IngressTarget{}, fmt.Errorf("sandbox %s: %w", id, ingress.ErrNotFound)
	}
	return targetOf(pod, port, time.Now(), p.to), nil
}

// pod returns the live sandbox pod of id, nil when there is none.
func (p *PodResolver) pod(id string) *corev1.Pod {
	for _, idx := range p.indexers {
		objs, err := idx.ByIndex(indexSandboxID, id)
		if err != nil {
			continue
		}
		for _, obj := range objs {
			pod, ok := obj.(*corev1.Pod)
			if ok && pod.DeletionTimestamp == nil && pod.Labels[labelWarm] == "" && pod.Labels[labelScope] == p.scope {
				return pod
			}
		}
	}
	return nil
}

// targetOf is the ingress target of port of a sandbox's pod at now. It is
// pure: the runtime's own reading of the pod (sandboxFrom) decides the
// state, the extensions and the expiry.
func targetOf(pod *corev1.Pod, port int, now time.Time, to timeouts) api.IngressTarget {
	sb := sandboxFrom(pod, false, now, to)
	t := api.IngressTarget{
		SandboxID: string(sb.ID),
		Port:      port,
		State:     string(sb.Status.State),
		Reason:    sb.Status.Reason,
		Public:    sb.Extensions[api.ExtensionIngressPublic] == "true",
		ExpiresAt: sb.ExpiresAt,
	}
	// As the servers: renew-on-access needs an expiry to move (the
	// extension's range was checked at create).
	if n, err := strconv.Atoi(sb.Extensions[api.ExtensionRenewExtend]); err == nil && n > 0 && sb.ExpiresAt != nil {
		t.RenewExtendSeconds = n
	}
	if sb.Status.State == sandbox.StateRunning && pod.Status.PodIP != "" {
		t.Endpoint = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))
	}
	return t
}
