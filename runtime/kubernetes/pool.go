package kubernetes

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

var _ sandbox.Pooler = (*Runtime)(nil)

// Warm pool tuning.
const (
	// poolTick is how often the leader looks at every pool, besides the
	// wake-ups that claims and pod changes send.
	poolTick = time.Second
	// poolDataKey holds the pool's definition in its ConfigMap;
	// annPoolError the leader's report of why the pool is failing.
	poolDataKey  = "pool.json"
	annPoolError = "opensandbox.io/pool-error"
)

// poolTrackers holds the pool policy's memory of each pool on this
// replica: claims and misses (since it started, as the API documents),
// its claims under way, and, on the leader, failures to start warm pods
// with the back-off they cause.
type poolTrackers struct {
	mu     sync.Mutex
	byName map[string]*warmpool.Tracker
	// starting is held (read) by each warm pod's creation, from the check
	// that its pool still exists until the pod is written; DeletePool
	// takes it once its pool is gone from the cache, so that no pod of
	// the pool lands after its sweep.
	starting sync.RWMutex
}

func (p *poolTrackers) get(name string) *warmpool.Tracker {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.byName[name]
	if t == nil {
		t = warmpool.NewTracker()
		p.byName[name] = t
	}
	return t
}

// keep forgets the trackers of pools not in defs.
func (p *poolTrackers) keep(defs map[string]*sandbox.Pool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name := range p.byName {
		if defs[name] == nil {
			delete(p.byName, name)
		}
	}
}

func poolConfigMapName(name string) string { return "osb-pool-" + name }

// wakePools asks the leader's pool loop to look at the pools now.
func (r *Runtime) wakePools() {
	select {
	case r.poolWake <- struct{}{}:
	default:
	}
}

// checkPool refuses a pool that cannot work: sandbox's rules, a name
// that cannot name the pool's objects, and a pod the runtime would
// refuse.
func (r *Runtime) checkPool(p *sandbox.Pool) error {
	if err := p.Check(); err != nil {
		return err
	}
	if len(validation.IsDNS1123Label(p.Name)) > 0 || len(p.Name) > 54 {
		return warmpool.Invalid(fmt.Sprintf("pool name %q: on Kubernetes a pool name is at most 54 lower-case letters, digits and '-', starting and ending with a letter or digit", p.Name))
	}
	if p.Template.NetworkPolicy != nil {
		// A warm pod would need its egress token handed over with its
		// claim; until it is, such a pool is refused, and a create with a
		// policy is made cold.
		return warmpool.Invalid(fmt.Sprintf("pool %s: a template with a network policy is not supported on Kubernetes yet (it is on Docker)", p.Name))
	}
	spec := sandbox.MemberSpec(&p.Template)
	if _, err := podFor(&r.cfg, r.ns, "check", &spec, time.Now(), p.Name, 1); err != nil {
		return err
	}
	return nil
}

// poolRecord is a pool's definition as its ConfigMap stores it.
type poolRecord struct {
	Name       string            `json:"name"`
	Image      string            `json:"image"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Resources  sandbox.Resources `json:"resources"`
	Capacity   sandbox.Capacity  `json:"capacity"`
	Revision   int64             `json:"revision"`
	CreatedAt  time.Time         `json:"createdAt"`
	FromConfig bool              `json:"fromConfig,omitempty"`
	Extensions map[string]string `json:"extensions,omitempty"`
}

func recordOf(p *sandbox.Pool) poolRecord {
	return poolRecord{Name: p.Name, Image: p.Template.Image, Entrypoint: p.Template.Entrypoint, Env: p.Template.Env,
		Resources: p.Template.Resources, Capacity: p.Capacity, Revision: p.Revision, CreatedAt: p.CreatedAt, FromConfig: p.FromConfig,
		Extensions: p.Template.Extensions}
}

func (rec *poolRecord) pool() sandbox.Pool {
	return sandbox.Pool{Name: rec.Name, Capacity: rec.Capacity, Revision: rec.Revision, CreatedAt: rec.CreatedAt, FromConfig: rec.FromConfig,
		Template: sandbox.Spec{Image: rec.Image, Entrypoint: slices.Clone(rec.Entrypoint), Env: maps.Clone(rec.Env), Resources: rec.Resources,
			Extensions: maps.Clone(rec.Extensions)}}
}

func (r *Runtime) poolConfigMap(p *sandbox.Pool) *corev1.ConfigMap {
	b, _ := json.Marshal(recordOf(p))
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: poolConfigMapName(p.Name), Namespace: r.ns,
			Labels: map[string]string{labelScope: r.cfg.LabelScope, labelKind: kindPool, labelPool: p.Name}},
		Data: map[string]string{poolDataKey: string(b)},
	}
}

// poolDef reads a pool's definition from the ConfigMap informer, or from
// the API server when the informer does not have it (made through
// another replica a moment ago).
func (r *Runtime) poolDef(ctx context.Context, name string) (*corev1.ConfigMap, *sandbox.Pool, error) {
	cm, err := r.poolDefs.Get(poolConfigMapName(name))
	if apierrors.IsNotFound(err) {
		cm, err = r.cs.CoreV1().ConfigMaps(r.ns).Get(ctx, poolConfigMapName(name), metav1.GetOptions{})
		if err == nil && (cm.Labels[labelScope] != r.cfg.LabelScope || cm.Labels[labelKind] != kindPool) {
			return nil, nil, warmpool.NotFound(name)
		}
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, warmpool.NotFound(name)
		}
		return nil, nil, apiError("read pool "+name, err)
	}
	p, err := decodePool(cm)
	return cm, p, err
}

func decodePool(cm *corev1.ConfigMap) (*sandbox.Pool, error) {
	var rec poolRecord
	if err := json.Unmarshal([]byte(cm.Data[poolDataKey]), &rec); err != nil {
		return nil, fmt.Errorf("pool definition %s: %w", cm.Name, err)
	}
	p := rec.pool()
	return &p, nil
}

// poolDefsAll returns every pool's definition, by name.
func (r *Runtime) poolDefsAll() (map[string]*sandbox.Pool, map[string]*corev1.ConfigMap) {
	cms, _ := r.poolDefs.List(labels.SelectorFromSet(labels.Set{labelKind: kindPool}))
	defs := make(map[string]*sandbox.Pool, len(cms))
	byName := make(map[string]*corev1.ConfigMap, len(cms))
	for _, cm := range cms {
		if p, err := decodePool(cm); err == nil {
			defs[p.Name], byName[p.Name] = p, cm
		} else {
			r.log.Warn("unreadable pool definition", "configmap", cm.Name, "err", err)
		}
	}
	return defs, byName
}

// waitPool waits until the informer has the pool's definition at least
// at resource version rv (or, with rv "", has it gone), so that a read
// after a write sees the write.
func (r *Runtime) waitPool(ctx context.Context, name string, written *corev1.ConfigMap) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		cm, err := r.poolDefs.Get(poolConfigMapName(name))
		switch {
		case written == nil && apierrors.IsNotFound(err):
			return
		case written != nil && err == nil && !newer(written, cm):
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// CreatePool stores the pool's definition in a ConfigMap; the leader
// starts filling it.
func (r *Runtime) CreatePool(ctx context.Context, p sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := r.checkPool(&p); err != nil {
		return nil, err
	}
	p.CreatedAt = time.Now().UTC()
	// Revisions never repeat across a pool's lives: a warm pod left by
	// an earlier pool of the same name is never taken for a current one.
	p.Revision = p.CreatedAt.UnixMilli()
	cm, err := r.cs.CoreV1().ConfigMaps(r.ns).Create(ctx, r.poolConfigMap(&p), metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, warmpool.Exists(p.Name)
		}
		return nil, apiError("store pool "+p.Name, err)
	}
	r.waitPool(ctx, p.Name, cm)
	r.log.Info("pool created", "pool", p.Name, "image", p.Template.Image)
	r.wakePools()
	return r.poolInfo(&p, ""), nil
}

// UpdatePool changes a pool's template and capacity; a changed template
// gets a new revision, whose pods replace the waiting ones, and the old
// revision's error goes (the leader forgets its failures when it reads
// the new revision).
func (r *Runtime) UpdatePool(ctx context.Context, p sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := r.checkPool(&p); err != nil {
		return nil, err
	}
	cm, cur, err := r.poolDef(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	var written *corev1.ConfigMap
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		next := p
		next.CreatedAt, next.Revision = cur.CreatedAt, cur.Revision
		next.FromConfig = p.FromConfig || cur.FromConfig
		if !sandbox.SameMembers(&cur.Template, &p.Template) {
			next.Revision++
		}
		c := cm.DeepCopy()
		c.Data = r.poolConfigMap(&next).Data
		if next.Revision != cur.Revision {
			delete(c.Annotations, annPoolError)
		}
		out, err := r.cs.CoreV1().ConfigMaps(r.ns).Update(ctx, c, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if latest, gerr := r.cs.CoreV1().ConfigMaps(r.ns).Get(ctx, cm.Name, metav1.GetOptions{}); gerr == nil {
				if lp, derr := decodePool(latest); derr == nil {
					cm, cur = latest, lp
				}
			}
		}
		written, p = out, next
		return err
	})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, warmpool.NotFound(p.Name)
		}
		return nil, apiError("update pool "+p.Name, err)
	}
	r.waitPool(ctx, p.Name, written)
	r.wakePools()
	return r.poolInfo(&p, ""), nil
}

// GetPool returns a pool with what it holds.
func (r *Runtime) GetPool(ctx context.Context, name string) (*sandbox.PoolInfo, error) {
	cm, p, err := r.poolDef(ctx, name)
	if err != nil {
		return nil, err
	}
	return r.poolInfo(p, cm.Annotations[annPoolError]), nil
}

// ListPools returns every pool, by name.
func (r *Runtime) ListPools(ctx context.Context) ([]*sandbox.PoolInfo, error) {
	defs, cms := r.poolDefsAll()
	out := make([]*sandbox.PoolInfo, 0, len(defs))
	for _, name := range slices.Sorted(maps.Keys(defs)) {
		out = append(out, r.poolInfo(defs[name], cms[name].Annotations[annPoolError]))
	}
	return out, nil
}

// DeletePool removes the pool's definition and its waiting pods; pods it
// handed out stay.
func (r *Runtime) DeletePool(ctx context.Context, name string) error {
	if _, _, err := r.poolDef(ctx, name); err != nil {
		return err
	}
	err := r.cs.CoreV1().ConfigMaps(r.ns).Delete(ctx, poolConfigMapName(name), metav1.DeleteOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return warmpool.NotFound(name)
		}
		return apiError("delete pool "+name, err)
	}
	r.waitPool(ctx, name, nil)
	// Starts this replica's pool loop began before the pool was gone
	// end before the sweep; later ones see it gone. (Another replica's
	// leader sweeps what its own late starts leave, at its next pass.)
	r.pools.starting.Lock()
	n := 0
	for _, pod := range r.allPods() {
		if pod.Labels[labelPool] == name && pod.Labels[labelWarm] != "" {
			// Exactly this version: a pod a claim took meanwhile stays.
			if err := r.remove(ctx, pod, true); err == nil {
				n++
			}
		}
	}
	r.pools.starting.Unlock()
	r.pools.mu.Lock()
	delete(r.pools.byName, name)
	r.pools.mu.Unlock()
	r.log.Info("pool deleted", "pool", name, "warm sandboxes removed", n)
	return nil
}

// allPods returns this replica's freshest view of every pod of its scope
// that is not being deleted.
func (r *Runtime) allPods() []*corev1.Pod {
	cached, _ := r.pods.List(labels.SelectorFromSet(labels.Set{labelKind: kindSandbox}))
	have := make(map[string]bool, len(cached))
	out := make([]*corev1.Pod, 0, len(cached))
	for _, c := range cached {
		have[c.Name] = true
		if pod, ok := r.podWrite.resolve(c.Name, c, true); ok && pod.DeletionTimestamp == nil {
			out = append(out, pod)
		}
	}
	for _, pod := range r.podWrite.extra(func(name string) bool { return have[name] }) {
		if pod.DeletionTimestamp == nil {
			out = append(out, pod)
		}
	}
	return out
}

// poolInfo counts a pool's pods. lastErr is the leader's report of the
// pool's error, for replicas that do not lead (the leader's own tracker
// is fresher).
func (r *Runtime) poolInfo(p *sandbox.Pool, lastErr string) *sandbox.PoolInfo {
	members, _ := r.members(r.allPods(), p.Name)
	info := &sandbox.PoolInfo{Pool: *p}
	info.Status = r.pools.get(p.Name).Status(p, members)
	if !r.Leading() {
		info.Status.Error = cmp.Or(info.Status.Error, lastErr)
	}
	return info
}

// members lists the pods pool started, handed out or not, for the pool
// policy, with the pods by sandbox id.
func (r *Runtime) members(pods []*corev1.Pod, pool string) ([]warmpool.Member, map[sandbox.ID]*corev1.Pod) {
	var out []warmpool.Member
	byID := map[sandbox.ID]*corev1.Pod{}
	for _, pod := range pods {
		if pod.Labels[labelPool] != pool {
			continue
		}
		sb := r.view(pod)
		rev, err := strconv.ParseInt(pod.Annotations[annRevision], 10, 64)
		if err != nil {
			rev = -1 // of no revision: replaced
		}
		m := warmpool.Member{ID: sb.ID, Revision: rev, Created: sb.CreatedAt, Status: sb.Status, HandedOut: pod.Labels[labelWarm] == ""}
		if m.Status.State == sandbox.StateRunning && pod.Status.PodIP == "" {
			m.Status.State = sandbox.StatePending // not reachable yet
		}
		out = append(out, m)
		byID[sb.ID] = pod
	}
	return out, byID
}

// Claim hands out a ready warm pod: of pool when it is named, else of the
// first pool (by name) whose template matches spec. warmpool.Claim says
// which, and what a failed hand-over does; the take is an update of the
// pod that removes its warm label, with the pod's resourceVersion as
// precondition, so of any number of claims on any number of replicas
// exactly one wins it; execd, which accepts one claim in its life, is the
// second guard.
func (r *Runtime) Claim(ctx context.Context, pool string, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	defs, _ := r.poolDefsAll()
	if _, ok := defs[pool]; pool != "" && !ok {
		// Made through another replica a moment ago?
		_, fetched, err := r.poolDef(ctx, pool)
		if err != nil {
			return nil, err
		}
		defs[pool] = fetched
	}
	pools := make([]warmpool.Candidate, 0, len(defs))
	for _, name := range slices.Sorted(maps.Keys(defs)) {
		pools = append(pools, warmpool.Candidate{Pool: defs[name], Tracker: r.pools.get(name)})
	}
	defer r.wakePools()
	return warmpool.Claim(ctx, claimer{r}, pools, pool, &spec, r.cfg.Observer, extRuntimeClass)
}

// claimer is the runtime as warmpool.Claim uses it.
type claimer struct{ r *Runtime }

func (c claimer) Members(def *sandbox.Pool) []warmpool.Member {
	m, _ := c.r.members(c.r.allPods(), def.Name)
	return m
}

// Discard removes a pod whose hand-over failed: taken, it is no longer
// warm, and no other claim can have it.
func (c claimer) Discard(ctx context.Context, id sandbox.ID, why string) {
	r := c.r
	pod := r.pod(id)
	if pod == nil {
		return
	}
	r.log.Info("removing warm sandbox", "sandbox", id, "pool", pod.Labels[labelPool], "why", why)
	if err := r.remove(ctx, pod, false); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		r.log.Warn("remove a warm sandbox whose hand-over failed", "sandbox", id, "err", err)
	}
}

// HandOver makes the warm pod m the sandbox spec asks for: it takes the
// pod (the update only one claim can win) with the user's metadata,
// entrypoint and expiry and a hand-over mark, has execd take a new token,
// the environment and the entrypoint, puts the token in the Secret, and
// clears the mark. When execd refuses the request as bad, the pod is put
// back as it was, warm.
func (c claimer) HandOver(ctx context.Context, def *sandbox.Pool, m warmpool.Member, spec *sandbox.Spec) (*sandbox.Sandbox, error) {
	r := c.r
	pod := r.pod(m.ID)
	if pod == nil || !stillWarm(pod, def) {
		return nil, fmt.Errorf("sandbox %s: %w", m.ID, warmpool.ErrLost)
	}
	oldToken, err := r.tokenFor(ctx, m.ID)
	if err != nil {
		// Not known yet (its Secret not seen), or the API server failing:
		// another pod may not share it.
		return nil, fmt.Errorf("read the token of sandbox %s: %v: %w", m.ID, err, warmpool.ErrLost)
	}
	entrypoint := spec.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = def.Template.Entrypoint
	}
	taken, err := r.take(ctx, pod, def, spec, entrypoint)
	if err != nil {
		return nil, err
	}

	token := newToken()
	url := "http://" + net.JoinHostPort(taken.Status.PodIP, strconv.Itoa(api.ExecdPort))
	if err := warmpool.ClaimExecd(ctx, r.httpc, url, oldToken, api.ClaimRequest{Token: token, Env: spec.Env, Entrypoint: entrypoint}); err != nil {
		if errors.Is(err, sandbox.ErrInvalid) {
			r.putBack(ctx, pod, taken)
		}
		return nil, err
	}
	// Taken: an entrypoint that could not start makes this sandbox
	// Failed, the claim's answer, rather than a reason to try another.
	// The hand-over's last patch records it on the pod.
	finish := map[string]any{"metadata": map[string]any{"annotations": map[string]any{annHandover: nil}}}
	var ee *warmpool.EntrypointError
	if err := warmpool.CheckEntrypoint(ctx, r.httpc, url, token); errors.As(err, &ee) {
		f := r.entrypointFailure(ctx, taken, ee)
		finish = failurePatch(taken, f)
		finish["metadata"].(map[string]any)["annotations"].(map[string]any)[annHandover] = nil
		r.mu.Lock()
		r.checked[taken.UID], r.failed[taken.UID] = true, f
		r.mu.Unlock()
		r.log.Warn("sandbox failed to start", "sandbox", m.ID, "pool", def.Name, "reason", f.Reason, "err", f.Message)
	} else {
		if err != nil {
			// Claimed and handed over: a status execd did not give is no
			// reason to fail the sandbox.
			r.log.Warn("entrypoint status of a claimed sandbox", "sandbox", m.ID, "err", err)
		}
		// execd has just answered the claim: a pod the kubelet has not
		// found Ready yet is up in this replica's view (as its probe of
		// execd would make it), so the claim answers Running, as the pool
		// promised. One that was Ready and lost it keeps the kubelet's
		// word, and its grace period.
		r.mu.Lock()
		if !podIsReady(taken) && readinessLost(taken).IsZero() {
			r.probe[taken.UID] = up
		}
		r.checked[taken.UID] = true
		r.mu.Unlock()
	}
	tokenPatch, _ := json.Marshal(map[string]any{"data": map[string]string{secretKey: base64.StdEncoding.EncodeToString([]byte(token))}})
	sec, err := r.cs.CoreV1().Secrets(r.ns).Patch(ctx, podName(m.ID), types.MergePatchType, tokenPatch, metav1.PatchOptions{})
	if err != nil {
		return nil, apiError("store the claimed sandbox's token", err)
	}
	r.secWrite.wrote(sec)
	finishPatch, _ := json.Marshal(finish)
	done, err := r.cs.CoreV1().Pods(r.ns).Patch(ctx, taken.Name, types.MergePatchType, finishPatch, metav1.PatchOptions{})
	if err != nil {
		return nil, apiError("finish the hand-over", err)
	}
	r.podWrite.wrote(done)
	r.log.Info("sandbox claimed from pool", "sandbox", m.ID, "pool", def.Name)
	return r.view(done), nil
}

// stillWarm reports whether pod is a warm pod of def's revision that a
// claim may take.
func stillWarm(pod *corev1.Pod, def *sandbox.Pool) bool {
	return pod.DeletionTimestamp == nil && pod.Labels[labelWarm] != "" && pod.Labels[labelPool] == def.Name &&
		pod.Annotations[annRevision] == strconv.FormatInt(def.Revision, 10) && pod.Status.PodIP != ""
}

// take removes the warm pod's label with its resourceVersion as
// precondition. A conflict means the pod changed since it was read: by
// another claim, or by anyone else (the kubelet updating its status); it
// is read again and, if it is still warm, taken again. It returns
// warmpool.ErrLost when the pod is no longer warm or could not be taken.
func (r *Runtime) take(ctx context.Context, pod *corev1.Pod, def *sandbox.Pool, spec *sandbox.Spec, entrypoint []string) (*corev1.Pod, error) {
	uid := pod.UID
	for {
		now := time.Now().UTC()
		p := pod.DeepCopy()
		delete(p.Labels, labelWarm)
		setMetadataLabels(p.Labels, spec.Metadata)
		ann := p.Annotations
		ann[annCreated] = now.Format(time.RFC3339Nano)
		ann[annHandover] = now.Format(time.RFC3339Nano)
		setJSON(ann, annEntrypoint, entrypoint)
		setJSON(ann, annMetadata, spec.Metadata)
		setJSON(ann, annExtensions, spec.Extensions)
		delete(ann, annExpires)
		if spec.ExpiresAt != nil {
			ann[annExpires] = spec.ExpiresAt.UTC().Format(time.RFC3339Nano)
		}
		taken, err := r.cs.CoreV1().Pods(r.ns).Update(ctx, p, metav1.UpdateOptions{})
		switch {
		case err == nil:
			r.podWrite.wrote(taken)
			return taken, nil
		case apierrors.IsNotFound(err):
			return nil, fmt.Errorf("pod %s is gone: %w", pod.Name, warmpool.ErrLost)
		case !apierrors.IsConflict(err):
			return nil, fmt.Errorf("take the warm sandbox: %v: %w", apiError("update pod "+pod.Name, err), warmpool.ErrLost)
		}
		fresh, err := r.cs.CoreV1().Pods(r.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("read pod %s again: %v: %w", pod.Name, err, warmpool.ErrLost)
		}
		fresh.ManagedFields = nil
		r.podWrite.wrote(fresh)
		if fresh.UID != uid || !stillWarm(fresh, def) {
			return nil, fmt.Errorf("pod %s: %w", pod.Name, warmpool.ErrLost)
		}
		pod = fresh
	}
}

// putBack makes a pod a claim took warm again, as orig was, after execd
// refused the claim's request (and so took none of it). A pod that cannot
// be put back is removed: half claimed, it is no one's.
func (r *Runtime) putBack(ctx context.Context, orig, taken *corev1.Pod) {
	ctx = context.WithoutCancel(ctx)
	cur := taken
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p := cur.DeepCopy()
		p.Labels, p.Annotations = maps.Clone(orig.Labels), maps.Clone(orig.Annotations)
		out, err := r.cs.CoreV1().Pods(r.ns).Update(ctx, p, metav1.UpdateOptions{})
		if err == nil {
			r.podWrite.wrote(out)
			return nil
		}
		if apierrors.IsConflict(err) {
			latest, gerr := r.cs.CoreV1().Pods(r.ns).Get(ctx, taken.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			if latest.UID != taken.UID {
				return apierrors.NewNotFound(corev1.Resource("pods"), taken.Name)
			}
			cur = latest
		}
		return err
	})
	if err == nil {
		return
	}
	if apierrors.IsNotFound(err) {
		return
	}
	r.log.Warn("put a warm sandbox back after a refused claim; removing it", "sandbox", taken.Labels[labelID], "err", err)
	if err := r.remove(ctx, taken, false); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		r.log.Warn("remove warm sandbox", "sandbox", taken.Labels[labelID], "err", err)
	}
}

// poolLoop fills the pools while this replica leads.
func (r *Runtime) poolLoop(ctx context.Context) {
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		r.recordFailures(ctx)
		r.dropPullSecrets(ctx)
		r.tendPools(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.poolWake:
		}
	}
}

// maxFailureRecords bounds the failures one pass records, so that a mass
// failure (a registry outage) does not hold the pools' refill up.
const maxFailureRecords = 16

// recordFailures writes the failure of every sandbox that has failed onto
// its pod (annFailure), once, so that its status stays Failed: the
// cluster keeps retrying what failed (schedules, pulls), and a sandbox
// reported Failed must not come back to life under its user. A pod that
// has not finished also gets activeDeadlineSeconds, so that if a node
// does take it later, the kubelet stops it at once instead of running the
// user's code unseen. Each write has the judged version as precondition:
// a pod that changed since (scheduled after all) is judged again. Warm
// pods are the pool loop's.
func (r *Runtime) recordFailures(ctx context.Context) {
	n := 0
	for _, pod := range r.allPods() {
		if n == maxFailureRecords {
			return
		}
		if pod.Annotations[annFailure] != "" || pod.Labels[labelWarm] != "" {
			continue
		}
		st := r.view(pod).Status
		if st.State != sandbox.StateFailed {
			continue
		}
		n++
		body := failurePatch(pod, failure{Reason: st.Reason, Message: st.Message, Since: st.Since})
		body["metadata"].(map[string]any)["resourceVersion"] = pod.ResourceVersion
		patch, _ := json.Marshal(body)
		out, err := r.cs.CoreV1().Pods(r.ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
				r.log.Warn("record a sandbox's failure", "sandbox", pod.Labels[labelID], "err", err)
			}
			continue
		}
		r.podWrite.wrote(out)
		r.log.Info("sandbox failed", "sandbox", pod.Labels[labelID], "reason", st.Reason, "message", st.Message)
	}
}

// failurePatch is the merge patch that records f on pod: the annFailure
// annotation, which every replica reads and which keeps the sandbox
// Failed, and, for a pod that has not finished, activeDeadlineSeconds, so
// that the kubelet stops it at once rather than run the user's code
// unseen. Callers may add to it.
func failurePatch(pod *corev1.Pod, f failure) map[string]any {
	b, _ := json.Marshal(f)
	body := map[string]any{"metadata": map[string]any{"annotations": map[string]any{annFailure: string(b)}}}
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && pod.Spec.ActiveDeadlineSeconds == nil {
		body["spec"] = map[string]any{"activeDeadlineSeconds": 1}
	}
	return body
}

// tendPools is one pass of the leader over the pools, as warmpool's Plan
// decides: it removes warm pods that failed, are of an older template,
// beyond bufferMax or of a pool that is gone, and starts pods until each
// pool's capacity is met.
func (r *Runtime) tendPools(ctx context.Context) {
	defs, cms := r.poolDefsAll()
	r.pools.keep(defs)
	pods := r.allPods()
	for _, pod := range pods {
		if name := pod.Labels[labelPool]; name != "" && defs[name] == nil && pod.Labels[labelWarm] != "" {
			r.discard(ctx, pod, "its pool was deleted")
		}
	}
	now := time.Now()
	for name, def := range defs {
		t := r.pools.get(name)
		members, byID := r.members(pods, name)
		plan := t.Plan(def, members, now)
		for _, rm := range plan.Remove {
			r.discard(ctx, byID[rm.ID], rm.Why)
		}
		r.publishPoolError(ctx, cms[name], t.StartError(def.Revision))
		if plan.Start > 0 {
			r.startWarm(ctx, def, t, plan.Start)
		}
	}
}

// startWarm creates n warm pods of a pool.
func (r *Runtime) startWarm(ctx context.Context, def *sandbox.Pool, t *warmpool.Tracker, n int) {
	spec := sandbox.MemberSpec(&def.Template)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r.pools.starting.RLock()
			defer r.pools.starting.RUnlock()
			if cm, err := r.poolDefs.Get(poolConfigMapName(def.Name)); err != nil {
				return // deleted since this pass read it
			} else if cur, err := decodePool(cm); err != nil || !cur.CreatedAt.Equal(def.CreatedAt) {
				return // deleted, and maybe made again, since
			}
			id := sandbox.NewID()
			pod, err := podFor(&r.cfg, r.ns, id, &spec, time.Now().UTC(), def.Name, def.Revision)
			if err == nil {
				_, err = r.createPod(ctx, id, pod, newToken(), "", "")
			}
			if err != nil && ctx.Err() == nil {
				r.log.Warn("start a warm sandbox", "pool", def.Name, "err", err)
				t.StartFailed(def.Revision, err, time.Now())
			}
		}()
	}
	wg.Wait()
}

// discard removes a warm pod.
func (r *Runtime) discard(ctx context.Context, pod *corev1.Pod, why string) {
	// Exactly the version judged: a pod a claim took since stays.
	switch err := r.remove(ctx, pod, true); {
	case err == nil:
		r.log.Info("removed warm sandbox", "sandbox", pod.Labels[labelID], "pool", pod.Labels[labelPool], "why", why)
	case errors.Is(err, errChanged), errors.Is(err, sandbox.ErrNotFound):
	default:
		r.log.Warn("remove warm sandbox", "sandbox", pod.Labels[labelID], "err", err)
	}
}

// publishPoolError records the leader's last failure on the pool's
// ConfigMap, so every replica reports it.
func (r *Runtime) publishPoolError(ctx context.Context, cm *corev1.ConfigMap, msg string) {
	if cm == nil || cm.Annotations[annPoolError] == msg {
		return
	}
	var patch []byte
	if msg == "" {
		patch = []byte(`{"metadata":{"annotations":{"` + annPoolError + `":null}}}`)
	} else {
		patch, _ = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annPoolError: msg}}})
	}
	if _, err := r.cs.CoreV1().ConfigMaps(r.ns).Patch(ctx, cm.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		r.log.Warn("record a pool's error", "pool", cm.Labels[labelPool], "err", err)
	}
}
