package execd

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// TestEntrypointStartFailed: an entrypoint that cannot start (missing,
// not executable, not a valid executable, not in PATH) is served as a
// status whose StartFailed is true; one that ran, whatever its end (exit
// 255 included, or a signal), is not.
func TestEntrypointStartFailed(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "plain")
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte("\x00\x01\x02 not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		argv   []string
		failed bool
		why    string
	}{
		{"missing", []string{filepath.Join(dir, "missing")}, true, "no such file"},
		{"not executable", []string{notExec}, true, "permission denied"},
		{"not a valid executable", []string{garbage}, true, "exec format error"},
		{"not in PATH", []string{"no-such-command-here"}, true, "not found"},
		{"exits 255", []string{"sh", "-c", "exit 255"}, false, "exit status 255"},
		{"killed", []string{"sh", "-c", "kill -9 $$"}, false, "signal: killed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, tc := newTestServer(t, nil)
			_, err := s.StartEntrypoint(c.argv)
			if (err != nil) != c.failed {
				t.Fatalf("StartEntrypoint: %v", err)
			}
			var st api.CommandStatus
			waitFor(t, "the entrypoint to end", func() bool {
				tc.call(http.MethodGet, "/command/status/"+api.EntrypointCommandID, nil, http.StatusOK, &st)
				return !st.Running
			})
			if st.StartFailed() != c.failed || !strings.Contains(st.Error, c.why) {
				t.Fatalf("status %+v: StartFailed %v, want %v with %q", st, st.StartFailed(), c.failed, c.why)
			}
		})
	}
}
