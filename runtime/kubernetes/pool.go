package kubernetes

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
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
	"github.com/opensandbox/opensandbox/sandbox"
)

var _ sandbox.Pooler = (*Runtime)(nil)

// Warm pool tuning.
const (
	// poolTick is how often the leader looks at every pool, besides the
	// wake-ups that claims and pod changes send.
	poolTick = time.Second
	// maxStartsPerTick bounds the warm pods one pool starts per pass, so
	// that a big refill does not swamp the API server cold creates use.
	maxStartsPerTick = 16
	// maxPoolBackoff is the longest a pool whose pods fail to start waits
	// before it tries again.
	maxPoolBackoff = time.Minute
	// claimTries bounds the warm pods one claim tries to take, counting
	// pods that another claim took first.
	claimTries = 8
	// poolDataKey holds the pool's definition in its ConfigMap;
	// annPoolError the leader's last failure to start a pod for it.
	poolDataKey  = "pool.json"
	annPoolError = "opensandbox.io/pool-error"
)

// poolCounters counts per pool what this replica saw: claims and misses
// (since it started, as the API documents), and, on the leader, failures
// to start warm pods with the back-off they cause.
type poolCounters struct {
	mu     sync.Mutex
	byName map[string]*poolCount
	// claiming holds the warm pods this replica's claims are taking, so
	// that two claims of one replica do not race for the same pod.
	claiming map[string]bool
	// failedPods holds the warm pods whose failure was counted, so that
	// one that takes more than a pass to remove is counted once.
	failedPods map[types.UID]bool
}

type poolCount struct {
	claims, misses uint64
	failures       int
	retryAt        time.Time
	lastErr        string
	// refilling is set when the pool's idle pods fell below BufferMin,
	// and cleared when they are back at BufferMax: starts are bounded per
	// pass, so a refill takes several passes.
	refilling bool
}

func (c *poolCounters) get(name string) *poolCount {
	pc := c.byName[name]
	if pc == nil {
		pc = &poolCount{}
		c.byName[name] = pc
	}
	return pc
}

func poolConfigMapName(name string) string { return "osb-pool-" + name }

// wakePools asks the leader's pool loop to look at the pools now.
func (r *Runtime) wakePools() {
	select {
	case r.poolWake <- struct{}{}:
	default:
	}
}

func poolNotFound(name string) error {
	return sandbox.Coded(sandbox.ErrNotFound, api.CodePoolNotFound, fmt.Sprintf("pool %s not found", name))
}

func poolInvalid(msg string) error {
	return sandbox.Coded(sandbox.ErrInvalid, api.CodePoolInvalidParameter, msg)
}

// checkPool refuses a pool that cannot work: sandbox's rules, a name
// that cannot name the pool's objects, and a pod the runtime would
// refuse.
func (r *Runtime) checkPool(p *sandbox.Pool) error {
	if err := p.Check(); err != nil {
		return err
	}
	if len(validation.IsDNS1123Label(p.Name)) > 0 || len(p.Name) > 54 {
		return poolInvalid(fmt.Sprintf("pool name %q: on Kubernetes a pool name is at most 54 lower-case letters, digits and '-', starting and ending with a letter or digit", p.Name))
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
}

func recordOf(p *sandbox.Pool) poolRecord {
	return poolRecord{Name: p.Name, Image: p.Template.Image, Entrypoint: p.Template.Entrypoint, Env: p.Template.Env,
		Resources: p.Template.Resources, Capacity: p.Capacity, Revision: p.Revision, CreatedAt: p.CreatedAt, FromConfig: p.FromConfig}
}

func (rec *poolRecord) pool() sandbox.Pool {
	return sandbox.Pool{Name: rec.Name, Capacity: rec.Capacity, Revision: rec.Revision, CreatedAt: rec.CreatedAt, FromConfig: rec.FromConfig,
		Template: sandbox.Spec{Image: rec.Image, Entrypoint: slices.Clone(rec.Entrypoint), Env: maps.Clone(rec.Env), Resources: rec.Resources}}
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
			return nil, nil, poolNotFound(name)
		}
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, poolNotFound(name)
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
			return nil, sandbox.Coded(sandbox.ErrConflict, api.CodePoolAlreadyExists, fmt.Sprintf("pool %s already exists", p.Name))
		}
		return nil, apiError("store pool "+p.Name, err)
	}
	r.waitPool(ctx, p.Name, cm)
	r.log.Info("pool created", "pool", p.Name, "image", p.Template.Image)
	r.wakePools()
	return r.poolInfo(&p, ""), nil
}

// UpdatePool changes a pool's template and capacity; a changed template
// gets a new revision, whose pods replace the waiting ones.
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
		delete(c.Annotations, annPoolError)
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
			return nil, poolNotFound(p.Name)
		}
		return nil, apiError("update pool "+p.Name, err)
	}
	r.waitPool(ctx, p.Name, written)
	r.pools.mu.Lock()
	pc := r.pools.get(p.Name)
	pc.failures, pc.retryAt, pc.lastErr = 0, time.Time{}, ""
	r.pools.mu.Unlock()
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
			return poolNotFound(name)
		}
		return apiError("delete pool "+name, err)
	}
	r.waitPool(ctx, name, nil)
	n := 0
	for _, pod := range r.allPods() {
		if pod.Labels[labelPool] == name && pod.Labels[labelWarm] != "" {
			// Exactly this version: a pod a claim took meanwhile stays.
			if err := r.remove(ctx, pod, true); err == nil {
				n++
			}
		}
	}
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

// poolInfo counts a pool's pods.
func (r *Runtime) poolInfo(p *sandbox.Pool, lastErr string) *sandbox.PoolInfo {
	info := &sandbox.PoolInfo{Pool: *p}
	st := &info.Status
	for _, pod := range r.allPods() {
		if pod.Labels[labelPool] != p.Name {
			continue
		}
		state := r.view(pod).Status.State
		switch {
		case state == sandbox.StateFailed || state == sandbox.StateTerminated || state == sandbox.StateUnknown:
		case pod.Labels[labelWarm] == "":
			st.Allocated++
		case pod.Annotations[annRevision] != strconv.FormatInt(p.Revision, 10):
		case state == sandbox.StatePending:
			st.Starting++
		case state == sandbox.StateRunning:
			st.Available++
		}
	}
	st.Total = st.Allocated + st.Available + st.Starting
	r.pools.mu.Lock()
	pc := r.pools.get(p.Name)
	st.Claims, st.Misses, st.Error = pc.claims, pc.misses, cmp.Or(pc.lastErr, lastErr)
	r.pools.mu.Unlock()
	return info
}

// errLost is a claim that another claim won; errNotTaken a warm pod a
// claim could not take for another reason (its token not known yet, the
// API server refusing), which another pod may not share.
var (
	errLost     = errors.New("another claim took the warm sandbox first")
	errNotTaken = errors.New("the warm sandbox could not be taken")
)

// handOverFailed starts a pool's error set by a failed hand-over.
const handOverFailed = "hand-over failed: "

// Claim hands out a ready warm pod. The pod is taken by an update that
// removes its warm label with the pod's resourceVersion as precondition,
// so of any number of claims on any number of replicas exactly one wins
// it; execd, which accepts one claim in its life, is the second guard.
func (r *Runtime) Claim(ctx context.Context, pool string, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	start := time.Now()
	defs, _ := r.poolDefsAll()
	var candidates []*sandbox.Pool
	if pool != "" {
		p, ok := defs[pool]
		if !ok {
			_, fetched, err := r.poolDef(ctx, pool)
			if err != nil {
				return nil, err
			}
			p = fetched
		}
		if !p.Satisfies(&spec, extRuntimeClass) {
			r.miss(pool)
			return nil, sandbox.ErrPoolEmpty
		}
		candidates = []*sandbox.Pool{p}
	} else {
		for _, name := range slices.Sorted(maps.Keys(defs)) {
			if defs[name].Matches(&spec, extRuntimeClass) {
				candidates = append(candidates, defs[name])
			}
		}
		if len(candidates) == 0 {
			return nil, sandbox.ErrPoolEmpty
		}
	}
	lost := map[string]bool{} // pods other claims took first
	for try := 0; try < claimTries; try++ {
		pod, def := r.pickWarm(candidates, lost)
		if pod == nil {
			break
		}
		sb, err := r.handOver(ctx, pod, def, &spec)
		r.pools.mu.Lock()
		delete(r.pools.claiming, pod.Name)
		r.pools.mu.Unlock()
		r.wakePools()
		switch {
		case err == nil:
			r.pools.mu.Lock()
			pc := r.pools.get(def.Name)
			pc.claims++
			if strings.HasPrefix(pc.lastErr, handOverFailed) {
				pc.lastErr = ""
			}
			r.pools.mu.Unlock()
			r.cfg.Observer.PoolClaim(def.Name, true)
			r.cfg.Observer.SandboxReady(sandbox.CreatePooled, time.Since(start))
			return sb, nil
		case errors.Is(err, errLost), errors.Is(err, errNotTaken):
			// Another claim won this pod, or it could not be taken: try
			// another.
			lost[pod.Name] = true
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			continue
		case errors.Is(err, sandbox.ErrInvalid):
			return nil, err
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
		// The pod was taken but could not be handed over (execd
		// unreachable, the API server failing): it was removed. Trying
		// more pods would likely fail alike and empty the pool; the
		// create goes cold instead.
		r.log.Warn("warm sandbox could not be handed over; creating cold", "pool", def.Name, "pod", pod.Name, "err", err)
		r.pools.mu.Lock()
		r.pools.get(def.Name).lastErr = handOverFailed + err.Error()
		r.pools.mu.Unlock()
		r.miss(def.Name)
		return nil, sandbox.ErrPoolEmpty
	}
	r.miss(candidates[0].Name)
	return nil, sandbox.ErrPoolEmpty
}

func (r *Runtime) miss(pool string) {
	r.pools.mu.Lock()
	r.pools.get(pool).misses++
	r.pools.mu.Unlock()
	r.cfg.Observer.PoolClaim(pool, false)
	r.wakePools()
}

// pickWarm chooses a ready warm pod of the first candidate pool that has
// one, at random so that claims on several replicas seldom collide, and
// marks it as being claimed by this replica.
func (r *Runtime) pickWarm(candidates []*sandbox.Pool, skip map[string]bool) (*corev1.Pod, *sandbox.Pool) {
	pods := r.allPods()
	r.pools.mu.Lock()
	defer r.pools.mu.Unlock()
	for _, p := range candidates {
		rev := strconv.FormatInt(p.Revision, 10)
		var ready []*corev1.Pod
		for _, pod := range pods {
			if pod.Labels[labelPool] != p.Name || pod.Labels[labelWarm] == "" || pod.Annotations[annRevision] != rev ||
				r.pools.claiming[pod.Name] || skip[pod.Name] || pod.Status.PodIP == "" {
				continue
			}
			if r.view(pod).Status.State == sandbox.StateRunning {
				ready = append(ready, pod)
			}
		}
		if len(ready) > 0 {
			pod := ready[rand.IntN(len(ready))]
			r.pools.claiming[pod.Name] = true
			return pod, p
		}
	}
	return nil, nil
}

// handOver makes a warm pod the sandbox spec asks for: it takes the pod
// (the update only one claim can win) with the user's metadata, entrypoint
// and expiry and a hand-over mark, puts a new token in the Secret, has
// execd take the token, the environment and the entrypoint, and clears
// the mark. A pod whose hand-over fails after it was taken is removed.
func (r *Runtime) handOver(ctx context.Context, pod *corev1.Pod, def *sandbox.Pool, spec *sandbox.Spec) (*sandbox.Sandbox, error) {
	id := sandbox.ID(pod.Labels[labelID])
	oldToken, err := r.tokenFor(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotTaken, err)
	}
	entrypoint := spec.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = def.Template.Entrypoint
	}
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
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil, errLost
		}
		return nil, fmt.Errorf("%w: %v", errNotTaken, apiError("take the warm sandbox", err))
	}
	r.podWrite.wrote(taken)
	fail := func(err error) (*sandbox.Sandbox, error) {
		if rerr := r.remove(context.WithoutCancel(ctx), taken, false); rerr != nil && !errors.Is(rerr, sandbox.ErrNotFound) {
			r.log.Warn("remove a warm sandbox whose hand-over failed", "sandbox", id, "err", rerr)
		}
		return nil, err
	}

	token := newToken()
	tokenPatch, _ := json.Marshal(map[string]any{"data": map[string]string{secretKey: base64.StdEncoding.EncodeToString([]byte(token))}})
	sec, err := r.cs.CoreV1().Secrets(r.ns).Patch(ctx, podName(id), types.MergePatchType, tokenPatch, metav1.PatchOptions{})
	if err != nil {
		return fail(apiError("store the claimed sandbox's token", err))
	}
	r.secWrite.wrote(sec)
	if err := r.claimExecd(ctx, taken.Status.PodIP, oldToken, api.ClaimRequest{Token: token, Env: spec.Env, Entrypoint: entrypoint}); err != nil {
		return fail(err)
	}
	done, err := r.cs.CoreV1().Pods(r.ns).Patch(ctx, taken.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+annHandover+`":null}}}`), metav1.PatchOptions{})
	if err != nil {
		return fail(apiError("finish the hand-over", err))
	}
	r.podWrite.wrote(done)
	r.log.Info("sandbox claimed from pool", "sandbox", id, "pool", def.Name)
	return r.view(done), nil
}

// claimExecd calls execd's /claim with the pool's token.
func (r *Runtime) claimExecd(ctx context.Context, ip, oldToken string, claim api.ClaimRequest) error {
	body, err := json.Marshal(claim)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(ip, strconv.Itoa(api.ExecdPort)) + "/claim"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(sandbox.HeaderExecdToken, oldToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.httpc.Do(req)
	if err != nil {
		return fmt.Errorf("claim through execd: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		return sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, "the sandbox refused the request: "+strings.TrimSpace(string(msg)))
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("claim through execd: %s: %s", resp.Status, msg)
	}
	return nil
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
		b, _ := json.Marshal(failure{Reason: st.Reason, Message: st.Message, Since: st.Since})
		meta := map[string]any{"resourceVersion": pod.ResourceVersion, "annotations": map[string]string{annFailure: string(b)}}
		body := map[string]any{"metadata": meta}
		if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && pod.Spec.ActiveDeadlineSeconds == nil {
			body["spec"] = map[string]any{"activeDeadlineSeconds": 1}
		}
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

// tendPools is one pass of the leader over the pools: it removes warm
// pods that failed, are of an older template or of a pool that is gone,
// and starts pods until each pool's capacity is met.
func (r *Runtime) tendPools(ctx context.Context) {
	defs, cms := r.poolDefsAll()
	byPool := map[string][]*corev1.Pod{}
	for _, pod := range r.allPods() {
		name := pod.Labels[labelPool]
		if name == "" {
			continue
		}
		if defs[name] == nil && pod.Labels[labelWarm] != "" {
			r.discard(ctx, pod, "its pool was deleted")
			continue
		}
		byPool[name] = append(byPool[name], pod)
	}
	now := time.Now()
	for name, def := range defs {
		rev := strconv.FormatInt(def.Revision, 10)
		starting, allocated := 0, 0
		var available []*corev1.Pod
		var failed []string
		for _, pod := range byPool[name] {
			st := r.view(pod).Status
			dead := st.State == sandbox.StateFailed || st.State == sandbox.StateTerminated || st.State == sandbox.StateUnknown
			switch {
			case pod.Labels[labelWarm] == "":
				if !dead {
					allocated++
				}
			case dead:
				r.pools.mu.Lock()
				seen := r.pools.failedPods[pod.UID]
				r.pools.failedPods[pod.UID] = true
				r.pools.mu.Unlock()
				if pod.Annotations[annRevision] == rev && !seen {
					failed = append(failed, cmp.Or(st.Reason+": "+st.Message, st.Reason))
				}
				r.discard(ctx, pod, "it failed: "+st.Reason)
			case pod.Annotations[annRevision] != rev:
				r.discard(ctx, pod, "its pool's template changed")
			case st.State == sandbox.StatePending:
				starting++
			default:
				available = append(available, pod)
			}
		}
		if extra := len(available) - def.Capacity.BufferMax; extra > 0 {
			// Shrunk: the newest go, the oldest stay ready.
			slices.SortFunc(available, func(a, b *corev1.Pod) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) })
			for _, pod := range available[:extra] {
				r.discard(ctx, pod, "its pool shrank")
			}
			available = available[extra:]
		}
		r.pools.mu.Lock()
		pc := r.pools.get(name)
		if len(failed) > 0 {
			pc.failures += len(failed)
			pc.lastErr = failed[len(failed)-1]
			pc.retryAt = now.Add(backoff(pc.failures))
		} else if len(available) > 0 {
			pc.failures, pc.lastErr = 0, ""
		}
		idle := len(available) + starting
		switch {
		case idle < def.Capacity.BufferMin:
			pc.refilling = true
		case idle >= def.Capacity.BufferMax:
			pc.refilling = false
		}
		refilling := pc.refilling
		lastErr, retryAt := pc.lastErr, pc.retryAt
		r.pools.mu.Unlock()
		r.publishPoolError(ctx, cms[name], lastErr)
		want := deficit(def.Capacity, idle, idle+allocated, refilling)
		if want == 0 || now.Before(retryAt) {
			continue
		}
		r.startWarm(ctx, def, min(want, maxStartsPerTick))
	}
}

// deficit is how many pods a pool must start: idle (available and
// starting) pods are refilled to BufferMax once they fell below
// BufferMin (refilling: until they are back at BufferMax), the pool holds
// at least PoolMin pods and at most PoolMax.
func deficit(c sandbox.Capacity, idle, total int, refilling bool) int {
	want := 0
	if refilling || idle < c.BufferMin {
		want = c.BufferMax - idle
	}
	if total+want < c.PoolMin {
		want = c.PoolMin - total
	}
	return max(0, min(want, c.PoolMax-total))
}

func backoff(failures int) time.Duration {
	d := time.Second << min(failures-1, 6)
	return min(d, maxPoolBackoff)
}

// startWarm creates n warm pods of a pool.
func (r *Runtime) startWarm(ctx context.Context, def *sandbox.Pool, n int) {
	spec := sandbox.MemberSpec(&def.Template)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			id := sandbox.NewID()
			pod, err := podFor(&r.cfg, r.ns, id, &spec, time.Now().UTC(), def.Name, def.Revision)
			if err == nil {
				_, err = r.createPod(ctx, id, pod, newToken())
			}
			if err != nil && ctx.Err() == nil {
				r.log.Warn("start a warm sandbox", "pool", def.Name, "err", err)
				r.pools.mu.Lock()
				pc := r.pools.get(def.Name)
				pc.failures++
				pc.lastErr = err.Error()
				pc.retryAt = time.Now().Add(backoff(pc.failures))
				r.pools.mu.Unlock()
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
	case errors.Is(err, errLost), errors.Is(err, sandbox.ErrNotFound):
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
