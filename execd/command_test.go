package execd

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// outputOf joins the text of events of one type with newlines.
func outputOf(events []api.Event, typ string) string {
	var lines []string
	for _, e := range events {
		if e.Type == typ {
			lines = append(lines, e.Text)
		}
	}
	return strings.Join(lines, "\n")
}

// terminal returns the last event, failing unless it ends a run.
func terminal(t *testing.T, events []api.Event) api.Event {
	t.Helper()
	if len(events) == 0 {
		t.Fatal("no events")
	}
	last := events[len(events)-1]
	if last.Type != api.EventError && last.Type != api.EventComplete {
		t.Fatalf("last event is %q, want error or execution_complete; events %+v", last.Type, events)
	}
	return last
}

func TestCommandStream(t *testing.T) {
	_, c := newTestServer(t, nil)
	events := c.stream("/command", api.RunCommandRequest{Command: "echo hi; echo oops >&2; printf 'a\\n\\nb\\r\\nc\\rd'; exit 3"})
	if events[0].Type != api.EventInit || len(events[0].Text) != 32 {
		t.Fatalf("first event %+v, want init with a 32-hex id", events[0])
	}
	if events[1].Type != api.EventPing {
		t.Fatalf("second event %+v, want ping", events[1])
	}
	for _, e := range events {
		if e.Timestamp == 0 {
			t.Errorf("event without timestamp: %+v", e)
		}
	}
	if got := outputOf(events, api.EventStdout); got != "hi\na\n\n\nb\nc\nd" {
		t.Errorf("stdout %q", got)
	}
	if got := outputOf(events, api.EventStderr); got != "oops" {
		t.Errorf("stderr %q", got)
	}
	last := terminal(t, events)
	if last.Type != api.EventError || last.Error.EName != "CommandExecError" || last.Error.EValue != "3" ||
		len(last.Error.Traceback) != 1 || last.Error.Traceback[0] != "exit status 3" {
		t.Errorf("terminal event %+v %+v", last, last.Error)
	}
	// The status route knows the command by its init id.
	var st api.CommandStatus
	c.call("GET", "/command/status/"+events[0].Text, nil, 200, &st)
	if st.Running || st.ExitCode == nil || *st.ExitCode != 3 || st.Error != "exit status 3" || st.FinishedAt == nil {
		t.Errorf("status %+v", st)
	}
}

func TestCommandSuccess(t *testing.T) {
	_, c := newTestServer(t, nil)
	events := c.stream("/command", api.RunCommandRequest{Command: "sleep 0.05; true"})
	last := terminal(t, events)
	if last.Type != api.EventComplete || last.ExecutionTime < 50 {
		t.Fatalf("terminal %+v, want execution_complete with execution_time >= 50", last)
	}
}

// TestCommandEndsWhenProcessExits: a background grandchild that keeps the
// pipes open must not hold the response.
func TestCommandEndsWhenProcessExits(t *testing.T) {
	_, c := newTestServer(t, nil)
	start := time.Now()
	events := c.stream("/command", api.RunCommandRequest{Command: "sleep 30 & echo started"})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("response took %v", d)
	}
	if outputOf(events, api.EventStdout) != "started" || terminal(t, events).Type != api.EventComplete {
		t.Fatalf("events %+v", events)
	}
}

func TestCommandPartialLineIsFlushedWhileRunning(t *testing.T) {
	_, c := newTestServer(t, nil)
	resp, err := c.hc.Do(c.request("POST", "/command", api.RunCommandRequest{Command: "printf 'prompt> '; sleep 2; echo done"}))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := api.NewEventDecoder(resp.Body)
	start := time.Now()
	for {
		ev, err := dec.Next()
		if err != nil {
			t.Fatalf("stream ended before the prompt: %v", err)
		}
		if ev.Type == api.EventStdout {
			if ev.Text != "prompt> " {
				t.Fatalf("first output %q", ev.Text)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("prompt arrived after %v", d)
			}
			return
		}
	}
}

func TestCommandOptions(t *testing.T) {
	_, c := newTestServer(t, func(cfg *Config) {
		f := filepath.Join(cfg.TempDir, "envs")
		os.WriteFile(f, []byte("# comment\nFROM_FILE=file\nexport QUOTED=\"q v\"\nOVERRIDDEN=file\n"), 0o600)
		cfg.EnvFile = f
	})
	dir := t.TempDir()
	events := c.stream("/command", api.RunCommandRequest{
		Command: `pwd; echo "$FROM_FILE|$QUOTED|$OVERRIDDEN|$MINE"; echo "token:${EXECD_ACCESS_TOKEN-unset}"`,
		Cwd:     dir,
		Envs:    map[string]string{"MINE": "mine", "OVERRIDDEN": "request"},
	})
	want := dir + "\nfile|q v|request|mine\ntoken:unset"
	if got := outputOf(events, api.EventStdout); got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
}

func TestCommandUser(t *testing.T) {
	_, c := newTestServer(t, nil)
	if os.Geteuid() != 0 {
		t.Log("not root; only the validation is checked")
	} else {
		uid := uint32(65534)
		events := c.stream("/command", api.RunCommandRequest{Command: `id -u; id -g; echo "$HOME $USER"`, UID: &uid, Cwd: "/"})
		if got := outputOf(events, api.EventStdout); got != "65534\n65534\n/nonexistent nobody" {
			t.Errorf("as uid 65534: %q", got)
		}
		gid := uint32(123)
		events = c.stream("/command", api.RunCommandRequest{Command: `id -g`, UID: &uid, GID: &gid, Cwd: "/"})
		if got := outputOf(events, api.EventStdout); got != "123" {
			t.Errorf("as gid 123: %q", got)
		}
	}
	gid := uint32(1)
	c.wantError("POST", "/command", api.RunCommandRequest{Command: "true", GID: &gid}, 400, api.CodeInvalidRequestBody)
}

func TestCommandTimeoutKillsGroup(t *testing.T) {
	_, c := newTestServer(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	events := c.stream("/command", api.RunCommandRequest{
		Command: "sleep 60 & echo $! > " + pidFile + "; wait",
		Timeout: 300,
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	last := terminal(t, events)
	if last.Type != api.EventError || last.Error.EValue != "-1" || last.Error.Traceback[0] != "signal: killed" {
		t.Fatalf("terminal %+v %+v", last, last.Error)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	waitGone(t, pid)
}

// waitGone waits for pid to disappear (or become a zombie).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	if pid <= 0 {
		t.Fatal("no pid")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running", pid)
		}
	}
}

func TestCommandBadRequests(t *testing.T) {
	_, c := newTestServer(t, nil)
	tests := []struct {
		name string
		body any
	}{
		{"malformed json", `{"command":`},
		{"wrong type", `{"command":42}`},
		{"empty command", api.RunCommandRequest{}},
		{"negative timeout", api.RunCommandRequest{Command: "true", Timeout: -1}},
		{"missing cwd", api.RunCommandRequest{Command: "true", Cwd: "/nonexistent/dir"}},
		{"cwd is a file", api.RunCommandRequest{Command: "true", Cwd: "/etc/passwd"}},
		{"undefined variable in cwd", api.RunCommandRequest{Command: "true", Cwd: "$NO_SUCH_VARIABLE_X/a"}},
		{"NUL in cwd", api.RunCommandRequest{Command: "true", Cwd: "/tmp\x00x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.t = t
			c.wantError("POST", "/command", tt.body, 400, api.CodeInvalidRequestBody)
		})
	}
}

// TestCommandWithoutShell runs commands in an environment whose PATH holds
// no shell: plain invocations are executed directly, shell syntax is
// refused with a clear error.
func TestCommandWithoutShell(t *testing.T) {
	_, c := newTestServer(t, nil)
	bin := t.TempDir()
	if err := os.Symlink("/bin/echo", filepath.Join(bin, "hello")); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PATH": bin}
	events := c.stream("/command", api.RunCommandRequest{Command: `hello 'two words' "and \"more\"" back\ slash`, Envs: env})
	if got := outputOf(events, api.EventStdout); got != `two words and "more" back slash` {
		t.Fatalf("direct exec output %q", got)
	}
	if terminal(t, events).Type != api.EventComplete {
		t.Fatalf("events %+v", events)
	}
	for _, cmd := range []string{"hello | cat", "hello $HOME", "missing-program"} {
		events = c.stream("/command", api.RunCommandRequest{Command: cmd, Envs: env})
		last := terminal(t, events)
		if len(events) != 2 || events[0].Type != api.EventInit || last.Type != api.EventError ||
			!strings.Contains(last.Error.EValue, "no shell") {
			t.Errorf("%q: events %+v (%+v)", cmd, events, last.Error)
		}
		var st api.CommandStatus
		c.call("GET", "/command/status/"+events[0].Text, nil, 200, &st)
		if st.ExitCode == nil || *st.ExitCode != 255 {
			t.Errorf("%q: status %+v, want exit code 255", cmd, st)
		}
	}
}

func TestBackgroundCommand(t *testing.T) {
	_, c := newTestServer(t, nil)
	events := c.stream("/command", api.RunCommandRequest{
		Command:    "echo one; echo two >&2; sleep 0.3; echo three; exit 4",
		Background: true,
	})
	if len(events) != 2 || events[0].Type != api.EventInit || events[1].Type != api.EventComplete {
		t.Fatalf("background events %+v", events)
	}
	id := events[0].Text
	var st api.CommandStatus
	c.call("GET", "/command/status/"+id, nil, 200, &st)
	if !st.Running || st.ExitCode != nil || st.Content != "echo one; echo two >&2; sleep 0.3; echo three; exit 4" {
		t.Fatalf("status while running %+v", st)
	}

	// Read the log with the cursor until the command is done.
	var log bytes.Buffer
	cursor := "0"
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, body := c.do(c.request("GET", "/command/"+id+"/logs?cursor="+cursor, nil))
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("logs: %d %s", resp.StatusCode, resp.Header)
		}
		log.Write(body)
		next := resp.Header.Get(api.HeaderTailCursor)
		if n, err := strconv.Atoi(next); err != nil || n != log.Len() {
			t.Fatalf("cursor %q after %d bytes", next, log.Len())
		}
		cursor = next
		c.call("GET", "/command/status/"+id, nil, 200, &st)
		if !st.Running && strings.Contains(log.String(), "three") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("command did not finish; log %q", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if log.String() != "one\ntwo\nthree\n" {
		t.Errorf("log %q", log.String())
	}
	if *st.ExitCode != 4 {
		t.Errorf("exit code %d", *st.ExitCode)
	}
	// A cursor past the end, or garbage, is clamped.
	resp, body := c.do(c.request("GET", "/command/"+id+"/logs?cursor=999999", nil))
	if len(body) != 0 || resp.Header.Get(api.HeaderTailCursor) != strconv.Itoa(log.Len()) {
		t.Errorf("cursor past end: %q, cursor %s", body, resp.Header.Get(api.HeaderTailCursor))
	}
	_, body = c.do(c.request("GET", "/command/"+id+"/logs?cursor=abc", nil))
	if string(body) != log.String() {
		t.Errorf("bad cursor: %q", body)
	}

	// Errors as the reference daemon answers them.
	c.wantError("GET", "/command/status/nope", nil, 404, api.CodeInvalidRequestBody)
	c.wantError("GET", "/command/nope/logs", nil, 400, api.CodeInvalidRequestBody)
	fg := c.stream("/command", api.RunCommandRequest{Command: "true"})
	c.wantError("GET", "/command/"+fg[0].Text+"/logs", nil, 400, api.CodeInvalidRequestBody)
}

func TestInterrupt(t *testing.T) {
	_, c := newTestServer(t, nil)
	c.wantError("DELETE", "/command", nil, 400, api.CodeMissingQuery)
	c.wantError("DELETE", "/command?id=nope", nil, 500, api.CodeRuntimeError)

	resp, err := c.hc.Do(c.request("POST", "/command", api.RunCommandRequest{Command: "echo ready; sleep 60"}))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := api.NewEventDecoder(resp.Body)
	init, _ := dec.Next()
	for ev, err := dec.Next(); ev.Text != "ready"; ev, err = dec.Next() {
		if err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	c.call("DELETE", "/command?id="+init.Text, nil, 200, nil)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("interrupt took %v", d)
	}
	var last api.Event
	for ev, err := dec.Next(); err == nil; ev, err = dec.Next() {
		last = ev
	}
	if last.Type != api.EventError || last.Error.EValue != "-1" || last.Error.Traceback[0] != "signal: terminated" {
		t.Fatalf("stream ended with %+v %+v", last, last.Error)
	}
	// Interrupting a finished command is an error.
	c.wantError("DELETE", "/command?id="+init.Text, nil, 500, api.CodeRuntimeError)
}

// TestClientDisconnect documents the choice for a foreground command whose
// client goes away: it runs to completion, its output is drained (it never
// blocks on a full pipe), and its status tells how it ended.
func TestClientDisconnect(t *testing.T) {
	_, c := newTestServer(t, nil)
	req := c.request("POST", "/command", api.RunCommandRequest{
		// Far more output than a pipe holds, then a normal exit.
		Command: "sleep 0.3; head -c 4000000 /dev/zero | tr '\\0' 'x' | fold -w 100; exit 5",
	})
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	init, err := api.NewEventDecoder(resp.Body).Next()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // the client leaves right after init
	var st api.CommandStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c.call("GET", "/command/status/"+init.Text, nil, 200, &st)
		if !st.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("command blocked after its client left")
		}
	}
	if *st.ExitCode != 5 {
		t.Fatalf("exit code %d, want 5", *st.ExitCode)
	}
}

func TestCommandRecordsAreEvicted(t *testing.T) {
	s, c := newTestServer(t, func(cfg *Config) { cfg.MaxRecords = 3 })
	var ids []string
	for i := 0; i < 6; i++ {
		ids = append(ids, c.stream("/command", api.RunCommandRequest{Command: "true"})[0].Text)
	}
	for _, id := range ids[:3] {
		c.wantError("GET", "/command/status/"+id, nil, 404, api.CodeInvalidRequestBody)
	}
	for _, id := range ids[3:] {
		c.call("GET", "/command/status/"+id, nil, 200, nil)
	}
	// Age-based eviction.
	s.commands.ttl = time.Millisecond
	time.Sleep(5 * time.Millisecond)
	s.commands.evict(time.Now())
	for _, id := range ids[3:] {
		c.wantError("GET", "/command/status/"+id, nil, 404, api.CodeInvalidRequestBody)
	}
}

func TestConcurrentCommands(t *testing.T) {
	_, c := newTestServer(t, nil)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.hc.Do(c.request("POST", "/command", api.RunCommandRequest{Command: fmt.Sprintf("echo %d; exit %d", i, i%7)}))
			if err != nil {
				errs <- err.Error()
				return
			}
			defer resp.Body.Close()
			var out, evalue string
			dec := api.NewEventDecoder(resp.Body)
			for ev, err := dec.Next(); err != io.EOF; ev, err = dec.Next() {
				if err != nil {
					errs <- err.Error()
					return
				}
				if ev.Type == api.EventStdout {
					out += ev.Text
				}
				if ev.Type == api.EventError {
					evalue = ev.Error.EValue
				}
			}
			if out != strconv.Itoa(i) || (i%7 != 0 && evalue != strconv.Itoa(i%7)) {
				errs <- fmt.Sprintf("command %d: output %q exit %q", i, out, evalue)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestAuth(t *testing.T) {
	if _, err := New(Config{TempDir: t.TempDir()}); err != ErrNoToken {
		t.Fatalf("New without token: %v, want ErrNoToken", err)
	}
	_, c := newTestServer(t, nil)
	for _, token := range []string{"", "wrong", testToken + "x"} {
		req := c.request("GET", "/ping", nil)
		req.Header.Set(api.HeaderExecdToken, token)
		resp, body := c.do(req)
		if resp.StatusCode != 401 || string(bytes.TrimSpace(body)) != `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}` {
			t.Errorf("token %q: %d %s", token, resp.StatusCode, body)
		}
	}
	c.call("GET", "/ping", nil, 200, nil)

	_, open := newTestServer(t, func(cfg *Config) { cfg.AccessToken, cfg.Insecure = "", true })
	open.token = ""
	open.call("GET", "/ping", nil, 200, nil)
}

func TestUnknownRoutes(t *testing.T) {
	_, c := newTestServer(t, nil)
	for _, r := range [][2]string{{"GET", "/nope"}, {"GET", "/command"}, {"PUT", "/ping"}, {"GET", "/command/x/y"}} {
		resp, body := c.do(c.request(r[0], r[1], nil))
		if resp.StatusCode != http.StatusNotFound || string(body) != "404 page not found\n" {
			t.Errorf("%s %s: %d %q", r[0], r[1], resp.StatusCode, body)
		}
	}
}

// TestJobsOutliveTheirCommand: "server &" must keep running after the
// command returns, even when it writes to the stdout it inherited; a
// background command's log keeps what such a job writes later.
func TestJobsOutliveTheirCommand(t *testing.T) {
	_, c := newTestServer(t, nil)
	dir := t.TempDir()
	events := c.stream("/command", api.RunCommandRequest{Command: "(sleep 0.3; echo late; touch " + dir + "/fg) & echo early"})
	if outputOf(events, api.EventStdout) != "early" {
		t.Fatalf("foreground output %+v", events)
	}
	bg := c.stream("/command", api.RunCommandRequest{Command: "(sleep 0.3; echo late; touch " + dir + "/bg) & echo early", Background: true})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, errFG := os.Stat(dir + "/fg")
		_, errBG := os.Stat(dir + "/bg")
		if errFG == nil && errBG == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs died after writing: fg %v, bg %v", errFG, errBG)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		log := string(c.call("GET", "/command/"+bg[0].Text+"/logs", nil, 200, nil))
		if log == "early\nlate\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("background log %q", log)
		}
	}
}

func TestBackgroundLogIsBounded(t *testing.T) {
	_, c := newTestServer(t, func(cfg *Config) { cfg.MaxLogBytes = 1000 })
	bg := c.stream("/command", api.RunCommandRequest{Command: "seq 1 2000", Background: true})
	id := bg[0].Text
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var st api.CommandStatus
		c.call("GET", "/command/status/"+id, nil, 200, &st)
		if !st.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("seq did not finish")
		}
	}
	resp, body := c.do(c.request("GET", "/command/"+id+"/logs?cursor=0", nil))
	total := 0
	for i := 1; i <= 2000; i++ {
		total += len(strconv.Itoa(i)) + 1
	}
	if len(body) != 1000 || !strings.HasSuffix(string(body), "\n1999\n2000\n") || resp.Header.Get(api.HeaderTailCursor) != strconv.Itoa(total) {
		t.Fatalf("bounded log: %d bytes ending %q, cursor %s (want 1000 bytes, cursor %d)",
			len(body), body[max(0, len(body)-20):], resp.Header.Get(api.HeaderTailCursor), total)
	}
}

// TestBackgroundLogsShareABudget: the logs of all background commands
// together stay within MaxLogBytesTotal; those of finished commands give
// way first, so the newest command's log is whole.
func TestBackgroundLogsShareABudget(t *testing.T) {
	s, c := newTestServer(t, func(cfg *Config) { cfg.MaxLogBytes, cfg.MaxLogBytesTotal = 300_000, 500_000 })
	const each = 250_000 // bytes of output per command
	var ids []string
	for i := range 4 {
		cmd := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' %c", each, 'a'+i)
		id := c.stream("/command", api.RunCommandRequest{Command: cmd, Background: true})[0].Text
		waitFor(t, "command "+cmd, func() bool {
			var st api.CommandStatus
			c.call("GET", "/command/status/"+id, nil, 200, &st)
			return !st.Running
		})
		ids = append(ids, id)
		if held := s.spools.Held(); held > 500_000 {
			t.Fatalf("after %d commands the logs hold %d bytes, over the budget", i+1, held)
		}
	}
	logs := make([]string, len(ids))
	for i, id := range ids {
		logs[i] = string(c.call("GET", "/command/"+id+"/logs?cursor=0", nil, 200, nil))
	}
	if logs[3] != strings.Repeat("d", each) {
		t.Errorf("the newest log is %d bytes, want all %d", len(logs[3]), each)
	}
	if len(logs[0]) != 0 || len(logs[1]) != 0 {
		t.Errorf("the oldest logs kept %d and %d bytes", len(logs[0]), len(logs[1]))
	}
	if len(logs[2]) != 500_000-each || strings.Trim(logs[2], "c") != "" {
		t.Errorf("the third log kept %d bytes, want the last %d", len(logs[2]), 500_000-each)
	}
}

// TestInsecureRefusesBrowsers: without a token, a page in a browser must
// not be able to run commands through execd on loopback.
func TestInsecureRefusesBrowsers(t *testing.T) {
	_, c := newTestServer(t, func(cfg *Config) { cfg.AccessToken, cfg.Insecure = "", true })
	c.token = ""
	req := c.request("POST", "/command", api.RunCommandRequest{Command: "true"})
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, _ := c.do(req); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d, want 403", resp.StatusCode)
	}
	c.stream("/command", api.RunCommandRequest{Command: "true"}) // non-browser clients are fine
}
