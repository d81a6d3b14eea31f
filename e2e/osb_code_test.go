package e2e

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

const interpreterImage = "opensandbox/code-interpreter"

// TestOSBCode covers osb code: runs from -c, a file and stdin in each
// language's default context and in contexts of its own, plots saved as
// PNG files, errors and their exit code, context create/list/delete, and
// bad input.
func TestOSBCode(t *testing.T) {
	testenv.MustHaveImage(t, interpreterImage)
	s := startServer(t, serverOptions{})
	var sb struct{ ID string }
	s.osb("sandbox", "create", "-i", interpreterImage, "-t", "10m", "-o", "json").json(t, &sb)
	id := sb.ID

	// The default python context keeps state between runs.
	s.osb("code", "run", id, "-c", "x = 6 * 7\nprint('set')").exits(t, 0, "set\n", "")
	s.osb("code", "run", id, "-c", "x").exits(t, 0, "42\n", "")
	dir := t.TempDir()
	file := filepath.Join(dir, "prog.py")
	os.WriteFile(file, []byte("import sys\nprint(sys.version_info[0])\nx + 1\n"), 0o644)
	s.osb("code", "run", id, "-f", file).exits(t, 0, "3\n43\n", "")
	s.osbIn(strings.NewReader("x * 2"), "", "code", "run", id).exits(t, 0, "84\n", "")
	s.osb("code", "run", id, "-l", "javascript", "-c", "let j = [1, 2, 3].map(n => n * 2); j").exits(t, 0, "[ 2, 4, 6 ]\n", "")
	s.osb("code", "run", id, "-l", "javascript", "-c", "j.length").exits(t, 0, "3\n", "")
	s.osb("code", "run", id, "-l", "bash", "-c", "cd /tmp; echo $PWD").exits(t, 0, "/tmp\n", "")

	// A plot is saved as a PNG file.
	plots := filepath.Join(dir, "plots")
	r := s.osb("code", "run", id, "--save", plots, "-c", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
	r.exits(t, 0, "", "*")
	data, err := os.ReadFile(filepath.Join(plots, "result-1.png"))
	if err != nil {
		t.Fatalf("plot not saved (stderr %q): %v", r.err, err)
	}
	if _, err := png.Decode(bytes.NewReader(data)); err != nil {
		t.Fatalf("saved plot is not a PNG: %v", err)
	}

	// An exception: traceback on stderr, exit 1; -o json carries it too.
	r = s.osb("code", "run", id, "-c", "def f():\n    raise KeyError('k')\nf()")
	if r.code != 1 || !strings.Contains(r.err, "Traceback") || !strings.Contains(r.err, "Error: KeyError: 'k'") {
		t.Fatalf("exception: exit %d, stderr %q", r.code, r.err)
	}
	var doc struct {
		ContextID string `json:"context_id"`
		Error     struct {
			EName string `json:"ename"`
		}
		Results []map[string]any
	}
	r = s.osb("code", "run", id, "-o", "json", "-c", "1/0")
	if r.code != 1 {
		t.Fatalf("-o json error: exit %d", r.code)
	}
	r.code = 0
	r.json(t, &doc)
	if doc.Error.EName != "ZeroDivisionError" || doc.ContextID == "" {
		t.Fatalf("-o json error document: %+v", doc)
	}

	// Contexts of their own.
	var cc struct{ ID, Language, Cwd string }
	s.osb("code", "context", "create", id, "-l", "python", "--cwd", "/tmp/work", "-o", "json").json(t, &cc)
	if cc.ID == "" || cc.Language != "python" || cc.Cwd != "/tmp/work" {
		t.Fatalf("context create: %+v", cc)
	}
	s.osb("code", "run", id, "--context-id", cc.ID, "-c", "import os\nos.getcwd()").exits(t, 0, "'/tmp/work'\n", "")
	// Its state is its own.
	s.osb("code", "run", id, "--context-id", cc.ID, "-c", "'x' in globals()").exits(t, 0, "False\n", "")
	var list []struct{ ID, Language string }
	s.osb("code", "context", "list", id, "-l", "python", "-o", "json").json(t, &list)
	if len(list) != 2 {
		t.Fatalf("context list: %+v", list)
	}
	if out := s.osb("code", "context", "list", id).ok(t); !strings.Contains(out, cc.ID) || !strings.Contains(out, "javascript") {
		t.Errorf("context table:\n%s", out)
	}
	s.osb("code", "context", "delete", id, cc.ID).ok(t)
	s.osb("code", "run", id, "--context-id", cc.ID, "-c", "1").fails(t, 1, "not found")
	s.osb("code", "context", "delete-all", id, "-l", "javascript").ok(t)
	s.osb("code", "context", "list", id, "-l", "javascript", "-o", "json").json(t, &list)
	if len(list) != 0 {
		t.Fatalf("after delete-all: %+v", list)
	}

	// Bad input.
	s.osb("code", "run", id, "-l", "cobol", "-c", "1").fails(t, 1, "unknown language \"cobol\"")
	s.osb("code", "run", id, "-f", filepath.Join(dir, "missing.py")).fails(t, 1, "missing.py")
	s.osb("code", "run", id, "-c", " ").fails(t, 2, "empty")
	s.osb("code", "run", "no-such-sandbox", "-c", "1").fails(t, 1, "no-such-sandbox")
}
