package interp

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

var testSupervisor = sync.OnceValue(func() *process.Supervisor { return process.NewSupervisor(false) })

// needInterpreter skips (fails in CI) when prog is not installed.
func needInterpreter(t testing.TB, prog string) {
	t.Helper()
	testenv.MustHaveCommand(t, prog)
}

// startContext starts a context of lang in a temporary directory and
// closes it at the end of the test.
func startContext(t testing.TB, lang string) *Context {
	t.Helper()
	needInterpreter(t, map[string]string{"python": "python3", "javascript": "node", "typescript": "node", "java": "java", "go": "go"}[lang])
	if lang == "typescript" {
		// Debian's node-typescript, whose module the driver loads.
		needInterpreter(t, "tsc")
	}
	c, err := Start(context.Background(), Options{
		Language:   lang,
		Dir:        t.TempDir(),
		Env:        os.Environ(),
		Supervisor: testSupervisor(),
		DriverDir:  t.TempDir(),
	})
	if err != nil {
		t.Fatalf("start %s: %v", lang, err)
	}
	t.Cleanup(c.Close)
	return c
}

// runResult gathers a run's events.
type runResult struct {
	stdout, stderr string
	results        []map[string]any
	counts         []int
	err            *api.ExecutionError
	statusErr      bool
	events         []api.Event
}

func runCode(t testing.TB, c *Context, code string, timeout time.Duration) *runResult {
	t.Helper()
	var mu sync.Mutex
	res := &runResult{}
	err := c.Run(context.Background(), code, timeout, func(evs ...api.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			res.events = append(res.events, ev)
			switch ev.Type {
			case api.EventStdout:
				res.stdout += ev.Text
			case api.EventStderr:
				res.stderr += ev.Text
			case api.EventResult:
				res.results = append(res.results, ev.Results)
			case api.EventExecutionCount:
				res.counts = append(res.counts, ev.ExecutionCount)
			case api.EventStatus:
				res.statusErr = ev.Text == "error"
			case api.EventError:
				res.err = ev.Error
			}
		}
	})
	if err != nil {
		t.Errorf("run %q: %v", code, err)
	}
	return res
}

func TestPythonStateResultsAndErrors(t *testing.T) {
	c := startContext(t, "python")
	if !strings.HasPrefix(c.Version(), "3.") {
		t.Errorf("version %q", c.Version())
	}
	r := runCode(t, c, "import os\nx = 40\ndef f(): return x + 2\nprint('hi')", 0)
	if r.stdout != "hi\n" || len(r.results) != 0 || r.err != nil {
		t.Fatalf("first run: %+v", r)
	}
	r = runCode(t, c, "f()", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "42" || len(r.counts) != 1 || r.counts[0] != 2 {
		t.Fatalf("state: %+v", r)
	}
	r = runCode(t, c, "'a' * 3", 0)
	if r.results[0]["text"] != "'aaa'" {
		t.Errorf("str result %v", r.results)
	}
	r = runCode(t, c, "import sys\nsys.stderr.write('oops\\n')\nNone", 0)
	if r.stderr != "oops\n" || len(r.results) != 0 {
		t.Errorf("stderr run: %+v", r)
	}
	r = runCode(t, c, "def g():\n    return 1/0\ng()", 0)
	if r.err == nil || r.err.EName != "ZeroDivisionError" || r.err.EValue != "division by zero" || !r.statusErr {
		t.Fatalf("error: %+v", r)
	}
	tb := strings.Join(r.err.Traceback, "\n")
	if !strings.Contains(tb, "in g") || strings.Contains(tb, "python.py") || !strings.HasSuffix(tb, "ZeroDivisionError: division by zero") {
		t.Errorf("traceback:\n%s", tb)
	}
	r = runCode(t, c, "def (:", 0)
	if r.err == nil || r.err.EName != "SyntaxError" {
		t.Errorf("syntax error: %+v", r)
	}
	// Rich output: _repr_html_, display(), top-level await.
	r = runCode(t, c, "class H:\n    def _repr_html_(self): return '<b>x</b>'\n    def __repr__(self): return 'H()'\ndisplay(H())\nH()", 0)
	if len(r.results) != 2 || r.results[0]["text/html"] != "<b>x</b>" || r.results[1]["text"] != "H()" || len(r.counts) != 1 {
		t.Errorf("rich: %+v", r)
	}
	r = runCode(t, c, "import asyncio\nawait asyncio.sleep(0.01)\n7", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "7" {
		t.Errorf("await: %+v", r)
	}
	// Output and results come in the order they were produced.
	r = runCode(t, c, "print('before')\ndisplay(1)\nprint('after')", 0)
	var order []string
	for _, ev := range r.events {
		if ev.Type == api.EventStdout || ev.Type == api.EventResult {
			order = append(order, ev.Type)
		}
	}
	// What was written before a display is sent before it; what follows
	// may come with it (the pipes are separate).
	if len(order) < 2 || order[0] != "stdout" || !strings.HasPrefix(r.stdout, "before\n") || len(r.results) != 1 {
		t.Errorf("order %v", order)
	}
}

func TestPythonInterruptAndTimeout(t *testing.T) {
	c := startContext(t, "python")
	runCode(t, c, "y = 5", 0)
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "import time\nwhile True:\n    time.sleep(0.01)", 0) }()
	waitBusy(t, c)
	if !c.Interrupt() {
		t.Fatal("Interrupt saw no run")
	}
	r := <-done
	if r.err == nil || r.err.EName != "KeyboardInterrupt" {
		t.Fatalf("interrupted run: %+v", r)
	}
	if c.Interrupt() {
		t.Error("Interrupt while idle reported a run")
	}
	if r := runCode(t, c, "y", 0); r.results[0]["text"] != "5" {
		t.Fatalf("state lost after interrupt: %+v", r)
	}

	start := time.Now()
	r = runCode(t, c, "while True: pass", 300*time.Millisecond)
	if r.err == nil || r.err.EName != ENameTimeout || time.Since(start) > 2*time.Second {
		t.Fatalf("timeout: %+v after %v", r, time.Since(start))
	}
	if r := runCode(t, c, "y + 1", 0); r.results[0]["text"] != "6" {
		t.Fatalf("state lost after timeout: %+v", r)
	}

	// Code that ignores the interrupt is killed KillGrace later.
	r = runCode(t, c, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", 200*time.Millisecond)
	if r.err == nil || r.err.EName != ENameTimeout || !strings.Contains(r.err.EValue, "killed") {
		t.Fatalf("kill after timeout: %+v", r)
	}
	<-c.Done()
	r = runCode(t, c, "1", 0)
	if r.err == nil || r.err.EName != ENameContextDied {
		t.Fatalf("run in a dead context: %+v", r)
	}
}

func waitBusy(t *testing.T, c *Context) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		running := c.running
		c.mu.Unlock()
		if running {
			time.Sleep(50 * time.Millisecond) // let the code start
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the run did not start")
		}
	}
}

func TestPythonExitKillsContext(t *testing.T) {
	c := startContext(t, "python")
	r := runCode(t, c, "print('bye')\nimport os\nos._exit(3)", 0)
	if r.stdout != "bye\n" || r.err == nil || r.err.EName != ENameContextDied || !strings.Contains(r.err.EValue, "exit status 3") {
		t.Fatalf("exit: %+v", r)
	}
}

func TestRunsQueueInOrder(t *testing.T) {
	c := startContext(t, "python")
	runCode(t, c, "seen = []", 0)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runCode(t, c, "import time\ntime.sleep(0.02)\nseen.append(1)", 0)
		}()
		_ = i
	}
	wg.Wait()
	if r := runCode(t, c, "len(seen)", 0); r.results[0]["text"] != "5" {
		t.Fatalf("runs: %+v", r)
	}
	// A queued run whose caller gives up is dropped.
	slow := make(chan error)
	go func() { slow <- c.Run(context.Background(), "import time\ntime.sleep(0.5)", 0, func(...api.Event) {}) }()
	waitBusy(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx, "seen.append(2)", 0, func(...api.Event) {}); err == nil {
		t.Fatal("a run waiting its turn ignored its context")
	}
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, c, "len(seen)", 0); r.results[0]["text"] != "5" {
		t.Fatalf("dropped run ran: %+v", r)
	}
}

func TestStartFailures(t *testing.T) {
	_, err := Start(context.Background(), Options{Language: "cobol", Supervisor: testSupervisor(), DriverDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "unknown language") {
		t.Errorf("unknown language: %v", err)
	}
	_, err = Start(context.Background(), Options{Language: "python", Env: []string{"PATH=/nonexistent"}, Supervisor: testSupervisor(), DriverDir: t.TempDir()})
	if _, ok := err.(*NotInstalledError); !ok {
		t.Errorf("missing interpreter: %v", err)
	}
	needInterpreter(t, "python3")
	// An interpreter that dies at start: its stderr explains why.
	dir := t.TempDir()
	os.WriteFile(dir+"/python3", []byte("#!/bin/sh\necho broken interpreter >&2\nexit 7\n"), 0o755)
	_, err = Start(context.Background(), Options{Language: "python", Dir: dir, Env: []string{"PATH=" + dir}, Supervisor: testSupervisor(), DriverDir: t.TempDir()})
	if se, ok := err.(*StartError); !ok || !strings.Contains(se.Stderr, "broken interpreter") || !strings.Contains(se.Reason, "exit status 7") {
		t.Errorf("broken interpreter: %v", err)
	}
	// One that never becomes ready.
	os.WriteFile(dir+"/python3", []byte("#!/bin/sh\nexec sleep 60\n"), 0o755)
	start := time.Now()
	_, err = Start(context.Background(), Options{Language: "python", Dir: dir, Env: []string{"PATH=" + dir}, Supervisor: testSupervisor(), DriverDir: t.TempDir(), StartTimeout: 300 * time.Millisecond})
	if _, ok := err.(*StartError); !ok || time.Since(start) > 2*time.Second {
		t.Errorf("hung interpreter: %v after %v", err, time.Since(start))
	}
}

func TestCloseEndsRunAndProcesses(t *testing.T) {
	c := startContext(t, "python")
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "import subprocess\nsubprocess.run(['sleep', '60'])", 0) }()
	waitBusy(t, c)
	start := time.Now()
	c.Close()
	r := <-done
	if r.err == nil || r.err.EName != ENameContextDied || time.Since(start) > 2*time.Second {
		t.Fatalf("close during run: %+v after %v", r, time.Since(start))
	}
}

// TestNoOutputAfterRunEnds: a process the code left printing never gets
// output into a finished run (it once crashed execd sending on a closed
// stream), and every run still ends cleanly.
func TestNoOutputAfterRunEnds(t *testing.T) {
	c := startContext(t, "python")
	runCode(t, c, "import subprocess\np = subprocess.Popen(['sh', '-c', 'while :; do echo noise; done'])", 0)
	for i := range 30 {
		var mu sync.Mutex
		ended := false
		err := c.Run(context.Background(), "1", 0, func(evs ...api.Event) {
			mu.Lock()
			defer mu.Unlock()
			if ended {
				t.Errorf("run %d: an event after the run ended: %+v", i, evs)
			}
		})
		mu.Lock()
		ended = true
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	runCode(t, c, "p.kill()", 0)
}

// TestUTF8AcrossReads: characters cut by the pipe's reads arrive whole.
func TestUTF8AcrossReads(t *testing.T) {
	c := startContext(t, "python")
	r := runCode(t, c, "print('€' * 300000)\nprint('進捗 ████ ' * 20000)", 0)
	want := strings.Repeat("€", 300000) + "\n" + strings.Repeat("進捗 ████ ", 20000) + "\n"
	if r.stdout != want {
		t.Fatalf("stdout differs: %d bytes, want %d; valid UTF-8 in every event: %v", len(r.stdout), len(want), validEvents(r.events))
	}
}

func validEvents(evs []api.Event) bool {
	for _, ev := range evs {
		if !utf8.ValidString(ev.Text) {
			return false
		}
	}
	return true
}

// TestDeathWithForkedChild: the driver dies while a child it forked holds
// the replies pipe; the run still ends at once, and the child is killed.
func TestDeathWithForkedChild(t *testing.T) {
	c := startContext(t, "python")
	start := time.Now()
	r := runCode(t, c, "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(600)\n    os._exit(0)\nprint(pid, flush=True)\nos._exit(1)", 0)
	if r.err == nil || r.err.EName != ENameContextDied || time.Since(start) > 5*time.Second {
		t.Fatalf("run: %+v after %v", r, time.Since(start))
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(r.stdout))
	waitGone := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(waitGone) {
			t.Fatalf("the forked child %d outlived its context", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestInterruptRightAfterStart: an interrupt sent as soon as the run is
// under way is not lost.
func TestInterruptRightAfterStart(t *testing.T) {
	c := startContext(t, "python")
	for i := range 10 {
		done := make(chan *runResult)
		// The cell sleeps far longer than the wait below, so that only a
		// lost interrupt, never a slow machine, fails the wait.
		go func() { done <- runCode(t, c, "import time\ntime.sleep(120)", 0) }()
		for !c.Interrupt() {
			time.Sleep(100 * time.Microsecond)
		}
		select {
		case r := <-done:
			if r.err == nil || r.err.EName != "KeyboardInterrupt" {
				t.Fatalf("try %d: %+v", i, r)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("try %d: the interrupt was lost", i)
		}
	}
}
