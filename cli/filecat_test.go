package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/internal/testexecd"
)

// TestFileCatLines runs osb file cat --offset --limit against a real
// execd in-process, reached through a lifecycle stub that gives its
// endpoint.
func TestFileCatLines(t *testing.T) {
	const token = "cat-token"
	ep := testexecd.Start(t, token)
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(ep)
	}))
	t.Cleanup(lifecycle.Close)
	dir := t.TempDir()
	path := filepath.Join(dir, "f.txt")
	os.WriteFile(path, []byte("one\r\ntwo\nthree"), 0o644)

	run := func(args ...string) (int, string, string) {
		vars := map[string]string{"OPEN_SANDBOX_DOMAIN": lifecycle.URL, "OPEN_SANDBOX_API_KEY": "k", "NO_COLOR": "1"}
		var out, errb bytes.Buffer
		args = append([]string{"--config", filepath.Join(t.TempDir(), "none.toml"), "file", "cat", "sb-1"}, args...)
		code := Run(t.Context(), args, Streams{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(k string) string { return vars[k] }})
		return code, out.String(), errb.String()
	}
	for _, tt := range []struct {
		args       []string
		code       int
		out, inErr string
	}{
		{[]string{path, "--offset", "2", "--limit", "1"}, 0, "two\n", ""},
		{[]string{path, "--offset", "1", "--limit", "1"}, 0, "one\r\n", ""},
		{[]string{path, "--offset", "2"}, 0, "two\nthree", ""},
		{[]string{path, "--limit", "1"}, 0, "one\r\n", ""},
		{[]string{path, "--offset", "9"}, 0, "", ""},
		{[]string{path}, 0, "one\r\ntwo\nthree", ""},
		{[]string{path, "--offset", "0"}, 2, "", "--offset 0"},
		{[]string{path, "--limit", "-1"}, 2, "", "--limit -1"},
		{[]string{filepath.Join(dir, "none"), "--limit", "1"}, 1, "", "not found"},
		{[]string{dir, "--limit", "1"}, 1, "", "is a directory"},
	} {
		code, out, errOut := run(tt.args...)
		if code != tt.code || out != tt.out || !strings.Contains(errOut, tt.inErr) {
			t.Errorf("osb file cat %q: exit %d, stdout %q, stderr %q; want %d %q %q", tt.args, code, out, errOut, tt.code, tt.out, tt.inErr)
		}
	}
}
