package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// osbResult is what one run of the osb binary printed and returned.
type osbResult struct {
	args     []string
	out, err string
	code     int
}

// osbEnv is the environment osb runs with against s: its own HOME, the
// server's address and key, nothing else of the caller's OPEN_SANDBOX_*.
func (s *server) osbEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OPEN_SANDBOX_") || strings.HasPrefix(kv, "HOME=") || strings.HasPrefix(kv, "NO_COLOR=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home, "OPEN_SANDBOX_DOMAIN="+s.listen, "OPEN_SANDBOX_API_KEY="+s.key)
}

// osbCmd prepares osb with args against s; home is its HOME ("" for a
// fresh one).
func (s *server) osbCmd(home string, args ...string) *exec.Cmd {
	if home == "" {
		home = s.t.TempDir()
	}
	cmd := exec.Command(osbBin, args...)
	cmd.Env = s.osbEnv(home)
	return cmd
}

// osb runs osb with args and stdin (may be nil) and returns what it did;
// it never fails the test itself.
func (s *server) osbIn(stdin io.Reader, home string, args ...string) osbResult {
	s.t.Helper()
	cmd := s.osbCmd(home, args...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(osbTimeout):
		cmd.Process.Kill()
		s.t.Fatalf("osb %s did not finish; stdout %q, stderr %q", strings.Join(args, " "), out.String(), errb.String())
	}
	r := osbResult{args: args, out: out.String(), err: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return r
}

func (s *server) osb(args ...string) osbResult {
	s.t.Helper()
	return s.osbIn(nil, "", args...)
}

// ok fails the test unless osb succeeded, and returns its stdout.
func (r osbResult) ok(t *testing.T) string {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("osb %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.code, r.out, r.err)
	}
	return r.out
}

// fails checks a failure: the exit code and a one-line error on stderr
// containing want, with no Go stack trace.
func (r osbResult) fails(t *testing.T, code int, want string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("osb %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.code, code, r.out, r.err)
	}
	if !strings.Contains(r.err, want) {
		t.Fatalf("osb %s: stderr %q does not say %q", strings.Join(r.args, " "), r.err, want)
	}
	if strings.Contains(r.err, "goroutine ") || strings.Contains(r.err, "panic:") {
		t.Fatalf("osb %s printed a stack trace:\n%s", strings.Join(r.args, " "), r.err)
	}
	if !strings.HasPrefix(r.err, "Error: ") {
		t.Fatalf("osb %s: stderr does not start with the error line: %q", strings.Join(r.args, " "), r.err)
	}
	first, _, _ := strings.Cut(r.err, "\n")
	if !strings.Contains(first, want) {
		t.Fatalf("osb %s: the error is not on one line: %q", strings.Join(r.args, " "), r.err)
	}
}

// json decodes osb's stdout into v.
func (r osbResult) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.ok(t)), v); err != nil {
		t.Fatalf("osb %s: stdout is not JSON: %v\n%s", strings.Join(r.args, " "), err, r.out)
	}
}

// osbTimeout bounds one run of osb in the tests.
var osbTimeout = 2 * time.Minute
