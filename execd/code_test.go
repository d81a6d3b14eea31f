package execd

import (
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// needProgram skips (fails in CI) when prog is not installed.
func needProgram(t *testing.T, prog string) {
	t.Helper()
	testenv.MustHaveCommand(t, prog)
}

func newCodeContext(t *testing.T, c *testClient, language, cwd string) api.CodeContext {
	t.Helper()
	var cc api.CodeContext
	c.call("POST", "/code/context", api.CodeContext{Language: language, Cwd: cwd}, 200, &cc)
	if len(cc.ID) != 32 || cc.Language != language {
		t.Fatalf("created context %+v", cc)
	}
	return cc
}

// codeRun is what a /code stream carried.
type codeRun struct {
	events  []api.Event
	stdout  string
	results []map[string]any
	err     *api.ExecutionError
}

func runCodeIn(t *testing.T, c *testClient, req api.RunCodeRequest) codeRun {
	t.Helper()
	events := c.stream("/code", req)
	r := codeRun{events: events}
	if len(events) < 2 || events[0].Type != api.EventInit {
		t.Fatalf("events %+v", events)
	}
	if last := events[len(events)-1]; last.Type != api.EventComplete {
		t.Fatalf("last event %+v, want execution_complete (also after an error)", last)
	}
	for _, ev := range events {
		switch ev.Type {
		case api.EventStdout:
			r.stdout += ev.Text
		case api.EventResult:
			r.results = append(r.results, ev.Results)
		case api.EventError:
			r.err = ev.Error
		}
	}
	return r
}

func TestCodeContextsPythonOverHTTP(t *testing.T) {
	needProgram(t, "python3")
	_, c := newTestServer(t, nil)
	dir := filepath.Join(t.TempDir(), "work")
	cc := newCodeContext(t, c, "python", dir)
	if cc.Cwd != dir {
		t.Errorf("cwd echoed %q, want %q", cc.Cwd, dir)
	}
	run := func(code string) codeRun {
		return runCodeIn(t, c, api.RunCodeRequest{Code: code, Context: &api.CodeContext{ID: cc.ID, Language: "python"}})
	}
	r := run("import os\nn = 6 * 7\nprint(os.getcwd())")
	if r.events[0].Text != cc.ID || r.stdout != dir+"\n" {
		t.Fatalf("first run %+v", r)
	}
	r = run("n")
	if len(r.results) != 1 || r.results[0]["text"] != "42" {
		t.Fatalf("state %+v", r)
	}
	i := 0
	for ; r.events[i].Type != api.EventExecutionCount; i++ {
	}
	if r.events[i].ExecutionCount != 2 || r.events[i+1].Type != api.EventResult {
		t.Errorf("execution_count then result: %+v", r.events)
	}
	r = run("undefined_name")
	if r.err == nil || r.err.EName != "NameError" || len(r.err.Traceback) == 0 {
		t.Fatalf("error %+v", r)
	}
	// status "error" comes right before the error.
	for i, ev := range r.events {
		if ev.Type == api.EventError && (i == 0 || r.events[i-1].Type != api.EventStatus || r.events[i-1].Text != "error") {
			t.Errorf("events %+v", r.events)
		}
	}

	// The default context: language only, stateful, listed.
	runCodeIn(t, c, api.RunCodeRequest{Code: "d = 1", Context: &api.CodeContext{Language: "python"}})
	r = runCodeIn(t, c, api.RunCodeRequest{Code: "d + 1", Context: &api.CodeContext{Language: "python"}})
	if r.results[0]["text"] != "2" || r.events[0].Text == cc.ID {
		t.Fatalf("default context %+v", r)
	}
	var list []api.CodeContext
	c.call("GET", "/code/contexts?language=python", nil, 200, &list)
	if len(list) != 2 || list[0].ID != cc.ID || list[1].ID != r.events[0].Text {
		t.Fatalf("list %+v", list)
	}
	c.call("GET", "/code/contexts?language=javascript", nil, 200, &list)
	if len(list) != 0 {
		t.Fatalf("list of another language %+v", list)
	}
	var got api.CodeContext
	c.call("GET", "/code/contexts/"+cc.ID, nil, 200, &got)
	if got.ID != cc.ID || got.Language != "python" {
		t.Errorf("get %+v", got)
	}
	c.call("DELETE", "/code/contexts/"+cc.ID, nil, 200, nil)
	c.wantError("GET", "/code/contexts/"+cc.ID, nil, 404, api.CodeContextNotFound)
	c.wantError("DELETE", "/code/contexts/"+cc.ID, nil, 404, api.CodeContextNotFound)
	c.wantError("POST", "/code", api.RunCodeRequest{Code: "1", Context: &api.CodeContext{ID: cc.ID, Language: "python"}}, 404, api.CodeContextNotFound)
	c.call("DELETE", "/code/contexts?language=python", nil, 200, nil)
	c.call("GET", "/code/contexts", nil, 200, &list)
	if len(list) != 0 {
		t.Fatalf("after delete by language %+v", list)
	}
	// The default context comes back, fresh.
	r = runCodeIn(t, c, api.RunCodeRequest{Code: "'d' in globals()", Context: &api.CodeContext{Language: "python"}})
	if r.results[0]["text"] != "False" {
		t.Fatalf("new default context %+v", r)
	}
}

func TestCodeInterruptOverHTTP(t *testing.T) {
	needProgram(t, "python3")
	_, c := newTestServer(t, nil)
	cc := newCodeContext(t, c, "python", "")
	ctx := &api.CodeContext{ID: cc.ID, Language: "python"}
	runCodeIn(t, c, api.RunCodeRequest{Code: "kept = 'yes'", Context: ctx})
	done := make(chan codeRun)
	go func() {
		done <- runCodeIn(t, c, api.RunCodeRequest{Code: "print('started', flush=True)\nwhile True: pass", Context: ctx})
	}()
	time.Sleep(300 * time.Millisecond)
	c.call("DELETE", "/code?id="+cc.ID, nil, 200, nil)
	select {
	case r := <-done:
		if r.err == nil || r.err.EName != "KeyboardInterrupt" || r.stdout != "started\n" {
			t.Fatalf("interrupted run %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("interrupt did not end the run")
	}
	r := runCodeIn(t, c, api.RunCodeRequest{Code: "kept", Context: ctx})
	if r.results[0]["text"] != "'yes'" {
		t.Fatalf("after interrupt %+v", r)
	}
	// The per-run timeout extension.
	start := time.Now()
	r = runCodeIn(t, c, api.RunCodeRequest{Code: "import time\ntime.sleep(30)", Context: ctx, Timeout: 300})
	if r.err == nil || r.err.EName != "TimeoutError" || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout %+v after %v", r, time.Since(start))
	}
	// Interrupting an idle context is not an error.
	c.call("DELETE", "/code?id="+cc.ID, nil, 200, nil)
}

func TestCodeBashContext(t *testing.T) {
	_, c := newTestServer(t, nil)
	dir := t.TempDir()
	cc := newCodeContext(t, c, "bash", dir)
	ctx := &api.CodeContext{ID: cc.ID, Language: "bash"}
	runCodeIn(t, c, api.RunCodeRequest{Code: "v=7; f() { echo \"f$1\"; }; mkdir -p sub; cd sub", Context: ctx})
	r := runCodeIn(t, c, api.RunCodeRequest{Code: "echo $v; f x; pwd", Context: ctx})
	if r.stdout != "7\nfx\n"+filepath.Join(dir, "sub")+"\n" {
		t.Fatalf("bash state: %q", r.stdout)
	}
	r = runCodeIn(t, c, api.RunCodeRequest{Code: "exit_code() { return 3; }; exit_code", Context: ctx})
	if r.err == nil || r.err.EName != api.ErrorNameCommand || r.err.EValue != "3" {
		t.Fatalf("bash failure %+v", r)
	}
	done := make(chan codeRun)
	go func() { done <- runCodeIn(t, c, api.RunCodeRequest{Code: "sleep 30", Context: ctx}) }()
	time.Sleep(300 * time.Millisecond)
	c.call("DELETE", "/code?id="+cc.ID, nil, 200, nil)
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("interrupted bash run %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("interrupt did not end the bash run")
	}
	if r := runCodeIn(t, c, api.RunCodeRequest{Code: "echo $v", Context: ctx}); r.stdout != "7\n" {
		t.Fatalf("bash state after interrupt %+v", r)
	}
}

func TestCodeAsCommand(t *testing.T) {
	_, c := newTestServer(t, nil)
	// No language: a shell command, even with an id (the reference's rule).
	for _, ctx := range []*api.CodeContext{nil, {ID: "whatever"}, {Language: "command"}} {
		events := c.stream("/code", api.RunCodeRequest{Code: "echo hi; exit 2", Context: ctx})
		if outputOf(events, api.EventStdout) != "hi" || terminal(t, events).Error == nil || terminal(t, events).Error.EValue != "2" {
			t.Fatalf("context %+v: %+v", ctx, events)
		}
	}
}

func TestCodeBadInput(t *testing.T) {
	_, c := newTestServer(t, func(cfg *Config) { cfg.MaxCodeContexts = 2 })
	e := c.wantError("POST", "/code/context", api.CodeContext{Language: "cobol"}, 400, api.CodeInvalidRequestBody)
	if !strings.Contains(e.Message, "cobol") || !strings.Contains(e.Message, "python") {
		t.Errorf("unknown language message %q", e.Message)
	}
	c.wantError("POST", "/code/context", api.CodeContext{}, 400, api.CodeInvalidRequestBody)
	c.wantError("POST", "/code/context", "not an object", 400, api.CodeInvalidRequestBody)
	c.wantError("POST", "/code", api.RunCodeRequest{Context: &api.CodeContext{Language: "python"}}, 400, api.CodeInvalidRequestBody)
	c.wantError("POST", "/code", api.RunCodeRequest{Code: "1", Context: &api.CodeContext{Language: "cobol"}}, 400, api.CodeInvalidRequestBody)
	c.wantError("POST", "/code", api.RunCodeRequest{Code: "1", Context: &api.CodeContext{ID: "0123456789abcdef0123456789abcdef", Language: "python"}}, 404, api.CodeContextNotFound)
	c.wantError("POST", "/code", api.RunCodeRequest{Code: "1", Timeout: -1, Context: &api.CodeContext{Language: "python"}}, 400, api.CodeInvalidRequestBody)
	c.wantError("DELETE", "/code/contexts", nil, 400, api.CodeMissingQuery)
	c.wantError("DELETE", "/code", nil, 400, api.CodeMissingQuery)
	c.wantError("DELETE", "/code?id=nothing", nil, 500, api.CodeRuntimeError)

	// The limit.
	newCodeContext(t, c, "bash", "")
	newCodeContext(t, c, "bash", "")
	c.wantError("POST", "/code/context", api.CodeContext{Language: "bash"}, http.StatusConflict, api.CodeTooManyContexts)
}

func TestCodeMissingInterpreter(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, c := newTestServer(t, nil)
	start := time.Now()
	e := c.wantError("POST", "/code/context", api.CodeContext{Language: "python"}, http.StatusNotImplemented, api.CodeNotSupported)
	if !strings.Contains(e.Message, "python3 is not installed") || time.Since(start) > time.Second {
		t.Errorf("missing interpreter: %q after %v", e.Message, time.Since(start))
	}
	c.wantError("POST", "/code", api.RunCodeRequest{Code: "1", Context: &api.CodeContext{Language: "javascript"}}, http.StatusNotImplemented, api.CodeNotSupported)
}

func TestCodeContextsInParallel(t *testing.T) {
	needProgram(t, "python3")
	_, c := newTestServer(t, nil)
	const n = 6
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i] = newCodeContext(t, c, "python", "").ID })
	}
	wg.Wait()
	for i := range n {
		wg.Go(func() {
			ctx := &api.CodeContext{ID: ids[i], Language: "python"}
			runCodeIn(t, c, api.RunCodeRequest{Code: "import time\ntime.sleep(0.2)\nmine = " + string(rune('0'+i)), Context: ctx})
			r := runCodeIn(t, c, api.RunCodeRequest{Code: "mine", Context: ctx})
			if len(r.results) != 1 || r.results[0]["text"] != string(rune('0'+i)) {
				t.Errorf("context %d: %+v", i, r)
			}
		})
	}
	wg.Wait()
}
