// Package kubernetes is the Kubernetes runtime: one Pod per sandbox, with
// execd copied into it by an init container and run as its main process,
// the sandbox's token in a Secret, and everything the runtime knows in the
// pod's labels and annotations. The server keeps nothing of its own, so
// any number of replicas can serve the API at once; the one holding a
// Lease enforces expiry, removes orphans and fills the warm pools.
//
// Reads are served from informers (one watch per kind of object; listing
// makes no API call); writes go to the API server, and a small overlay
// lets a replica read its own writes before its informer delivers them.
// Only a sandbox the informer does not know (made through another replica
// a moment ago, or gone) costs a lookup on the API server.
package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

var (
	_ sandbox.Runtime         = (*Runtime)(nil)
	_ sandbox.Diagnoser       = (*Runtime)(nil)
	_ sandbox.Reconciler      = (*Runtime)(nil)
	_ sandbox.Elected         = (*Runtime)(nil)
	_ sandbox.Limited         = (*Runtime)(nil)
	_ sandbox.HostSizer       = (*Runtime)(nil)
	_ sandbox.ExtensionReader = (*Runtime)(nil)
	_ sandbox.ExpiryExtender  = (*Runtime)(nil)
	_ sandbox.ExecdTokener    = (*Runtime)(nil)
)

// Runtime runs sandboxes as pods of one namespace.
type Runtime struct {
	cfg Config
	ns  string
	log *slog.Logger
	cs  kubernetes.Interface

	factory  informers.SharedInformerFactory
	pods     listerscorev1.PodNamespaceLister
	secrets  listerscorev1.SecretNamespaceLister
	poolDefs listerscorev1.ConfigMapNamespaceLister
	podWrite *overlay[*corev1.Pod]
	// nodes is the node informer's lister when this server may read
	// nodes (see watchNodes), else nil.
	nodeFactory informers.SharedInformerFactory
	nodes       listerscorev1.NodeLister
	nodesSynced func() bool
	secWrite    *overlay[*corev1.Secret]

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	leading atomic.Bool
	term    atomic.Uint64 // counts the terms won, so an old one never ends a new one
	// terms carries each term this replica leads to housekeep.
	terms chan context.Context
	// probe is execd's readiness as this replica saw it, by pod UID:
	// probing while a probe runs, up once execd answered.
	mu    sync.Mutex
	probe map[types.UID]probeState
	// checked holds the pods whose entrypoint this replica has asked
	// execd about (or has given up asking), by UID; failed, those whose
	// entrypoint could not start, until the pod carries the failure
	// (annFailure) that every replica reads.
	checked map[types.UID]bool
	failed  map[types.UID]failure
	// starts holds when this replica created a sandbox that is not
	// Running yet, for the Observer.
	starts map[sandbox.ID]time.Time
	pools  poolTrackers

	poolWake chan struct{}
	httpc    *http.Client
}

type probeState int

const (
	probing probeState = iota + 1
	up
)

// New connects to the cluster, fills the runtime's informers, and starts
// taking part in the election of the replica that keeps house.
func New(cfg Config, logger *slog.Logger) (*Runtime, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// No key file: each sandbox's vault key is random, kept in its Secret.
	if err := cfg.Egress.LoadVaultFiles(""); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	routeKlog(logger)
	cc, rc, err := clientConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	ns := cfg.Namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, fmt.Errorf("kubernetes namespace: %w", err)
		}
	}
	// Creates come in bursts (a pool refill, many agents at once); the
	// client's default of 5 requests a second would queue them.
	rc.QPS, rc.Burst = 200, 400
	rc.UserAgent = "opensandbox-server"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return newRuntime(cfg, cs, ns, logger)
}

// clientConfig loads the client configuration every client of the
// cluster here uses (the runtime, the gateway's PodResolver): the file
// kubeconfig when given, else KUBECONFIG or ~/.kube/config, else the
// pod's service account when running in a cluster. The ClientConfig
// also answers the default namespace (the context's, or the pod's own).
func clientConfig(kubeconfig string) (clientcmd.ClientConfig, *rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client configuration (kubeconfig, KUBECONFIG or in-cluster): %w", err)
	}
	return cc, rc, nil
}

func newRuntime(cfg Config, cs kubernetes.Interface, ns string, logger *slog.Logger) (*Runtime, error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runtime{
		cfg: cfg, ns: ns, cs: cs,
		log:      logger.With("runtime", "kubernetes", "namespace", ns),
		podWrite: newOverlay[*corev1.Pod](),
		secWrite: newOverlay[*corev1.Secret](),
		ctx:      ctx, cancel: cancel,
		probe:    map[types.UID]probeState{},
		checked:  map[types.UID]bool{},
		failed:   map[types.UID]failure{},
		starts:   map[sandbox.ID]time.Time{},
		pools:    poolTrackers{byName: map[string]*warmpool.Tracker{}},
		poolWake: make(chan struct{}, 1),
		terms:    make(chan context.Context),
		httpc: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second,
			DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext}},
	}
	selector := labels.SelectorFromSet(labels.Set{labelScope: cfg.LabelScope}).String()
	r.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	podInf := r.factory.Core().V1().Pods()
	secInf := r.factory.Core().V1().Secrets()
	cmInf := r.factory.Core().V1().ConfigMaps()
	for _, inf := range []cache.SharedIndexInformer{podInf.Informer(), secInf.Informer(), cmInf.Informer()} {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			cancel()
			return nil, err
		}
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.podSeen(obj) },
		UpdateFunc: func(_, obj any) { r.podSeen(obj) },
		DeleteFunc: r.podGone,
	}); err != nil {
		cancel()
		return nil, err
	}
	if _, err := secInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.secretSeen(obj) },
		UpdateFunc: func(_, obj any) { r.secretSeen(obj) },
		DeleteFunc: func(obj any) {
			if s, ok := unwrapTombstone(obj).(*corev1.Secret); ok {
				r.secWrite.gone(s.Name)
			}
		},
	}); err != nil {
		cancel()
		return nil, err
	}
	r.pods = podInf.Lister().Pods(ns)
	r.secrets = secInf.Lister().Secrets(ns)
	r.poolDefs = cmInf.Lister().ConfigMaps(ns)
	r.factory.Start(ctx.Done())
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	for typ, ok := range r.factory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			cancel()
			r.factory.Shutdown()
			return nil, fmt.Errorf("watch %v in namespace %s: %w (is the API server reachable, and may this server list and watch pods, secrets and configmaps there?)",
				typ, ns, sandbox.ErrUnavailable)
		}
	}
	if err := r.ensureNetworkPolicy(ctx); err != nil {
		cancel()
		r.factory.Shutdown()
		return nil, err
	}
	r.watchNodes()
	r.wg.Add(3)
	go r.elect()
	go r.housekeep()
	go r.janitor()
	r.log.Info("kubernetes runtime ready", "identity", r.cfg.Identity)
	return r, nil
}

// stripManagedFields keeps the informers' copies small.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func unwrapTombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// Close stops the runtime's informers and loops, and gives up the lease;
// sandboxes keep running.
func (r *Runtime) Close() error {
	r.cancel()
	r.factory.Shutdown() // no event handler runs after this
	if r.nodeFactory != nil {
		r.nodeFactory.Shutdown()
	}
	r.wg.Wait()
	r.httpc.CloseIdleConnections()
	return nil
}

// Leading reports whether this replica holds the lease: only then does the
// lifecycle manager enforce expiry and run housekeeping.
func (r *Runtime) Leading() bool { return r.leading.Load() }

// Unsupported says why the runtime has no pause and no snapshots.
func (r *Runtime) Unsupported(op string) string {
	switch op {
	case sandbox.OpPause:
		return "the kubernetes runtime cannot pause sandboxes: Kubernetes has no way to freeze a pod with its processes and memory (the container runtime interface offers no pause); delete the sandbox, or keep it running with a longer timeout"
	case sandbox.OpSnapshot:
		return "the kubernetes runtime cannot take snapshots: Kubernetes cannot commit a running container to an image; keep data that must outlive a sandbox on a volume (a PersistentVolumeClaim)"
	}
	return ""
}

// podSeen is the pod informer's add and update handler.
func (r *Runtime) podSeen(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || r.ctx.Err() != nil {
		return
	}
	r.podWrite.seen(pod)
	if pod.Labels[labelWarm] != "" {
		r.wakePools()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := sandbox.ID(pod.Labels[labelID])
	check := r.needsEntrypointCheckLocked(pod)
	ready := podIsReady(pod) || r.probe[pod.UID] == up
	if start, ok := r.starts[id]; ok && ready && !check {
		delete(r.starts, id)
		if _, failed := r.failed[pod.UID]; !failed {
			r.cfg.Observer.SandboxReady(sandbox.CreateCold, time.Since(start))
		}
	}
	if podIsReady(pod) && r.probe[pod.UID] == up {
		// The kubelet's probe speaks from now on: if execd stops
		// answering it, the sandbox is no longer taken for Running.
		delete(r.probe, pod.UID)
		ready = true
	}
	// A started pod is probed until execd answers, and, ready or not
	// (the kubelet's probe may have been first), until execd has said
	// whether the entrypoint could start.
	if (!ready || check) && podStarted(pod) && r.probe[pod.UID] == 0 && pod.DeletionTimestamp == nil {
		r.probe[pod.UID] = probing
		r.wg.Add(1)
		go r.probeExecd(pod.UID, id, pod.Status.PodIP)
	}
}

// podGone is the pod informer's delete handler.
func (r *Runtime) podGone(obj any) {
	pod, ok := unwrapTombstone(obj).(*corev1.Pod)
	if !ok {
		return
	}
	r.podWrite.gone(pod.Name)
	r.mu.Lock()
	delete(r.probe, pod.UID)
	delete(r.checked, pod.UID)
	delete(r.failed, pod.UID)
	delete(r.starts, sandbox.ID(pod.Labels[labelID]))
	r.mu.Unlock()
	r.wakePools()
}

func (r *Runtime) secretSeen(obj any) {
	if s, ok := obj.(*corev1.Secret); ok {
		r.secWrite.seen(s)
	}
}

// probeExecd asks a started pod's execd for /ping until it answers, so
// that the sandbox is Running at once instead of at the kubelet's next
// readiness probe, and then, for a sandbox whose entrypoint this replica
// has not checked, asks execd whether the entrypoint could start
// (warmpool.CheckEntrypoint): the sandbox is Running only once it has, and
// Failed with reason ENTRYPOINT_FAILED at once when it could not.
func (r *Runtime) probeExecd(uid types.UID, id sandbox.ID, ip string) {
	defer r.wg.Done()
	base := "http://" + net.JoinHostPort(ip, strconv.Itoa(api.ExecdPort))
	deadline := time.Now().Add(r.cfg.StartTimeout)
	wait := 25 * time.Millisecond
	defer func() {
		r.mu.Lock()
		if r.probe[uid] == probing {
			delete(r.probe, uid) // a later event may start another
		}
		r.mu.Unlock()
	}()
	pinged := false
	var last error
	for time.Now().Before(deadline) && r.ctx.Err() == nil {
		pod := r.pod(id)
		if pod == nil || pod.UID != uid || !podStarted(pod) {
			return // gone or stopped
		}
		r.mu.Lock()
		check := r.needsEntrypointCheckLocked(pod)
		r.mu.Unlock()
		if !check && (podIsReady(pod) || pinged) {
			if pinged {
				r.markUp(uid, id)
			}
			return // up, or the kubelet's probe speaks
		}
		if !pinged {
			pinged = r.ping(base, id)
		}
		if pinged && check {
			ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
			err := warmpool.CheckEntrypoint(ctx, r.httpc, base, r.token(id))
			cancel()
			var ee *warmpool.EntrypointError
			switch {
			case errors.As(err, &ee):
				r.entrypointFailed(pod, ee)
				return
			case err == nil:
				r.mu.Lock()
				r.checked[uid] = true
				r.mu.Unlock()
				r.markUp(uid, id)
				return
			}
			last = err
		}
		select {
		case <-r.ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
	if pinged && r.ctx.Err() == nil {
		// execd answers /ping but not about its entrypoint: not asked
		// again, and no reason to fail a sandbox that serves.
		r.log.Warn("ask execd whether the entrypoint started", "sandbox", id, "err", last)
		r.mu.Lock()
		r.checked[uid] = true
		r.mu.Unlock()
		r.markUp(uid, id)
	}
}

// ping reports whether execd at base answers /ping with the sandbox's
// token.
func (r *Runtime) ping(base string, id sandbox.ID) bool {
	ctx, cancel := context.WithTimeout(r.ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/ping", nil)
	req.Header.Set(sandbox.HeaderExecdToken, r.token(id))
	resp, err := r.httpc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// markUp records that the pod uid's execd answered.
func (r *Runtime) markUp(uid types.UID, id sandbox.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probe[uid] == probing { // not gone meanwhile
		r.probe[uid] = up
	}
	if start, ok := r.starts[id]; ok {
		delete(r.starts, id)
		r.cfg.Observer.SandboxReady(sandbox.CreateCold, time.Since(start))
	}
}

// needsEntrypointCheckLocked reports whether this replica is to ask the
// execd of pod whether its entrypoint could start: a sandbox starting
// (not Ready yet, or Ready for less than freshStart) that is not of a
// pool (a warm pod has no entrypoint yet; the claim that hands it out
// asks, and records the answer on the pod), that nobody has found
// failed, and that this replica has not asked about. A sandbox that has
// been serving for longer when this replica first sees it (a restarted
// server's) is taken as it is. r.mu must be held.
func (r *Runtime) needsEntrypointCheckLocked(pod *corev1.Pod) bool {
	return pod.Labels[labelPool] == "" && pod.Labels[labelWarm] == "" && pod.Annotations[annHandover] == "" &&
		pod.Annotations[annFailure] == "" && !r.checked[pod.UID] && !readyFor(pod, freshStart, time.Now())
}

// readyFor reports whether pod has been Ready for at least d at now.
func readyFor(pod *corev1.Pod, d time.Duration, now time.Time) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && now.Sub(c.LastTransitionTime.Time) >= d
		}
	}
	return false
}

// entrypointFailed makes the sandbox of pod Failed with reason
// ENTRYPOINT_FAILED: at once in this replica's view, and for every replica
// (and a restarted server) once the failure is recorded on the pod, which
// also ends the pod (see failurePatch).
func (r *Runtime) entrypointFailed(pod *corev1.Pod, ee *warmpool.EntrypointError) {
	f := r.entrypointFailure(r.ctx, pod, ee)
	r.mu.Lock()
	r.checked[pod.UID], r.failed[pod.UID] = true, f
	delete(r.starts, sandbox.ID(pod.Labels[labelID]))
	r.mu.Unlock()
	r.log.Warn("sandbox failed to start", "sandbox", pod.Labels[labelID], "reason", f.Reason, "err", f.Message)
	r.recordFailure(r.ctx, pod, f)
}

// entrypointFailure is the failure of a sandbox whose entrypoint could
// not start: execd's error and the last lines of the pod's log, as the
// Docker runtime reports it.
func (r *Runtime) entrypointFailure(ctx context.Context, pod *corev1.Pod, ee *warmpool.EntrypointError) failure {
	msg := ee.Error()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	tail := int64(5)
	b, err := r.cs.CoreV1().Pods(r.ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: containerSandbox, TailLines: &tail}).DoRaw(ctx)
	if logs := strings.TrimRight(string(b), "\n"); err == nil && strings.TrimSpace(logs) != "" {
		msg += "; last lines of its log:\n" + logs
	}
	return failure{Reason: api.ReasonEntrypointFailed, Message: msg, Since: time.Now().UTC()}
}

// recordFailure writes f on pod (failurePatch), trying again a few times:
// until it lands, only this replica knows of the failure.
func (r *Runtime) recordFailure(ctx context.Context, pod *corev1.Pod, f failure) {
	patch, _ := json.Marshal(failurePatch(pod, f))
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
			}
		}
		var out *corev1.Pod
		out, err = r.cs.CoreV1().Pods(r.ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err == nil {
			r.podWrite.wrote(out)
			return
		}
		if apierrors.IsNotFound(err) {
			return
		}
	}
	if ctx.Err() == nil {
		r.log.Warn("record a sandbox's failure", "sandbox", pod.Labels[labelID], "err", err)
	}
}

// janitor drops stale overlay entries.
func (r *Runtime) janitor() {
	defer r.wg.Done()
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case now := <-t.C:
			r.podWrite.expire(now)
			r.secWrite.expire(now)
		}
	}
}

// pod returns the freshest pod of id this replica knows, or nil when it
// does not exist or is being deleted.
func (r *Runtime) pod(id sandbox.ID) *corev1.Pod {
	name := podName(id)
	cached, err := r.pods.Get(name)
	pod, ok := r.podWrite.resolve(name, cached, err == nil)
	if !ok || pod.DeletionTimestamp != nil || pod.Labels[labelScope] != r.cfg.LabelScope {
		return nil
	}
	return pod
}

// sandboxPod is pod for a sandbox a user may see: warm pods not handed
// out are the pools' own. A pod this replica's informer does not have is
// looked up on the API server, so that a sandbox made through another
// replica a moment ago is found (clients behind a load balancer create on
// one replica and poll another); misses cost one call, hits none.
func (r *Runtime) sandboxPod(ctx context.Context, id sandbox.ID) (*corev1.Pod, error) {
	pod := r.pod(id)
	if pod == nil && !r.podWrite.isDeleted(podName(id)) {
		pod = r.fetchPod(ctx, id)
	}
	if pod == nil || pod.Labels[labelWarm] != "" {
		return nil, notFound(id)
	}
	return pod, nil
}

// fetchPod reads a pod the informer does not have yet from the API
// server, and keeps it (and its token) in the overlay until the informer
// catches up.
func (r *Runtime) fetchPod(ctx context.Context, id sandbox.ID) *corev1.Pod {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil || pod.Labels[labelScope] != r.cfg.LabelScope || pod.Labels[labelKind] != kindSandbox || pod.DeletionTimestamp != nil {
		return nil
	}
	pod.ManagedFields = nil
	r.podWrite.wrote(pod)
	if sec, err := r.cs.CoreV1().Secrets(r.ns).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
		r.secWrite.wrote(sec)
	}
	return pod
}

func notFound(id sandbox.ID) error {
	return sandbox.Coded(sandbox.ErrNotFound, api.CodeKubernetesSandboxNotFound, fmt.Sprintf("sandbox %s not found", id))
}

// token returns the sandbox's execd token from the informer, or "".
func (r *Runtime) token(id sandbox.ID) string {
	name := podName(id)
	cached, err := r.secrets.Get(name)
	s, ok := r.secWrite.resolve(name, cached, err == nil)
	if !ok {
		return ""
	}
	return string(s.Data[secretKey])
}

// ExecdToken returns the execd token of a sandbox, started or not.
func (r *Runtime) ExecdToken(ctx context.Context, id sandbox.ID) (string, error) {
	if _, err := r.sandboxPod(ctx, id); err != nil {
		return "", err
	}
	return r.tokenFor(ctx, id)
}

// tokenFor returns the sandbox's execd token, from the API server when
// the informer does not have its Secret yet (the pod's and the Secret's
// watches deliver independently).
func (r *Runtime) tokenFor(ctx context.Context, id sandbox.ID) (string, error) {
	if t := r.token(id); t != "" {
		return t, nil
	}
	sec, err := r.cs.CoreV1().Secrets(r.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil {
		return "", apiError("read the sandbox's token", err)
	}
	r.secWrite.wrote(sec)
	if t := string(sec.Data[secretKey]); t != "" {
		return t, nil
	}
	return "", fmt.Errorf("sandbox %s has no token in its secret: %w", id, sandbox.ErrUnavailable)
}

// view is the sandbox of pod as this replica sees it: the pod, what its
// probe of execd found, and a failure it found that the pod does not
// carry yet.
func (r *Runtime) view(pod *corev1.Pod) *sandbox.Sandbox {
	r.mu.Lock()
	isUp := r.probe[pod.UID] == up
	checking := r.probe[pod.UID] == probing && r.needsEntrypointCheckLocked(pod)
	f, failed := r.failed[pod.UID]
	r.mu.Unlock()
	now := time.Now()
	sb := sandboxFrom(pod, isUp, now, timeouts{start: r.cfg.StartTimeout, schedule: r.cfg.ScheduleTimeout})
	switch {
	case failed && pod.Annotations[annFailure] == "":
		sb.Status = sandbox.Status{State: sandbox.StateFailed, Reason: f.Reason, Message: f.Message, Since: f.Since}
	case checking && sb.Status.State == sandbox.StateRunning:
		// Ready by the kubelet's probe before this replica heard from
		// execd whether the entrypoint started: not Running yet.
		sb.Status = sandbox.Status{State: sandbox.StatePending, Reason: "EXECD_STARTING", Message: "waiting for execd to answer", Since: sb.CreatedAt}
	}
	return sb
}

// freshStart is how long a sandbox may have been Ready (by the kubelet's
// probe) and still be asked whether its entrypoint started, staying
// Pending until it has answered. One Ready for longer when a replica
// first sees it has long been reported Running, and stays so.
const freshStart = 30 * time.Second

// Get returns a sandbox from the informer's cache.
func (r *Runtime) Get(ctx context.Context, id sandbox.ID) (*sandbox.Sandbox, error) {
	pod, err := r.sandboxPod(ctx, id)
	if err != nil {
		return nil, err
	}
	return r.view(pod), nil
}

// List returns every sandbox from the informer's cache.
func (r *Runtime) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	cached, err := r.pods.List(labels.SelectorFromSet(labels.Set{labelKind: kindSandbox}))
	if err != nil {
		return nil, err
	}
	have := make(map[string]bool, len(cached))
	out := make([]*sandbox.Sandbox, 0, len(cached))
	add := func(pod *corev1.Pod) {
		if pod.DeletionTimestamp == nil && pod.Labels[labelWarm] == "" && pod.Labels[labelKind] == kindSandbox {
			out = append(out, r.view(pod))
		}
	}
	for _, c := range cached {
		have[c.Name] = true
		if pod, ok := r.podWrite.resolve(c.Name, c, true); ok {
			add(pod)
		}
	}
	for _, pod := range r.podWrite.extra(func(name string) bool { return have[name] }) {
		add(pod)
	}
	return out, nil
}

// Create makes the sandbox's Secret and Pod. The pod starts in the
// background; Get reports Running once its execd answers.
func (r *Runtime) Create(ctx context.Context, id sandbox.ID, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	if r.pod(id) != nil {
		return nil, sandbox.Coded(sandbox.ErrConflict, api.CodeSandboxAlreadyExists, fmt.Sprintf("sandbox %s already exists", id))
	}
	now := time.Now().UTC()
	pod, err := podFor(&r.cfg, r.ns, id, &spec, now, "", 0)
	if err != nil {
		return nil, err
	}
	if spec.NetworkPolicy != nil {
		if err := r.egressRuntimeOK(ctx, pod); err != nil {
			return nil, err
		}
	}
	owned, err := r.makeClaims(ctx, id, spec.Volumes)
	if err != nil {
		return nil, err
	}
	if len(owned) > 0 {
		setJSON(pod.Annotations, annOwnedClaims, owned)
	}
	if spec.ImageAuth != nil {
		// The credentials of this create only: the leader removes them
		// once the image is pulled (dropPullSecrets).
		sec, err := pullSecretFor(&r.cfg, r.ns, id, spec.Image, spec.ImageAuth)
		if err == nil {
			_, err = r.cs.CoreV1().Secrets(r.ns).Create(ctx, sec, metav1.CreateOptions{})
			if err != nil {
				err = apiError("store the registry credentials", err)
			}
		}
		if err != nil {
			r.deleteClaims(context.WithoutCancel(ctx), owned)
			return nil, err
		}
	}
	r.mu.Lock()
	r.starts[id] = time.Now()
	r.mu.Unlock()
	egressToken, vaultKey := "", ""
	if spec.NetworkPolicy != nil {
		egressToken = newToken()
	}
	if spec.CredentialProxy {
		if vaultKey, err = r.cfg.Egress.SandboxVaultKey(id); err != nil {
			r.deleteClaims(context.WithoutCancel(ctx), owned)
			return nil, fmt.Errorf("the vault key: %w", err)
		}
	}
	created, err := r.createPod(ctx, id, pod, newToken(), egressToken, vaultKey)
	if err != nil {
		r.mu.Lock()
		delete(r.starts, id)
		r.mu.Unlock()
		r.deleteClaims(context.WithoutCancel(ctx), owned)
		if spec.ImageAuth != nil {
			r.deletePullSecret(context.WithoutCancel(ctx), id)
		}
		return nil, err
	}
	if len(owned) > 0 {
		r.ownClaims(ctx, created, owned)
	}
	r.log.Info("sandbox created", "sandbox", id, "image", spec.Image)
	return r.view(created), nil
}

// createPod creates the token Secret (with the egress token of a pod that
// runs osb-egress, and the key that seals its credential vault) and then
// the pod; a pod that cannot be created takes its Secret with it.
func (r *Runtime) createPod(ctx context.Context, id sandbox.ID, pod *corev1.Pod, token, egressToken, vaultKey string) (*corev1.Pod, error) {
	sec, err := r.cs.CoreV1().Secrets(r.ns).Create(ctx, secretFor(&r.cfg, r.ns, id, token, egressToken, vaultKey), metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, sandbox.Coded(sandbox.ErrConflict, api.CodeSandboxAlreadyExists, fmt.Sprintf("sandbox %s already exists", id))
		}
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("create the sandbox's token secret: namespace %s: %v: %w", r.ns, err, sandbox.ErrUnavailable)
		}
		return nil, apiError("create the sandbox's token secret", err)
	}
	r.secWrite.wrote(sec)
	created, err := r.cs.CoreV1().Pods(r.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := r.cs.CoreV1().Secrets(r.ns).Delete(bg, sec.Name, metav1.DeleteOptions{}); derr != nil && !apierrors.IsNotFound(derr) {
			r.log.Warn("remove the token secret of a pod that could not be created", "sandbox", id, "err", derr)
		}
		r.secWrite.removed(sec.Name, "")
		if apierrors.IsAlreadyExists(err) {
			return nil, sandbox.Coded(sandbox.ErrConflict, api.CodeSandboxAlreadyExists, fmt.Sprintf("sandbox %s already exists", id))
		}
		return nil, apiError("create the sandbox's pod", err)
	}
	r.podWrite.wrote(created)
	return created, nil
}

// apiError classifies an API server error.
func apiError(doing string, err error) error {
	var kind error
	switch {
	case apierrors.IsNotFound(err):
		kind = sandbox.ErrNotFound
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		kind = sandbox.ErrConflict
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, fmt.Sprintf("%s: the cluster refused it: %v", doing, err))
	case apierrors.IsForbidden(err):
		msg := err.Error()
		switch {
		case strings.Contains(msg, "exceeded quota"):
			// Frees up as sandboxes go.
			return sandbox.Coded(sandbox.ErrUnavailable, api.CodeKubernetesQuotaExceeded, fmt.Sprintf("%s: %v", doing, err))
		case strings.Contains(msg, "User \"") && strings.Contains(msg, " cannot "):
			// This server's own permissions (RBAC).
			return sandbox.Coded(sandbox.ErrUnavailable, api.CodeKubernetesForbidden, fmt.Sprintf("%s: %v", doing, err))
		}
		// An admission policy (Pod Security, a webhook, a validating
		// policy, a LimitRange) refuses the pod as asked: retrying will
		// not help.
		return sandbox.Coded(sandbox.ErrInvalid, api.CodeKubernetesPolicyViolation, fmt.Sprintf("%s: the cluster's policy refuses it: %v", doing, err))
	default:
		kind = sandbox.ErrUnavailable
	}
	return fmt.Errorf("%s: %v: %w", doing, err, kind)
}

// Delete removes the sandbox's pod, its Secret and the volumes made for
// it.
func (r *Runtime) Delete(ctx context.Context, id sandbox.ID) error {
	pod, err := r.sandboxPod(ctx, id)
	if err != nil {
		return err
	}
	return r.remove(ctx, pod, false)
}

// errChanged is remove's answer when the pod is no longer the version
// given (a claim took the warm pod meanwhile).
var errChanged = errors.New("the pod changed since it was judged")

// cleanupTimeout bounds the deletes that finish a removal after the
// caller's context has ended.
const cleanupTimeout = 30 * time.Second

// remove deletes a pod and what belongs to it. With exact, only the
// version of the pod given is deleted: a pod changed since (a warm pod a
// claim took meanwhile) is left alone, and errChanged returned.
func (r *Runtime) remove(ctx context.Context, pod *corev1.Pod, exact bool) error {
	id := sandbox.ID(pod.Labels[labelID])
	pre := &metav1.Preconditions{UID: &pod.UID}
	if exact {
		pre.ResourceVersion = &pod.ResourceVersion
	}
	err := r.cs.CoreV1().Pods(r.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: pre})
	gone := false
	switch {
	case err == nil:
	case apierrors.IsConflict(err) && exact:
		return errChanged
	case apierrors.IsNotFound(err):
		gone = true // what belonged to it is still removed below
	case apierrors.IsConflict(err):
		// Replaced by a pod of the same name: not ours.
		r.podWrite.removed(pod.Name, pod.UID)
		return notFound(id)
	default:
		return apiError("delete the sandbox's pod", err)
	}
	r.podWrite.removed(pod.Name, pod.UID)
	r.mu.Lock()
	delete(r.starts, id)
	r.mu.Unlock()
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := r.cs.CoreV1().Secrets(r.ns).Delete(bg, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		// The reconciler removes it later.
		r.log.Warn("delete the sandbox's token secret", "sandbox", id, "err", err)
	}
	r.secWrite.removed(pod.Name, "")
	if len(pod.Spec.ImagePullSecrets) > 0 {
		r.deletePullSecret(bg, id)
	}
	var owned []string
	if ownedJSON := pod.Annotations[annOwnedClaims]; ownedJSON != "" {
		if err := jsonUnmarshal(ownedJSON, &owned); err == nil {
			r.deleteClaims(bg, owned)
		}
	}
	if gone {
		return notFound(id)
	}
	r.log.Info("sandbox deleted", "sandbox", id)
	return nil
}

// updatePod applies change to the sandbox's pod, retrying on conflicts
// with the API server's latest version.
func (r *Runtime) updatePod(ctx context.Context, id sandbox.ID, change func(*corev1.Pod)) (*corev1.Pod, error) {
	pod, _, err := r.updatePodIf(ctx, id, func(p *corev1.Pod) bool {
		change(p)
		return true
	})
	return pod, err
}

// updatePodIf is updatePod for a change that may find nothing to do:
// change edits a copy of the pod and reports whether to write it. Each
// write is conditioned on the version of the pod change saw (the
// informer's, then the API server's latest after a conflict), so change
// decides on the state its write replaces. It returns the pod as written,
// or as judged when there was nothing to write.
func (r *Runtime) updatePodIf(ctx context.Context, id sandbox.ID, change func(*corev1.Pod) bool) (*corev1.Pod, bool, error) {
	pod, err := r.sandboxPod(ctx, id)
	if err != nil {
		return nil, false, err
	}
	var out *corev1.Pod
	wrote := false
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := pod.DeepCopy()
		if !change(p) {
			out, wrote = pod, false
			return nil
		}
		updated, err := r.cs.CoreV1().Pods(r.ns).Update(ctx, p, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := r.cs.CoreV1().Pods(r.ns).Get(ctx, pod.Name, metav1.GetOptions{}); gerr == nil {
				pod = latest
			}
		}
		out, wrote = updated, err == nil
		return err
	})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, notFound(id)
		}
		return nil, false, apiError("update the sandbox's pod", err)
	}
	if wrote {
		r.podWrite.wrote(out)
	}
	return out, wrote, nil
}

// SetExpiry records the expiry in the pod's annotations.
func (r *Runtime) SetExpiry(ctx context.Context, id sandbox.ID, at *time.Time) error {
	_, err := r.updatePod(ctx, id, func(p *corev1.Pod) {
		if at == nil {
			delete(p.Annotations, annExpires)
		} else {
			p.Annotations[annExpires] = at.UTC().Format(time.RFC3339Nano)
		}
	})
	return err
}

// ExtendExpiry moves the expiry in the pod's annotations to at, unless it
// is already at or after at - slack: renew-on-access, asked of every
// server replica that a gateway's renewal reaches. The update carries the
// resourceVersion of the pod it judged, so of two replicas that judged
// the same version one write fails with a conflict, and that replica
// judges again on the pod the other wrote, and finds nothing to do.
func (r *Runtime) ExtendExpiry(ctx context.Context, id sandbox.ID, at time.Time, slack time.Duration) (time.Time, bool, error) {
	at = at.UTC()
	var expires time.Time
	hasExpiry := true
	_, wrote, err := r.updatePodIf(ctx, id, func(p *corev1.Pod) bool {
		cur, err := time.Parse(time.RFC3339Nano, p.Annotations[annExpires])
		if hasExpiry = err == nil; !hasExpiry {
			return false
		}
		if !cur.Before(at.Add(-slack)) {
			expires = cur
			return false
		}
		p.Annotations[annExpires] = at.Format(time.RFC3339Nano)
		expires = at
		return true
	})
	if err != nil {
		return time.Time{}, false, err
	}
	if !hasExpiry {
		return time.Time{}, false, sandbox.Coded(sandbox.ErrConflict, api.CodeKubernetesInvalidExpiration,
			fmt.Sprintf("sandbox %s was created without a timeout and has no expiration to extend", id))
	}
	return expires, wrote, nil
}

// PatchMetadata merges patch into the metadata annotation and its label
// mirror.
func (r *Runtime) PatchMetadata(ctx context.Context, id sandbox.ID, patch map[string]*string) (*sandbox.Sandbox, error) {
	pod, err := r.updatePod(ctx, id, func(p *corev1.Pod) {
		md := map[string]string{}
		jsonUnmarshal(p.Annotations[annMetadata], &md)
		if md == nil {
			md = map[string]string{}
		}
		for k, v := range patch {
			if v == nil {
				delete(md, k)
			} else {
				md[k] = *v
			}
		}
		setJSON(p.Annotations, annMetadata, md)
		setMetadataLabels(p.Labels, md)
	})
	if err != nil {
		return nil, err
	}
	return r.view(pod), nil
}

// Endpoint returns the pod's address for port, waiting (within ctx) until
// the pod has one. Pod addresses must be routable from the clients;
// where they are not, clients use the server proxy.
func (r *Runtime) Endpoint(ctx context.Context, id sandbox.ID, port int) (sandbox.Endpoint, error) {
	if port < 1 || port > 65535 {
		return sandbox.Endpoint{}, sandbox.Coded(sandbox.ErrInvalid, api.CodeKubernetesInvalidPort, fmt.Sprintf("port %d is not in 1..65535", port))
	}
	var pod *corev1.Pod
	for {
		var err error
		if pod, err = r.sandboxPod(ctx, id); err != nil {
			return sandbox.Endpoint{}, err
		}
		if pod.Status.PodIP != "" {
			break
		}
		if st := r.view(pod).Status; st.State == sandbox.StateFailed || st.State == sandbox.StateTerminated {
			return sandbox.Endpoint{}, sandbox.Coded(sandbox.ErrConflict, api.CodeKubernetesSandboxNotRunning,
				fmt.Sprintf("sandbox %s is %s (%s: %s) and has no address", id, st.State, st.Reason, st.Message))
		}
		select {
		case <-ctx.Done():
			return sandbox.Endpoint{}, fmt.Errorf("sandbox %s has no address yet (%s): %w", id, r.view(pod).Status.Reason, sandbox.ErrUnavailable)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if port == sandbox.PortEgress && hasEgress(pod) {
		// Straight to osb-egress, never through execd (which the
		// sandbox controls), whatever secure access says.
		return r.egressEndpoint(ctx, id, pod)
	}
	token, err := r.tokenFor(ctx, id)
	if err != nil {
		return sandbox.Endpoint{}, err
	}
	return podEndpoint(pod.Status.PodIP, token, pod.Annotations[annSecure] == "true", port), nil
}

// podEndpoint is the endpoint of port of a pod at address ip whose execd
// token is token: the protocol's direct form {podIP}:{port}, with the
// token for execd's own port. A pod with secure access has every other
// port behind execd's forwarder, {podIP}:44772/proxy/{port}, which wants
// the token too: a path ending in the port, which clients accept as the
// endpoint of the port they asked.
func podEndpoint(ip, token string, secure bool, port int) sandbox.Endpoint {
	execd := net.JoinHostPort(ip, strconv.Itoa(api.ExecdPort))
	headers := map[string]string{sandbox.HeaderExecdToken: token}
	switch {
	case port == api.ExecdPort:
		return sandbox.Endpoint{Address: execd, Headers: headers}
	case secure:
		return sandbox.Endpoint{Address: execd + "/proxy/" + strconv.Itoa(port), Headers: headers}
	}
	return sandbox.Endpoint{Address: net.JoinHostPort(ip, strconv.Itoa(port))}
}
