package interp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// jsTimeout bounds every wait for the driver; runs that should end take
// milliseconds.
const jsTimeout = 20 * time.Second

// jsDriver is a javascript driver started as execd starts it, with the test
// on the other ends of its pipes.
type jsDriver struct {
	t          testing.TB
	cmd        *exec.Cmd
	requests   *os.File // fd 3, the driver's requests
	interrupts *os.File // fd 5
	replies    chan jsReply
	stdout     *jsOutput
	stderr     *jsOutput
	ready      reply
	started    time.Duration // from start to the ready message

	mu          sync.Mutex
	startedRuns []string // ids of the started replies, in order
	exited      chan struct{}
	exitErr     error
	runs        int
}

// jsReply is one line of fd 4, parsed as execd parses it.
type jsReply struct {
	reply
	err error
}

// jsOutput collects one of the driver's output pipes.
type jsOutput struct {
	r  *process.Reader
	mu sync.Mutex
	b  []byte
}

func newJSOutput(f *os.File) *jsOutput {
	o := &jsOutput{}
	o.r = process.NewReader(f, func(p []byte) {
		o.mu.Lock()
		o.b = append(o.b, p...)
		o.mu.Unlock()
	}, 0, nil)
	go o.r.Run()
	return o
}

// take returns what the pipe carried so far, everything written to it up
// to now included, and forgets it.
func (o *jsOutput) take() string {
	o.r.Sync()
	o.mu.Lock()
	defer o.mu.Unlock()
	s := string(o.b)
	o.b = nil
	return s
}

// jsRun is what one run gave.
type jsRun struct {
	id       string
	replies  []reply
	stdout   string
	stderr   string
	result   *reply
	error    *reply
	displays []reply
	done     reply
}

// startJS starts the driver in dir (a new temporary directory when empty)
// with extra environment variables, and waits for its ready message.
func startJS(t testing.TB, dir string, env ...string) *jsDriver {
	t.Helper()
	testenv.MustHaveCommand(t, "node")
	l, ok := lookupLanguage("javascript")
	if !ok {
		t.Fatal("javascript is not offered: javascript.js is not embedded")
	}
	environ, path := l.environ(os.Environ())
	node, err := l.findInterpreter(path)
	if err != nil {
		t.Fatal(err)
	}
	script, err := l.driverPath(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if dir == "" {
		dir = t.TempDir()
	}

	var toClose []*os.File
	pipe := func() (r, w *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		toClose = append(toClose, r, w)
		return r, w
	}
	reqR, reqW := pipe()
	repR, repW := pipe()
	intR, intW := pipe()
	outR, outW := pipe()
	errR, errW := pipe()
	t.Cleanup(func() {
		for _, f := range toClose {
			f.Close()
		}
	})

	cmd := exec.Command(node, l.args(script)...)
	cmd.Dir = dir
	cmd.Env = append(environ, env...)
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.ExtraFiles = []*os.File{reqR, repW, intR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*os.File{reqR, repW, intR, outW, errW} {
		f.Close()
	}
	d := &jsDriver{
		t:          t,
		cmd:        cmd,
		requests:   reqW,
		interrupts: intW,
		replies:    make(chan jsReply, 64),
		stdout:     newJSOutput(outR),
		stderr:     newJSOutput(errR),
		exited:     make(chan struct{}),
	}
	go func() {
		d.exitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	})
	go d.readReplies(repR)

	m, ok := d.next()
	if !ok {
		t.Fatalf("driver exited before ready: %v; stderr: %s", d.exitErr, d.stderr.take())
	}
	if m.err != nil || m.Type != replyReady {
		t.Fatalf("first reply is %+v (%v), want ready", m.reply, m.err)
	}
	d.started = time.Since(begin)
	d.ready = m.reply
	return d
}

func (d *jsDriver) readReplies(f *os.File) {
	defer close(d.replies)
	br := bufio.NewReaderSize(f, 64<<10)
	var s lineSplitter
	s.max = maxReplyLine
	buf := make([]byte, 64<<10)
	for {
		n, err := br.Read(buf)
		s.write(buf[:n], func(line []byte) {
			m, err := parseReply(line)
			if err == nil && m.Type == replyStarted {
				// Checked by TestJavascriptStarted; the runs' own checks
				// see the replies that carry their outcome.
				d.mu.Lock()
				d.startedRuns = append(d.startedRuns, m.ID)
				d.mu.Unlock()
				return
			}
			d.replies <- jsReply{reply: m, err: err}
		}, func(err error) {
			d.replies <- jsReply{err: err}
		})
		if err != nil {
			return
		}
	}
}

// next returns the next reply; ok is false when the replies pipe closed.
func (d *jsDriver) next() (jsReply, bool) {
	d.t.Helper()
	select {
	case m, ok := <-d.replies:
		return m, ok
	case <-time.After(jsTimeout):
		d.t.Fatalf("no reply from the driver in %v; stderr: %s", jsTimeout, d.stderr.take())
		return jsReply{}, false
	}
}

// send sends an execute request and returns its id.
func (d *jsDriver) send(code string) string {
	d.t.Helper()
	d.runs++
	id := fmt.Sprintf("run-%d", d.runs)
	b, err := json.Marshal(map[string]string{"type": "execute", "id": id, "code": code})
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.requests.Write(append(b, '\n')); err != nil {
		d.t.Fatal(err)
	}
	return id
}

// wait collects run id's replies until its done, then the output written
// before it, and checks the order of the messages.
func (d *jsDriver) wait(id string) jsRun {
	d.t.Helper()
	r := jsRun{id: id}
	for {
		m, ok := d.next()
		if !ok {
			d.t.Fatalf("driver exited during run %s: %v; stderr: %s", id, d.exitErr, d.stderr.take())
		}
		if m.err != nil {
			d.t.Fatalf("run %s: bad reply: %v", id, m.err)
		}
		if m.ID != id {
			d.t.Fatalf("run %s: reply %+v for another run", id, m.reply)
		}
		if r.error != nil && m.Type != replyDone {
			d.t.Fatalf("run %s: %s reply after the error", id, m.Type)
		}
		r.replies = append(r.replies, m.reply)
		switch m.Type {
		case replyResult:
			if r.result != nil {
				d.t.Fatalf("run %s: two results", id)
			}
			r.result = &m.reply
		case replyError:
			r.error = &m.reply
		case replyDisplay:
			if r.result != nil {
				d.t.Fatalf("run %s: display after the result", id)
			}
			r.displays = append(r.displays, m.reply)
		case replyDone:
			r.done = m.reply
			r.stdout = d.stdout.take()
			r.stderr = d.stderr.take()
			return r
		default:
			d.t.Fatalf("run %s: unexpected reply %+v", id, m.reply)
		}
	}
}

// run runs code and returns what it gave.
func (d *jsDriver) run(code string) jsRun {
	d.t.Helper()
	return d.wait(d.send(code))
}

func (d *jsDriver) interrupt() {
	d.t.Helper()
	if _, err := d.interrupts.Write([]byte("\n")); err != nil {
		d.t.Fatal(err)
	}
}

// close closes the requests pipe and returns how long the driver took to
// exit and its exit status.
func (d *jsDriver) close() (time.Duration, error) {
	d.t.Helper()
	begin := time.Now()
	d.requests.Close()
	select {
	case <-d.exited:
		return time.Since(begin), d.exitErr
	case <-time.After(jsTimeout):
		d.t.Fatal("driver still running after its requests pipe closed")
		return 0, nil
	}
}

// text returns the result's text/plain, "" when there is no result.
func (r jsRun) text() string {
	if r.result == nil {
		return ""
	}
	s, _ := r.result.Data["text/plain"].(string)
	return s
}

// mustResult fails unless the run ended with a result whose text/plain is
// want.
func (r jsRun) mustResult(t testing.TB, want string) {
	t.Helper()
	if r.error != nil {
		t.Fatalf("run %s: error %s: %s\n%s", r.id, r.error.EName, r.error.EValue, strings.Join(r.error.Traceback, "\n"))
	}
	if r.result == nil {
		t.Fatalf("run %s: no result, want %q", r.id, want)
	}
	if got := r.text(); got != want {
		t.Fatalf("run %s: result %q, want %q", r.id, got, want)
	}
}

// mustNothing fails unless the run ended with neither a result nor an
// error.
func (r jsRun) mustNothing(t testing.TB) {
	t.Helper()
	if r.result != nil || r.error != nil {
		t.Fatalf("run %s: %+v, want neither a result nor an error", r.id, r.replies)
	}
}

// mustError fails unless the run ended with an error named ename.
func (r jsRun) mustError(t testing.TB, ename, evalue string) {
	t.Helper()
	if r.error == nil {
		t.Fatalf("run %s: no error (result %q), want %s", r.id, r.text(), ename)
	}
	if r.error.EName != ename || r.error.EValue != evalue {
		t.Fatalf("run %s: error %s: %q, want %s: %q", r.id, r.error.EName, r.error.EValue, ename, evalue)
	}
	if r.result != nil {
		t.Fatalf("run %s: both a result and an error", r.id)
	}
}

func TestJavascriptReady(t *testing.T) {
	d := startJS(t, "")
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	if d.ready.Language != "javascript" || d.ready.Version != want {
		t.Errorf("ready = %+v, want language javascript, version %s", d.ready, want)
	}
	t.Logf("node %s: ready %.1f ms after start", want, float64(d.started.Microseconds())/1000)
}

func TestJavascriptState(t *testing.T) {
	d := startJS(t, "")
	steps := []struct {
		code string
		want string // text/plain of the result; "" for none
	}{
		{"var v = 1", ""},
		{"let l = 2", ""},
		{"const c = 3", ""},
		{"function f() { return 4 }", ""},
		{"class K { m() { return 5 } }", ""},
		{"const path = require('path')", ""},
		{"v + l + c + f() + new K().m()", "15"},
		// let, const and class declared again, as in a REPL.
		{"let l = 20; const c = 30; l + c", "50"},
		{"class K { m() { return 6 } }; new K().m()", "6"},
		{"v = 7; globalThis.v", "7"},
		{"path.join('a', 'b')", "'a/b'"},
		{"let later = await Promise.resolve(8)", ""},
		{"later", "8"},
	}
	for _, s := range steps {
		r := d.run(s.code)
		if s.want == "" {
			r.mustNothing(t)
			continue
		}
		r.mustResult(t, s.want)
	}
}

func TestJavascriptResults(t *testing.T) {
	d := startJS(t, "")
	tests := []struct {
		code string
		text string // "" for no result
		json string // the application/json value; "" for none
	}{
		{"1 + 1", "2", ""},
		{"'str'", "'str'", ""},
		{"null", "null", ""},
		{"undefined", "", ""},
		{"console.log('x')", "", ""},
		{"let z = 1", "", ""},
		{"", "", ""},
		{"({a: 1, b: [1, 'two', null, true]})", "{ a: 1, b: [ 1, 'two', null, true ] }", `{"a":1,"b":[1,"two",null,true]}`},
		{"{a: 1}", "{ a: 1 }", `{"a":1}`},
		{"{ let q = 5; q }", "5", ""},
		{"[1, 2, 3]", "[ 1, 2, 3 ]", "[1,2,3]"},
		{"[1, undefined]", "[ 1, undefined ]", ""},
		{"({d: new Date(0)})", "{ d: 1970-01-01T00:00:00.000Z }", ""},
		{"({get g() { return 1 }})", "{ g: [Getter] }", ""},
		{"const cyc = {}; cyc.self = cyc; cyc", "<ref *1> { self: [Circular *1] }", ""},
		{"new Map([[1, 2]])", "Map(1) { 1 => 2 }", ""},
		{"class P { constructor() { this.x = 1 } }; new P()", "P { x: 1 }", ""},
		{"10n", "10n", ""},
		{"-0", "-0", ""},
		{"NaN", "NaN", ""},
		{"Symbol('s')", "Symbol(s)", ""},
		{"Promise.resolve(3)", "Promise { 3 }", ""},
		{"await 7", "7", ""},
		{"(() => 1)", "[Function (anonymous)]", ""},
		{"'a\\nb'", `'a\nb'`, ""},
	}
	for _, tt := range tests {
		r := d.run(tt.code)
		if r.error != nil {
			t.Errorf("%q: error %s: %s", tt.code, r.error.EName, r.error.EValue)
			continue
		}
		if tt.text == "" {
			if r.result != nil {
				t.Errorf("%q: result %v, want none", tt.code, r.result.Data)
			}
			continue
		}
		if r.result == nil {
			t.Errorf("%q: no result, want %q", tt.code, tt.text)
			continue
		}
		if got := r.text(); got != tt.text {
			t.Errorf("%q: text/plain %q, want %q", tt.code, got, tt.text)
		}
		got, ok := r.result.Data["application/json"]
		switch {
		case tt.json == "" && ok:
			t.Errorf("%q: application/json %v, want none", tt.code, got)
		case tt.json != "":
			var want any
			if err := json.Unmarshal([]byte(tt.json), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%q: application/json %#v, want %s", tt.code, got, tt.json)
			}
		}
		if n := len(r.result.Data); n != 1 && !(n == 2 && ok) {
			t.Errorf("%q: data %v has other types", tt.code, r.result.Data)
		}
	}

	// A big array is text/plain as util.inspect cuts it, JSON whole.
	r := d.run("Array.from({length: 200}, (_, i) => i)")
	if !strings.HasSuffix(r.text(), "... 100 more items\n]") {
		t.Errorf("200 items: text/plain %q", r.text())
	}
	if a, ok := r.result.Data["application/json"].([]any); !ok || len(a) != 200 {
		t.Errorf("200 items: application/json %v", r.result.Data["application/json"])
	}
	// Past 1 MiB the JSON copy is left out.
	r = d.run("Array.from({length: 300000}, (_, i) => i)")
	if _, ok := r.result.Data["application/json"]; ok || r.text() == "" {
		t.Errorf("300000 items: data has application/json or no text/plain")
	}
}

func TestJavascriptExecutionCount(t *testing.T) {
	d := startJS(t, "")
	for i, code := range []string{"1", "throw new Error('x')", "let = ;", "undefined", "2"} {
		r := d.run(code)
		if r.done.ExecutionCount != i+1 {
			t.Errorf("run %d (%q): done execution_count %d", i+1, code, r.done.ExecutionCount)
		}
		if r.result != nil && r.result.ExecutionCount != i+1 {
			t.Errorf("run %d (%q): result execution_count %d", i+1, code, r.result.ExecutionCount)
		}
	}
}

func TestJavascriptOutput(t *testing.T) {
	d := startJS(t, "")
	r := d.run("console.log('out'); console.error('err'); process.stdout.write('raw'); 1")
	r.mustResult(t, "1")
	if r.stdout != "out\nraw" || r.stderr != "err\n" {
		t.Errorf("stdout %q, stderr %q", r.stdout, r.stderr)
	}
	// More than a pipe holds, on both pipes: all of it is there before done.
	const big = 1 << 20
	r = d.run(fmt.Sprintf("process.stdout.write('o'.repeat(%d)); process.stderr.write('e'.repeat(%d)); 'written'", big, big))
	r.mustResult(t, "'written'")
	if len(r.stdout) != big || strings.Trim(r.stdout, "o") != "" {
		t.Errorf("stdout: %d bytes before done, want %d", len(r.stdout), big)
	}
	if len(r.stderr) != big || strings.Trim(r.stderr, "e") != "" {
		t.Errorf("stderr: %d bytes before done, want %d", len(r.stderr), big)
	}
	// Output of an interrupted run is there before its done too.
	id := d.send("console.log('before'); while (true) {}")
	time.Sleep(100 * time.Millisecond)
	d.interrupt()
	r = d.wait(id)
	r.mustError(t, "Interrupted", "execution was interrupted")
	if r.stdout != "before\n" {
		t.Errorf("interrupted run: stdout %q", r.stdout)
	}
}

func TestJavascriptDisplay(t *testing.T) {
	d := startJS(t, "")
	big := strings.Repeat("QUJD", 2<<20) // 8 MiB of base64
	r := d.run(`display(1, 'a'); display({k: [1]});
display.html('<b>x</b>'); display.markdown('# t'); display.svg('<svg/>'); display.latex('$x$');
display.png('iVBO\nRw0K'); display.png(Buffer.from([1, 2, 3])); display.jpeg(new Uint8Array([255, 216]));
display.json({k: [1, 'v']}); display.png('` + big + `'); 'end'`)
	r.mustResult(t, "'end'")
	want := []map[string]any{
		{"text/plain": "1"},
		{"text/plain": "'a'"},
		{"text/plain": "{ k: [ 1 ] }", "application/json": map[string]any{"k": []any{1.0}}},
		{"text/html": "<b>x</b>"},
		{"text/markdown": "# t"},
		{"image/svg+xml": "<svg/>"},
		{"text/latex": "$x$"},
		{"image/png": "iVBORw0K"},
		{"image/png": "AQID"},
		{"image/jpeg": "/9g="},
		{"application/json": map[string]any{"k": []any{1.0, "v"}}},
		{"image/png": big},
	}
	if len(r.displays) != len(want) {
		t.Fatalf("%d displays, want %d: %v", len(r.displays), len(want), r.displays)
	}
	for i, w := range want {
		if !reflect.DeepEqual(r.displays[i].Data, w) {
			t.Errorf("display %d: %.200v, want %.200v", i, r.displays[i].Data, w)
		}
	}
	// Bad arguments are the code's errors, reported without the driver's
	// frames.
	for _, tt := range []struct{ code, ename, evalue string }{
		{"display.html(5)", "TypeError", "display.html expects a string, not number"},
		{"display.png('not base64!')", "TypeError", "display.png expects base64 text"},
		{"display.json(undefined)", "TypeError", "display.json expects a JSON value, not undefined"},
	} {
		r := d.run(tt.code)
		r.mustError(t, tt.ename, tt.evalue)
		for _, line := range r.error.Traceback {
			if strings.Contains(line, "javascript.js") {
				t.Errorf("%q: traceback shows the driver: %q", tt.code, r.error.Traceback)
			}
		}
	}
	// display() in code left running after its run ended goes nowhere.
	d.run("setTimeout(() => display('late'), 1)")
	time.Sleep(50 * time.Millisecond)
	if r := d.run("2"); len(r.displays) != 0 {
		t.Errorf("a later run got %v", r.displays)
	}
}

func TestJavascriptErrors(t *testing.T) {
	d := startJS(t, "")
	tests := []struct {
		code      string
		ename     string
		evalue    string
		traceback []string // its first lines
	}{
		{"throw new Error('boom')", "Error", "boom", []string{"Error: boom", "    at <cell-1>:1:7"}},
		{"function f() { null.x }\nf()", "TypeError", "Cannot read properties of null (reading 'x')",
			[]string{"TypeError: Cannot read properties of null (reading 'x')", "    at f (<cell-2>:1:21)", "    at <cell-2>:2:1"}},
		{"undefinedName", "ReferenceError", "undefinedName is not defined", []string{"ReferenceError: undefinedName is not defined"}},
		{"throw 'oops'", "Error", "oops", []string{"Uncaught 'oops'"}},
		{"throw {a: 1}", "Error", "[object Object]", []string{"Uncaught { a: 1 }"}},
		{"let = ;", "SyntaxError", "Unexpected token ';'", []string{"<cell-6>:1", "let = ;", "      ^", "", "SyntaxError: Unexpected token ';'"}},
		{"1 +\n(2", "SyntaxError", "Unexpected end of input", []string{"<cell-7>:2", "(2", "  ^", "", "SyntaxError: Unexpected end of input"}},
		{"await Promise.reject(new RangeError('r'))", "RangeError", "r", []string{"RangeError: r"}},
		{"await Promise.reject(5)", "Error", "5", []string{"Uncaught 5"}},
		{"const k = 1; k = 2", "TypeError", "Assignment to constant variable.", nil},
		{"await new Promise((_, reject) => setTimeout(() => reject(new Error('later')), 10))", "Error", "later", nil},
		{"class E extends Error { constructor() { super('custom'); this.name = 'MyError' } }; throw new E()", "MyError", "custom", []string{"MyError: custom"}},
	}
	for _, tt := range tests {
		r := d.run(tt.code)
		r.mustError(t, tt.ename, tt.evalue)
		tb := r.error.Traceback
		if len(tb) < len(tt.traceback) || !slices.Equal(tb[:len(tt.traceback)], tt.traceback) {
			t.Errorf("%q: traceback %q, want it to start with %q", tt.code, tb, tt.traceback)
		}
		for _, line := range tb {
			if strings.Contains(line, "javascript.js") || strings.Contains(line, "node:inspector") {
				t.Errorf("%q: traceback shows the driver: %q", tt.code, tb)
				break
			}
		}
	}
	// The context survives all of them.
	d.run("1").mustResult(t, "1")
}

func TestJavascriptRequire(t *testing.T) {
	cwd := t.TempDir()
	global := t.TempDir()
	write := func(name, src string) {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(cwd, "local.js"), "module.exports = 'local'")
	write(filepath.Join(cwd, "node_modules", "dep", "index.js"), "module.exports = 'dep'")
	write(filepath.Join(global, "globalmod", "index.js"), "module.exports = 'global'")
	d := startJS(t, cwd, "NODE_PATH="+global)
	d.run("require('./local.js')").mustResult(t, "'local'")
	d.run("require('dep')").mustResult(t, "'dep'")
	d.run("require('globalmod')").mustResult(t, "'global'")
	d.run("typeof module").mustResult(t, "'object'")
	r := d.run("require('./missing')")
	if r.error == nil || r.error.EName != "Error" || !strings.Contains(r.error.EValue, "Cannot find module './missing'") {
		t.Errorf("missing module: %+v", r.error)
	}
}

func TestJavascriptInterrupt(t *testing.T) {
	d := startJS(t, "")
	d.run("let keep = 41").mustNothing(t)
	tests := []struct{ name, code string }{
		{"loop", "while (true) {}"},
		{"loop after an await", "await null; for (;;) {}"},
		{"loop in a timer", "await new Promise(() => setTimeout(() => { for (;;) {} }, 10))"},
		{"loop in an immediate", "await new Promise(() => setImmediate(() => { for (;;) {} }))"},
		{"loop in a nextTick", "await new Promise(() => process.nextTick(() => { for (;;) {} }))"},
		{"loop in an I/O callback", "await new Promise(() => require('fs').readFile('/dev/null', () => { for (;;) {} }))"},
		{"pending await", "await new Promise(() => {})"},
		{"sleep", "await new Promise(r => setTimeout(r, 1e9))"},
		{"display in a loop", "for (;;) display.html('<p>' + 'x'.repeat(1000))"},
		{"console in a loop", "for (let i = 0; ; i++) console.log(i)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := d.send(tt.code)
			time.Sleep(200 * time.Millisecond)
			d.interrupt()
			r := d.wait(id)
			r.mustError(t, "Interrupted", "execution was interrupted")
			// The state is kept, and timers, promises and output still work.
			r = d.run("await new Promise(r => setTimeout(r, 5)); console.log('alive'); keep + 1")
			r.mustResult(t, "42")
			if r.stdout != "alive\n" {
				t.Errorf("stdout after the interrupt: %q", r.stdout)
			}
		})
	}
}

// An interrupt that stops an immediate after another one of the same turn
// leaves node unable to run immediates: the driver exits rather than spin.
func TestJavascriptInterruptBreaksImmediates(t *testing.T) {
	d := startJS(t, "")
	id := d.send("await new Promise(() => { setImmediate(() => {}); setImmediate(() => { for (;;) {} }) })")
	time.Sleep(200 * time.Millisecond)
	d.interrupt()
	for {
		m, ok := d.next()
		if !ok {
			break
		}
		if m.ID != id {
			t.Fatalf("reply %+v", m)
		}
	}
	select {
	case <-d.exited:
	case <-time.After(jsTimeout):
		t.Fatal("driver still running")
	}
	var ee *exec.ExitError
	if !errors.As(d.exitErr, &ee) || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1", d.exitErr)
	}
	if s := d.stderr.take(); !strings.Contains(s, "left node unable to run immediates") {
		t.Errorf("stderr %q", s)
	}
}

func TestJavascriptInterruptRaces(t *testing.T) {
	d := startJS(t, "")
	// While idle: ignored, also by the next run.
	d.interrupt()
	time.Sleep(50 * time.Millisecond)
	d.run("1").mustResult(t, "1")
	// Twice during a run: the second is not left for the next run.
	id := d.send("while (true) {}")
	time.Sleep(50 * time.Millisecond)
	d.interrupt()
	d.interrupt()
	d.wait(id).mustError(t, "Interrupted", "execution was interrupted")
	d.run("await new Promise(r => setTimeout(r, 50)); 2").mustResult(t, "2")
	// Around a run's end: the run ends once, either way, and the next run
	// is not interrupted.
	for i := range 30 {
		id := d.send("await new Promise(r => setTimeout(r, 2)); 'ok'")
		time.Sleep(time.Duration(i%6) * time.Millisecond)
		d.interrupt()
		r := d.wait(id)
		if r.error != nil && r.error.EName != "Interrupted" || r.error == nil && r.text() != "'ok'" {
			t.Fatalf("run %d: %+v", i, r.replies)
		}
		d.run("await new Promise(r => setTimeout(r, 5)); 3").mustResult(t, "3")
	}
}

func TestJavascriptBackgroundErrors(t *testing.T) {
	d := startJS(t, "")
	r1 := d.run("setTimeout(() => { throw new Error('late boom') }, 5); Promise.reject(new Error('unhandled')); 1")
	r1.mustResult(t, "1")
	r2 := d.run("await new Promise(r => setTimeout(r, 100)); 2")
	r2.mustResult(t, "2")
	stderr := r1.stderr + r2.stderr
	for _, want := range []string{"Uncaught Error: late boom", "Uncaught (in promise) Error: unhandled"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
}

func TestJavascriptSubprocesses(t *testing.T) {
	d := startJS(t, "")
	// The shell reports which of fds 3, 4, 5 it inherited.
	d.run(`require('child_process').execFileSync('sh', ['-c', 'for f in 3 4 5; do [ -e /proc/$$/fd/$f ] && echo $f; done; true'], {encoding: 'utf8'})`).mustResult(t, "''")
	r := d.run(`require('child_process').execSync('echo child; echo childerr >&2', {stdio: 'inherit'}); 1`)
	r.mustResult(t, "1")
	if r.stdout != "child\n" || r.stderr != "childerr\n" {
		t.Errorf("child output: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	// stdin is /dev/null.
	d.run("require('fs').readFileSync(0, 'utf8')").mustResult(t, "''")
}

func TestJavascriptExit(t *testing.T) {
	t.Run("requests closed", func(t *testing.T) {
		d := startJS(t, "")
		d.run("setInterval(() => {}, 1000); 1").mustResult(t, "1")
		took, err := d.close()
		if err != nil {
			t.Fatalf("exit: %v", err)
		}
		if took > 2*time.Second {
			t.Errorf("exit took %v", took)
		}
		t.Logf("exit %.1f ms after the requests pipe closed", float64(took.Microseconds())/1000)
	})
	t.Run("after an interrupt", func(t *testing.T) {
		d := startJS(t, "")
		id := d.send("while (true) {}")
		time.Sleep(50 * time.Millisecond)
		d.interrupt()
		d.wait(id).mustError(t, "Interrupted", "execution was interrupted")
		if _, err := d.close(); err != nil {
			t.Fatalf("exit: %v", err)
		}
		if s := d.stderr.take(); s != "" {
			t.Errorf("stderr at exit: %q", s)
		}
	})
	t.Run("process.exit", func(t *testing.T) {
		d := startJS(t, "")
		d.send("console.log('bye'); process.exit(3)")
		if m, ok := d.next(); ok {
			t.Fatalf("reply %+v, want none", m)
		}
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
			t.Fatal("driver still running after process.exit")
		}
		var ee *exec.ExitError
		if !errors.As(d.exitErr, &ee) || ee.ExitCode() != 3 {
			t.Errorf("exit: %v, want status 3", d.exitErr)
		}
		if s := d.stdout.take(); s != "bye\n" {
			t.Errorf("stdout %q", s)
		}
	})
}

func TestJavascriptRequestLines(t *testing.T) {
	d := startJS(t, "")
	// Lines that are not execute requests are ignored; a request split
	// across writes and two in one write are read whole.
	b, _ := json.Marshal(map[string]string{"type": "execute", "id": "split", "code": "'é' + 1"})
	for _, w := range []string{"not json\n", `{"type":"other"}` + "\n", "[]\n", string(b[:10]), string(b[10:]) + "\n" +
		`{"type":"execute","id":"second","code":"2"}` + "\n"} {
		if _, err := io.WriteString(d.requests, w); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.wait("split").mustResult(t, "'é1'")
	d.wait("second").mustResult(t, "2")
}

// TestJavascriptRoundTrip reports the time of a warm run of 1+1, request
// to done, as execd sees it.
func TestJavascriptRoundTrip(t *testing.T) {
	d := startJS(t, "")
	d.run("1+1")
	const n = 200
	times := make([]time.Duration, n)
	for i := range times {
		begin := time.Now()
		d.run("1+1").mustResult(t, "2")
		times[i] = time.Since(begin)
	}
	slices.Sort(times)
	t.Logf("1+1: median %v, p90 %v over %d runs", times[n/2], times[n*9/10], n)
}

func BenchmarkJavascriptRoundTrip(b *testing.B) {
	d := startJS(b, "")
	d.run("1+1")
	for b.Loop() {
		d.run("1+1")
	}
}

// TestJavascriptStarted: every run is announced as started before its
// outcome, which is when execd lets interrupts through.
func TestJavascriptStarted(t *testing.T) {
	d := startJS(t, t.TempDir())
	a := d.send("1")
	d.wait(a)
	b := d.send("2")
	d.wait(b)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.startedRuns) != 2 || d.startedRuns[0] != a || d.startedRuns[1] != b {
		t.Errorf("started replies %v, want [%s %s]", d.startedRuns, a, b)
	}
}
