package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// createRunning creates a busybox sandbox through osb, waiting until it
// runs, and returns its id.
func createRunning(t *testing.T, s *server) string {
	t.Helper()
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "-t", "10m", "-o", "json").json(t, &c)
	return c.ID
}

// exits checks that osb exited with code, printing stdout and stderr as
// given ("*" for anything).
func (r osbResult) exits(t *testing.T, code int, stdout, stderr string) {
	t.Helper()
	if r.code != code || (stdout != "*" && r.out != stdout) || (stderr != "*" && r.err != stderr) {
		t.Errorf("osb %s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr %q",
			strings.Join(r.args, " "), r.code, r.out, r.err, code, stdout, stderr)
	}
}

// TestOSBCommandRun covers osb command run and osb exec: streams, exit
// codes, flags, Ctrl-C and bad input.
func TestOSBCommandRun(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := createRunning(t, s)

	// Each stream goes to its own side, line by line in order.
	s.osb("command", "run", id, "--", "sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2; printf partial").
		exits(t, 0, "out1\nout2\npartial\n", "err1\nerr2\n")
	// The words are quoted for the shell; sh -c brings expansion back.
	s.osb("command", "run", id, "--", "echo", "$HOME", "a  b", "it's", "").exits(t, 0, "$HOME a  b it's \n", "")
	s.osb("command", "run", id, "--", "sh", "-c", "echo $HOME").exits(t, 0, "/root\n", "")
	// Flags before the id, -w, -e; words without -- are the command too.
	s.osb("command", "run", "-w", "/etc", id, "pwd").exits(t, 0, "/etc\n", "")
	s.osb("command", "run", id, "-e", "A=1", "-e", "B=x=y", "--", "sh", "-c", "echo $A $B").exits(t, 0, "1 x=y\n", "")
	s.osb("exec", id, "--", "echo", "legacy").exits(t, 0, "legacy\n", "")

	// The remote exit code is osb's; a signal is 128+N with one line.
	s.osb("command", "run", id, "--", "sh", "-c", "echo before; exit 3").exits(t, 3, "before\n", "")
	s.osb("exec", id, "--", "false").exits(t, 1, "", "")
	r := s.osb("command", "run", id, "--", "sh", "-c", "kill -9 $$")
	r.exits(t, 137, "", "Error: command killed by signal SIGKILL (killed)\n")
	s.osb("command", "run", id, "--", "sh", "-c", "kill -TERM $$").exits(t, 143, "", "Error: command killed by signal SIGTERM (terminated)\n")
	start := time.Now()
	s.osb("command", "run", id, "-t", "1s", "--", "sleep", "30").exits(t, 137, "", "Error: command killed by signal SIGKILL (killed)\n")
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("-t 1s took %v", d)
	}

	// Background: start, status, logs, follow.
	var bg struct {
		ExecutionID string `json:"execution_id"`
		SandboxID   string `json:"sandbox_id"`
		Mode        string
	}
	s.osb("command", "run", id, "-d", "-o", "json", "--", "sh", "-c", "echo bg1; sleep 1; echo bg2 >&2; exit 4").json(t, &bg)
	if bg.ExecutionID == "" || bg.SandboxID != id || bg.Mode != "background" {
		t.Fatalf("background: %+v", bg)
	}
	var st struct {
		ID         string
		Content    string
		Running    bool
		ExitCode   *int       `json:"exit_code"`
		Error      *string    `json:"error"`
		StartedAt  time.Time  `json:"started_at"`
		FinishedAt *time.Time `json:"finished_at"`
	}
	s.osb("command", "status", id, bg.ExecutionID, "-o", "json").json(t, &st)
	if st.ID != bg.ExecutionID || !st.Running || st.ExitCode != nil || st.FinishedAt != nil || !strings.Contains(st.Content, "echo bg1") {
		t.Errorf("status while running: %+v", st)
	}
	s.osb("command", "logs", id, bg.ExecutionID, "--follow").exits(t, 4, "bg1\nbg2\n", "")
	s.osb("command", "status", id, bg.ExecutionID, "-o", "json").json(t, &st)
	if st.Running || st.ExitCode == nil || *st.ExitCode != 4 || st.Error == nil || *st.Error != "exit status 4" || st.FinishedAt == nil || st.StartedAt.Location() != time.UTC {
		t.Errorf("status when done: %+v", st)
	}
	if out := s.osb("command", "status", id, bg.ExecutionID).ok(t); !strings.Contains(out, "Command Status") || !strings.Contains(out, "exit status 4") {
		t.Errorf("status (table): %q", out)
	}
	var sy map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("command", "status", id, bg.ExecutionID, "-o", "yaml").ok(t)), &sy); err != nil || sy["exit_code"] != 4 || sy["running"] != false {
		t.Errorf("status (yaml): %v %v", sy, err)
	}
	var logs struct {
		Content string
		Cursor  int64
	}
	s.osb("command", "logs", id, bg.ExecutionID, "-o", "json").json(t, &logs)
	if logs.Content != "bg1\nbg2\n" || logs.Cursor != 8 {
		t.Errorf("logs (json): %+v", logs)
	}
	s.osb("command", "logs", id, bg.ExecutionID, "--cursor", "4", "-o", "raw").exits(t, 0, "bg2\n", "")
	s.osb("command", "logs", id, bg.ExecutionID, "--cursor", "8", "-o", "yaml").exits(t, 0, "content: \"\"\ncursor: 8\n", "")
	if out := s.osb("command", "logs", id, bg.ExecutionID).ok(t); out != "Command Logs\nbg1\nbg2\n" {
		t.Errorf("logs (table): %q", out)
	}
	if out := s.osb("command", "run", id, "-d", "--", "true").ok(t); !strings.Contains(out, "Background Command Started") || !strings.Contains(out, "execution_id") {
		t.Errorf("background (table): %q", out)
	}
	if out := s.osb("command", "run", id, "-d", "-o", "yaml", "--", "true").ok(t); !strings.Contains(out, "mode: background\n") {
		t.Errorf("background (yaml): %q", out)
	}

	// Interrupt: SIGTERM to the group; follow then exits 143.
	s.osb("command", "run", id, "-d", "-o", "json", "--", "sleep", "30").json(t, &bg)
	var msg struct{ Status, Message string }
	s.osb("command", "interrupt", id, bg.ExecutionID, "-o", "json").json(t, &msg)
	if msg.Status != "ok" || msg.Message != "Interrupted: "+bg.ExecutionID {
		t.Errorf("interrupt: %+v", msg)
	}
	s.osb("command", "logs", id, bg.ExecutionID, "-f").exits(t, 143, "", "Error: command killed by signal SIGTERM (terminated)\n")
	s.osb("command", "status", id, bg.ExecutionID, "-o", "json").json(t, &st)
	if st.ExitCode == nil || *st.ExitCode != -1 || st.Error == nil || *st.Error != "signal: terminated" {
		t.Errorf("status after interrupt: %+v", st)
	}
	s.osb("command", "interrupt", id, bg.ExecutionID).fails(t, 1, "not running")
	s.osb("command", "status", id, "no-such-command").fails(t, 1, "command not found")

	// Ctrl-C while a command runs: output arrives as it is written, and
	// the remote command is stopped.
	cmd := s.osbCmd("", "command", "run", id, "--", "sh", "-c", "echo ready; sleep 31")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("first line %q, %v; stderr %q", line, err, stderr.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 || !strings.HasPrefix(stderr.String(), "Error: interrupted; command ") {
		t.Errorf("after Ctrl-C: %v, stderr %q", err, stderr.String())
	}
	if ps := s.execd(id).mustRun("ps"); strings.Contains(ps, "sleep 31") {
		t.Errorf("the command runs on after Ctrl-C:\n%s", ps)
	}

	// Bad input.
	s.osb("command", "run", id, "-o", "json", "--", "true").fails(t, 1, "does not offer -o json in the foreground")
	s.osb("command", "run", id, "-d", "-o", "raw", "--", "true").fails(t, 1, "does not offer -o raw with -d")
	s.osb("command", "run", id).fails(t, 2, "missing the command to run")
	s.osb("command", "run").fails(t, 2, "missing the sandbox ID")
	s.osb("command", "run", id, "ls", "-la").fails(t, 2, "unknown shorthand flag")
	s.osb("command", "run", id, "-e", "NOVALUE", "--", "true").fails(t, 2, `invalid --env "NOVALUE"`)
	s.osb("command", "run", id, "-t", "soon", "--", "true").fails(t, 2, "invalid duration")
	s.osb("command", "run", id, "-w", "/no/such/dir", "--", "true").fails(t, 1, "/no/such/dir")
	s.osb("command", "logs", id, bg.ExecutionID, "-f", "--cursor", "3").fails(t, 2, "cannot be used together")
	s.osb("command", "logs", id, bg.ExecutionID, "-f", "-o", "json").fails(t, 1, "does not offer -o json with --follow")
	s.osb("command", "status", id).fails(t, 2, "accepts 2 arg(s)")
	r = s.osb("command", "run", "no-such-sandbox", "--", "true")
	r.fails(t, 1, "SANDBOX_NOT_FOUND")
	r.fails(t, 1, "request_id=")
}

// TestOSBCommandSession covers osb command session: state kept from run
// to run, streams merged, exit codes, formats.
func TestOSBCommandSession(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := createRunning(t, s)

	var ss struct {
		SandboxID        string  `json:"sandbox_id"`
		SessionID        string  `json:"session_id"`
		WorkingDirectory *string `json:"working_directory"`
	}
	s.osb("command", "session", "create", id, "-w", "/tmp", "-o", "json").json(t, &ss)
	if ss.SandboxID != id || ss.SessionID == "" || ss.WorkingDirectory == nil || *ss.WorkingDirectory != "/tmp" {
		t.Fatalf("session create: %+v", ss)
	}
	sid := ss.SessionID
	s.osb("command", "session", "run", id, sid, "--", "pwd").exits(t, 0, "/tmp\n", "")
	s.osb("command", "session", "run", id, sid, "--", "export", "STAGE=two words").exits(t, 0, "", "")
	s.osb("command", "session", "run", id, sid, "--", "cd", "/etc").exits(t, 0, "", "")
	s.osb("command", "session", "run", id, sid, "--", "sh", "-c", `echo "$STAGE"; pwd; echo oops >&2`).exits(t, 0, "two words\n/etc\noops\n", "")
	s.osb("command", "session", "run", id, sid, "-w", "/", "--", "pwd").exits(t, 0, "/\n", "")
	s.osb("command", "session", "run", id, sid, "--", "sh", "-c", "exit 5").exits(t, 5, "", "")
	s.osb("command", "session", "run", id, sid, "--", "echo", "$STAGE").exits(t, 0, "$STAGE\n", "")
	s.osb("command", "session", "run", id, sid, "-o", "json", "--", "true").fails(t, 1, "does not offer -o json")
	s.osb("command", "session", "run", id, sid).fails(t, 2, "missing the command to run")

	// Table and YAML documents; delete in each format.
	if out := s.osb("command", "session", "create", id).ok(t); !strings.Contains(out, "Session Created") || !strings.Contains(out, "working_directory:") {
		t.Errorf("session create (table): %q", out)
	}
	var y map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("command", "session", "create", id, "-o", "yaml").ok(t)), &y); err != nil || y["working_directory"] != nil || y["session_id"] == "" {
		t.Errorf("session create (yaml): %v %v", y, err)
	}
	if out := s.osb("command", "session", "delete", id, y["session_id"].(string)).ok(t); !strings.Contains(out, "Deleted session: ") {
		t.Errorf("session delete (table): %q", out)
	}
	var msg struct{ Status, Message string }
	s.osb("command", "session", "delete", id, sid, "-o", "json").json(t, &msg)
	if msg.Status != "ok" || msg.Message != "Deleted session: "+sid {
		t.Errorf("session delete (json): %+v", msg)
	}
	s.osb("command", "session", "run", id, sid, "--", "true").fails(t, 1, sid)
	s.osb("command", "session", "delete", id, sid).fails(t, 1, "not found")
}
