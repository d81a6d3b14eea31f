package execd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// The decoders below mirror how the OpenSandbox clients read execd
// streams, so that a change of framing that one of them would reject fails
// here first.

// wireEvent is the event as the clients model it. The Python client
// rejects an event without type or timestamp; the Go client reads results
// as a string map.
type wireEvent struct {
	Type      string              `json:"type"`
	Text      string              `json:"text"`
	Timestamp *int64              `json:"timestamp"`
	Results   map[string]string   `json:"results"`
	Error     *api.ExecutionError `json:"error"`
}

// decodeLineClient reads like the Python and JavaScript clients: split on
// newlines, skip blank and comment lines, strip an optional "data:".
func decodeLineClient(t *testing.T, body []byte) []wireEvent {
	var out []wireEvent
	for _, line := range strings.Split(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, ":") {
			continue
		}
		line = strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		var ev wireEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("line client: %v in %q", err, line)
		}
		out = append(out, ev)
	}
	return out
}

// decodeBlankLineClient reads like the Go client: lines accumulate until a
// blank line dispatches them; lines may be at most 4 MiB.
func decodeBlankLineClient(t *testing.T, body []byte) []wireEvent {
	var out []wireEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var pending []string
	for sc.Scan() {
		line := sc.Text()
		if line != "" {
			pending = append(pending, strings.TrimSpace(strings.TrimPrefix(line, "data:")))
			continue
		}
		if len(pending) == 0 {
			continue
		}
		var ev wireEvent
		if err := json.Unmarshal([]byte(strings.Join(pending, "\n")), &ev); err != nil {
			t.Fatalf("blank-line client: %v in %q", err, pending)
		}
		out = append(out, ev)
		pending = nil
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("blank-line client: %v", err)
	}
	if len(pending) > 0 {
		t.Fatalf("blank-line client: %d lines never dispatched (missing blank line at the end)", len(pending))
	}
	return out
}

var frame = regexp.MustCompile(`^(\{[^\n]*\}\n\n)*$`)

func TestStreamConformance(t *testing.T) {
	_, c := newTestServer(t, nil)
	sid := newSession(t, c, nil)
	cases := []struct {
		name, path string
		body       any
		wantExit   string // "" for success
	}{
		{"foreground", "/command", api.RunCommandRequest{Command: `echo "quotes \" and \\ back"; printf '\x01\t<tag>&\n'; echo é🎉; echo err >&2; exit 2`}, "2"},
		{"success", "/command", api.RunCommandRequest{Command: "echo ok"}, ""},
		{"background", "/command", api.RunCommandRequest{Command: "echo bg", Background: true}, ""},
		{"start failure", "/command", api.RunCommandRequest{Command: "x", Envs: map[string]string{"PATH": "/nonexistent"}}, "?"},
		{"session", "/session/" + sid + "/run", api.RunInSessionRequest{Command: "echo in session; exit 4"}, "4"},
		{"long line", "/command", api.RunCommandRequest{Command: "head -c 1200000 /dev/zero | tr '\\0' '\"'"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.hc.Do(c.request("POST", tc.path, tc.body))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			if !frame.Match(body) {
				t.Fatalf("body is not a sequence of one-line JSON objects each followed by a blank line:\n%.400s", body)
			}
			a, b := decodeLineClient(t, body), decodeBlankLineClient(t, body)
			if len(a) != len(b) || len(a) < 2 {
				t.Fatalf("clients disagree: %d vs %d events", len(a), len(b))
			}
			for i, ev := range a {
				if ev.Type == "" || ev.Timestamp == nil || *ev.Timestamp == 0 {
					t.Errorf("event %d lacks type or timestamp: %+v", i, ev)
				}
			}
			if a[0].Type != api.EventInit || a[0].Text == "" {
				t.Errorf("first event %+v", a[0])
			}
			last := a[len(a)-1]
			switch tc.wantExit {
			case "":
				if last.Type != api.EventComplete {
					t.Errorf("last event %+v, want execution_complete", last)
				}
			case "?":
				if last.Type != api.EventError || last.Error == nil || last.Error.EValue == "" {
					t.Errorf("last event %+v, want error", last)
				}
			default:
				if last.Type != api.EventError || last.Error.EValue != tc.wantExit {
					t.Errorf("last event %+v, want error %s", last, tc.wantExit)
				}
			}
		})
	}
}
