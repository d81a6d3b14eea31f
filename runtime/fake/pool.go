package fake

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

var _ sandbox.Pooler = (*Pooled)(nil)

// Pooled is the in-memory runtime with warm pools, kept by the policy the
// real runtimes follow (runtime/warmpool), so that code above runtimes and
// the conformance suite can exercise pools without an engine. Warm
// sandboxes are ordinary fake sandboxes, invisible until claimed. Its
// "execd" refuses, as the real one does, a claim with an empty or reserved
// variable name (sandbox.ErrInvalid, the sandbox stays warm); FailNext
// ("HandOver", err) makes the next hand-over fail with err instead (the
// sandbox is then discarded).
type Pooled struct {
	*Runtime

	// pools is guarded by Runtime.mu.
	pools map[string]*fakePool
	wake  chan struct{}
	stop  context.CancelFunc
	done  chan struct{}
	once  sync.Once
}

type fakePool struct {
	def     sandbox.Pool
	tracker *warmpool.Tracker
}

// poolTick is how often the pool loop looks at every pool, besides the
// wake-ups claims and changes send.
const poolTick = 20 * time.Millisecond

// NewPooled returns an empty runtime with warm pools, whose pool loop
// runs until Close.
func NewPooled() *Pooled {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pooled{Runtime: New(), pools: map[string]*fakePool{}, wake: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	go p.loop(ctx)
	return p
}

// Close stops the pool loop.
func (p *Pooled) Close() error {
	p.once.Do(func() {
		p.stop()
		<-p.done
	})
	return p.Runtime.Close()
}

func (p *Pooled) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Pooled) loop(ctx context.Context) {
	defer close(p.done)
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.wake:
		}
		p.tend()
	}
}

// tend looks at every pool once, as warmpool's Plan decides.
func (p *Pooled) tend() {
	r := p.Runtime
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range r.sandboxes {
		if e.pool != "" && !e.claiming && p.pools[e.pool] == nil {
			delete(r.sandboxes, id) // its pool was deleted
		}
	}
	for _, fp := range p.pools {
		plan := fp.tracker.Plan(&fp.def, r.membersLocked(fp.def.Name), now)
		for _, rm := range plan.Remove {
			delete(r.sandboxes, rm.ID)
		}
		for range plan.Start {
			if err := r.faultLocked("Create"); err != nil {
				fp.tracker.StartFailed(fp.def.Revision, err, now)
				break
			}
			if _, err := r.createLocked(sandbox.NewID(), sandbox.MemberSpec(&fp.def.Template), fp.def.Name, fp.def.Revision); err != nil {
				fp.tracker.StartFailed(fp.def.Revision, err, now)
				break
			}
		}
	}
}

// membersLocked lists the sandboxes pool started. r.mu must be held.
func (r *Runtime) membersLocked(pool string) []warmpool.Member {
	var out []warmpool.Member
	for _, e := range r.sandboxes {
		if e.from == pool {
			out = append(out, warmpool.Member{ID: e.sb.ID, Revision: e.revision, Created: e.sb.CreatedAt,
				Status: e.sb.Status, HandedOut: e.pool == "" || e.claiming})
		}
	}
	return out
}

func cloneSpec(s *sandbox.Spec) sandbox.Spec {
	c := *s
	c.Entrypoint = slices.Clone(s.Entrypoint)
	c.Env = maps.Clone(s.Env)
	return c
}

func (p *Pooled) infoLocked(fp *fakePool) *sandbox.PoolInfo {
	info := &sandbox.PoolInfo{Pool: fp.def}
	info.Template = cloneSpec(&fp.def.Template)
	info.Status = fp.tracker.Status(&fp.def, p.Runtime.membersLocked(fp.def.Name))
	return info
}

// lastRevision keeps revisions unique across pools' lives.
var (
	revMu        sync.Mutex
	lastRevision int64
)

func newRevision(now time.Time) int64 {
	revMu.Lock()
	defer revMu.Unlock()
	lastRevision = max(lastRevision+1, now.UnixMilli())
	return lastRevision
}

// CreatePool defines a pool and starts filling it.
func (p *Pooled) CreatePool(ctx context.Context, def sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := def.Check(); err != nil {
		return nil, err
	}
	def.CreatedAt = time.Now().UTC()
	def.Revision = newRevision(def.CreatedAt)
	def.Template = cloneSpec(&def.Template)
	r := p.Runtime
	r.mu.Lock()
	if _, ok := p.pools[def.Name]; ok {
		r.mu.Unlock()
		return nil, warmpool.Exists(def.Name)
	}
	fp := &fakePool{def: def, tracker: warmpool.NewTracker()}
	p.pools[def.Name] = fp
	info := p.infoLocked(fp)
	r.mu.Unlock()
	p.wakeUp()
	return info, nil
}

// UpdatePool changes a pool's template and capacity; a template that
// makes other sandboxes gets a new revision.
func (p *Pooled) UpdatePool(ctx context.Context, def sandbox.Pool) (*sandbox.PoolInfo, error) {
	if err := def.Check(); err != nil {
		return nil, err
	}
	r := p.Runtime
	r.mu.Lock()
	fp, ok := p.pools[def.Name]
	if !ok {
		r.mu.Unlock()
		return nil, warmpool.NotFound(def.Name)
	}
	def.CreatedAt, def.Revision = fp.def.CreatedAt, fp.def.Revision
	def.FromConfig = def.FromConfig || fp.def.FromConfig
	def.Template = cloneSpec(&def.Template)
	if !sandbox.SameMembers(&fp.def.Template, &def.Template) {
		def.Revision++
	}
	fp.def = def
	info := p.infoLocked(fp)
	r.mu.Unlock()
	p.wakeUp()
	return info, nil
}

// GetPool returns a pool with its status.
func (p *Pooled) GetPool(ctx context.Context, name string) (*sandbox.PoolInfo, error) {
	p.Runtime.mu.Lock()
	defer p.Runtime.mu.Unlock()
	fp, ok := p.pools[name]
	if !ok {
		return nil, warmpool.NotFound(name)
	}
	return p.infoLocked(fp), nil
}

// ListPools returns every pool, by name.
func (p *Pooled) ListPools(ctx context.Context) ([]*sandbox.PoolInfo, error) {
	p.Runtime.mu.Lock()
	defer p.Runtime.mu.Unlock()
	out := make([]*sandbox.PoolInfo, 0, len(p.pools))
	for _, name := range slices.Sorted(maps.Keys(p.pools)) {
		out = append(out, p.infoLocked(p.pools[name]))
	}
	return out, nil
}

// DeletePool removes a pool and its warm sandboxes; those it handed out
// stay.
func (p *Pooled) DeletePool(ctx context.Context, name string) error {
	r := p.Runtime
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := p.pools[name]; !ok {
		return warmpool.NotFound(name)
	}
	delete(p.pools, name)
	for id, e := range r.sandboxes {
		if e.pool == name && !e.claiming {
			delete(r.sandboxes, id)
		}
	}
	return nil
}

// Claim hands out a warm sandbox, as warmpool.Claim decides.
func (p *Pooled) Claim(ctx context.Context, pool string, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	r := p.Runtime
	r.mu.Lock()
	pools := make([]warmpool.Candidate, 0, len(p.pools))
	for _, name := range slices.Sorted(maps.Keys(p.pools)) {
		def := p.pools[name].def
		pools = append(pools, warmpool.Candidate{Pool: &def, Tracker: p.pools[name].tracker})
	}
	obs := r.Observer
	r.mu.Unlock()
	defer p.wakeUp()
	return warmpool.Claim(ctx, claimer{p}, pools, pool, &spec, obs)
}

// claimer is the runtime as warmpool.Claim uses it.
type claimer struct{ p *Pooled }

func (c claimer) Members(def *sandbox.Pool) []warmpool.Member {
	r := c.p.Runtime
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.membersLocked(def.Name)
}

// reservedEnv are variables execd refuses in a claim.
var reservedEnv = map[string]bool{"EXECD_ACCESS_TOKEN": true}

func (c claimer) HandOver(ctx context.Context, def *sandbox.Pool, m warmpool.Member, spec *sandbox.Spec) (*sandbox.Sandbox, error) {
	r := c.p.Runtime
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.sandboxes[m.ID]
	if e == nil || e.claiming || e.pool != def.Name || e.revision != def.Revision || e.sb.Status.State != sandbox.StateRunning {
		return nil, fmt.Errorf("sandbox %s: %w", m.ID, warmpool.ErrLost)
	}
	for k := range spec.Env {
		if k == "" || reservedEnv[k] {
			return nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter,
				fmt.Sprintf("the sandbox refused the request: invalid environment variable name %q", k))
		}
	}
	e.claiming = true
	if err := r.faultLocked("HandOver"); err != nil {
		if errors.Is(err, sandbox.ErrInvalid) {
			e.claiming = false
		}
		return nil, err
	}
	entrypoint := spec.Entrypoint
	if len(entrypoint) == 0 {
		entrypoint = def.Template.Entrypoint
	}
	now := time.Now()
	e.pool, e.claiming = "", false
	e.token = "token-claimed-" + string(m.ID)
	e.sb.CreatedAt = now
	e.sb.Entrypoint = slices.Clone(entrypoint)
	e.sb.Metadata = maps.Clone(spec.Metadata)
	e.sb.Extensions = maps.Clone(spec.Extensions)
	e.sb.ExpiresAt = spec.ExpiresAt
	e.events = append(e.events, sandbox.Event{Time: now, Source: sandbox.SourceLifecycle, Type: "CLAIMED",
		Message: "handed out by warm pool " + def.Name})
	return clone(&e.sb), nil
}

func (c claimer) Discard(ctx context.Context, id sandbox.ID, why string) {
	r := c.p.Runtime
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sandboxes, id)
}
