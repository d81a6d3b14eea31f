package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/events"

	"github.com/opensandbox/opensandbox/sandbox"
)

// rebuild fills the index at start from the store and the engine: one
// list call for every container of this scope. Sandboxes come back in the
// state their containers are in; creates and deletes a restart
// interrupted are finished; containers of deleted sandboxes are removed.
func (r *Runtime) rebuild(ctx context.Context) error {
	if err := r.recoverSnapshots(ctx); err != nil {
		return fmt.Errorf("recover snapshots: %w", err)
	}
	recs, err := r.st.records()
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	containers, err := r.eng.list(ctx, r.scopeLabel())
	if err != nil {
		return fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	tombs, err := r.st.tombstones()
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	seen := map[sandbox.ID]bool{}
	for i := range containers {
		c := &containers[i]
		id := sandbox.ID(c.Labels[labelID])
		if id == "" {
			continue
		}
		seen[id] = true
		if err := r.restoreContainer(ctx, recs[id], tombs[id], c); err != nil {
			r.log.Error("restore sandbox", "sandbox", id, "err", err)
		}
	}
	for id, rec := range recs {
		if !seen[id] {
			r.restore(ctx, rec, nil)
		}
	}
	r.sweepEgress(ctx)
	return nil
}

// sweepEgress removes the egress containers of this scope whose sandbox
// the runtime does not know: left by a create or a delete that a crash
// cut short.
func (r *Runtime) sweepEgress(ctx context.Context) {
	egs, err := r.eng.list(ctx, labelEgressScope+"="+r.cfg.LabelScope)
	if err != nil {
		r.log.Warn("list egress containers", "err", err)
		return
	}
	for _, c := range egs {
		id := sandbox.ID(c.Labels[labelEgressOf])
		r.mu.Lock()
		_, known := r.byID[id]
		r.mu.Unlock()
		if known {
			continue
		}
		r.log.Info("removing the egress container of an unknown sandbox", "sandbox", id)
		if err := r.eng.remove(ctx, c.ID); err != nil {
			r.log.Warn("remove egress container", "sandbox", id, "err", err)
		}
	}
}

// restoreContainer brings back the sandbox of a container found on the
// engine: removed if the sandbox was deleted, adopted from the labels if
// the store does not know it.
func (r *Runtime) restoreContainer(ctx context.Context, rec *record, buried bool, c *containerInfo) error {
	id := sandbox.ID(c.Labels[labelID])
	if buried {
		r.log.Warn("removing the container of a deleted sandbox", "sandbox", id)
		return r.eng.remove(ctx, c.ID)
	}
	if rec == nil && c.Labels[labelPool] != "" {
		// A warm sandbox whose record is gone: it cannot be told whether
		// it was handed out, so it is nobody's.
		r.log.Warn("removing a warm pool container the store does not know", "sandbox", id)
		return r.eng.remove(ctx, c.ID)
	}
	if rec == nil {
		// The store does not know it (lost, or replaced): the labels and
		// the container's environment carry what is needed to adopt it.
		info, err := r.eng.inspect(ctx, c.ID)
		if err != nil {
			return err
		}
		rec = recordFromLabels(c.Labels)
		rec.Token = tokenFromEnv(info.Env)
		if err := r.st.putRecord(rec); err != nil {
			return fmt.Errorf("adopt: %w", err)
		}
		r.log.Warn("adopted a sandbox the store did not know", "sandbox", id)
	}
	r.restore(ctx, rec, c)
	return nil
}

func tokenFromEnv(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envExecdToken+"="); ok {
			return v
		}
	}
	return ""
}

// restore puts one sandbox back into the index, given its record and its
// container (nil when there is none).
func (r *Runtime) restore(ctx context.Context, rec *record, c *containerInfo) {
	id := rec.ID
	switch {
	case rec.Deleting:
		if err := r.finishDelete(ctx, id); err != nil {
			r.log.Error("finish interrupted delete", "sandbox", id, "err", err)
		}
		return
	case rec.Failure != nil:
		e := newEntry(recordSandbox(rec), rec.Token)
		e.egressToken = rec.EgressToken
		e.sb.Status = *rec.Failure
		e.from, e.revision = rec.Pool, rec.PoolRevision
		if !rec.Claimed {
			e.pool = rec.Pool // a failed warm sandbox: the pool removes it
		}
		if c != nil {
			e.ports = c.Ports
		}
		e.markPortsKnown()
		r.mu.Lock()
		r.byID[id] = e
		r.mu.Unlock()
		return
	case c == nil && rec.Spec == nil:
		// It ran, and its container is gone: removed behind the server's
		// back. The sandbox is gone with it.
		r.forget(id, "its container disappeared")
		return
	}
	e := newEntry(recordSandbox(rec), rec.Token)
	e.egressToken = rec.EgressToken
	e.from, e.revision, e.heldStart = rec.Pool, rec.PoolRevision, rec.HeldStart
	if !rec.Claimed {
		e.pool = rec.Pool
		if rec.Claiming {
			// A claim the restart interrupted: execd may hold the new token
			// and run the user's entrypoint. It is nobody's now.
			r.log.Warn("removing a warm sandbox whose claim was interrupted", "sandbox", id)
			r.mu.Lock()
			r.byID[id] = e
			r.discardLocked(e, "its claim was interrupted by a restart")
			r.mu.Unlock()
			return
		}
	}
	if e.token == "" && c != nil {
		// A record from before tokens were stored: read it back from the
		// container.
		if info, err := r.eng.inspect(ctx, c.ID); err == nil {
			e.token = tokenFromEnv(info.Env)
		}
	}
	restarted := false
	if rec.Spec == nil && c != nil && c.State == "running" && isHeld(c.Labels) {
		// Its container may have started again while no server ran: that
		// start gets its entrypoint as a create's does.
		var err error
		if restarted, err = r.needsHandOver(ctx, c.ID, rec.HeldStart); err != nil {
			r.log.Error("look whether a sandbox's container started again since its held entrypoint was handed over", "sandbox", id, "err", err)
		}
	}
	if rec.Spec != nil || restarted || (c != nil && (c.State == "created" || c.State == "restarting")) {
		// An unfinished create, a container that never started, or one
		// that started again with its entrypoint held: provision it,
		// unless it needed credentials, which were never stored.
		if c == nil && rec.NeededAuth {
			r.mu.Lock()
			r.byID[id] = e
			r.mu.Unlock()
			r.fail(e, "CREATE_INTERRUPTED", "the server restarted while pulling the image with credentials, which are not kept: create the sandbox again")
			return
		}
		spec := rec.Spec
		if spec == nil {
			spec = &sandbox.Spec{Image: rec.Image, SnapshotID: rec.SnapshotID, Entrypoint: rec.Entrypoint}
		}
		r.mu.Lock()
		r.byID[id] = e
		if restarted {
			r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", heldRestartMessage)
		} else {
			r.transitionLocked(e, sandbox.StatePending, "CREATING", "resumed")
		}
		pctx := r.prepareProvisionLocked(e)
		r.mu.Unlock()
		r.runProvision(pctx, e, *spec)
		return
	}
	r.mu.Lock()
	e.ports = c.Ports
	r.applyContainerStateLocked(e, c.State, c.ExitCode, false)
	r.byID[id] = e
	r.mu.Unlock()
	e.markPortsKnown()
}

// heldRestartMessage is the status message of a sandbox whose container
// started again, until its held entrypoint is handed over.
const heldRestartMessage = "its container started again; its entrypoint starts once its disk is measured"

// heldSpec is what provisioning needs of a sandbox whose running
// container waits for its held entrypoint. r.mu must be held.
func heldSpec(e *entry) sandbox.Spec {
	return sandbox.Spec{Image: e.sb.Image, SnapshotID: e.sb.SnapshotID, Entrypoint: slices.Clone(e.sb.Entrypoint)}
}

// heldResume is a provisioning to run once r.mu is released.
type heldResume struct {
	e    *entry
	ctx  context.Context
	spec sandbox.Spec
}

// forget drops a sandbox that no longer exists from the store and the
// index.
func (r *Runtime) forget(id sandbox.ID, why string) {
	r.log.Warn("forgetting sandbox", "sandbox", id, "why", why)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.eng.remove(ctx, egressName(id)); err != nil {
		r.log.Warn("remove the egress container of a forgotten sandbox", "sandbox", id, "err", err)
	}
	if err := r.st.bury(id); err != nil {
		r.log.Error("forget sandbox", "sandbox", id, "err", err)
	}
	r.mu.Lock()
	delete(r.byID, id)
	r.mu.Unlock()
}

// applyContainerStateLocked sets a provisioned sandbox's state from its
// container's. r.mu must be held.
func (r *Runtime) applyContainerStateLocked(e *entry, state string, exitCode int, oom bool) {
	switch state {
	case "running":
		r.transitionLocked(e, sandbox.StateRunning, "CONTAINER_RUNNING", "")
	case "paused":
		r.transitionLocked(e, sandbox.StatePaused, "CONTAINER_PAUSED", "")
	case "exited", "dead":
		switch {
		case oom:
			r.transitionLocked(e, sandbox.StateFailed, "OOM_KILLED", "the sandbox ran out of memory and its container was killed")
		case exitCode == 0:
			r.transitionLocked(e, sandbox.StateTerminated, "CONTAINER_EXITED", "the sandbox's container stopped")
		default:
			r.transitionLocked(e, sandbox.StateFailed, "CONTAINER_EXITED_ERROR",
				fmt.Sprintf("the sandbox's container stopped with exit code %d", exitCode))
		}
	case "created", "restarting", "removing":
		r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", "")
	default:
		r.transitionLocked(e, sandbox.StateUnknown, "CONTAINER_"+strings.ToUpper(state), "")
	}
}

// recordFromLabels rebuilds a record from a container's labels.
func recordFromLabels(l map[string]string) *record {
	rec := &record{ID: sandbox.ID(l[labelID]), Image: l[labelImage], SnapshotID: l[labelSnapshot], SecureAccess: l[labelSecure] == "true"}
	rec.CreatedAt, _ = time.Parse(time.RFC3339Nano, l[labelCreated])
	json.Unmarshal([]byte(l[labelEntrypoint]), &rec.Entrypoint)
	json.Unmarshal([]byte(l[labelMetadata]), &rec.Metadata)
	json.Unmarshal([]byte(l[labelExtensions]), &rec.Extensions)
	if t, err := time.Parse(time.RFC3339Nano, l[labelExpires]); err == nil {
		rec.ExpiresAt = &t
	}
	if os, arch, ok := strings.Cut(l[labelPlatform], "/"); ok {
		rec.Platform = &sandbox.Platform{OS: os, Arch: arch}
	}
	return rec
}

// watchEvents keeps the index current from the engine's event stream,
// reconnecting (and resynchronizing, since events may have been missed)
// when the stream breaks.
func (r *Runtime) watchEvents() {
	defer r.wg.Done()
	for r.ctx.Err() == nil {
		msgs, errs := r.eng.events(r.ctx, r.scopeLabel())
		err := r.consumeEvents(msgs, errs)
		if r.ctx.Err() != nil {
			return
		}
		r.log.Warn("engine event stream broke; resynchronizing", "err", err)
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(time.Second):
		}
		if err := r.Reconcile(r.ctx); err != nil {
			r.log.Warn("resynchronize", "err", err)
		}
	}
}

func (r *Runtime) consumeEvents(msgs <-chan events.Message, errs <-chan error) error {
	for {
		select {
		case m := <-msgs:
			r.handleEvent(m)
		case err := <-errs:
			return err
		case <-r.ctx.Done():
			return r.ctx.Err()
		}
	}
}

// handleEvent applies one engine event to the index.
func (r *Runtime) handleEvent(m events.Message) {
	id := sandbox.ID(m.Actor.Attributes[labelID])
	if id == "" {
		return
	}
	action := string(m.Action)
	r.event(id, sandbox.Event{Time: time.Unix(0, m.TimeNano).UTC(), Source: sandbox.SourceRuntime, Type: action, Message: eventMessage(m)})
	var failed *sandbox.Status
	var resume context.Context
	var spec sandbox.Spec
	r.mu.Lock()
	e, ok := r.byID[id]
	if ok && !e.deleting {
		st := e.sb.Status.State
		provisioned := st != sandbox.StatePending && st != sandbox.StateFailed
		switch action {
		case "oom":
			e.oomed = true
		case "pause":
			if provisioned {
				r.transitionLocked(e, sandbox.StatePaused, "CONTAINER_PAUSED", "")
			}
		case "unpause":
			if provisioned {
				r.transitionLocked(e, sandbox.StateRunning, "CONTAINER_RUNNING", "")
			}
		case "die":
			if provisioned {
				code, _ := strconv.Atoi(m.Actor.Attributes["exitCode"])
				r.applyContainerStateLocked(e, "exited", code, e.oomed)
				s := e.sb.Status
				failed = &s
			}
		case "start":
			if provisioned && st != sandbox.StateFailed && e.pool == "" && !e.provisioning() && isHeld(m.Actor.Attributes) {
				// Started again (docker start, docker restart): this
				// start gets its entrypoint once the disk watcher has it.
				r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", heldRestartMessage)
				resume, spec = r.prepareProvisionLocked(e), heldSpec(e)
			}
		case "destroy":
			if provisioned && st != sandbox.StateTerminated {
				r.transitionLocked(e, sandbox.StateTerminated, "CONTAINER_REMOVED", "the sandbox's container was removed outside the server")
			}
		}
	}
	r.mu.Unlock()
	if resume != nil {
		r.runProvision(resume, e, spec)
	}
	if failed != nil {
		// Written outside the index's lock: a store write waits for the disk.
		r.recMu.Lock()
		if err := r.st.updateRecord(id, func(rec *record) { rec.Failure = failed }); err != nil {
			r.log.Warn("record stopped sandbox", "sandbox", id, "err", err)
		}
		r.recMu.Unlock()
	}
}

func eventMessage(m events.Message) string {
	msg := string(m.Action)
	if code := m.Actor.Attributes["exitCode"]; code != "" {
		msg += " (exit code " + code + ")"
	}
	if sig := m.Actor.Attributes["signal"]; sig != "" {
		msg += " (signal " + sig + ")"
	}
	return msg
}

// Reconcile brings the index in line with the engine: containers removed
// behind the server's back take their sandboxes with them, containers of
// deleted sandboxes are removed, containers the index lacks are adopted,
// container states are re-read, and deletes that stopped half-way are
// finished. The lifecycle manager runs it periodically; the event loop
// runs it after missing events. It judges only entries that did not
// change while it looked at the engine, and never two at a time. Each
// pass is reported to the Observer.
func (r *Runtime) Reconcile(ctx context.Context) error {
	r.reconcileMu.Lock()
	defer r.reconcileMu.Unlock()
	start := time.Now()
	err := r.reconcileLocked(ctx)
	r.cfg.Observer.Reconciled(sandbox.LoopRuntime, time.Since(start), err)
	return err
}

// reconcileLocked is one pass of Reconcile. r.reconcileMu must be held.
func (r *Runtime) reconcileLocked(ctx context.Context) error {
	r.mu.Lock()
	gens := make(map[sandbox.ID]uint64, len(r.byID))
	for id, e := range r.byID {
		gens[id] = e.gen
	}
	r.mu.Unlock()

	containers, err := r.eng.list(ctx, r.scopeLabel())
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	byID := map[sandbox.ID]*containerInfo{}
	for i := range containers {
		if id := sandbox.ID(containers[i].Labels[labelID]); id != "" {
			byID[id] = &containers[i]
		}
	}
	recs, err := r.st.records()
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	tombs, err := r.st.tombstones()
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}

	var forget []sandbox.ID
	var adopt []*containerInfo
	var resume []heldResume
	r.mu.Lock()
	for id, e := range r.byID {
		gen, known := gens[id]
		if !known || gen != e.gen || e.deleting || e.provisioning() {
			continue // changed or busy since the engine was read: judge it next time
		}
		c := byID[id]
		switch {
		case e.sb.Status.State == sandbox.StateFailed:
		case c == nil:
			forget = append(forget, id)
		case c.State == "running" && isHeld(c.Labels) && e.pool == "" && e.sb.Status.State != sandbox.StateRunning && e.sb.Status.State != sandbox.StatePaused:
			// Stopped, and started again unseen: this start gets its
			// entrypoint once the disk watcher has it.
			e.ports = c.Ports
			r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", heldRestartMessage)
			resume = append(resume, heldResume{e, r.prepareProvisionLocked(e), heldSpec(e)})
		default:
			e.ports = c.Ports
			r.applyContainerStateLocked(e, c.State, c.ExitCode, e.oomed)
		}
	}
	for id, c := range byID {
		if _, ok := r.byID[id]; !ok {
			if _, listed := gens[id]; !listed {
				adopt = append(adopt, c)
			}
		}
	}
	r.mu.Unlock()

	for _, h := range resume {
		r.runProvision(h.ctx, h.e, h.spec)
	}
	for _, id := range forget {
		r.forget(id, "its container disappeared")
	}
	for _, c := range adopt {
		id := sandbox.ID(c.Labels[labelID])
		if buried, _ := r.st.deleted(id); buried || tombs[id] {
			if err := r.eng.remove(ctx, c.ID); err != nil {
				r.log.Warn("remove the container of a deleted sandbox", "sandbox", id, "err", err)
			}
			continue
		}
		if err := r.restoreContainer(ctx, recs[id], false, c); err != nil {
			r.log.Warn("adopt container", "sandbox", id, "err", err)
		}
	}
	for id, rec := range recs {
		if rec.Deleting && byID[id] == nil {
			r.mu.Lock()
			_, indexed := r.byID[id]
			r.mu.Unlock()
			if !indexed {
				if err := r.finishDelete(ctx, id); err != nil {
					r.log.Warn("finish interrupted delete", "sandbox", id, "err", err)
				}
			}
		}
	}
	r.sweepPins()
	r.checkGuard(ctx)
	return nil
}
