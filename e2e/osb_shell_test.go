package e2e

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// tmux is a tmux server of one test, with one session running a
// command on a real terminal.
type tmux struct {
	t      *testing.T
	socket string
}

func startTmux(t *testing.T, cols, rows string, command string) *tmux {
	t.Helper()
	testenv.MustHaveCommand(t, "tmux")
	tm := &tmux{t: t, socket: "osb-e2e-" + randomHex(4)}
	t.Cleanup(func() { exec.Command("tmux", "-L", tm.socket, "kill-server").Run() })
	tm.run("-f", "/dev/null", "new-session", "-d", "-s", "main", "-x", cols, "-y", rows, command)
	tm.run("set-option", "-g", "window-size", "manual")
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// screen is what the terminal shows now.
func (tm *tmux) screen() string {
	tm.t.Helper()
	return tm.run("capture-pane", "-p", "-t", "main")
}

// waitFor waits until the screen shows want.
func (tm *tmux) waitFor(want string) {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := tm.screen()
		if strings.Contains(s, want) {
			return
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("the screen never showed %q; it shows:\n%s", want, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// typeLine types a line and Enter.
func (tm *tmux) typeLine(line string) {
	tm.t.Helper()
	tm.run("send-keys", "-t", "main", "-l", line)
	tm.run("send-keys", "-t", "main", "Enter")
}

// TestOSBShell drives `osb shell` on a real terminal: typing, the screen,
// window resizes, Ctrl-C to the remote program, and the exit status.
func TestOSBShell(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", pythonImage, "-o", "json").json(t, &c)

	env := strings.Join(s.osbEnv(t.TempDir()), "' '")
	tm := startTmux(t, "100", "30", "env -i '"+env+"' "+osbBin+" shell "+c.ID+" --cwd /tmp; echo OSB-EXIT=$?; sleep 60")
	tm.typeLine("echo $((6*7)) in $PWD")
	tm.waitFor("42 in /tmp")

	// The remote terminal starts at the local size and follows resizes.
	tm.typeLine("stty size")
	tm.waitFor("30 100")
	tm.run("resize-window", "-t", "main", "-x", "120", "-y", "40")
	time.Sleep(300 * time.Millisecond)
	tm.typeLine("echo size=$(stty size)")
	tm.waitFor("size=40 120")

	// Ctrl-C reaches the remote foreground program, not osb.
	tm.typeLine("sleep 300; echo SLEPT-$((20+22))")
	time.Sleep(500 * time.Millisecond)
	tm.run("send-keys", "-t", "main", "C-c")
	tm.typeLine("echo still here")
	tm.waitFor("still here")
	if strings.Contains(tm.screen(), "SLEPT-42") {
		t.Error("Ctrl-C did not interrupt the remote sleep")
	}

	// A full-screen program gets the terminal's size.
	tm.typeLine("python3 -c 'import shutil; print(\"cols\", shutil.get_terminal_size())'")
	tm.waitFor("columns=120, lines=40")

	tm.typeLine("exit 3")
	tm.waitFor("OSB-EXIT=3")
}

// TestOSBShellPiped runs `osb shell` without a terminal: input from a
// pipe, the remote command's exit code as osb's.
func TestOSBShellPiped(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "-o", "json").json(t, &c)
	defer func(d time.Duration) { osbTimeout = d }(osbTimeout)
	osbTimeout = 20 * time.Second

	r := s.osbIn(strings.NewReader("echo piped $((2+3))\nexit 4\n"), "", "shell", c.ID, "--", "sh")
	if r.code != 4 || !strings.Contains(r.out, "piped 5") {
		t.Errorf("piped shell: exit %d, stdout %q, stderr %q", r.code, r.out, r.err)
	}
	// End of input ends the shell like Ctrl-D.
	r = s.osbIn(strings.NewReader("echo bye\n"), "", "shell", c.ID, "--", "sh")
	if r.code != 0 || !strings.Contains(r.out, "bye") {
		t.Errorf("shell ended by EOF: exit %d, stdout %q, stderr %q", r.code, r.out, r.err)
	}
	s.osb("shell", "no-such-sandbox").fails(t, 1, "not found")
}
