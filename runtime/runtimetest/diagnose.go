package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// diagnostics holds a sandbox.Diagnoser to its promises: the output of
// the sandbox's main process, its events oldest first with the reason of
// a failure among them, a description naming it, and ErrNotFound for a
// sandbox that is not there.
func (s *suite) diagnostics(t *testing.T) {
	rt := s.new(t)
	d, ok := rt.(sandbox.Diagnoser)
	if !ok {
		t.Skip("runtime has no diagnostics")
	}
	limit := s.startLimit(t)
	ctx := context.Background()
	word := fmt.Sprintf("diagnosed-%d", time.Now().UnixNano())
	spec := s.spec()
	if s.opts.Hooks.Output != nil {
		spec.Entrypoint = s.opts.Hooks.Output(word)
	}
	id := s.create(t, rt, spec)
	WaitState(t, rt, id, sandbox.StateRunning, limit)

	if s.opts.Hooks.Output != nil {
		deadline := time.Now().Add(limit)
		for {
			logs, err := d.Logs(ctx, id, 0, time.Time{})
			if err != nil {
				t.Fatalf("Logs: %v", err)
			}
			if strings.Contains(logs, word) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Logs after %v has no %q, what the entrypoint printed:\n%s", limit, word, logs)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// since is after everything the sandbox printed: none of it.
		if logs, err := d.Logs(ctx, id, 0, time.Now().Add(time.Hour)); err != nil || strings.Contains(logs, word) {
			t.Errorf("Logs since an hour ahead = %q, %v; want nothing of what was printed before", logs, err)
		}
	}
	logs, err := d.Logs(ctx, id, 1, time.Time{})
	if err != nil {
		t.Fatalf("Logs with tail 1: %v", err)
	}
	if n := strings.Count(strings.TrimSuffix(logs, "\n"), "\n"); n > 0 {
		t.Errorf("Logs with tail 1 has %d lines:\n%s", n+1, logs)
	}

	events := checkEvents(t, d, id)
	lifecycle := false
	for _, ev := range events {
		lifecycle = lifecycle || ev.Source == sandbox.SourceLifecycle
	}
	if !lifecycle {
		t.Errorf("Events of a Running sandbox has no lifecycle event: %+v", events)
	}
	desc, err := d.Inspect(ctx, id)
	if err != nil || !strings.Contains(desc, string(id)) {
		t.Errorf("Inspect = %q, %v; want a description naming %s", desc, err, id)
	}

	// A sandbox that failed says why in its events, and can be looked at.
	failing := s.spec()
	failing.Image = s.opts.MissingImage
	failed := s.create(t, rt, failing)
	sb := WaitState(t, rt, failed, sandbox.StateFailed, limit)
	found := false
	for _, ev := range checkEvents(t, d, failed) {
		found = found || strings.Contains(ev.Type+" "+ev.Message, sb.Status.Reason)
	}
	if !found {
		t.Errorf("no event of the failed sandbox gives its reason %s", sb.Status.Reason)
	}
	if _, err := d.Logs(ctx, failed, 0, time.Time{}); err != nil {
		t.Errorf("Logs of a Failed sandbox: %v", err)
	}
	if desc, err := d.Inspect(ctx, failed); err != nil || desc == "" {
		t.Errorf("Inspect of a Failed sandbox = %q, %v", desc, err)
	}

	unknown := sandbox.NewID()
	_, errLogs := d.Logs(ctx, unknown, 0, time.Time{})
	_, errEvents := d.Events(ctx, unknown)
	_, errInspect := d.Inspect(ctx, unknown)
	for op, err := range map[string]error{"Logs": errLogs, "Events": errEvents, "Inspect": errInspect} {
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("%s of an unknown sandbox: %v, want ErrNotFound", op, err)
		}
	}
	rt.Delete(ctx, id)
	rt.Delete(ctx, failed)
}

// checkEvents returns the sandbox's events, checked: at least one, oldest
// first, each with a known source and a type.
func checkEvents(t *testing.T, d sandbox.Diagnoser, id sandbox.ID) []sandbox.Event {
	t.Helper()
	events, err := d.Events(context.Background(), id)
	if err != nil {
		t.Fatalf("Events(%s): %v", id, err)
	}
	if len(events) == 0 {
		t.Fatalf("Events(%s) is empty", id)
	}
	for i, ev := range events {
		if (ev.Source != sandbox.SourceLifecycle && ev.Source != sandbox.SourceRuntime) || ev.Type == "" || ev.Time.IsZero() {
			t.Errorf("event %d of %s: %+v, want a time, a source (lifecycle or runtime) and a type", i, id, ev)
		}
		if i > 0 && ev.Time.Before(events[i-1].Time.Truncate(time.Second)) {
			t.Errorf("events of %s are not oldest first: %d at %v after %d at %v", id, i, ev.Time, i-1, events[i-1].Time)
		}
	}
	return events
}

// reconcile: a sandbox whose objects vanish behind the runtime's back
// ends up gone or Failed, never reported Running; a housekeeping pass
// (Reconciler, when the runtime has one) leaves a healthy sandbox alone.
func (s *suite) reconcile(t *testing.T) {
	if s.opts.Hooks.Vanish == nil {
		t.Skip("no Vanish hook")
	}
	rt := s.new(t)
	limit := s.startLimit(t)
	ctx := context.Background()
	healthy := s.create(t, rt, s.spec())
	doomed := s.create(t, rt, s.spec())
	WaitState(t, rt, healthy, sandbox.StateRunning, limit)
	WaitState(t, rt, doomed, sandbox.StateRunning, limit)
	s.opts.Hooks.Vanish(t, rt, doomed)

	rec, _ := rt.(sandbox.Reconciler)
	deadline := time.Now().Add(limit)
	for {
		if rec != nil {
			if err := rec.Reconcile(ctx); err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
		}
		sb, err := rt.Get(ctx, doomed)
		if errors.Is(err, sandbox.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatalf("Get of a vanished sandbox: %v", err)
		}
		if sb.Status.State == sandbox.StateFailed {
			if sb.Status.Reason == "" {
				t.Errorf("vanished sandbox Failed without a reason: %+v", sb.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sandbox whose objects vanished is still %+v after %v; want gone or Failed", sb.Status, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
	list, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.ID == doomed && sb.Status.State != sandbox.StateFailed {
			t.Errorf("List has the vanished sandbox as %s", sb.Status.State)
		}
	}
	if err := rt.Delete(ctx, doomed); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Delete of the vanished sandbox: %v", err)
	}
	if sb, err := rt.Get(ctx, healthy); err != nil || sb.Status.State != sandbox.StateRunning {
		t.Fatalf("the sandbox beside it after reconciling: %+v, %v", sb, err)
	}
	if s.opts.Reach != nil {
		ep, err := rt.Endpoint(ctx, healthy, api.ExecdPort)
		if err != nil {
			t.Fatal(err)
		}
		s.opts.Reach(t, ep)
	}
	rt.Delete(ctx, healthy)
}
