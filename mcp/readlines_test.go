package mcp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testexecd"
	"github.com/opensandbox/opensandbox/sdk"
)

// TestFileReadLines pages through a file with file_read's line and lines
// against a real execd run in-process, behind a lifecycle stub that
// reports one running sandbox and its execd endpoint.
func TestFileReadLines(t *testing.T) {
	const token, id = "lines-token", "sb-lines"
	ep := testexecd.Start(t, token)
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/endpoints/"+strconv.Itoa(sdk.PortExecd)):
			json.NewEncoder(w).Encode(ep)
		case strings.HasSuffix(r.URL.Path, "/sandboxes/"+id):
			json.NewEncoder(w).Encode(api.Sandbox{ID: id, Status: api.SandboxStatus{State: sdk.StateRunning}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(lifecycle.Close)
	c, err := sdk.NewClient(sdk.Config{Domain: lifecycle.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := New(Config{Client: c, DefaultImage: busyboxImage, DefaultTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, s)

	dir := t.TempDir()
	var seq strings.Builder
	for i := 1; i <= 1000; i++ {
		seq.WriteString(strconv.Itoa(i) + "\n")
	}
	seqPath := filepath.Join(dir, "seq.txt")
	os.WriteFile(seqPath, []byte(seq.String()), 0o644)
	crlf := filepath.Join(dir, "crlf.txt")
	os.WriteFile(crlf, []byte("a\r\nb\r\nc"), 0o644)
	long := filepath.Join(dir, "long.txt")
	os.WriteFile(long, []byte(strings.Repeat("é", 100)+"\nnext\n"), 0o644)
	bin := filepath.Join(dir, "bin")
	os.WriteFile(bin, []byte("x\x00y\n"), 0o644)
	args := func(path string, kv ...any) map[string]any {
		m := map[string]any{"sandbox_id": id, "path": path}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}

	tests := []struct {
		name    string
		args    map[string]any
		content string
		next    int64 // next_line; 0 when the read reached the end
		note    string
	}{
		{"a page", args(seqPath, "line", 10, "lines", 3), "10\n11\n12\n", 13, "line 13"},
		{"the last page", args(seqPath, "line", 999, "lines", 5), "999\n1000\n", 0, ""},
		{"exactly to the end", args(seqPath, "line", 999, "lines", 2), "999\n1000\n", 0, ""},
		{"lines alone start at 1", args(seqPath, "lines", 2), "1\n2\n", 3, "line 3"},
		{"max_bytes cuts at a line end", args(seqPath, "line", 1, "max_bytes", 7), "1\n2\n3\n", 4, "line 4"},
		{"past the end", args(seqPath, "line", 2000), "", 0, "fewer than 2000 lines"},
		{"CRLF and no final newline", args(crlf, "line", 2), "b\r\nc", 0, ""},
		{"a line longer than max_bytes", args(long, "line", 1, "max_bytes", 11), strings.Repeat("é", 5), 2, "line 1 is longer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out ReadOutput
			text := ok(t, cs, "file_read", tt.args, &out)
			if out.Content != tt.content || out.NextLine != tt.next || out.Truncated != (tt.next != 0) || out.Encoding != "text" {
				t.Errorf("content %q next_line %d truncated %v encoding %s; want %q %d", out.Content, out.NextLine, out.Truncated, out.Encoding, tt.content, tt.next)
			}
			if !strings.HasPrefix(text, tt.content) || !strings.Contains(text, tt.note) {
				t.Errorf("text %q: want the content and %q", text, tt.note)
			}
			if tt.next != 0 && !strings.Contains(text, "line "+strconv.FormatInt(tt.next, 10)) {
				t.Errorf("text %q does not say where to read on", text)
			}
		})
	}

	// Paging with next_line reads the whole file, each line once.
	var all strings.Builder
	for line, pages := int64(1), 0; line != 0; pages++ {
		if pages > 20 {
			t.Fatal("paging does not end")
		}
		var out ReadOutput
		ok(t, cs, "file_read", args(seqPath, "line", line, "lines", 77), &out)
		all.WriteString(out.Content)
		line = out.NextLine
	}
	if all.String() != seq.String() {
		t.Errorf("paged read differs from the file (%d of %d bytes)", all.Len(), seq.Len())
	}

	var out ReadOutput
	if text := ok(t, cs, "file_read", args(bin, "line", 1), &out); out.Encoding != "binary" || out.Content != "" || !strings.Contains(text, "binary") {
		t.Errorf("binary by lines: %q %+v", text, out)
	}
	wantToolError(t, cs, "file_read", args(seqPath, "line", 2, "offset", 5), "offset", "line")
	wantToolError(t, cs, "file_read", args(seqPath, "line", 2, "encoding", "base64"), "base64")
	wantToolError(t, cs, "file_read", args(seqPath, "line", 0), "line")
	wantToolError(t, cs, "file_read", args(dir, "line", 1), "is a directory")
	wantToolError(t, cs, "file_read", args(filepath.Join(dir, "none"), "line", 1), "not found")
}
