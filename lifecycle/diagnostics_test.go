package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

// diagRuntime is the fake with a log of its own and engine events added
// to the lifecycle ones, recording what Logs was asked.
type diagRuntime struct {
	*fake.Runtime
	log    string
	engine []sandbox.Event

	mu        sync.Mutex
	lastTail  int
	lastSince time.Time
}

func (d *diagRuntime) Logs(ctx context.Context, id sandbox.ID, tail int, since time.Time) (string, error) {
	if _, err := d.Get(ctx, id); err != nil {
		return "", err
	}
	d.mu.Lock()
	d.lastTail, d.lastSince = tail, since
	d.mu.Unlock()
	lines := strings.SplitAfter(d.log, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if tail > 0 && len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return strings.Join(lines, ""), nil
}

func (d *diagRuntime) asked() (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastTail, d.lastSince
}

func (d *diagRuntime) Events(ctx context.Context, id sandbox.ID) ([]sandbox.Event, error) {
	ev, err := d.Runtime.Events(ctx, id)
	if err != nil {
		return nil, err
	}
	ev = append(ev, d.engine...)
	slices.SortStableFunc(ev, func(a, b sandbox.Event) int { return a.Time.Compare(b.Time) })
	return ev, nil
}

func newDiagEnv(t *testing.T, log string) (*testEnv, *diagRuntime, string) {
	rt := &diagRuntime{Runtime: fake.New(), log: log}
	rt.StartDelay = time.Millisecond
	e := newEnvWith(t, rt)
	id := e.create("")
	e.waitState(id, sandbox.StateRunning)
	rt.engine = []sandbox.Event{{Time: time.Now(), Source: sandbox.SourceRuntime, Type: "OOM", Message: "memory\nlimit"}}
	return e, rt, id
}

func TestDiagnosticDescriptors(t *testing.T) {
	e, _, id := newDiagEnv(t, "line one\nline two\n")
	get := func(kind, scope string) api.DiagnosticContent {
		t.Helper()
		var d api.DiagnosticContent
		r := e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/"+kind+"?scope="+scope, "").wantStatus(t, 200)
		r.decode(t, &d)
		if d.SandboxID != id || d.Kind != kind || d.Scope != scope || d.Delivery != "inline" || d.ContentType != "text/plain; charset=utf-8" ||
			d.Content == nil || d.ContentURL != "" || d.ExpiresAt != nil || d.ContentLength == nil || *d.ContentLength != int64(len(*d.Content)) {
			t.Fatalf("descriptor %s", r.body)
		}
		if r.header.Get("Deprecation") != "" {
			t.Fatalf("stable form with Deprecation header")
		}
		return d
	}
	if d := get("logs", "container"); *d.Content != "line one\nline two\n" || d.Truncated {
		t.Fatalf("container logs %+v", d)
	}
	if d := get("logs", "lifecycle"); !strings.Contains(*d.Content, "lifecycle CREATING") || !strings.Contains(*d.Content, "lifecycle RUNNING") || strings.Contains(*d.Content, "OOM") {
		t.Fatalf("lifecycle logs %q", *d.Content)
	}
	if d := get("logs", "all"); !strings.Contains(*d.Content, "CREATING") || !strings.Contains(*d.Content, "line two") {
		t.Fatalf("all logs %q", *d.Content)
	}
	if d := get("events", "runtime"); *d.Content == "" || strings.Contains(*d.Content, "CREATING") || !strings.Contains(*d.Content, "runtime OOM memory limit\n") {
		t.Fatalf("runtime events %q", *d.Content)
	}
	if d := get("events", "lifecycle"); strings.Contains(*d.Content, "OOM") || !strings.Contains(*d.Content, "RUNNING") {
		t.Fatalf("lifecycle events %q", *d.Content)
	}
	d := get("events", "all")
	lines := strings.Split(strings.TrimSpace(*d.Content), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "OOM") {
		t.Fatalf("all events %q", *d.Content)
	}
	if _, err := time.Parse(time.RFC3339Nano, strings.Fields(lines[0])[0]); err != nil {
		t.Fatalf("event line %q does not start with a timestamp", lines[0])
	}

	for _, c := range []struct{ kind, scope string }{
		{"logs", "runtime"}, {"logs", ""}, {"logs", "network"}, {"events", "container"}, {"events", "ALL"},
	} {
		e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/"+c.kind+"?scope="+c.scope, "").wantError(t, 400, api.CodeDiagnosticsInvalidScope)
	}
	e.call("GET", "/v1/sandboxes/nope/diagnostics/logs?scope=container", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("GET", "/v1/sandboxes/nope/diagnostics/events?scope=all", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
}

func TestDiagnosticTruncation(t *testing.T) {
	// More lines than the descriptor asks for: the oldest are left out.
	var b strings.Builder
	for i := range diagTailLines + 5 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	e, rt, id := newDiagEnv(t, b.String())
	var d api.DiagnosticContent
	e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/logs?scope=container", "").wantStatus(t, 200).decode(t, &d)
	if !d.Truncated || strings.Contains(*d.Content, "line 4\n") || !strings.HasPrefix(*d.Content, "line 5\n") ||
		strings.Count(*d.Content, "\n") != diagTailLines {
		t.Fatalf("truncated %v, %d lines starting %q", d.Truncated, strings.Count(*d.Content, "\n"), (*d.Content)[:20])
	}
	if tail, _ := rt.asked(); tail != diagTailLines+1 {
		t.Fatalf("asked the runtime for %d lines", tail)
	}

	// Fewer but longer lines than the byte cap: cut at a line start.
	long := strings.Repeat("x", 1000)
	b.Reset()
	for i := range 2000 {
		fmt.Fprintf(&b, "%04d %s\n", i, long)
	}
	e, _, id = newDiagEnv(t, b.String())
	e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/logs?scope=container", "").wantStatus(t, 200).decode(t, &d)
	if !d.Truncated || len(*d.Content) > diagMaxBytes || !strings.HasSuffix(*d.Content, "1999 "+long+"\n") || !strings.HasPrefix(*d.Content, "0") {
		t.Fatalf("byte cap: truncated %v, %d bytes, starts %q", d.Truncated, len(*d.Content), (*d.Content)[:10])
	}
	// The legacy form is capped too.
	r := e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/logs?tail=10000", "").wantStatus(t, 200)
	if len(r.body) > diagMaxBytes {
		t.Fatalf("legacy logs of %d bytes", len(r.body))
	}
}

func TestDiagnosticLegacy(t *testing.T) {
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	e, rt, id := newDiagEnv(t, b.String())
	text := func(path string) string {
		t.Helper()
		r := e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/"+path, "", "Accept", "text/plain").wantStatus(t, 200)
		if r.header.Get("Content-Type") != "text/plain; charset=utf-8" || r.header.Get("Deprecation") != "true" {
			t.Fatalf("%s: headers %v", path, r.header)
		}
		return string(r.body)
	}
	if got := text("logs"); strings.Count(got, "\n") != 100 || !strings.HasSuffix(got, "line 299\n") {
		t.Fatalf("default tail: %d lines", strings.Count(got, "\n"))
	}
	if got := text("logs?tail=3"); got != "line 297\nline 298\nline 299\n" {
		t.Fatalf("tail=3: %q", got)
	}
	before := time.Now()
	text("logs?since=10m")
	if _, since := rt.asked(); since.After(before.Add(-10*time.Minute+time.Second)) || since.Before(before.Add(-10*time.Minute-time.Minute)) {
		t.Fatalf("since=10m asked the runtime for %v", since)
	}
	text("logs?since=2d")
	if _, since := rt.asked(); time.Since(since) < 47*time.Hour {
		t.Fatalf("since=2d asked the runtime for %v", since)
	}
	if got := text("events"); strings.Count(got, "\n") != 3 {
		t.Fatalf("events: %q", got)
	}
	if got := text("events?limit=1"); strings.Count(got, "\n") != 1 || !strings.Contains(got, "OOM") {
		t.Fatalf("events limit=1: %q", got)
	}
	if got := text("inspect"); !strings.Contains(got, id) {
		t.Fatalf("inspect: %q", got)
	}
	got := text("summary?tail=2&event_limit=1")
	for _, want := range []string{"Sandbox " + id, "===== INSPECT =====", "===== EVENTS =====", "OOM", "===== LOGS =====", "line 298\nline 299\n"} {
		if !strings.Contains(got, want) {
			t.Fatalf("summary lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "line 297") || strings.Contains(got, "CREATING") {
		t.Fatalf("summary ignores its limits:\n%s", got)
	}
	for _, q := range []string{
		"logs?tail=0", "logs?tail=10001", "logs?tail=x", "logs?since=soon", "logs?since=-5m", "logs?since=0s",
		"events?limit=0", "events?limit=501", "summary?tail=0", "summary?event_limit=501",
	} {
		e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/"+q, "").wantError(t, 400, api.CodeSandboxInvalidParameter)
	}
	for _, p := range []string{"logs", "events", "inspect", "summary"} {
		e.call("GET", "/v1/sandboxes/nope/diagnostics/"+p, "").wantError(t, 404, api.CodeDockerSandboxNotFound)
	}
}

func TestDiagnosticsNotImplemented(t *testing.T) {
	e := newEnvWith(t, bareRuntime{fake.New()})
	id := e.create("")
	for _, p := range []string{"logs?scope=container", "events?scope=all", "logs", "events", "inspect", "summary"} {
		e.call("GET", "/v1/sandboxes/"+id+"/diagnostics/"+p, "").wantError(t, 501, "DIAGNOSTICS_NOT_IMPLEMENTED")
	}
}
