package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/events"

	"github.com/opensandbox/opensandbox/sandbox"
)

// rebuild fills the index at start from the store and the engine: one
// list call for every container of this scope. Sandboxes come back in the
// state their containers are in; creates a restart interrupted are
// resumed; deletes it interrupted are finished.
func (r *Runtime) rebuild(ctx context.Context) error {
	recs, err := r.st.records()
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	containers, err := r.eng.list(ctx, r.scopeLabel())
	if err != nil {
		return fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	seen := map[sandbox.ID]bool{}
	for _, c := range containers {
		id := sandbox.ID(c.Labels[labelID])
		if id == "" {
			continue
		}
		seen[id] = true
		rec := recs[id]
		if rec == nil {
			// The store does not know it (lost or replaced): the labels
			// carry what is needed to adopt it.
			rec = recordFromLabels(c.Labels)
			if err := r.st.putRecord(rec); err != nil {
				return fmt.Errorf("adopt sandbox %s: %w", id, err)
			}
			r.log.Warn("adopted a sandbox the store did not know", "sandbox", id)
		}
		r.restore(ctx, rec, &c)
	}
	for id, rec := range recs {
		if !seen[id] {
			r.restore(ctx, rec, nil)
		}
	}
	r.sweepTokens()
	return nil
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
		e := newEntry(recordSandbox(rec), r.readToken(id))
		e.sb.Status = *rec.Failure
		e.markPortsKnown()
		r.mu.Lock()
		r.byID[id] = e
		r.mu.Unlock()
		if c != nil {
			// A failed create's container that a restart kept.
			r.eng.remove(ctx, c.ID)
		}
		return
	case c == nil && rec.Spec == nil:
		// It ran, and its container is gone: removed behind the server's
		// back. The sandbox is gone with it.
		r.log.Warn("sandbox's container disappeared; forgetting it", "sandbox", id)
		r.st.deleteSandbox(id)
		os.Remove(r.tokenFile(id))
		return
	}
	token := r.readToken(id)
	if token == "" {
		token = newToken()
		if err := os.WriteFile(r.tokenFile(id), []byte(token), 0o400); err != nil {
			r.log.Error("rewrite lost token", "sandbox", id, "err", err)
		}
	}
	e := newEntry(recordSandbox(rec), token)
	r.mu.Lock()
	r.byID[id] = e
	r.mu.Unlock()
	if rec.Spec != nil {
		// Unfinished create: resume it, unless it needed credentials,
		// which were never stored.
		if rec.NeededAuth && c == nil {
			r.failRestored(e, "CREATE_INTERRUPTED", "the server restarted while pulling the image with credentials, which are not kept: create the sandbox again")
			return
		}
		r.mu.Lock()
		r.transitionLocked(e, sandbox.StatePending, "CREATING", "resumed after a restart")
		r.mu.Unlock()
		r.startProvision(e, *rec.Spec)
		return
	}
	r.mu.Lock()
	e.ports = c.Ports
	r.applyContainerStateLocked(e, c.State, c.ExitCode)
	r.mu.Unlock()
	e.markPortsKnown()
}

func (r *Runtime) failRestored(e *entry, reason, msg string) {
	status := sandbox.Status{State: sandbox.StateFailed, Reason: reason, Message: msg, Since: time.Now().UTC()}
	r.st.updateRecord(e.sb.ID, func(rec *record) { rec.Failure, rec.Spec = &status, nil })
	r.mu.Lock()
	r.transitionLocked(e, sandbox.StateFailed, reason, msg)
	r.mu.Unlock()
	e.markPortsKnown()
}

// applyContainerStateLocked sets a provisioned sandbox's state from its
// container's. r.mu must be held.
func (r *Runtime) applyContainerStateLocked(e *entry, state string, exitCode int) {
	switch state {
	case "running":
		r.transitionLocked(e, sandbox.StateRunning, "CONTAINER_RUNNING", "")
	case "paused":
		r.transitionLocked(e, sandbox.StatePaused, "CONTAINER_PAUSED", "")
	case "exited", "dead":
		if exitCode == 0 {
			r.transitionLocked(e, sandbox.StateTerminated, "CONTAINER_EXITED", "the sandbox's container stopped")
		} else {
			r.transitionLocked(e, sandbox.StateFailed, "CONTAINER_EXITED_ERROR",
				fmt.Sprintf("the sandbox's container stopped with exit code %d", exitCode))
		}
	case "created", "restarting", "removing":
		r.transitionLocked(e, sandbox.StatePending, "CONTAINER_STARTING", "")
	default:
		r.transitionLocked(e, sandbox.StateUnknown, "CONTAINER_"+state, "")
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
	return rec
}

// sweepTokens removes token files of sandboxes the runtime no longer
// has.
func (r *Runtime) sweepTokens() {
	entries, err := os.ReadDir(r.tokens)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range entries {
		if _, ok := r.byID[sandbox.ID(f.Name())]; !ok {
			os.Remove(r.tokenFile(sandbox.ID(f.Name())))
		}
	}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byID[id]
	if !ok || e.deleting {
		return
	}
	st := e.sb.Status.State
	provisioned := st != sandbox.StatePending && st != sandbox.StateFailed
	switch action {
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
			r.applyContainerStateLocked(e, "exited", code)
			r.st.updateRecord(id, func(rec *record) { s := e.sb.Status; rec.Failure = &s })
		}
	case "destroy":
		if provisioned && st != sandbox.StateTerminated {
			e.sb.Status = sandbox.Status{State: sandbox.StateTerminated, Reason: "CONTAINER_REMOVED",
				Message: "the sandbox's container was removed outside the server", Since: time.Now().UTC()}
		}
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
// this scope that the index lacks are adopted, container states are
// re-read, failed sandboxes lose leftover containers, and deletes that
// stopped half-way are finished. The lifecycle manager runs it
// periodically; the event loop runs it after missing events.
func (r *Runtime) Reconcile(ctx context.Context) error {
	containers, err := r.eng.list(ctx, r.scopeLabel())
	if err != nil {
		return err
	}
	byID := map[sandbox.ID]*containerInfo{}
	for i := range containers {
		if id := sandbox.ID(containers[i].Labels[labelID]); id != "" {
			byID[id] = &containers[i]
		}
	}
	recs, err := r.st.records()
	if err != nil {
		return err
	}
	type todo struct {
		rec *record
		c   *containerInfo
	}
	var adopt, forget []todo
	var removeContainers []string
	r.mu.Lock()
	for id, e := range r.byID {
		if e.deleting || e.cancel != nil && !isDone(e.done) {
			continue // being deleted or provisioned: not ours to judge now
		}
		c := byID[id]
		switch {
		case e.sb.Status.State == sandbox.StateFailed:
			if c != nil {
				removeContainers = append(removeContainers, c.ID)
			}
		case c == nil:
			forget = append(forget, todo{rec: recs[id]})
		default:
			e.ports = c.Ports
			r.applyContainerStateLocked(e, c.State, c.ExitCode)
		}
	}
	for id, c := range byID {
		if _, ok := r.byID[id]; !ok {
			rec := recs[id]
			if rec == nil {
				rec = recordFromLabels(c.Labels)
			}
			adopt = append(adopt, todo{rec, c})
		}
	}
	r.mu.Unlock()
	for _, cid := range removeContainers {
		r.eng.remove(ctx, cid)
	}
	for _, f := range forget {
		if f.rec == nil {
			continue
		}
		r.log.Warn("sandbox's container disappeared; forgetting it", "sandbox", f.rec.ID)
		r.st.deleteSandbox(f.rec.ID)
		os.Remove(r.tokenFile(f.rec.ID))
		r.mu.Lock()
		delete(r.byID, f.rec.ID)
		r.mu.Unlock()
	}
	for _, a := range adopt {
		if a.rec.Deleting {
			r.finishDelete(ctx, a.rec.ID)
			continue
		}
		r.st.putRecord(a.rec)
		r.restore(ctx, a.rec, a.c)
	}
	for id, rec := range recs {
		if rec.Deleting && byID[id] == nil {
			r.finishDelete(ctx, id)
		}
	}
	r.sweepTokens()
	return nil
}

func isDone(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
