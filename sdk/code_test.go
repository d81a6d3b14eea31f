package sdk_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// codeDaemon answers the /code routes of execd.md §5 the way the
// reference daemon does, for a test of the SDK's side of the wire: the
// product's own /code routes are not built yet, so this stand-in is the
// only peer the code-context client has so far.
type codeDaemon struct {
	t        *testing.T
	contexts map[string]api.CodeContext
	lastRun  api.RunCodeRequest
}

func (d *codeDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(api.HeaderExecdToken) != "tok" {
		w.WriteHeader(401)
		io.WriteString(w, `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`)
		return
	}
	switch {
	case r.Method == "POST" && r.URL.Path == "/code/context":
		var cc api.CodeContext
		json.NewDecoder(r.Body).Decode(&cc)
		cc.ID = "ctx-" + cc.Language
		d.contexts[cc.ID] = cc
		json.NewEncoder(w).Encode(cc)
	case r.Method == "GET" && r.URL.Path == "/code/contexts":
		out := []api.CodeContext{}
		for _, cc := range d.contexts {
			if l := r.URL.Query().Get("language"); l == "" || l == cc.Language {
				out = append(out, api.CodeContext{ID: cc.ID, Language: cc.Language})
			}
		}
		json.NewEncoder(w).Encode(out)
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/code/contexts/"):
		cc, ok := d.contexts[strings.TrimPrefix(r.URL.Path, "/code/contexts/")]
		if !ok {
			w.WriteHeader(404)
			io.WriteString(w, `{"code":"CONTEXT_NOT_FOUND","message":"no such context"}`)
			return
		}
		json.NewEncoder(w).Encode(cc)
	case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/code/contexts/"):
		delete(d.contexts, strings.TrimPrefix(r.URL.Path, "/code/contexts/"))
	case r.Method == "DELETE" && r.URL.Path == "/code":
		if r.URL.Query().Get("id") == "" {
			w.WriteHeader(400)
			io.WriteString(w, `{"code":"MISSING_QUERY","message":"missing query parameter 'id'"}`)
		}
	case r.Method == "POST" && r.URL.Path == "/code":
		d.lastRun = api.RunCodeRequest{}
		json.NewDecoder(r.Body).Decode(&d.lastRun)
		w.Header().Set("Content-Type", "text/event-stream")
		now := time.Now().UnixMilli()
		send := func(ev api.Event) {
			ev.Timestamp = now
			w.Write(ev.AppendFrame(nil))
		}
		send(api.Event{Type: api.EventInit, Text: d.lastRun.Context.ID})
		send(api.Event{Type: api.EventPing, Text: "pong"})
		send(api.Event{Type: api.EventStdout, Text: "partial "})
		send(api.Event{Type: api.EventStdout, Text: "line\n"})
		if strings.Contains(d.lastRun.Code, "raise") {
			send(api.Event{Type: api.EventStatus, Text: "error"})
			send(api.Event{Type: api.EventError, Error: &api.ExecutionError{EName: "ValueError", EValue: "bad", Traceback: []string{"Traceback...", "ValueError: bad"}}})
		} else {
			send(api.Event{Type: api.EventExecutionCount, ExecutionCount: 3})
			send(api.Event{Type: api.EventResult, Results: map[string]any{"text": "4", "image/png": "iVBORw0KGgo="}})
		}
		send(api.Event{Type: api.EventComplete, ExecutionTime: 12})
	default:
		w.WriteHeader(404)
	}
}

func TestCodeContextsWire(t *testing.T) {
	d := &codeDaemon{t: t, contexts: map[string]api.CodeContext{}}
	execd := httptest.NewServer(d)
	defer execd.Close()
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: strings.TrimPrefix(execd.URL, "http://"), Headers: map[string]string{api.HeaderExecdToken: "tok"}})
	}))
	defer lifecycle.Close()
	c, _ := sdk.NewClient(sdk.Config{Domain: lifecycle.URL})
	sb := c.Sandbox("sb")
	ctx := t.Context()

	cc, err := sb.CreateCodeContext(ctx, sdk.LanguagePython, "/work")
	if err != nil || cc.ID != "ctx-python" || cc.Cwd != "/work" {
		t.Fatalf("create: %+v %v", cc, err)
	}
	sb.CreateCodeContext(ctx, sdk.LanguageJavaScript, "")
	if list, err := sb.CodeContexts(ctx, sdk.LanguagePython); err != nil || len(list) != 1 {
		t.Errorf("list python: %+v %v", list, err)
	}
	if list, err := sb.CodeContexts(ctx, ""); err != nil || len(list) != 2 {
		t.Errorf("list all: %+v %v", list, err)
	}

	var events []string
	res, err := sb.RunCode(ctx, "2+2", &sdk.CodeOptions{Context: cc, OnEvent: func(ev api.Event) { events = append(events, ev.Type) }})
	if err != nil {
		t.Fatal(err)
	}
	if d.lastRun.Context.ID != cc.ID || d.lastRun.Context.Language != "python" || d.lastRun.Code != "2+2" {
		t.Errorf("request %+v", d.lastRun)
	}
	if res.Stdout != "partial line\n" || res.ExecutionCount != 3 || len(res.Results) != 1 || res.Results[0]["text"] != "4" ||
		res.Results[0]["image/png"] != "iVBORw0KGgo=" || !res.OK() || res.Elapsed != 12*time.Millisecond {
		t.Errorf("result %+v", res)
	}
	if strings.Join(events, ",") != "init,stdout,stdout,execution_count,result,execution_complete" {
		t.Errorf("events %v", events)
	}

	// An exception is an Execution error, and the stream is read to its
	// completion after it.
	res, err = sb.RunCode(ctx, "raise ValueError('bad')", &sdk.CodeOptions{Context: cc})
	if err != nil || res.OK() || res.Error.EName != "ValueError" || len(res.Error.Traceback) != 2 || res.Elapsed != 12*time.Millisecond {
		t.Errorf("exception: %+v %v", res, err)
	}
	// Without a context, python's default context.
	if _, err := sb.RunCode(ctx, "1", nil); err != nil || d.lastRun.Context.Language != "python" || d.lastRun.Context.ID != "" {
		t.Errorf("default context: %+v %v", d.lastRun, err)
	}

	if err := sb.InterruptCode(ctx, cc.ID); err != nil {
		t.Error(err)
	}
	if err := sb.DeleteCodeContext(ctx, cc.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.CodeContext(ctx, cc.ID); err == nil || !strings.Contains(err.Error(), "CONTEXT_NOT_FOUND") {
		t.Errorf("deleted context: %v", err)
	}
}
