package docker

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

var _ sandbox.Pooler = (*Runtime)(nil)

// Warm pool tuning.
const (
	// poolTick is how often the pool loop looks at every pool, besides
	// the wake-ups that claims and changes send it.
	poolTick = time.Second
	// maxParallelStarts bounds the warm sandboxes of one pool being
	// started at once, so that a big refill does not swamp the engine
	// that cold creates use too.
	maxParallelStarts = 8
	// maxPoolBackoff is the longest a pool whose sandboxes fail to start
	// waits before it tries again.
	maxPoolBackoff = time.Minute
	// claimTries is how many warm sandboxes a claim tries before it gives
	// up and lets the create go cold.
	claimTries = 3
)

// poolState is a pool and what the runtime counts about it. Guarded by
// Runtime.mu.
type poolState struct {
	def    sandbox.Pool
	claims uint64
	misses uint64
	// failures counts warm sandboxes that failed to start in a row;
	// retryAt is when the next may be tried; lastErr says why the last
	// failed.
	failures    int
	retryAt     time.Time
	lastFailure time.Time
	lastErr     string
	// refilling is set when the pool's idle sandboxes fell below
	// BufferMin, and cleared when they are back at BufferMax: starts are
	// bounded per pass, so a refill takes several passes.
	refilling bool
}

// claimClient calls execd's /claim; it never goes through a proxy.
var claimClient = &http.Client{
	Timeout:   10 * time.Second,
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
		r.pools[p.Name] = &poolState{def: *p}
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
		return nil, sandbox.Coded(sandbox.ErrConflict, api.CodePoolAlreadyExists, fmt.Sprintf("pool %s already exists", p.Name))
	}
	if err := r.st.putPool(&p); err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("record pool %s: %w", p.Name, err)
	}
	ps := &poolState{def: p}
	r.pools[p.Name] = ps
	info := r.poolInfoLocked(ps)
	r.mu.Unlock()
	r.log.Info("pool created", "pool", p.Name, "image", p.Template.Image)
	r.wakePools()
	return info, nil
}

// UpdatePool changes a pool's template and capacity; a new template gets
// a new revision, and warm sandboxes of the old one are replaced.
func (r *Runtime) UpdatePool(ctx context.Context, p sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := r.checkPool(&p); err != nil {
		return nil, err
	}
	r.mu.Lock()
	ps, ok := r.pools[p.Name]
	if !ok {
		r.mu.Unlock()
		return nil, poolNotFound(p.Name)
	}
	p.CreatedAt, p.Revision = ps.def.CreatedAt, ps.def.Revision
	p.FromConfig = p.FromConfig || ps.def.FromConfig
	if !sandbox.SameMembers(&ps.def.Template, &p.Template) {
		p.Revision++
		ps.failures, ps.lastErr, ps.retryAt = 0, "", time.Time{}
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

func poolNotFound(name string) error {
	return sandbox.Coded(sandbox.ErrNotFound, api.CodePoolNotFound, fmt.Sprintf("pool %s not found", name))
}

// GetPool returns a pool with its status.
func (r *Runtime) GetPool(ctx context.Context, name string) (*sandbox.PoolInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps, ok := r.pools[name]
	if !ok {
		return nil, poolNotFound(name)
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
		return poolNotFound(name)
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
	st := &info.Status
	for _, e := range r.byID {
		if e.deleting || e.from != ps.def.Name {
			continue
		}
		state := e.sb.Status.State
		switch {
		case state == sandbox.StateFailed || state == sandbox.StateTerminated || state == sandbox.StateUnknown:
			// Gone or going: neither ready nor anyone's.
		case e.pool == "" || e.claiming:
			st.Allocated++
		case state == sandbox.StatePending:
			st.Starting++
		case state == sandbox.StateRunning && e.revision == ps.def.Revision:
			st.Available++
		}
	}
	st.Total = st.Allocated + st.Available + st.Starting
	st.Claims, st.Misses, st.Error = ps.claims, ps.misses, ps.lastErr
	return info
}

func cloneSpec(s *sandbox.Spec) sandbox.Spec {
	c := *s
	c.Entrypoint = slices.Clone(s.Entrypoint)
	c.Env = maps.Clone(s.Env)
	return c
}

// Claim hands out a warm sandbox: of pool when it is named, else of the
// first pool (by name) whose template matches spec.
func (r *Runtime) Claim(ctx context.Context, pool string, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	start := time.Now()
	for try := 0; try < claimTries; try++ {
		r.mu.Lock()
		var candidates []*poolState
		if pool != "" {
			ps, ok := r.pools[pool]
			if !ok {
				r.mu.Unlock()
				return nil, poolNotFound(pool)
			}
			if !ps.def.Satisfies(&spec, extRuntime) {
				ps.misses++
				r.mu.Unlock()
				r.cfg.Observer.PoolClaim(pool, false)
				return nil, sandbox.ErrPoolEmpty
			}
			candidates = []*poolState{ps}
		} else {
			for _, name := range slices.Sorted(maps.Keys(r.pools)) {
				if ps := r.pools[name]; ps.def.Matches(&spec, extRuntime) {
					candidates = append(candidates, ps)
				}
			}
		}
		var e *entry
		var ps *poolState
		for _, c := range candidates {
			if e = r.pickLocked(c); e != nil {
				ps = c
				break
			}
		}
		if e == nil {
			if len(candidates) > 0 {
				candidates[0].misses++
				r.cfg.Observer.PoolClaim(candidates[0].def.Name, false)
			}
			r.mu.Unlock()
			r.wakePools()
			return nil, sandbox.ErrPoolEmpty
		}
		e.claiming = true
		def := ps.def
		r.mu.Unlock()
		r.wakePools() // refill meanwhile

		sb, err := r.handOver(ctx, e, &def, &spec)
		if err == nil {
			r.mu.Lock()
			ps.claims++
			r.mu.Unlock()
			r.cfg.Observer.PoolClaim(def.Name, true)
			r.cfg.Observer.SandboxReady(sandbox.CreatePooled, time.Since(start))
			return sb, nil
		}
		if errors.Is(err, sandbox.ErrInvalid) {
			// The request, not the sandbox, was at fault: it stays warm,
			// its claim marker cleared.
			r.recMu.Lock()
			if uerr := r.st.updateRecord(e.sb.ID, func(rec *record) { rec.Claiming = false }); uerr != nil {
				r.log.Warn("clear claim marker", "sandbox", e.sb.ID, "err", uerr)
			}
			r.recMu.Unlock()
			r.mu.Lock()
			e.claiming = false
			r.mu.Unlock()
			return nil, err
		}
		r.mu.Lock()
		r.log.Warn("warm sandbox could not be claimed; trying another", "pool", def.Name, "sandbox", e.sb.ID, "err", err)
		// Never unmarked before it is marked deleting: no other claim may
		// take it in between.
		r.discardLocked(e, "it could not be claimed")
		if try == claimTries-1 {
			ps.misses++
			r.cfg.Observer.PoolClaim(def.Name, false)
		}
		r.mu.Unlock()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, sandbox.ErrPoolEmpty
}

// pickLocked returns the oldest ready warm sandbox of ps, or nil. r.mu
// must be held.
func (r *Runtime) pickLocked(ps *poolState) *entry {
	var best *entry
	for _, e := range r.byID {
		if e.pool != ps.def.Name || e.deleting || e.claiming || e.revision != ps.def.Revision ||
			e.sb.Status.State != sandbox.StateRunning {
			continue
		}
		if best == nil || e.sb.CreatedAt.Before(best.sb.CreatedAt) {
			best = e
		}
	}
	return best
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
	body, err := json.Marshal(api.ClaimRequest{Token: token, Env: spec.Env, Entrypoint: entrypoint})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, execdURL(addr)+"/claim", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set(sandbox.HeaderExecdToken, oldToken)
	req.Header.Set("Content-Type", "application/json")
	// Recorded first: a restart that finds a claim begun and not finished
	// cannot tell whether execd took it, so it removes the sandbox rather
	// than hand it out again (see restore).
	r.recMu.Lock()
	err = r.st.updateRecord(id, func(rec *record) { rec.Claiming = true })
	r.recMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("record the claim: %w", err)
	}
	resp, err := claimClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("claim through execd: %w", err)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, "the sandbox refused the request: "+string(msg))
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("claim through execd: %s: %s", resp.Status, msg)
	}

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
		// trusted to anyone.
		r.mu.Lock()
		r.discardLocked(e, "its claim could not be recorded")
		r.mu.Unlock()
		return nil, err
	}
	r.log.Info("sandbox claimed from pool", "sandbox", id, "pool", def.Name)
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

// tendPools looks at every pool once: warm sandboxes that failed are
// removed (and the pool backs off), those of an old template or beyond
// bufferMax are removed, and new ones are started to bring the buffer
// back to bufferMax once it fell below bufferMin, and the pool to poolMin.
func (r *Runtime) tendPools() {
	now := time.Now()
	type start struct {
		def sandbox.Pool
		n   int
	}
	var starts []start
	var drop []*entry
	r.mu.Lock()
	for _, e := range r.byID {
		if e.pool != "" && !e.deleting && !e.claiming && r.pools[e.pool] == nil {
			drop = append(drop, e) // its pool was deleted while it started
		}
	}
	for _, ps := range r.pools {
		name := ps.def.Name
		var available []*entry
		starting, staleStarting, allocated := 0, 0, 0
		recovered := false
		for _, e := range r.byID {
			if e.deleting {
				continue
			}
			st := e.sb.Status
			failed := st.State == sandbox.StateFailed || st.State == sandbox.StateTerminated || st.State == sandbox.StateUnknown
			if e.pool == "" || e.claiming {
				if e.from == name && !failed {
					allocated++ // handed out (or being) and alive
				}
				continue
			}
			if e.pool != name {
				continue
			}
			switch {
			case failed:
				if e.revision == ps.def.Revision {
					ps.failures++
					ps.lastFailure = now
					ps.lastErr = cmp.Or(st.Reason+": "+st.Message, st.Reason)
					ps.retryAt = now.Add(backoff(ps.failures))
				}
				drop = append(drop, e)
			case e.revision != ps.def.Revision:
				if st.State == sandbox.StatePending {
					staleStarting++ // removed once it has started
				} else {
					drop = append(drop, e)
				}
			case st.State == sandbox.StatePending:
				starting++
			case st.State == sandbox.StateRunning:
				available = append(available, e)
				if st.Since.After(ps.lastFailure) {
					recovered = true
				}
			}
		}
		if recovered && ps.failures > 0 {
			// A sandbox started after the last failure: the pool works.
			ps.failures, ps.lastErr, ps.retryAt = 0, "", time.Time{}
		}
		c := ps.def.Capacity
		if extra := len(available) - c.BufferMax; extra > 0 {
			// Shrunk: the newest go, the oldest stay ready.
			slices.SortFunc(available, func(a, b *entry) int { return b.sb.CreatedAt.Compare(a.sb.CreatedAt) })
			drop = append(drop, available[:extra]...)
			available = available[extra:]
		}
		have := len(available) + starting
		total := allocated + have + staleStarting
		if have < c.BufferMin {
			ps.refilling = true
		} else if have >= c.BufferMax {
			ps.refilling = false
		}
		want := 0
		if ps.refilling {
			want = c.BufferMax - have
		}
		if total+want < c.PoolMin {
			want = c.PoolMin - total
		}
		want = min(want, c.PoolMax-total, maxParallelStarts-starting-staleStarting)
		if ps.failures > 0 {
			// After failures, one probe at a time, once the delay passed.
			if now.Before(ps.retryAt) || starting > 0 {
				want = 0
			}
			want = min(want, 1)
		}
		if want > 0 {
			starts = append(starts, start{ps.def, want})
		}
	}
	r.mu.Unlock()

	if len(drop) > 0 {
		r.discard(drop, "it failed, or is no longer wanted")
	}
	for _, s := range starts {
		for range s.n {
			spec := sandbox.MemberSpec(&s.def.Template)
			if _, err := r.create(r.ctx, sandbox.NewID(), spec, s.def.Name, s.def.Revision); err != nil {
				if errors.Is(err, errPoolGone) {
					break
				}
				r.log.Warn("start warm sandbox", "pool", s.def.Name, "err", err)
				r.mu.Lock()
				if ps := r.pools[s.def.Name]; ps != nil {
					ps.failures++
					ps.lastErr = err.Error()
					ps.retryAt = now.Add(backoff(ps.failures))
				}
				r.mu.Unlock()
				break
			}
		}
	}
}

// backoff is the wait after n failures in a row: 1 s, doubling, at most
// maxPoolBackoff.
func backoff(n int) time.Duration {
	d := time.Second << min(n-1, 10)
	return min(d, maxPoolBackoff)
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
