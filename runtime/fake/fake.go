// Package fake is an in-memory sandbox.Runtime with the real state rules
// and scriptable faults, for tests of the code above runtimes. It passes
// the same conformance suite (runtime/runtimetest) as the real runtimes,
// so it cannot drift from them. Only tests import it.
package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

var (
	_ sandbox.Runtime      = (*Runtime)(nil)
	_ sandbox.Pauser       = (*Runtime)(nil)
	_ sandbox.Snapshotter  = (*Runtime)(nil)
	_ sandbox.Diagnoser    = (*Runtime)(nil)
	_ sandbox.ExecdTokener = (*Runtime)(nil)
)

// Runtime is the in-memory runtime. The zero value is not usable; call New.
type Runtime struct {
	// StartDelay is how long a sandbox stays Pending. Default 10 ms.
	StartDelay time.Duration
	// MissingImages fail to start, as an image that cannot be pulled.
	MissingImages map[string]bool
	// Observer is told of every sandbox that becomes Running, as a cold
	// create. Default: sandbox.NopObserver. Set it before the first
	// Create.
	Observer sandbox.Observer

	mu        sync.Mutex
	sandboxes map[sandbox.ID]*entry
	snapshots map[sandbox.SnapshotID]*sandbox.Snapshot
	faults    map[string]error
}

type entry struct {
	sb     sandbox.Sandbox
	token  string
	events []sandbox.Event
	// pool is the warm pool holding the sandbox until it is claimed
	// (Pooled): while set, the sandbox is invisible. from names the pool
	// it came from, for good, revision the template's revision it was
	// started from; claiming marks a claim under way.
	pool, from string
	revision   int64
	claiming   bool
	// broken makes the sandbox's hand-over fail, as a warm sandbox that no
	// longer takes its pool's token does (Pooled.BreakWarm).
	broken bool
}

// New returns an empty runtime.
func New() *Runtime {
	return &Runtime{
		StartDelay:    10 * time.Millisecond,
		MissingImages: map[string]bool{},
		Observer:      sandbox.NopObserver{},
		sandboxes:     map[sandbox.ID]*entry{},
		snapshots:     map[sandbox.SnapshotID]*sandbox.Snapshot{},
		faults:        map[string]error{},
	}
}

// FailNext makes the next call of op ("Create", "Delete", "Pause", ...)
// fail with err.
func (r *Runtime) FailNext(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[op] = err
}

// fault returns and clears a scripted failure of op. r.mu must be held.
func (r *Runtime) faultLocked(op string) error {
	err := r.faults[op]
	delete(r.faults, op)
	return err
}

func clone(sb *sandbox.Sandbox) *sandbox.Sandbox {
	c := *sb
	c.Metadata = maps.Clone(sb.Metadata)
	c.Extensions = maps.Clone(sb.Extensions)
	c.Entrypoint = slices.Clone(sb.Entrypoint)
	if sb.ExpiresAt != nil {
		t := *sb.ExpiresAt
		c.ExpiresAt = &t
	}
	return &c
}

func (e *entry) transition(state sandbox.State, reason, msg string) {
	now := time.Now()
	e.sb.Status = sandbox.Status{State: state, Reason: reason, Message: msg, Since: now}
	e.events = append(e.events, sandbox.Event{Time: now, Source: sandbox.SourceLifecycle, Type: reason, Message: msg})
}

// Create records the sandbox as Pending and makes it Running after
// StartDelay, telling the Observer, or Failed when its image is in
// MissingImages.
func (r *Runtime) Create(ctx context.Context, id sandbox.ID, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.faultLocked("Create"); err != nil {
		return nil, err
	}
	e, err := r.createLocked(id, spec, "", 0)
	if err != nil {
		return nil, err
	}
	return clone(&e.sb), nil
}

// createLocked starts a sandbox, or with pool set a warm sandbox of that
// pool's template revision. r.mu must be held.
func (r *Runtime) createLocked(id sandbox.ID, spec sandbox.Spec, pool string, revision int64) (*entry, error) {
	if _, ok := r.sandboxes[id]; ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrConflict)
	}
	e := &entry{token: "token-" + string(id), sb: sandbox.Sandbox{
		ID: id, Image: spec.Image, SnapshotID: spec.SnapshotID, Entrypoint: slices.Clone(spec.Entrypoint),
		Metadata: maps.Clone(spec.Metadata), Platform: spec.Platform, CreatedAt: time.Now(), ExpiresAt: spec.ExpiresAt,
		Extensions: maps.Clone(spec.Extensions), SecureAccess: spec.SecureAccess,
	}, pool: pool, from: pool, revision: revision}
	e.transition(sandbox.StatePending, "CREATING", "sandbox is being created")
	r.sandboxes[id] = e
	missing := r.MissingImages[spec.Image]
	obs, requested := r.Observer, time.Now()
	time.AfterFunc(r.StartDelay, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.sandboxes[id] != e || e.sb.Status.State != sandbox.StatePending {
			return
		}
		if missing {
			e.transition(sandbox.StateFailed, "IMAGE_PULL_FAILED", fmt.Sprintf("image %s not found", spec.Image))
			return
		}
		e.transition(sandbox.StateRunning, "RUNNING", "execd answers")
		if pool == "" {
			// A warm sandbox's start is not a create anyone waits for.
			obs.SandboxReady(sandbox.CreateCold, time.Since(requested))
		}
	})
	return e, nil
}

func (r *Runtime) getLocked(id sandbox.ID) (*entry, error) {
	e, ok := r.sandboxes[id]
	if !ok || e.pool != "" {
		return nil, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
	}
	return e, nil
}

// Get returns a copy of the sandbox.
func (r *Runtime) Get(ctx context.Context, id sandbox.ID) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return nil, err
	}
	return clone(&e.sb), nil
}

// List returns copies of every sandbox.
func (r *Runtime) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*sandbox.Sandbox, 0, len(r.sandboxes))
	for _, e := range r.sandboxes {
		if e.pool == "" {
			out = append(out, clone(&e.sb))
		}
	}
	return out, nil
}

// Delete forgets the sandbox.
func (r *Runtime) Delete(ctx context.Context, id sandbox.ID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.faultLocked("Delete"); err != nil {
		return err
	}
	if _, err := r.getLocked(id); err != nil {
		return err
	}
	delete(r.sandboxes, id)
	return nil
}

// Endpoint returns a made-up address with the sandbox's token.
func (r *Runtime) Endpoint(ctx context.Context, id sandbox.ID, port int) (sandbox.Endpoint, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return sandbox.Endpoint{}, err
	}
	if port < 1 || port > 65535 {
		return sandbox.Endpoint{}, fmt.Errorf("port %d: %w", port, sandbox.ErrInvalid)
	}
	return sandbox.Endpoint{
		Address: fmt.Sprintf("fake.invalid:%d", port),
		Headers: map[string]string{sandbox.HeaderExecdToken: e.token},
	}, nil
}

// Token returns the sandbox's execd token, for tests of what carries it.
func (r *Runtime) Token(id sandbox.ID) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.sandboxes[id]; e != nil {
		return e.token
	}
	return ""
}

// ExecdToken returns the sandbox's execd token from its create on, as
// the Kubernetes runtime does.
func (r *Runtime) ExecdToken(ctx context.Context, id sandbox.ID) (string, error) {
	if t := r.Token(id); t != "" {
		return t, nil
	}
	return "", fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
}

// SetExpiry records the expiry.
func (r *Runtime) SetExpiry(ctx context.Context, id sandbox.ID, at *time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return err
	}
	e.sb.ExpiresAt = at
	return nil
}

// PatchMetadata applies a merge patch.
func (r *Runtime) PatchMetadata(ctx context.Context, id sandbox.ID, patch map[string]*string) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return nil, err
	}
	if e.sb.Metadata == nil {
		e.sb.Metadata = map[string]string{}
	}
	for k, v := range patch {
		if v == nil {
			delete(e.sb.Metadata, k)
		} else {
			e.sb.Metadata[k] = *v
		}
	}
	return clone(&e.sb), nil
}

// Pause freezes a Running sandbox.
func (r *Runtime) Pause(ctx context.Context, id sandbox.ID) error {
	return r.move(id, "Pause", sandbox.StateRunning, sandbox.StatePaused, "PAUSED", api.CodeDockerSandboxNotRunning)
}

// Resume thaws a Paused sandbox.
func (r *Runtime) Resume(ctx context.Context, id sandbox.ID) error {
	return r.move(id, "Resume", sandbox.StatePaused, sandbox.StateRunning, "RUNNING", api.CodeDockerSandboxNotPaused)
}

func (r *Runtime) move(id sandbox.ID, op string, from, to sandbox.State, reason, code string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.faultLocked(op); err != nil {
		return err
	}
	e, err := r.getLocked(id)
	if err != nil {
		return err
	}
	if e.sb.Status.State != from {
		return sandbox.Coded(sandbox.ErrConflict, code, fmt.Sprintf("sandbox %s is %s, not %s", id, e.sb.Status.State, from))
	}
	e.transition(to, reason, "")
	return nil
}

// CreateSnapshot captures a Running sandbox; the snapshot is Ready after
// StartDelay.
func (r *Runtime) CreateSnapshot(ctx context.Context, id sandbox.ID, snap sandbox.SnapshotID, name string) (*sandbox.Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return nil, err
	}
	if e.sb.Status.State != sandbox.StateRunning {
		return nil, sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotInvalidSourceState, fmt.Sprintf("sandbox %s is %s, not Running", id, e.sb.Status.State))
	}
	now := time.Now()
	s := &sandbox.Snapshot{ID: snap, SandboxID: id, Name: name, State: sandbox.SnapshotCreating, Reason: "snapshot_accepted", Since: now, CreatedAt: now}
	r.snapshots[snap] = s
	time.AfterFunc(r.StartDelay, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if s.State == sandbox.SnapshotCreating {
			s.State, s.Reason, s.Since = sandbox.SnapshotReady, "snapshot_ready", time.Now()
		}
	})
	c := *s
	return &c, nil
}

// GetSnapshot returns a copy of the snapshot.
func (r *Runtime) GetSnapshot(ctx context.Context, snap sandbox.SnapshotID) (*sandbox.Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.snapshots[snap]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: %w", snap, sandbox.ErrNotFound)
	}
	c := *s
	return &c, nil
}

// ListSnapshots returns copies of every snapshot.
func (r *Runtime) ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*sandbox.Snapshot, 0, len(r.snapshots))
	for _, s := range r.snapshots {
		c := *s
		out = append(out, &c)
	}
	return out, nil
}

// DeleteSnapshot forgets a snapshot that is not Creating.
func (r *Runtime) DeleteSnapshot(ctx context.Context, snap sandbox.SnapshotID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.snapshots[snap]
	if !ok {
		return fmt.Errorf("snapshot %s: %w", snap, sandbox.ErrNotFound)
	}
	if s.State == sandbox.SnapshotCreating {
		return sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotInvalidState, fmt.Sprintf("snapshot %s is still being created", snap))
	}
	delete(r.snapshots, snap)
	return nil
}

// SnapshotImage returns a made-up image for a Ready snapshot.
func (r *Runtime) SnapshotImage(ctx context.Context, snap sandbox.SnapshotID) (string, error) {
	s, err := r.GetSnapshot(ctx, snap)
	if err != nil {
		return "", err
	}
	if s.State != sandbox.SnapshotReady {
		return "", sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotNotReady, fmt.Sprintf("snapshot %s is %s", snap, s.State))
	}
	return "fake/snapshot:" + string(snap), nil
}

// Logs returns a fixed log line per sandbox.
func (r *Runtime) Logs(ctx context.Context, id sandbox.ID, tail int, since time.Time) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.getLocked(id); err != nil {
		return "", err
	}
	return "execd listening\n", nil
}

// Events returns the sandbox's recorded transitions.
func (r *Runtime) Events(ctx context.Context, id sandbox.ID) ([]sandbox.Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, err := r.getLocked(id)
	if err != nil {
		return nil, err
	}
	return slices.Clone(e.events), nil
}

// Inspect describes the sandbox.
func (r *Runtime) Inspect(ctx context.Context, id sandbox.ID) (string, error) {
	sb, err := r.Get(ctx, id)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("fake sandbox %s, image %s, state %s\n", sb.ID, sb.Image, sb.Status.State), nil
}

// Close does nothing.
func (r *Runtime) Close() error { return nil }
