package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// snapshotRepo is the repository of snapshot images.
const snapshotRepo = "opensandbox-snapshot"

func snapshotRef(snap sandbox.SnapshotID) string { return snapshotRepo + ":" + string(snap) }

// recoverSnapshots settles snapshots a restart caught being made: Ready
// if the commit finished (its image exists), else Failed.
func (r *Runtime) recoverSnapshots(ctx context.Context) error {
	recs, err := r.st.snapshots()
	if err != nil {
		return err
	}
	for _, rec := range recs {
		if rec.State != sandbox.SnapshotCreating {
			continue
		}
		ref := snapshotRef(rec.ID)
		ok, err := r.eng.imageExists(ctx, ref)
		if err != nil {
			return err
		}
		rec.Since = time.Now().UTC()
		if ok {
			rec.State, rec.Reason, rec.Image = sandbox.SnapshotReady, "snapshot_ready", ref
		} else {
			rec.State, rec.Reason, rec.Message = sandbox.SnapshotFailed, "snapshot_recovery_failed", "the server restarted while the snapshot was being taken"
		}
		if err := r.st.putSnapshot(rec); err != nil {
			return err
		}
	}
	return nil
}

// CreateSnapshot commits a Running sandbox's container to an image in
// the background (the container is paused for the moment of the commit,
// then keeps running). The snapshot is Creating until the image exists.
func (r *Runtime) CreateSnapshot(ctx context.Context, id sandbox.ID, snap sandbox.SnapshotID, name string) (*sandbox.Snapshot, error) {
	r.mu.Lock()
	e, err := r.getLocked(id)
	if err == nil && e.sb.Status.State != sandbox.StateRunning {
		err = sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotInvalidSourceState,
			fmt.Sprintf("sandbox %s is %s; only a Running sandbox can be snapshotted", id, e.sb.Status.State))
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	rec := &snapshotRecord{Snapshot: sandbox.Snapshot{ID: snap, SandboxID: id, Name: name, State: sandbox.SnapshotCreating,
		Reason: "snapshot_accepted", Since: now, CreatedAt: now}}
	if err := r.st.putSnapshot(rec); err != nil {
		return nil, fmt.Errorf("record snapshot: %w", err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ref := snapshotRef(snap)
		err := r.eng.commit(r.ctx, containerName(id), ref, map[string]string{
			labelScope: r.cfg.LabelScope, labelSnapshotOf: string(id),
		})
		done := *rec
		done.Since = time.Now().UTC()
		if err != nil {
			done.State, done.Reason, done.Message = sandbox.SnapshotFailed, "snapshot_capture_failed", err.Error()
			r.log.Warn("snapshot failed", "snapshot", snap, "sandbox", id, "err", err)
		} else {
			done.State, done.Reason, done.Image = sandbox.SnapshotReady, "snapshot_ready", ref
			r.log.Info("snapshot ready", "snapshot", snap, "sandbox", id, "image", ref)
		}
		if err := r.st.putSnapshot(&done); err != nil {
			r.log.Error("record snapshot", "snapshot", snap, "err", err)
		}
	}()
	c := rec.Snapshot
	return &c, nil
}

// GetSnapshot returns a snapshot.
func (r *Runtime) GetSnapshot(ctx context.Context, snap sandbox.SnapshotID) (*sandbox.Snapshot, error) {
	rec, err := r.st.snapshot(snap)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, sandbox.Coded(sandbox.ErrNotFound, api.CodeSnapshotNotFound, fmt.Sprintf("snapshot %s not found", snap))
	}
	s := rec.Snapshot
	return &s, nil
}

// ListSnapshots returns every snapshot.
func (r *Runtime) ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error) {
	recs, err := r.st.snapshots()
	if err != nil {
		return nil, err
	}
	out := make([]*sandbox.Snapshot, len(recs))
	for i, rec := range recs {
		s := rec.Snapshot
		out[i] = &s
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot and its image. Sandboxes restored from
// it keep running: the engine keeps the layers they use.
func (r *Runtime) DeleteSnapshot(ctx context.Context, snap sandbox.SnapshotID) error {
	rec, err := r.st.snapshot(snap)
	if err != nil {
		return err
	}
	if rec == nil {
		return sandbox.Coded(sandbox.ErrNotFound, api.CodeSnapshotNotFound, fmt.Sprintf("snapshot %s not found", snap))
	}
	if rec.State == sandbox.SnapshotCreating {
		return sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotInvalidState, fmt.Sprintf("snapshot %s is still being created", snap))
	}
	if rec.Image != "" {
		if err := r.eng.removeImage(ctx, rec.Image); err != nil {
			return fmt.Errorf("remove image of snapshot %s: %w", snap, err)
		}
	}
	return r.st.deleteSnapshot(snap)
}

// SnapshotImage returns the image a Ready snapshot restores from.
func (r *Runtime) SnapshotImage(ctx context.Context, snap sandbox.SnapshotID) (string, error) {
	rec, err := r.st.snapshot(snap)
	if err != nil {
		return "", err
	}
	switch {
	case rec == nil:
		return "", sandbox.Coded(sandbox.ErrNotFound, api.CodeSnapshotNotFound, fmt.Sprintf("snapshot %s not found", snap))
	case rec.State != sandbox.SnapshotReady:
		return "", sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotNotReady, fmt.Sprintf("snapshot %s is %s, not Ready", snap, rec.State))
	case rec.Image == "":
		return "", sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotInvalidRestoreConfig, fmt.Sprintf("snapshot %s has no image", snap))
	}
	return rec.Image, nil
}

// Logs returns the container's output: what execd and the entrypoint
// wrote to stdout and stderr, with the engine's timestamps.
func (r *Runtime) Logs(ctx context.Context, id sandbox.ID, tail int, since time.Time) (string, error) {
	if _, err := r.Get(ctx, id); err != nil {
		return "", err
	}
	out, err := r.eng.logs(ctx, containerName(id), tail, since)
	if errors.Is(err, errNoSuchObject) {
		out, err = "", nil // no container (yet, or any more): no output
	}
	if err != nil {
		return "", err
	}
	// osb-egress's log follows: what it enforces, and what it refused.
	if eg, err := r.eng.logs(ctx, egressName(id), tail, since); err == nil && eg != "" {
		out += "--- osb-egress ---\n" + eg
	}
	return out, nil
}

// Events returns the sandbox's recorded events, oldest first.
func (r *Runtime) Events(ctx context.Context, id sandbox.ID) ([]sandbox.Event, error) {
	if _, err := r.Get(ctx, id); err != nil {
		return nil, err
	}
	r.events.flush()
	evs, err := r.st.events(id)
	if err != nil {
		return nil, err
	}
	if denied := r.egressDenials(ctx, id); len(denied) > 0 {
		evs = append(evs, denied...)
		slices.SortStableFunc(evs, func(a, b sandbox.Event) int { return a.Time.Compare(b.Time) })
	}
	return evs, nil
}

// Inspect returns the engine's description of the sandbox's container.
func (r *Runtime) Inspect(ctx context.Context, id sandbox.ID) (string, error) {
	sb, err := r.Get(ctx, id)
	if err != nil {
		return "", err
	}
	raw, err := r.eng.inspectJSON(ctx, containerName(id))
	if errors.Is(err, errNoSuchObject) {
		return fmt.Sprintf("sandbox %s is %s (%s: %s) and has no container\n", id, sb.Status.State, sb.Status.Reason, sb.Status.Message), nil
	}
	if err != nil {
		return "", err
	}
	return string(raw) + "\n", nil
}

// RemoveScope removes every container, snapshot image and named volume
// of this runtime's label scope, after stopping the provisioning under
// way; the index and the store keep their records. For tests, and for
// an operator retiring a scope before removing the data directory.
func (r *Runtime) RemoveScope(ctx context.Context) error {
	var errs []error
	r.mu.Lock()
	var waits []chan struct{}
	for _, e := range r.byID {
		if e.cancel != nil {
			e.cancel()
			waits = append(waits, e.done)
		}
	}
	r.mu.Unlock()
	for _, w := range waits {
		<-w
	}
	containers, err := r.eng.list(ctx, r.scopeLabel())
	errs = append(errs, err)
	for _, c := range containers {
		errs = append(errs, r.eng.remove(ctx, c.ID))
	}
	// Every sandbox of the scope is gone, those that never got a
	// container included: so are their pins.
	if ents, err := os.ReadDir(r.cfg.pinsDir()); err == nil {
		for _, ent := range ents {
			if ent.IsDir() {
				r.removeSandboxPins(sandbox.ID(ent.Name()))
			}
		}
	}
	images, err := r.eng.imagesWithLabel(ctx, r.scopeLabel())
	errs = append(errs, err)
	for _, img := range images {
		for _, tag := range img.RepoTags {
			errs = append(errs, r.eng.removeImage(ctx, tag))
		}
	}
	recs, _ := r.st.records()
	for _, rec := range recs {
		for _, v := range rec.OwnedVolumes {
			errs = append(errs, r.eng.removeVolume(ctx, v))
		}
	}
	return errors.Join(errs...)
}
