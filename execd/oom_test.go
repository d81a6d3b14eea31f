package execd

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
)

// TestChildOOMScores: every kind of process execd starts reads 1000 as
// its own oom_score_adj, while execd keeps its own: commands (foreground
// and background), bash sessions, code contexts, terminals and the
// entrypoint.
func TestChildOOMScores(t *testing.T) {
	own, err := process.ReadOOMScore(0)
	if err != nil {
		t.Fatal(err)
	}
	if own == 1000 {
		t.Fatal("this test's own oom_score_adj is already 1000: the test would prove nothing")
	}
	s, tc := newTestServer(t, nil)
	const show = "cat /proc/self/oom_score_adj"

	t.Run("command", func(t *testing.T) {
		if out := stdoutOf(tc.stream("/command", api.RunCommandRequest{Command: show})); out != "1000" {
			t.Errorf("foreground command reads %q", out)
		}
	})
	t.Run("background", func(t *testing.T) {
		id := initID(t, tc.stream("/command", api.RunCommandRequest{Command: show, Background: true}))
		waitFor(t, "the background command to finish", func() bool {
			var st api.CommandStatus
			tc.call(http.MethodGet, "/command/status/"+id, nil, http.StatusOK, &st)
			return !st.Running
		})
		if out := strings.TrimSpace(string(tc.call(http.MethodGet, "/command/"+id+"/logs", nil, http.StatusOK, nil))); out != "1000" {
			t.Errorf("background command reads %q", out)
		}
	})
	t.Run("session", func(t *testing.T) {
		var created api.CreateSessionResponse
		tc.call(http.MethodPost, "/session", nil, http.StatusOK, &created)
		if out := stdoutOf(tc.stream("/session/"+created.SessionID+"/run", api.RunInSessionRequest{Command: show})); out != "1000" {
			t.Errorf("session reads %q", out)
		}
	})
	t.Run("bash context", func(t *testing.T) {
		evs := tc.stream("/code", api.RunCodeRequest{Code: show, Context: &api.CodeContext{Language: "bash"}})
		if out := strings.TrimSpace(stdoutOf(evs)); out != "1000" {
			t.Errorf("bash context reads %q", out)
		}
	})
	t.Run("python context", func(t *testing.T) {
		needProgram(t, "python3")
		evs := tc.stream("/code", api.RunCodeRequest{Code: "print(open('/proc/self/oom_score_adj').read().strip())", Context: &api.CodeContext{Language: "python"}})
		if out := strings.TrimSpace(stdoutOf(evs)); out != "1000" {
			t.Errorf("python context reads %q", out)
		}
	})
	t.Run("pty", func(t *testing.T) {
		p := dialPTY(t, tc, createPTY(t, tc, nil), "")
		p.shell("echo score=$(cat /proc/self/oom_score_adj)", "score=1000")
	})
	t.Run("entrypoint", func(t *testing.T) {
		e, err := s.StartEntrypoint([]string{"sleep", "30"})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Signal(9)
		if got, err := process.ReadOOMScore(e.cmd.proc.Pid()); err != nil || got != 1000 {
			t.Errorf("entrypoint: %d, %v", got, err)
		}
	})
	if got, _ := process.ReadOOMScore(0); got != own {
		t.Errorf("execd's own score changed from %d to %d", own, got)
	}
}

// TestChildOOMScoreOff: -1 leaves processes with execd's own score.
func TestChildOOMScoreOff(t *testing.T) {
	_, tc := newTestServer(t, func(c *Config) { c.ChildOOMScoreAdj = -1 })
	own, _ := os.ReadFile("/proc/self/oom_score_adj")
	if out := stdoutOf(tc.stream("/command", api.RunCommandRequest{Command: "cat /proc/self/oom_score_adj"})); out != strings.TrimSpace(string(own)) {
		t.Errorf("command reads %q, execd has %q", out, own)
	}
}

// TestChildOOMScoreInvalid: a score out of range is refused at start.
func TestChildOOMScoreInvalid(t *testing.T) {
	for _, v := range []int{-2, 1001} {
		if _, err := New(Config{Insecure: true, TempDir: t.TempDir(), ChildOOMScoreAdj: v}); err == nil {
			t.Errorf("ChildOOMScoreAdj %d accepted", v)
		}
	}
}

// stdoutOf joins the stdout events of a stream.
func stdoutOf(evs []api.Event) string {
	var out []string
	for _, ev := range evs {
		if ev.Type == api.EventStdout {
			out = append(out, ev.Text)
		}
	}
	return strings.Join(out, "")
}

// initID returns the text of a stream's init event.
func initID(t *testing.T, evs []api.Event) string {
	t.Helper()
	for _, ev := range evs {
		if ev.Type == api.EventInit {
			return ev.Text
		}
	}
	t.Fatalf("no init event in %v", evs)
	return ""
}
