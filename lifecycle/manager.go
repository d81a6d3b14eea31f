// Package lifecycle is the lifecycle server: the Manager, which carries
// out sandbox operations on a sandbox.Runtime and enforces expiry, and the
// HTTP API (/v1 and the root) that the OpenSandbox clients speak. It
// never imports a runtime; cmd/opensandbox-server hands it one.
package lifecycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	// MaxTimeout bounds a sandbox's timeout and renewals (how far ahead
	// an expiry may be). 0 means no bound.
	MaxTimeout time.Duration
	// ExpiryInterval is how often expiry is enforced. Default 250 ms, so a
	// sandbox outlives its expiry by less than a second.
	ExpiryInterval time.Duration
	// HousekeepingInterval is how often the runtime's own reconciliation
	// (orphans, drift) runs, if it has one. Default 15 s.
	HousekeepingInterval time.Duration
	// RuntimeName picks the runtime-specific error codes: "DOCKER" or
	// "KUBERNETES". Default "DOCKER"; New refuses a manager with another.
	RuntimeName string
	// Logger receives the manager's log. Default: discard.
	Logger *slog.Logger
	// Observer is told how long each expiry sweep takes. Default:
	// sandbox.NopObserver.
	Observer sandbox.Observer
}

// Manager carries out sandbox operations on a runtime, and runs the
// reconcile loop that deletes expired sandboxes.
type Manager struct {
	rt  sandbox.Runtime
	cfg ManagerConfig
	log *slog.Logger
	now func() time.Time
}

// NewManager returns a manager of rt.
func NewManager(rt sandbox.Runtime, cfg ManagerConfig) *Manager {
	cfg.ExpiryInterval = cmp.Or(cfg.ExpiryInterval, 250*time.Millisecond)
	cfg.HousekeepingInterval = cmp.Or(cfg.HousekeepingInterval, 15*time.Second)
	cfg.RuntimeName = cmp.Or(cfg.RuntimeName, "DOCKER")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = sandbox.NopObserver{}
	}
	return &Manager{rt: rt, cfg: cfg, log: cfg.Logger, now: time.Now}
}

// Runtime returns the manager's runtime.
func (m *Manager) Runtime() sandbox.Runtime { return m.rt }

// Run enforces expiry, and runs the runtime's housekeeping, until ctx
// ends. Expiry is kept by the runtime, so a restarted server picks every
// timer up again from the first tick.
func (m *Manager) Run(ctx context.Context) {
	expiry := time.NewTicker(m.cfg.ExpiryInterval)
	defer expiry.Stop()
	house := time.NewTicker(m.cfg.HousekeepingInterval)
	defer house.Stop()
	m.housekeeping(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-expiry.C:
			m.expire(ctx)
		case <-house.C:
			m.housekeeping(ctx)
		}
	}
}

// expire deletes every sandbox whose expiry has passed, and reports the
// sweep to the Observer.
func (m *Manager) expire(ctx context.Context) {
	if !m.leading() {
		return
	}
	start := time.Now()
	err := m.expireAll(ctx)
	m.cfg.Observer.Reconciled(sandbox.LoopExpiry, time.Since(start), err)
}

// leading reports whether this server keeps house: always, unless the
// runtime is shared by replicas that elect one.
func (m *Manager) leading() bool {
	e, ok := m.rt.(sandbox.Elected)
	return !ok || e.Leading()
}

// unsupported is the 501 for an operation the runtime lacks, with the
// runtime's own reason when it gives one.
func (m *Manager) unsupported(op, code, generic string) error {
	if l, ok := m.rt.(sandbox.Limited); ok {
		if why := l.Unsupported(op); why != "" {
			return sandbox.Coded(sandbox.ErrNotImplemented, code, why)
		}
	}
	return sandbox.Coded(sandbox.ErrNotImplemented, code, generic)
}

// expireAll is one expiry sweep. It logs each failure, and returns the
// first.
func (m *Manager) expireAll(ctx context.Context) error {
	all, err := m.rt.List(ctx)
	if err != nil {
		m.log.Error("list sandboxes for expiry", "err", err)
		return fmt.Errorf("list sandboxes: %w", err)
	}
	now := m.now()
	var first error
	for _, sb := range all {
		if !sb.Expired(now) {
			continue
		}
		err := m.rt.Delete(ctx, sb.ID)
		switch {
		case err == nil:
			m.log.Info("sandbox expired", "sandbox", sb.ID, "expiresAt", sb.ExpiresAt)
		case errors.Is(err, sandbox.ErrNotFound):
		default:
			m.log.Error("delete expired sandbox", "sandbox", sb.ID, "err", err)
			if first == nil {
				first = fmt.Errorf("delete expired sandbox %s: %w", sb.ID, err)
			}
		}
	}
	return first
}

func (m *Manager) housekeeping(ctx context.Context) {
	rc, ok := m.rt.(sandbox.Reconciler)
	if !ok || !m.leading() {
		return
	}
	if err := rc.Reconcile(ctx); err != nil && ctx.Err() == nil {
		m.log.Error("runtime reconcile", "err", err)
	}
}

// Create makes a sandbox from spec. A spec with a SnapshotID has its
// image resolved from the snapshot, which must be Ready.
func (m *Manager) Create(ctx context.Context, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	if spec.SnapshotID != "" {
		sn, ok := m.rt.(sandbox.Snapshotter)
		if !ok {
			return nil, sandbox.Coded(sandbox.ErrNotImplemented, codeSnapshotNotImpl, "this runtime cannot restore snapshots")
		}
		image, err := sn.SnapshotImage(ctx, sandbox.SnapshotID(spec.SnapshotID))
		if err != nil {
			return nil, err
		}
		spec.Image = image
	}
	if p, ok := m.rt.(sandbox.Pooler); ok && spec.SnapshotID == "" {
		poolRef := strings.TrimSpace(spec.Extensions[extPoolRef])
		sb, err := p.Claim(ctx, poolRef, spec)
		switch {
		case err == nil:
			return sb, nil
		case poolRef != "" && errors.Is(err, sandbox.ErrPoolEmpty):
			// Nothing warm: made cold from the pool's template.
			info, gerr := p.GetPool(ctx, poolRef)
			if gerr != nil {
				return nil, gerr
			}
			spec = fromTemplate(spec, &info.Template)
		case poolRef != "":
			return nil, err
		case !errors.Is(err, sandbox.ErrPoolEmpty):
			m.log.Warn("claim from a matching warm pool failed; creating cold", "err", err)
		}
	}
	return m.rt.Create(ctx, sandbox.NewID(), spec)
}

// fromTemplate fills what a pool-mode create left out from the pool's
// template: image, entrypoint, resources, and environment and extensions
// under the request's own.
func fromTemplate(spec sandbox.Spec, t *sandbox.Spec) sandbox.Spec {
	if spec.Image == "" {
		spec.Image = t.Image
	}
	if len(spec.Entrypoint) == 0 {
		spec.Entrypoint = slices.Clone(t.Entrypoint)
	}
	if len(spec.Entrypoint) == 0 {
		spec.Entrypoint = slices.Clone(snapshotEntrypoint)
	}
	if spec.Resources == (sandbox.Resources{}) {
		spec.Resources = t.Resources
	}
	env := maps.Clone(t.Env)
	if env == nil && len(spec.Env) > 0 {
		env = map[string]string{}
	}
	maps.Copy(env, spec.Env)
	spec.Env = env
	spec.Extensions = sandbox.WithTemplateExtensions(spec.Extensions, t)
	return spec
}

// Renew moves a sandbox's expiry to at, which must be in the future (and
// within MaxTimeout). A sandbox without expiry cannot be renewed.
func (m *Manager) Renew(ctx context.Context, id sandbox.ID, at time.Time) (time.Time, error) {
	sb, err := m.rt.Get(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	if sb.ExpiresAt == nil {
		return time.Time{}, sandbox.Coded(sandbox.ErrConflict, runtimeCodes[m.cfg.RuntimeName].invalidExpiration,
			fmt.Sprintf("sandbox %s was created without a timeout and has no expiration to renew", id))
	}
	now := m.now()
	at = at.UTC()
	if !at.After(now) {
		return time.Time{}, sandbox.Coded(sandbox.ErrInvalid, runtimeCodes[m.cfg.RuntimeName].invalidExpiration,
			fmt.Sprintf("new expiration %s is not in the future", at.Format(time.RFC3339)))
	}
	if m.cfg.MaxTimeout > 0 && at.Sub(now) > m.cfg.MaxTimeout {
		return time.Time{}, sandbox.Coded(sandbox.ErrInvalid, codeInvalidParameter,
			fmt.Sprintf("new expiration is more than the server's maximum of %v ahead", m.cfg.MaxTimeout))
	}
	if err := m.rt.SetExpiry(ctx, id, &at); err != nil {
		return time.Time{}, err
	}
	return at, nil
}

// RenewOnAccess moves a sandbox's expiry to at unless it is already at
// or after at - slack; it never shortens one. It reports whether it
// wrote. On a runtime shared by several servers (sandbox.ExpiryExtender)
// the decision is made on the runtime's stored state in the same write,
// so a renewal asked of every replica at once lands once.
func (m *Manager) RenewOnAccess(ctx context.Context, id sandbox.ID, at time.Time, slack time.Duration) (bool, error) {
	if ext, ok := m.rt.(sandbox.ExpiryExtender); ok {
		_, wrote, err := ext.ExtendExpiry(ctx, id, at, slack)
		return wrote, err
	}
	sb, err := m.rt.Get(ctx, id)
	if err != nil {
		return false, err
	}
	if sb.ExpiresAt != nil && !sb.ExpiresAt.Before(at.Add(-slack)) {
		return false, nil
	}
	if _, err := m.Renew(ctx, id, at); err != nil {
		return false, err
	}
	return true, nil
}

// Pause freezes a sandbox, if the runtime can.
func (m *Manager) Pause(ctx context.Context, id sandbox.ID) error {
	p, ok := m.rt.(sandbox.Pauser)
	if !ok {
		return m.unsupported(sandbox.OpPause, codeAPINotSupported, "this runtime cannot pause sandboxes")
	}
	return p.Pause(ctx, id)
}

// Resume thaws a sandbox, if the runtime can.
func (m *Manager) Resume(ctx context.Context, id sandbox.ID) error {
	p, ok := m.rt.(sandbox.Pauser)
	if !ok {
		return m.unsupported(sandbox.OpPause, codeAPINotSupported, "this runtime cannot resume sandboxes")
	}
	return p.Resume(ctx, id)
}

// Snapshotter returns the runtime's snapshot support, or an error that
// answers 501.
func (m *Manager) Snapshotter() (sandbox.Snapshotter, error) {
	sn, ok := m.rt.(sandbox.Snapshotter)
	if !ok {
		return nil, m.unsupported(sandbox.OpSnapshot, codeSnapshotNotImpl, "this runtime cannot take snapshots")
	}
	return sn, nil
}

// Diagnoser returns the runtime's diagnostics, or an error that answers
// 501.
func (m *Manager) Diagnoser() (sandbox.Diagnoser, error) {
	d, ok := m.rt.(sandbox.Diagnoser)
	if !ok {
		return nil, sandbox.Coded(sandbox.ErrNotImplemented, "DIAGNOSTICS_NOT_IMPLEMENTED", "this runtime has no diagnostics")
	}
	return d, nil
}
