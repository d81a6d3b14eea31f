package interp

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// The python driver, tested through a Context (what clients get) and, for
// what a Context does not show (the started reply, how the interpreter is
// invoked), through rawDriver, which speaks the driver protocol itself.

// testPythons returns the interpreters the driver is tested with: python3,
// and the paths listed in OSB_TEST_PYTHONS (separated by ':'), e.g. older
// versions, since the driver must run on python 3.8 and later.
func testPythons(t *testing.T) []string {
	needInterpreter(t, "python3")
	pythons := []string{"python3"}
	for _, p := range filepath.SplitList(os.Getenv("OSB_TEST_PYTHONS")) {
		if p != "" {
			pythons = append(pythons, p)
		}
	}
	return pythons
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// rawDriver is the python driver started as execd starts it, without a
// Context: requests on fd 3, replies on fd 4 read as JSON objects.
type rawDriver struct {
	t       *testing.T
	cmd     *exec.Cmd
	dir     string // its working directory
	driver  string // the driver file's path
	req     *os.File
	replies chan map[string]any // closed at EOF
	stdout  lockedBuffer
	stderr  lockedBuffer
	runs    int
}

// startRawDriver runs `python [flags] python.py` in a temporary directory
// with env and waits for its ready reply.
func startRawDriver(t *testing.T, python string, flags, env []string) *rawDriver {
	t.Helper()
	src, err := os.ReadFile("python.py")
	if err != nil {
		t.Fatal(err)
	}
	d := &rawDriver{t: t, dir: t.TempDir(), driver: filepath.Join(t.TempDir(), "python.py"), replies: make(chan map[string]any, 64)}
	if err := os.WriteFile(d.driver, src, 0o600); err != nil {
		t.Fatal(err)
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d.req = reqW
	d.cmd = exec.Command(python, append(append([]string{}, flags...), d.driver)...)
	d.cmd.Dir, d.cmd.Env = d.dir, env
	d.cmd.Stdout, d.cmd.Stderr = &d.stdout, &d.stderr
	d.cmd.ExtraFiles = []*os.File{reqR, repW}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", python, err)
	}
	reqR.Close()
	repW.Close()
	go func() {
		defer close(d.replies)
		defer repR.Close()
		r := bufio.NewReader(repR)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				var m map[string]any
				if json.Unmarshal(line, &m) != nil {
					m = map[string]any{"type": "invalid", "line": string(line)}
				}
				d.replies <- m
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		d.req.Close()
		done := make(chan struct{})
		go func() { d.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			d.cmd.Process.Kill()
			<-done
		}
	})
	if m := d.next(10 * time.Second); m["type"] != "ready" {
		t.Fatalf("%s: first reply %v, stderr %q", python, m, d.stderr.String())
	}
	return d
}

// next returns the next reply; it fails the test after timeout or at EOF.
func (d *rawDriver) next(timeout time.Duration) map[string]any {
	d.t.Helper()
	select {
	case m, ok := <-d.replies:
		if !ok {
			d.t.Fatalf("the driver closed its replies; stderr %q", d.stderr.String())
		}
		return m
	case <-time.After(timeout):
		d.t.Fatalf("no reply within %v; stderr %q", timeout, d.stderr.String())
	}
	return nil
}

// send sends an execute request and returns its id.
func (d *rawDriver) send(code string) string {
	d.t.Helper()
	d.runs++
	id := "run-" + strconv.Itoa(d.runs)
	line, _ := json.Marshal(map[string]string{"type": "execute", "id": id, "code": code})
	if _, err := d.req.Write(append(line, '\n')); err != nil {
		d.t.Fatal(err)
	}
	return id
}

// finish returns the replies of run id up to its done, included.
func (d *rawDriver) finish(id string) []map[string]any {
	d.t.Helper()
	var out []map[string]any
	for {
		m := d.next(30 * time.Second)
		if m["id"] != id {
			d.t.Fatalf("reply of another run: %v", m)
		}
		out = append(out, m)
		if m["type"] == "done" {
			return out
		}
	}
}

// run executes code and returns its replies.
func (d *rawDriver) run(code string) []map[string]any {
	d.t.Helper()
	return d.finish(d.send(code))
}

// result returns the text/plain of the run's result reply, "" without one.
func result(replies []map[string]any) string {
	for _, m := range replies {
		if m["type"] == "result" {
			s, _ := m["data"].(map[string]any)["text/plain"].(string)
			return s
		}
	}
	return ""
}

// replyTypes returns the types of replies, in order.
func replyTypes(replies []map[string]any) []string {
	var types []string
	for _, m := range replies {
		types = append(types, m["type"].(string))
	}
	return types
}

// environWithout returns the process's environment without the variables
// named, with MPLBACKEND=agg as execd sets it.
func environWithout(names ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		drop := k == "MPLBACKEND"
		for _, n := range names {
			drop = drop || k == n
		}
		if !drop {
			env = append(env, kv)
		}
	}
	return append(env, "MPLBACKEND=agg")
}

// TestPythonDriverSourceIsPython38 checks that the driver parses as python
// 3.8 (Debian bullseye has 3.9, Ubuntu 22.04 3.10) and uses none of the
// newer APIs it is easy to reach for.
func TestPythonDriverSourceIsPython38(t *testing.T) {
	needInterpreter(t, "python3")
	out, err := exec.Command("python3", "-c", "import ast, sys; ast.parse(open(sys.argv[1]).read(), 'python.py', feature_version=(3, 8))", "python.py").CombinedOutput()
	if err != nil {
		t.Fatalf("python.py is not python 3.8: %v\n%s", err, out)
	}
	src, err := os.ReadFile("python.py")
	if err != nil {
		t.Fatal(err)
	}
	for _, api := range []string{".removeprefix(", ".removesuffix(", "ast.unparse", "functools.cache", ".is_relative_to(", "zoneinfo", "asyncio.to_thread", "asyncio.timeout(", "TaskGroup", "add_note("} {
		if bytes.Contains(src, []byte(api)) {
			t.Errorf("python.py uses %q, which python 3.8 lacks", api)
		}
	}
}

// TestPythonDriverInvocation runs the driver as `python3 python.py`, also
// in python's strictest mode (-W error -X dev: a warning of the driver's is
// an error) and with PYTHONUNBUFFERED set or not, on every interpreter of
// testPythons.
func TestPythonDriverInvocation(t *testing.T) {
	modes := []struct {
		name  string
		flags []string
		env   []string
	}{
		{"plain", nil, environWithout("PYTHONUNBUFFERED")},
		{"unbuffered", nil, append(environWithout("PYTHONUNBUFFERED"), "PYTHONUNBUFFERED=1")},
		{"dev", []string{"-W", "error", "-X", "dev"}, environWithout("PYTHONUNBUFFERED")},
	}
	for _, python := range testPythons(t) {
		for _, mode := range modes {
			t.Run(strings.ReplaceAll(python, "/", "_")+"/"+mode.name, func(t *testing.T) {
				d := startRawDriver(t, python, mode.flags, mode.env)
				// The user's code imports from the cwd, never the driver's
				// own directory: `import python` is the cwd's python.py.
				os.WriteFile(filepath.Join(d.dir, "python.py"), []byte("WHO = 'user'\n"), 0o644)
				r := d.run("import sys, os, python\n(sys.path[0], python.WHO, " + strconv.Quote(filepath.Dir(d.driver)) + " in sys.path)")
				if got := replyTypes(r); strings.Join(got, " ") != "started result done" {
					t.Fatalf("replies %v", r)
				}
				if got := result(r); got != "('', 'user', False)" {
					t.Errorf("sys.path: %s", got)
				}
				// Line-buffered standard streams: print() is one write.
				r = d.run("import io\n(sys.stdout.line_buffering, isinstance(sys.stdout.buffer, io.BufferedWriter), sys.stderr.line_buffering, sys.stderr.write_through, sys.stdout.name)")
				if got := result(r); got != "(True, True, True, True, '<stdout>')" {
					t.Errorf("streams: %s", got)
				}
				// A run with a bit of everything, which must raise no warning.
				r = d.run("import asyncio\nprint('out')\nawait asyncio.sleep(0)\ndisplay(1)\nfrom IPython.display import HTML\n!echo shell\nHTML('<b>h</b>')")
				if got := replyTypes(r); strings.Join(got, " ") != "started display result done" {
					t.Errorf("replies %v", r)
				}
				r = d.run("def f():\n    raise ValueError('v')\nf()")
				if got := replyTypes(r); strings.Join(got, " ") != "started error done" || r[1]["ename"] != "ValueError" {
					t.Errorf("error run: %v", r)
				}
				deadline := time.Now().Add(5 * time.Second)
				for !strings.Contains(d.stdout.String(), "out\nshell\n") && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if !strings.Contains(d.stdout.String(), "out\nshell\n") {
					t.Errorf("stdout %q", d.stdout.String())
				}
				if s := d.stderr.String(); s != "" {
					t.Errorf("stderr %q", s)
				}
			})
		}
	}
}

// TestPythonDriverStarted checks that every run begins with a started reply,
// and that an interrupt sent as soon as it arrives stops the code.
func TestPythonDriverStarted(t *testing.T) {
	needInterpreter(t, "python3")
	d := startRawDriver(t, "python3", nil, environWithout())
	for _, code := range []string{"1", "x = 1", "def (:", "%%bash\ntrue", "%nope"} {
		r := d.run(code)
		if len(r) < 2 || r[0]["type"] != "started" || r[len(r)-1]["type"] != "done" {
			t.Errorf("%q: replies %v", code, r)
		}
	}
	for _, code := range []string{"import time\nprint('go', flush=True)\ntime.sleep(30)", "import asyncio\nawait asyncio.sleep(30)"} {
		start := time.Now()
		id := d.send(code)
		if m := d.next(10 * time.Second); m["type"] != "started" || m["id"] != id {
			t.Fatalf("first reply %v", m)
		}
		d.cmd.Process.Signal(os.Interrupt)
		r := d.finish(id)
		if len(r) != 2 || r[0]["type"] != "error" || r[0]["ename"] != "KeyboardInterrupt" || time.Since(start) > 10*time.Second {
			t.Fatalf("interrupt right after started: %v", r)
		}
	}
	if got := result(d.run("'alive'")); got != "'alive'" {
		t.Fatalf("after interrupts: %q", got)
	}
}

// TestPythonTracebacksHideTheDriver checks that no traceback shows a frame
// of the driver, wherever it is: last (the SIGINT handler), in the middle
// (display() calling the user's _repr_html_), in a chained exception.
func TestPythonTracebacksHideTheDriver(t *testing.T) {
	c := startContext(t, "python")
	runCode(t, c, "import time", 0)
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "def wait():\n    time.sleep(30)\nwait()", 0) }()
	waitBusy(t, c)
	c.Interrupt()
	r := <-done
	checkTraceback(t, "interrupt", r, "KeyboardInterrupt", "in wait", "KeyboardInterrupt")

	r = runCode(t, c, "class B:\n    def _repr_html_(self):\n        raise SystemExit(5)\ndisplay(B())", 0)
	checkTraceback(t, "display", r, "SystemExit", "in _repr_html_", "SystemExit: 5")
	if tb := strings.Join(r.err.Traceback, "\n"); !strings.Contains(tb, "display(B())") {
		t.Errorf("the user's frame calling display() is gone:\n%s", tb)
	}

	r = runCode(t, c, "try:\n    input()\nexcept EOFError as e:\n    raise ValueError('no input') from e", 0)
	checkTraceback(t, "chained", r, "ValueError", "input()", "ValueError: no input")
	if tb := strings.Join(r.err.Traceback, "\n"); !strings.Contains(tb, "EOFError: input() is not available") || !strings.Contains(tb, "direct cause") {
		t.Errorf("chained traceback:\n%s", tb)
	}

	r = runCode(t, c, "import asyncio\nasync def boom():\n    await asyncio.sleep(0)\n    raise KeyError('k')\nawait boom()", 0)
	checkTraceback(t, "async", r, "KeyError", "in boom", "KeyError: 'k'")
	if tb := strings.Join(r.err.Traceback, "\n"); strings.Contains(tb, "asyncio") {
		t.Errorf("asyncio's frames in the traceback:\n%s", tb)
	}
}

// checkTraceback checks a run's error: its name, a line the traceback must
// have, its last line, and no frame of the driver.
func checkTraceback(t *testing.T, what string, r *runResult, ename, has, last string) {
	t.Helper()
	if r.err == nil || r.err.EName != ename {
		t.Errorf("%s: error %+v, want %s", what, r.err, ename)
		return
	}
	tb := strings.Join(r.err.Traceback, "\n")
	if strings.Contains(tb, "python.py") || strings.Contains(tb, "_main") || !strings.Contains(tb, has) || !strings.HasSuffix(tb, last) {
		t.Errorf("%s: traceback:\n%s", what, tb)
	}
}

// TestPythonExitQuitAndInput checks that exit(), quit() and sys.exit() end
// the run with SystemExit and leave the context (stdin included) as it was,
// and that input() says why it fails.
func TestPythonExitQuitAndInput(t *testing.T) {
	c := startContext(t, "python")
	runCode(t, c, "import sys\nkept = 1", 0)
	for _, tc := range []struct{ code, evalue string }{
		{"exit()", ""},
		{"quit(2)", "2"},
		{"sys.exit(3)", "3"},
		{"raise SystemExit('bye')", "bye"},
	} {
		r := runCode(t, c, tc.code, 0)
		if r.err == nil || r.err.EName != "SystemExit" || r.err.EValue != tc.evalue {
			t.Errorf("%s: %+v", tc.code, r.err)
		}
	}
	r := runCode(t, c, "(kept, sys.stdin.closed, 'exit()' in repr(exit))", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "(1, False, True)" {
		t.Errorf("after exits: %+v", r)
	}
	r = runCode(t, c, "name = input('name? ')", 0)
	if r.err == nil || r.err.EName != "EOFError" || r.err.EValue != "input() is not available: code in a context has no stdin" || r.stdout != "" {
		t.Errorf("input: %+v", r)
	}
	// Code that gives itself a stdin can read it.
	r = runCode(t, c, "import io\nsys.stdin = io.StringIO('typed\\n')\ntry:\n    v = input()\nfinally:\n    sys.stdin = sys.__stdin__\nv", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "'typed'" {
		t.Errorf("input from a StringIO: %+v", r)
	}
}

// TestPythonIPythonDisplay checks the IPython.display names notebook code
// uses: the driver's stand-in when IPython is not importable, IPython's own
// (sending to execd) when it is.
func TestPythonIPythonDisplay(t *testing.T) {
	c := startContext(t, "python")
	// Whatever is installed, display() from IPython shows rich output.
	r := runCode(t, c, "from IPython.display import display, HTML\ndisplay(HTML('<p>r</p>'))", 0)
	if len(r.results) != 1 || r.results[0]["text/html"] != "<p>r</p>" || r.err != nil || r.stdout != "" {
		t.Errorf("IPython display: %+v", r)
	}

	// The stand-in, with IPython out of reach.
	c = startContext(t, "python")
	r = runCode(t, c, `import sys, importlib
sys.path[:] = [p for p in sys.path if not p.endswith(("site-packages", "dist-packages"))]
importlib.invalidate_caches()
import IPython
from IPython.display import display, HTML, Markdown, Image, SVG, JSON, Latex, Math, clear_output
from IPython.core.display import display as core_display
'stand-in' in IPython.__doc__, IPython.get_ipython(), core_display is display, repr(HTML('x'))`, 0)
	if len(r.results) != 1 || r.results[0]["text"] != "(True, None, True, '<IPython.core.display.HTML object>')" {
		t.Fatalf("stand-in: %+v", r)
	}
	png := "\x89PNG\r\n\x1a\nrest"
	r = runCode(t, c, fmt.Sprintf(`png = %q.encode('latin-1')
open('pic.jpg', 'wb').write(b'\xff\xd8\xffjpeg')
open('page.html', 'w').write('<i>file</i>')
display(HTML('<b>h</b>'), Markdown('# m'), Latex(r'$x$'), Math('x^2'), SVG('<svg/>'), JSON({'a': [1]}), JSON('[2]'))
display(Image(data=png), Image(filename='pic.jpg'), Image('pic.jpg', format='jpeg'), HTML('page.html'))
display(Image(url='https://example.com/i.png'))
display({'text/html': '<u>raw</u>'}, raw=True)
h = display('first', display_id=True)
h.update('second')
clear_output()
Image(png)`, png), 0)
	want := []map[string]any{
		{"text/html": "<b>h</b>"},
		{"text/markdown": "# m"},
		{"text/latex": "$x$"},
		{"text/latex": "$\\displaystyle x^2$"},
		{"image/svg+xml": "<svg/>"},
		{"application/json": map[string]any{"a": []any{1.0}}},
		{"application/json": []any{2.0}},
		{"image/png": base64.StdEncoding.EncodeToString([]byte(png))},
		{"image/jpeg": base64.StdEncoding.EncodeToString([]byte("\xff\xd8\xffjpeg"))},
		{"image/jpeg": base64.StdEncoding.EncodeToString([]byte("\xff\xd8\xffjpeg"))},
		{"text/html": "<i>file</i>"},
		{"text/html": `<img src="https://example.com/i.png"/>`},
		{"text/html": "<u>raw</u>"},
		{"text": "'first'"},
		{"text": "'second'"},
		{"image/png": base64.StdEncoding.EncodeToString([]byte(png))},
	}
	if r.err != nil || len(r.results) != len(want) {
		t.Fatalf("stand-in displays: %+v", r)
	}
	for i, w := range want {
		for k, v := range w {
			got, _ := json.Marshal(r.results[i][k])
			exp, _ := json.Marshal(v)
			if !bytes.Equal(got, exp) {
				t.Errorf("display %d: %s = %s, want %s (all: %v)", i, k, got, exp, r.results[i])
			}
		}
	}
}

// TestPythonMagics checks the IPython syntax notebook code uses: shell
// escapes, %pip, %cd, %env, the cell magics supported, errors for the rest,
// and that `!` or `%` inside a string, a bracket or a continued line is
// left alone.
func TestPythonMagics(t *testing.T) {
	c := startContext(t, "python")
	r := runCode(t, c, "n = 3\nprint('before', flush=True)\n!echo shell {n + 1} $n $HOME_NOT_A_VAR\nfor i in range(2):\n    !echo loop $i\nprint('after')", 0)
	if r.err != nil || r.stdout != "before\nshell 4 3\nloop 0\nloop 1\nafter\n" {
		t.Errorf("shell escapes: %+v", r)
	}
	r = runCode(t, c, "!exit 3\n_exit_code", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "3" {
		t.Errorf("exit code: %+v", r)
	}
	r = runCode(t, c, "%pip --version", 0)
	if r.err != nil || !strings.Contains(r.stdout+r.stderr, "pip") {
		t.Errorf("%%pip: %+v", r)
	}
	r = runCode(t, c, "%matplotlib inline\n%config InlineBackend.figure_format = 'retina'\n%load_ext autoreload\n%autoreload 2\nimport os\nos.mkdir('sub')\n%cd sub\n%env OSB_X=1\n(os.path.basename(os.getcwd()), os.environ['OSB_X'])", 0)
	if r.err != nil || !strings.HasSuffix(r.stdout, "/sub\nenv: OSB_X=1\n") || len(r.results) != 1 || r.results[0]["text"] != "('sub', '1')" {
		t.Errorf("line magics: %+v", r)
	}
	r = runCode(t, c, "%env OSB_X", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "'1'" {
		t.Errorf("%%env NAME: %+v", r)
	}
	r = runCode(t, c, "\n%%writefile -a notes.txt\nline one\n", 0)
	r2 := runCode(t, c, "%%bash\ncat notes.txt\necho err >&2", 0)
	if r.stdout != "Writing notes.txt\n" || r2.stdout != "line one\n" || r2.stderr != "err\n" {
		t.Errorf("cell magics: %+v %+v", r, r2)
	}
	for _, tc := range []struct{ code, evalue string }{
		{"x = 1\n%timeit x", "magic %timeit is not supported here"},
		{"%%time\nx = 1", "magic %%time is not supported here"},
		{"x = 1\n%%time\nx", "magic %%time is not supported here"},
	} {
		r := runCode(t, c, tc.code, 0)
		if r.err == nil || r.err.EName != "UsageError" || r.err.EValue != tc.evalue || len(r.err.Traceback) != 1 {
			t.Errorf("%q: %+v", tc.code, r.err)
		}
	}
	r = runCode(t, c, "x", 0)
	if r.err == nil || r.err.EName != "NameError" {
		t.Errorf("a cell with an unsupported magic ran: %+v", r)
	}
	// An interrupt stops a shell escape and the cell.
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "!sleep 30\nafter = 1", 0) }()
	waitBusy(t, c)
	start := time.Now()
	c.Interrupt()
	if r = <-done; r.err == nil || r.err.EName != "KeyboardInterrupt" || time.Since(start) > 5*time.Second {
		t.Errorf("interrupted shell escape: %+v after %v", r, time.Since(start))
	}
	if r = runCode(t, c, "'after' in dir()", 0); len(r.results) != 1 || r.results[0]["text"] != "False" {
		t.Errorf("the cell went on after its interrupted shell escape: %+v", r)
	}
	// Python that merely looks like IPython syntax.
	r = runCode(t, c, "s = '''\n!not a shell escape\n%not_a_magic\n'''\nt = (7\n% 4)\nu = 9 \\\n% 5\nv = [1\n% 2]\n(s, t, u, v)", 0)
	if r.err != nil || len(r.results) != 1 || r.results[0]["text"] != `('\n!not a shell escape\n%not_a_magic\n', 3, 4, [1])` {
		t.Errorf("strings and continuations: %+v %+v", r, r.err)
	}
}

// TestPythonTrailingSemicolon checks that a ';' after the last expression
// hides its value, as in IPython, and only then.
func TestPythonTrailingSemicolon(t *testing.T) {
	c := startContext(t, "python")
	for _, tc := range []struct {
		code string
		want string // "" for no result
	}{
		{"1;", ""},
		{"(1 + 1) ;  # done", ""},
		{"x = 2\nx \\\n;", ""},
		{"'é';", ""},
		{"x", "2"},
		{"x  # ;", "2"},
		{"';'", "';'"},
		{"x; x + 1", "3"},
		{"[x,\n x];", ""},
	} {
		r := runCode(t, c, tc.code, 0)
		got := ""
		if len(r.results) == 1 {
			got, _ = r.results[0]["text"].(string)
		}
		if r.err != nil || got != tc.want || len(r.results) > 1 {
			t.Errorf("%q: result %q, want %q (%+v)", tc.code, got, tc.want, r)
		}
	}
}

// TestPythonSizeCaps checks that no reply gets too big: text/plain is
// truncated at 1 MiB, other values over 12 MiB are dropped, values that do
// not fit in a 15 MiB line together are dropped largest first, and errors
// are cut.
func TestPythonSizeCaps(t *testing.T) {
	c := startContext(t, "python")
	r := runCode(t, c, "'a' * (2 << 20)", 0)
	text, _ := r.results[0]["text"].(string)
	if n := 2<<20 + 2 - 1<<20; len(text) > 1<<20+100 || !strings.HasSuffix(text, fmt.Sprintf("... [truncated: %d more characters]", n)) {
		t.Errorf("text/plain of %d characters ends %q", len(text), text[max(0, len(text)-60):])
	}
	r = runCode(t, c, "class Big:\n    def _repr_html_(self): return 'h' * (13 << 20)\n    def _repr_markdown_(self): return 'm'\n    def __repr__(self): return 'Big()'\nBig()", 0)
	if res := r.results[0]; res["text/html"] != nil || res["text/markdown"] != "m" || !strings.HasPrefix(res["text"].(string), "Big()\n[text/html output dropped: 13.0 MiB is over the limit of 12 MiB]") {
		t.Errorf("a value over 12 MiB: text %q, keys %d", res["text"], len(res))
	}
	r = runCode(t, c, "class Two:\n    def _repr_html_(self): return 'h' * (8 << 20)\n    def _repr_markdown_(self): return 'm' * (7 << 20)\ndisplay(Two())", 0)
	if res := r.results[0]; res["text/html"] != nil || len(res["text/markdown"].(string)) != 7<<20 || !strings.Contains(res["text"].(string), "[text/html output dropped: 8.0 MiB does not fit in one reply]") {
		t.Errorf("values that do not fit together: text %q, keys %d", res["text"], len(res))
	}
	r = runCode(t, c, "raise ValueError('v' * (3 << 20))", 0)
	if r.err == nil || len(r.err.EValue) > 1<<20+100 || !strings.Contains(r.err.EValue, "[truncated: ") {
		t.Errorf("a huge evalue: %d characters", len(r.err.EValue))
	}
	size := 0
	for _, l := range r.err.Traceback {
		size += len(l)
	}
	if size > 3<<20 {
		t.Errorf("traceback of %d characters", size)
	}
}

// TestPythonAsyncio checks that every cell runs in the context's event loop:
// tasks can be created without await and advance during later cells that
// await; interrupts stop both kinds of cells and unwind an awaiting task;
// context variables a cell sets are seen by the next.
func TestPythonAsyncio(t *testing.T) {
	c := startContext(t, "python")
	r := runCode(t, c, "import asyncio\nlog = []\nasync def bg():\n    log.append('start')\n    await asyncio.sleep(0.05)\n    log.append('end')\ntask = asyncio.create_task(bg())\nasyncio.get_running_loop() is asyncio.get_event_loop()", 0)
	if r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "True" {
		t.Fatalf("create_task without await: %+v", r)
	}
	r = runCode(t, c, "await asyncio.sleep(0.2)\n(task.done(), log)", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "(True, ['start', 'end'])" {
		t.Errorf("the task did not advance: %+v", r)
	}

	runCode(t, c, "import time\nunwound = []", 0)
	for _, code := range []string{
		"time.sleep(30)",
		"try:\n    await asyncio.sleep(30)\nfinally:\n    unwound.append(1)",
	} {
		done := make(chan *runResult)
		go func() { done <- runCode(t, c, code, 0) }()
		waitBusy(t, c)
		c.Interrupt()
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%q: the interrupt did not stop it", code)
		}
		if r.err == nil || r.err.EName != "KeyboardInterrupt" {
			t.Errorf("%q interrupted: %+v", code, r)
		}
	}
	r = runCode(t, c, "unwound", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "[1]" {
		t.Errorf("the interrupted task was not unwound: %+v", r)
	}

	// Script-style asyncio.run works in a cell, and an interrupt stops it.
	r = runCode(t, c, "async def main():\n    await asyncio.sleep(0.01)\n    return 42\nasyncio.run(main())", 0)
	if r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "42" {
		t.Errorf("asyncio.run in a cell: %+v", r)
	}
	r = runCode(t, c, "async def boom():\n    raise ValueError('inner')\nasyncio.run(boom())", 0)
	if r.err == nil || r.err.EName != "ValueError" {
		t.Errorf("asyncio.run raising: %+v", r)
	}
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "asyncio.run(asyncio.sleep(30))", 0) }()
	waitBusy(t, c)
	c.Interrupt()
	select {
	case r = <-done:
		if r.err == nil || r.err.EName != "KeyboardInterrupt" {
			t.Errorf("asyncio.run interrupted: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the interrupt did not stop asyncio.run")
	}

	runCode(t, c, "import contextvars, decimal\nvar = contextvars.ContextVar('var')\nvar.set('kept')\ndecimal.getcontext().prec = 40", 0)
	r = runCode(t, c, "(var.get(), decimal.getcontext().prec)", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "('kept', 40)" {
		t.Errorf("context variables: %+v", r)
	}
}

// TestPythonOutputChunks checks that print() reaches execd as one chunk per
// line, not the text and its newline apart (python -u would split them).
func TestPythonOutputChunks(t *testing.T) {
	c := startContext(t, "python")
	r := runCode(t, c, "import sys, time\nfor i in range(3):\n    print('line', i)\n    time.sleep(0.05)\nsys.stderr.write('e\\n')", 0)
	var chunks []string
	for _, ev := range r.events {
		if ev.Type == api.EventStdout {
			chunks = append(chunks, ev.Text)
		}
	}
	// Each line is one write; the reader may still join two of them.
	for _, chunk := range chunks {
		if !strings.HasSuffix(chunk, "\n") || strings.HasPrefix(chunk, "\n") {
			t.Errorf("stdout chunk %q of %q", chunk, chunks)
		}
	}
	if r.stdout != "line 0\nline 1\nline 2\n" || r.stderr != "e\n" {
		t.Errorf("stdout %q, stderr %q", r.stdout, r.stderr)
	}
}
