package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

var _ sandbox.Pooler = (*Runtime)(nil)

// poolTick is how often the pool loop looks at every pool, besides the
// wake-ups that claims and changes send it.
const poolTick = time.Second

// poolState is a pool and the policy's memory of it. def is guarded by
// Runtime.mu, and replaced (never changed) by UpdatePool.
type poolState struct {
	def     sandbox.Pool
	tracker *warmpool.Tracker
}

// claimClient calls execd's /claim; it never goes through a proxy.
var claimClient = &http.Client{
	Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
}

// loadPools reads the pools' definitions from the store.
func (r *Runtime) loadPools() error {
	defs, err := r.st.pools()
	if err != nil {
		return fmt.Errorf("read pools: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range defs {
		r.pools[p.Name] = &poolState{def: *p, tracker: warmpool.NewTracker()}
	}
	return nil
}

// wakePools asks the pool loop to look at the pools now.
func (r *Runtime) wakePools() {
	select {
	case r.poolWake <- struct{}{}:
	default:
	}
}

// checkPool refuses a pool that cannot work: sandbox's rules, and a
// container the engine would refuse.
func (r *Runtime) checkPool(p *sandbox.Pool) error {
	if err := p.Check(); err != nil {
		return err
	}
	spec := sandbox.MemberSpec(&p.Template)
	if _, _, _, err := containerConfig(&r.cfg, "check", &spec, time.Now(), "check", p.Name); err != nil {
		return err
	}
	return nil
}

// CreatePool defines a pool and starts filling it.
func (r *Runtime) CreatePool(ctx context.Context, p sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := r.checkPool(&p); err != nil {
		return nil, err
	}
	// Revisions never repeat across a pool's lives: a warm sandbox left by
	// a deleted pool can never pass for one of a new pool of that name.
	p.CreatedAt = time.Now().UTC()
	p.Revision = p.CreatedAt.UnixMilli()
	r.mu.Lock()
	if _, ok := r.pools[p.Name]; ok {
		r.mu.Unlock()
		return nil, warmpool.Exists(p.Name)
	}
	if err := r.st.putPool(&p); err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("record pool %s: %w", p.Name, err)
	}
	ps := &poolState{def: p, tracker: warmpool.NewTracker()}
	r.pools[p.Name] = ps
	info := r.poolInfoLocked(ps)
	r.mu.Unlock()
	r.log.Info("pool created", "pool", p.Name, "image", p.Template.Image)
	r.wakePools()
	return info, nil
}

// UpdatePool changes a pool's template and capacity; a new template gets
// a new revision, and warm sandboxes of the old one are replaced (the
// old revision's failures are forgotten once the pool loop reads it).
func (r *Runtime) UpdatePool(ctx context.Context, p sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := r.checkPool(&p); err != nil {
		return nil, err
	}
	r.mu.Lock()
	ps, ok := r.pools[p.Name]
	if !ok {
		r.mu.Unlock()
		return nil, warmpool.NotFound(p.Name)
	}
	p.CreatedAt, p.Revision = ps.def.CreatedAt, ps.def.Revision
	p.FromConfig = p.FromConfig || ps.def.FromConfig
	if !sandbox.SameMembers(&ps.def.Template, &p.Template) {
		p.Revision++
	}
	if err := r.st.putPool(&p); err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("record pool %s: %w", p.Name, err)
	}
	ps.def = p
	info := r.poolInfoLocked(ps)
	r.mu.Unlock()
	r.wakePools()
	return info, nil
}

// GetPool returns a pool with its status.
func (r *Runtime) GetPool(ctx context.Context, name string) (*sandbox.PoolInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps, ok := r.pools[name]
	if !ok {
		return nil, warmpool.NotFound(name)
	}
	return r.poolInfoLocked(ps), nil
}

// ListPools returns every pool, by name.
func (r *Runtime) ListPools(ctx context.Context) ([]*sandbox.PoolInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*sandbox.PoolInfo, 0, len(r.pools))
	for _, name := range slices.Sorted(maps.Keys(r.pools)) {
		out = append(out, r.poolInfoLocked(r.pools[name]))
	}
	return out, nil
}

// DeletePool removes a pool and its warm sandboxes; those it handed out
// are left alone.
func (r *Runtime) DeletePool(ctx context.Context, name string) error {
	r.mu.Lock()
	if _, ok := r.pools[name]; !ok {
		r.mu.Unlock()
		return warmpool.NotFound(name)
	}
	if err := r.st.deletePool(name); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("forget pool %s: %w", name, err)
	}
	delete(r.pools, name)
	var members []*entry
	for _, e := range r.byID {
		if e.pool == name && !e.deleting && !e.claiming {
			members = append(members, e)
		}
	}
	r.mu.Unlock()
	r.discard(members, "its pool was deleted")
	r.log.Info("pool deleted", "pool", name, "warm sandboxes removed", len(members))
	return nil
}

// poolInfoLocked returns a pool with its status. r.mu must be held.
func (r *Runtime) poolInfoLocked(ps *poolState) *sandbox.PoolInfo {
	info := &sandbox.PoolInfo{Pool: ps.def}
	info.Template = cloneSpec(&ps.def.Template)
	info.Status = ps.tracker.Status(&ps.def, r.membersLocked(ps.def.Name))
	return info
}

func cloneSpec(s *sandbox.Spec) sandbox.Spec {
	c := *s
	c.Entrypoint = slices.Clone(s.Entrypoint)
	c.Env = maps.Clone(s.Env)
	return c
}

// Claim hands out a warm sandbox: of pool when it is named, else of the
// first pool (by name) whose template matches spec. warmpool.Claim says
// which, and what a failed hand-over does.
func (r *Runtime) Claim(ctx context.Context, pool string, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	pools := make([]warmpool.Candidate, 0, len(r.pools))
	for _, name := range slices.Sorted(maps.Keys(r.pools)) {
		ps := r.pools[name]
		def := ps.def // replaced, never changed, by UpdatePool
		pools = append(pools, warmpool.Candidate{Pool: &def, Tracker: ps.tracker})
	}
	r.mu.Unlock()
	defer r.wakePools()
	return warmpool.Claim(ctx, claimer{r}, pools, pool, &spec, r.cfg.Observer, extRuntime)
}

// claimer is the runtime as warmpool.Claim uses it.
type claimer struct{ r *Runtime }

func (c claimer) Members(def *sandbox.Pool) []warmpool.Member {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	return c.r.membersLocked(def.Name)
}

// HandOver takes the warm sandbox m, if it still is one, marking it
// claiming under r.mu so that no other claim can, and hands it over. A
// request execd refused leaves it warm again.
func (c claimer) HandOver(ctx context.Context, def *sandbox.Pool, m warmpool.Member, spec *sandbox.Spec) (*sandbox.Sandbox, error) {
	r := c.r
	r.mu.Lock()
	e := r.byID[m.ID]
	if e == nil || e.deleting || e.claiming || e.pool != def.Name || e.revision != def.Revision || e.sb.Status.State != sandbox.StateRunning {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", m.ID, warmpool.ErrLost)
	}
	e.claiming = true
	r.mu.Unlock()
	r.wakePools() // refill meanwhile

	sb, err := r.handOver(ctx, e, def, spec)
	if errors.Is(err, sandbox.ErrInvalid) {
		// The request, not the sandbox, was at fault: it stays warm, its
		// claim marker cleared.
		r.recMu.Lock()
		if uerr := r.st.updateRecord(e.sb.ID, func(rec *record) { rec.Claiming = false }); uerr != nil {
			r.log.Warn("clear claim marker", "sandbox", e.sb.ID, "err", uerr)
		}
		r.recMu.Unlock()
		r.mu.Lock()
		e.claiming = false
		r.mu.Unlock()
	}
	return sb, err
}

// Discard removes a warm sandbox whose hand-over failed. It is still
// marked claiming, so no other claim took it meanwhile.
func (c claimer) Discard(ctx context.Context, id sandbox.ID, why string) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if e := c.r.byID[id]; e != nil {
		c.r.discardLocked(e, why)
	}
}

// membersLocked lists the sandboxes pool started, handed out or not, for
// the pool policy. r.mu must be held.
func (r *Runtime) membersLocked(pool string) []warmpool.Member {
	var out []warmpool.Member
	for _, e := range r.byID {
		if e.from != pool || e.deleting {
			continue
		}
		out = append(out, warmpool.Member{ID: e.sb.ID, Revision: e.revision, Created: e.sb.CreatedAt,
			Status: e.sb.Status, HandedOut: e.pool == "" || e.claiming})
	}
	return out
}

// handOver gives the claimed warm sandbox e its user's settings: a fresh
// execd token, environment and entrypoint through execd's /claim, then
// metadata, expiry and the rest in the index and the store. The sandbox
// becomes visible, Running, when this returns.
func (r *Runtime) handOver(ctx context.Context, e *entry, def *sandbox.Pool, spec *sandbox.Spec) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	id, oldToken, addr := e.sb.ID, e.token, e.ports[api.ExecdPort]
	r.mu.Unlock()
	entrypoint := spec.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = def.Template.Entrypoint
	}
	token := newToken()
	// Recorded first: a restart that finds a claim begun and not finished
	// cannot tell whether execd took it, so it removes the sandbox rather
	// than hand it out again (see restore).
	r.recMu.Lock()
	err := r.st.updateRecord(id, func(rec *record) { rec.Claiming = true })
	r.recMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("record the claim: %w", err)
	}
	if err := warmpool.ClaimExecd(ctx, claimClient, execdURL(addr), oldToken,
		api.ClaimRequest{Token: token, Env: spec.Env, Entrypoint: entrypoint}); err != nil {
		return nil, err
	}
	// Taken: an entrypoint that could not start makes this sandbox Failed
	// below, the claim's answer, rather than a reason to try another.
	startErr := checkEntrypoint(ctx, addr, token)

	now := time.Now().UTC()
	var sb *sandbox.Sandbox
	err = r.updateRecord(id, func(cur *entry) (func(*record), error) {
		if cur == nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
		}
		cur.pool, cur.claiming, cur.token = "", false, token
		cur.sb.CreatedAt = now
		cur.sb.Entrypoint = slices.Clone(entrypoint)
		cur.sb.Metadata = maps.Clone(spec.Metadata)
		cur.sb.Extensions = maps.Clone(spec.Extensions)
		cur.sb.ExpiresAt = spec.ExpiresAt
		cur.gen++
		r.event(id, sandbox.Event{Time: now, Source: sandbox.SourceLifecycle, Type: "CLAIMED",
			Message: "handed out by warm pool " + def.Name})
		sb = cloneSandbox(&cur.sb)
		md, ext, ep := maps.Clone(spec.Metadata), maps.Clone(spec.Extensions), slices.Clone(entrypoint)
		return func(rec *record) {
			rec.Claimed, rec.Token, rec.CreatedAt = true, token, now
			rec.Metadata, rec.Extensions, rec.Entrypoint, rec.ExpiresAt = md, ext, ep, spec.ExpiresAt
		}, nil
	})
	if err != nil {
		// The index has it as claimed, the store may not: it cannot be
		// trusted to anyone, and the claim discards it.
		return nil, fmt.Errorf("record the claimed sandbox: %w", err)
	}
	r.log.Info("sandbox claimed from pool", "sandbox", id, "pool", def.Name)
	var f *failure
	if errors.As(startErr, &f) && f.reason != api.ReasonEntrypointFailed {
		// Claimed and handed over: a status execd did not give is no
		// reason to fail the sandbox.
		r.log.Warn("entrypoint status of a claimed sandbox", "sandbox", id, "err", startErr)
	} else if f != nil {
		r.failStarted(context.WithoutCancel(ctx), e, f)
		if cur, err := r.Get(ctx, id); err == nil {
			sb = cur
		}
	}
	return sb, nil
}

// discard removes warm sandboxes in the background, except those handed
// out or being claimed since they were chosen.
func (r *Runtime) discard(members []*entry, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range members {
		if e.pool == "" || e.claiming {
			continue
		}
		r.discardLocked(e, why)
	}
}

// discardLocked marks e deleting and removes it in the background. r.mu
// must be held.
func (r *Runtime) discardLocked(e *entry, why string) {
	if e.deleting {
		return
	}
	e.claiming = false
	cancel, done := r.markDeletingLocked(e)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.log.Info("removing warm sandbox", "sandbox", e.sb.ID, "pool", e.from, "why", why)
		if err := r.remove(context.WithoutCancel(r.ctx), e, cancel, done); err != nil {
			r.log.Warn("remove warm sandbox", "sandbox", e.sb.ID, "err", err)
		}
	}()
}

// poolLoop keeps every pool between its bounds until the runtime closes.
func (r *Runtime) poolLoop() {
	defer r.wg.Done()
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		case <-r.poolWake:
		}
		r.tendPools()
	}
}

// tendPools looks at every pool once, as warmpool's Plan decides: warm
// sandboxes that failed, are of an old template or beyond bufferMax are
// removed, and new ones started; warm sandboxes of deleted pools go too.
func (r *Runtime) tendPools() {
	now := time.Now()
	type start struct {
		def     sandbox.Pool
		tracker *warmpool.Tracker
		n       int
	}
	var starts []start
	r.mu.Lock()
	for _, e := range r.byID {
		if e.pool != "" && !e.deleting && !e.claiming && r.pools[e.pool] == nil {
			r.discardLocked(e, "its pool was deleted")
		}
	}
	for _, ps := range r.pools {
		plan := ps.tracker.Plan(&ps.def, r.membersLocked(ps.def.Name), now)
		for _, rm := range plan.Remove {
			// Plan removes only warm sandboxes no claim is taking, and r.mu
			// has been held since it listed them.
			r.discardLocked(r.byID[rm.ID], rm.Why)
		}
		if plan.Start > 0 {
			starts = append(starts, start{ps.def, ps.tracker, plan.Start})
		}
	}
	r.mu.Unlock()

	for _, s := range starts {
		for range s.n {
			spec := sandbox.MemberSpec(&s.def.Template)
			if _, err := r.create(r.ctx, sandbox.NewID(), spec, s.def.Name, s.def.Revision); err != nil {
				if errors.Is(err, errPoolGone) {
					break
				}
				r.log.Warn("start warm sandbox", "pool", s.def.Name, "err", err)
				s.tracker.StartFailed(s.def.Revision, err, time.Now())
				break
			}
		}
	}
}

var _ sandbox.PoolLister = (*Runtime)(nil)

// Pools reports how full every pool is, for the server's metrics.
func (r *Runtime) Pools(ctx context.Context) ([]sandbox.PoolSize, error) {
	infos, err := r.ListPools(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.PoolSize, 0, len(infos))
	for _, info := range infos {
		st := info.Status
		out = append(out, sandbox.PoolSize{Name: info.Name, Total: st.Total, Allocated: st.Allocated, Available: st.Available})
	}
	return out, nil
}
