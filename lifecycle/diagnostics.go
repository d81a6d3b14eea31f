package lifecycle

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Limits of the diagnostics routes.
const (
	// diagMaxBytes caps the text of one answer; beyond it the oldest
	// part is cut (truncated: true).
	diagMaxBytes = 1 << 20
	// diagTailLines is how many of the last log lines a descriptor
	// asks the runtime for.
	diagTailLines = 10000
)

const textContentType = "text/plain; charset=utf-8"

// diagnosticLogs answers GET /sandboxes/{id}/diagnostics/logs. With a
// scope it is the stable descriptor: container (the runtime's log of the
// main process), lifecycle (the sandbox's lifecycle events) or all. Without
// one it is the reference's deprecated plain text: tail (1-10000, default
// 100) last lines, since (a duration such as 10m) ago.
func (s *Server) diagnosticLogs(w http.ResponseWriter, r *http.Request) error {
	d, err := s.m.Diagnoser()
	if err != nil {
		return err
	}
	ctx, id, q := r.Context(), sandbox.ID(r.PathValue("id")), r.URL.Query()
	if !q.Has("scope") {
		tail, err := intParam(q, "tail", 1, 10000, 100)
		if err != nil {
			return err
		}
		since, err := sinceParam(q, s.now())
		if err != nil {
			return err
		}
		text, err := d.Logs(ctx, id, tail, since)
		if err != nil {
			return err
		}
		return writeLegacyText(w, text)
	}
	scope := q.Get("scope")
	var text string
	var cut bool
	switch scope {
	case "container":
		text, cut, err = containerLog(ctx, d, id)
	case "lifecycle":
		text, err = eventsText(ctx, d, id, sandbox.SourceLifecycle, 0)
	case "all":
		var logs, events string
		if events, err = eventsText(ctx, d, id, sandbox.SourceLifecycle, 0); err == nil {
			logs, cut, err = containerLog(ctx, d, id)
		}
		text = "== lifecycle ==\n" + events + "== container ==\n" + logs
	default:
		return invalid(codeInvalidScope, "scope %q: want container, lifecycle or all", scope)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, descriptor(id, "logs", scope, text, cut))
}

// diagnosticEvents answers GET /sandboxes/{id}/diagnostics/events. With a
// scope it is the stable descriptor: lifecycle (state transitions and
// requests), runtime (what the engine reported) or all. Without one it is
// the reference's deprecated plain text of the last limit (1-500, default
// 50) events.
func (s *Server) diagnosticEvents(w http.ResponseWriter, r *http.Request) error {
	d, err := s.m.Diagnoser()
	if err != nil {
		return err
	}
	ctx, id, q := r.Context(), sandbox.ID(r.PathValue("id")), r.URL.Query()
	if !q.Has("scope") {
		limit, err := intParam(q, "limit", 1, 500, 50)
		if err != nil {
			return err
		}
		text, err := eventsText(ctx, d, id, "", limit)
		if err != nil {
			return err
		}
		return writeLegacyText(w, text)
	}
	scope := q.Get("scope")
	source := ""
	switch scope {
	case "lifecycle":
		source = sandbox.SourceLifecycle
	case "runtime":
		source = sandbox.SourceRuntime
	case "all":
	default:
		return invalid(codeInvalidScope, "scope %q: want lifecycle, runtime or all", scope)
	}
	text, err := eventsText(ctx, d, id, source, 0)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, descriptor(id, "events", scope, text, false))
}

// diagnosticInspect answers the deprecated GET
// /sandboxes/{id}/diagnostics/inspect: the runtime's description of the
// sandbox, as plain text.
func (s *Server) diagnosticInspect(w http.ResponseWriter, r *http.Request) error {
	d, err := s.m.Diagnoser()
	if err != nil {
		return err
	}
	text, err := d.Inspect(r.Context(), sandbox.ID(r.PathValue("id")))
	if err != nil {
		return err
	}
	return writeLegacyText(w, text)
}

// diagnosticSummary answers the deprecated GET
// /sandboxes/{id}/diagnostics/summary: a banner, then the INSPECT, EVENTS
// (the last event_limit, 1-500, default 20) and LOGS (the last tail lines,
// 1-10000, default 50) sections, as plain text.
func (s *Server) diagnosticSummary(w http.ResponseWriter, r *http.Request) error {
	d, err := s.m.Diagnoser()
	if err != nil {
		return err
	}
	ctx, id, q := r.Context(), sandbox.ID(r.PathValue("id")), r.URL.Query()
	tail, err := intParam(q, "tail", 1, 10000, 50)
	if err != nil {
		return err
	}
	limit, err := intParam(q, "event_limit", 1, 500, 20)
	if err != nil {
		return err
	}
	inspect, err := d.Inspect(ctx, id)
	if err != nil {
		return err
	}
	events, err := eventsText(ctx, d, id, "", limit)
	if err != nil {
		return err
	}
	logs, err := d.Logs(ctx, id, tail, time.Time{})
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Sandbox %s diagnostics summary (%s)\n\n", id, s.now().UTC().Format(time.RFC3339))
	for _, sec := range []struct{ title, text string }{{"INSPECT", inspect}, {"EVENTS", events}, {"LOGS", logs}} {
		fmt.Fprintf(&b, "===== %s =====\n%s", sec.title, sec.text)
		if !strings.HasSuffix(sec.text, "\n") {
			b.WriteByte('\n')
		}
		b.WriteByte('\n')
	}
	return writeLegacyText(w, b.String())
}

// containerLog returns the last diagTailLines lines of the sandbox's log,
// and whether older lines were left out.
func containerLog(ctx context.Context, d sandbox.Diagnoser, id sandbox.ID) (string, bool, error) {
	text, err := d.Logs(ctx, id, diagTailLines+1, time.Time{})
	if err != nil {
		return "", false, err
	}
	lines := strings.SplitAfter(text, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > diagTailLines {
		return strings.Join(lines[len(lines)-diagTailLines:], ""), true, nil
	}
	return text, false, nil
}

// eventsText renders the sandbox's events from source ("" for all), the
// last limit of them (0 for all), one line each, oldest first.
func eventsText(ctx context.Context, d sandbox.Diagnoser, id sandbox.ID, source string, limit int) (string, error) {
	events, err := d.Events(ctx, id)
	if err != nil {
		return "", err
	}
	var keep []sandbox.Event
	for _, e := range events {
		if source == "" || e.Source == source {
			keep = append(keep, e)
		}
	}
	if limit > 0 && len(keep) > limit {
		keep = keep[len(keep)-limit:]
	}
	var b strings.Builder
	for _, e := range keep {
		fmt.Fprintf(&b, "%s %s %s", e.Time.UTC().Format(time.RFC3339Nano), e.Source, e.Type)
		if e.Message != "" {
			b.WriteString(" " + strings.ReplaceAll(e.Message, "\n", " "))
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// capText keeps the last diagMaxBytes of text, from a line start where
// there is one, and reports whether it cut anything.
func capText(text string) (string, bool) {
	if len(text) <= diagMaxBytes {
		return text, false
	}
	text = text[len(text)-diagMaxBytes:]
	if i := strings.IndexByte(text, '\n'); i >= 0 && i < len(text)-1 {
		text = text[i+1:]
	}
	return text, true
}

// descriptor returns an inline diagnostics descriptor of text, capped at
// diagMaxBytes; truncated reports any cut, the runtime's or the cap's.
func descriptor(id sandbox.ID, kind, scope, text string, truncated bool) api.DiagnosticContent {
	text, cut := capText(text)
	n := int64(len(text))
	return api.DiagnosticContent{
		SandboxID:     string(id),
		Kind:          kind,
		Scope:         scope,
		Delivery:      "inline",
		ContentType:   textContentType,
		Truncated:     truncated || cut,
		Content:       &text,
		ContentLength: &n,
	}
}

// writeLegacyText answers the deprecated plain-text diagnostics forms.
func writeLegacyText(w http.ResponseWriter, text string) error {
	text, _ = capText(text)
	h := w.Header()
	h.Set("Content-Type", textContentType)
	h.Set("Deprecation", "true")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(text)) // an error means the client has gone
	return nil
}

// intParam reads integer query parameter name, from lo to hi, def when
// absent.
func intParam(q url.Values, name string, lo, hi, def int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, invalid(codeInvalidParameter, "%s %q: want an integer from %d to %d", name, v, lo, hi)
	}
	return n, nil
}

// sinceParam reads the since query parameter, a duration ("30s", "10m",
// "1h", "2d") back from now; absent means the whole log.
func sinceParam(q url.Values, now time.Time) (time.Time, error) {
	v := q.Get("since")
	if v == "" {
		return time.Time{}, nil
	}
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(v, "d"); ok {
		var n int
		n, err = strconv.Atoi(days)
		if err == nil && (n < 0 || n > 36500) {
			err = strconv.ErrRange
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(v)
	}
	if err != nil || d <= 0 {
		return time.Time{}, invalid(codeInvalidParameter, "since %q: want a positive duration such as 30s, 10m, 1h or 2d", v)
	}
	return now.Add(-d), nil
}
