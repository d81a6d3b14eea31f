package execd

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

func newSession(t *testing.T, c *testClient, body any) string {
	t.Helper()
	var resp api.CreateSessionResponse
	c.call("POST", "/session", body, 200, &resp)
	if len(resp.SessionID) != 36 || strings.Count(resp.SessionID, "-") != 4 {
		t.Fatalf("session id %q is not a UUID", resp.SessionID)
	}
	return resp.SessionID
}

func runIn(t *testing.T, c *testClient, id string, req api.RunInSessionRequest) ([]api.Event, string) {
	t.Helper()
	events := c.stream("/session/"+id+"/run", req)
	if events[0].Type != api.EventInit || events[0].Text != id {
		t.Fatalf("first event %+v, want init with the session id", events[0])
	}
	return events, outputOf(events, api.EventStdout)
}

func TestSessionKeepsShellState(t *testing.T) {
	_, c := newTestServer(t, nil)
	dir := t.TempDir()
	id := newSession(t, c, api.CreateSessionRequest{Cwd: dir})
	events, _ := runIn(t, c, id, api.RunInSessionRequest{Command: `
unexported=1
export EXPORTED=2
greet() { echo "hello $1"; }
alias ll='echo aliased'
set -o pipefail
mkdir -p sub && cd sub`})
	if terminal(t, events).Type != api.EventComplete {
		t.Fatalf("setup run: %+v", events)
	}
	_, out := runIn(t, c, id, api.RunInSessionRequest{Command: `echo "$unexported $EXPORTED"; greet you; ll; pwd; shopt -o pipefail | cut -f2`})
	want := "1 2\nhello you\naliased\n" + filepath.Join(dir, "sub") + "\non"
	if out != want {
		t.Fatalf("second run output %q, want %q", out, want)
	}
}

func TestSessionOutputAndStatus(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	events, out := runIn(t, c, id, api.RunInSessionRequest{Command: "echo out; echo; echo err >&2; printf partial; false"})
	if out != "out\nerr\npartial" {
		t.Errorf("output %q (stderr merged, empty lines dropped)", out)
	}
	last := terminal(t, events)
	if last.Type != api.EventError || last.Error.EValue != "1" {
		t.Errorf("terminal %+v %+v", last, last.Error)
	}
	// A run that writes nothing.
	events, out = runIn(t, c, id, api.RunInSessionRequest{Command: ":"})
	if out != "" || terminal(t, events).Type != api.EventComplete {
		t.Errorf("empty run: %+v", events)
	}
}

// TestSessionMarkerCannotBeForged: nothing the user prints or does to the
// descriptors it can reach ends a run early or changes its status.
func TestSessionMarkerCannotBeForged(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	events, out := runIn(t, c, id, api.RunInSessionRequest{Command: `
printf '0\n'; printf '\n0\n' >&2
{ echo 0 >&3; } 2>/dev/null || echo "fd3 closed"
read -r line || echo "stdin empty"
sleep 0.2; echo still running; exit_status=7; (exit $exit_status)`})
	if out != "0\n0\nfd3 closed\nstdin empty\nstill running" {
		t.Errorf("output %q", out)
	}
	if last := terminal(t, events); last.Type != api.EventError || last.Error.EValue != "7" {
		t.Errorf("terminal %+v %+v", last, last.Error)
	}
}

func TestSessionExitStartsFreshShell(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	runIn(t, c, id, api.RunInSessionRequest{Command: "x=kept"})
	events, _ := runIn(t, c, id, api.RunInSessionRequest{Command: "echo bye; exit 3"})
	last := terminal(t, events)
	if last.Error == nil || last.Error.EValue != "3" || !strings.Contains(last.Error.Traceback[0], "fresh shell") {
		t.Fatalf("exit run: %+v %+v", last, last.Error)
	}
	if outputOf(events, api.EventStdout) != "bye" {
		t.Errorf("exit run output %q", outputOf(events, api.EventStdout))
	}
	events, out := runIn(t, c, id, api.RunInSessionRequest{Command: `echo "x=${x-unset}"`})
	if out != "x=unset" || terminal(t, events).Type != api.EventComplete {
		t.Fatalf("after exit: %q %+v", out, events)
	}
}

func TestSessionTimeout(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	runIn(t, c, id, api.RunInSessionRequest{Command: "x=kept"})

	// SIGINT interrupts the run; the shell and its state survive.
	start := time.Now()
	events, out := runIn(t, c, id, api.RunInSessionRequest{Command: "echo before; sleep 30; echo after", Timeout: 300})
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	last := terminal(t, events)
	if out != "before" || last.Error == nil || last.Error.EValue != "-1" || !strings.Contains(last.Error.Traceback[0], "timed out") {
		t.Fatalf("timed out run: %q %+v %+v", out, last, last.Error)
	}
	_, out = runIn(t, c, id, api.RunInSessionRequest{Command: "echo $x"})
	if out != "kept" {
		t.Fatalf("state after interrupted run: %q", out)
	}

	// A run that ignores SIGINT costs the shell.
	events, _ = runIn(t, c, id, api.RunInSessionRequest{Command: "trap '' INT; sleep 30", Timeout: 200})
	if last := terminal(t, events); last.Error == nil || !strings.Contains(last.Error.Traceback[0], "killed") {
		t.Fatalf("stubborn run: %+v", last)
	}
	events, out = runIn(t, c, id, api.RunInSessionRequest{Command: `echo "${x-unset}"`})
	if out != "unset" || terminal(t, events).Type != api.EventComplete {
		t.Fatalf("after kill: %q %+v", out, events)
	}
}

func TestSessionRunCwd(t *testing.T) {
	_, c := newTestServer(t, nil)
	a, b := t.TempDir(), t.TempDir()
	id := newSession(t, c, api.CreateSessionRequest{Cwd: filepath.Join(a, "created")})
	if _, err := os.Stat(filepath.Join(a, "created")); err != nil {
		t.Fatalf("session cwd not created: %v", err)
	}
	_, out := runIn(t, c, id, api.RunInSessionRequest{Command: "pwd", Cwd: b})
	if out != b {
		t.Errorf("pwd with cwd = %q, want %q", out, b)
	}
	_, out = runIn(t, c, id, api.RunInSessionRequest{Command: "pwd"})
	if out != b {
		t.Errorf("pwd after a run with cwd = %q, want %q (the resulting directory persists)", out, b)
	}
	c.wantError("POST", "/session/"+id+"/run", api.RunInSessionRequest{Command: "pwd", Cwd: "/nonexistent"}, 400, api.CodeInvalidRequestBody)
}

func TestSessionRunsAreSerialized(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	var wg sync.WaitGroup
	outs := make([]string, 4)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, outs[i] = runIn(t, c, id, api.RunInSessionRequest{Command: "for i in 1 2 3; do echo run; sleep 0.02; done"})
		}()
	}
	wg.Wait()
	for i, out := range outs {
		if out != "run\nrun\nrun" {
			t.Errorf("run %d output %q: runs interleaved", i, out)
		}
	}
}

func TestSessionErrors(t *testing.T) {
	_, c := newTestServer(t, nil)
	c.wantError("POST", "/session/nope/run", api.RunInSessionRequest{Command: "true"}, 500, api.CodeRuntimeError)
	c.wantError("DELETE", "/session/nope", nil, 404, api.CodeContextNotFound)
	c.wantError("POST", "/session", `{"cwd":`, 400, api.CodeInvalidRequestBody)
	id := newSession(t, c, "")
	c.wantError("POST", "/session/"+id+"/run", `{}`, 400, api.CodeInvalidRequestBody)
	c.wantError("POST", "/session/"+id+"/run", `{"command":"x","timeout":-5}`, 400, api.CodeInvalidRequestBody)
	c.call("DELETE", "/session/"+id, nil, 200, nil)
	c.wantError("POST", "/session/"+id+"/run", api.RunInSessionRequest{Command: "true"}, 500, api.CodeRuntimeError)

	// The interrupt route closes a session, as the reference daemon does.
	id = newSession(t, c, nil)
	c.call("DELETE", "/command?id="+id, nil, 200, nil)
	c.wantError("DELETE", "/session/"+id, nil, 404, api.CodeContextNotFound)
}

func TestSessionDeleteKillsRunningRun(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	done := make(chan []api.Event)
	go func() {
		events, _ := runIn(t, c, id, api.RunInSessionRequest{Command: "echo go; sleep 60"})
		done <- events
	}()
	time.Sleep(300 * time.Millisecond)
	c.call("DELETE", "/session/"+id, nil, 200, nil)
	select {
	case events := <-done:
		if terminal(t, events).Type != api.EventError {
			t.Fatalf("run of a deleted session ended with %+v", events)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not end when its session was deleted")
	}
}

// TestSessionStatusCopiesCannotEndARun: bash keeps a saved copy of the
// status descriptor while a run is sourced; writing a fake status to it
// must not end the run or shift the next one.
func TestSessionStatusCopiesCannotEndARun(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	events, out := runIn(t, c, id, api.RunInSessionRequest{Command: `
for fd in $(ls /proc/$$/fd); do [ "$fd" -gt 2 ] && { printf '0\n' >&$fd; printf 'x 0\n' >&$fd; } 2>/dev/null; done
sleep 0.2; echo late; false`})
	if out != "late" || terminal(t, events).Error == nil || terminal(t, events).Error.EValue != "1" {
		t.Fatalf("forged run: %q %+v %+v", out, terminal(t, events), terminal(t, events).Error)
	}
	events, out = runIn(t, c, id, api.RunInSessionRequest{Command: "echo second"})
	if out != "second" || terminal(t, events).Type != api.EventComplete {
		t.Fatalf("next run: %q %+v", out, events)
	}
}

// TestSessionCloseDoesNotWaitForClient: a client that stops reading must
// not keep a delete from killing the session.
func TestSessionCloseDoesNotWaitForClient(t *testing.T) {
	_, c := newTestServer(t, nil)
	id := newSession(t, c, nil)
	req := c.request("POST", "/session/"+id+"/run", api.RunInSessionRequest{Command: "yes | head -c 100000000"})
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read: the server's writes fill the socket
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	c.call("DELETE", "/session/"+id, nil, 200, nil)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("delete took %v", d)
	}
}

// TestSessionInPlainSh: where there is no bash the session uses sh, and a
// timed-out run still leaves the shell and its state alive.
func TestSessionInPlainSh(t *testing.T) {
	sh := "/bin/dash"
	if _, err := os.Stat(sh); err != nil {
		sh = "/bin/busybox"
	}
	bin := t.TempDir()
	for name, target := range map[string]string{"sh": sh, "sleep": "/bin/sleep"} {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	_, c := newTestServer(t, func(cfg *Config) {
		cfg.EnvFile = filepath.Join(cfg.TempDir, "env")
		os.WriteFile(cfg.EnvFile, []byte("PATH="+bin+"\n"), 0o600)
	})
	id := newSession(t, c, nil)
	runIn(t, c, id, api.RunInSessionRequest{Command: "x=kept; f() { echo f$x; }"})
	events, _ := runIn(t, c, id, api.RunInSessionRequest{Command: "sleep 30", Timeout: 300})
	if last := terminal(t, events); last.Error == nil || !strings.Contains(last.Error.Traceback[0], "interrupted") {
		t.Fatalf("timed-out run: %+v", last)
	}
	if _, out := runIn(t, c, id, api.RunInSessionRequest{Command: "f"}); out != "fkept" {
		t.Fatalf("state after the timeout: %q", out)
	}
}
