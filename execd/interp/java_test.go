package interp

import (
	"strings"
	"testing"
	"time"
)

func TestJavaStateResultsAndErrors(t *testing.T) {
	c := startContext(t, "java")
	if !strings.HasPrefix(c.Version(), "1") && !strings.HasPrefix(c.Version(), "2") {
		t.Errorf("version %q", c.Version())
	}
	r := runCode(t, c, "import java.util.*;\nint x = 40;\nint f() { return x + 2; }\nSystem.out.println(\"hi\");", 0)
	if r.stdout != "hi\n" || len(r.results) != 0 || r.err != nil {
		t.Fatalf("first run: %+v", r)
	}
	r = runCode(t, c, "f()", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "42" || len(r.counts) != 1 || r.counts[0] != 2 {
		t.Fatalf("state: %+v", r)
	}
	// Imports persist; the last expression is the result, in jshell's
	// notation.
	r = runCode(t, c, "List<Integer> l = new ArrayList<>(List.of(1, 2));\nl.add(3);\nl", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "[1, 2, 3]" {
		t.Fatalf("import and result: %+v", r)
	}
	if r = runCode(t, c, "\"a\".repeat(3)", 0); r.results[0]["text"] != `"aaa"` {
		t.Errorf("string result %v", r.results)
	}
	// A declaration may be replaced by a later cell.
	if r = runCode(t, c, "int f() { return 7; }\nf()", 0); len(r.results) != 1 || r.results[0]["text"] != "7" {
		t.Errorf("redeclared method: %+v", r)
	}
	if r = runCode(t, c, "System.err.print(\"oops\");", 0); r.stderr != "oops" || len(r.results) != 0 {
		t.Errorf("stderr run: %+v", r)
	}

	// An exception: its class, message and the frames of the code only.
	r = runCode(t, c, "int g() { return 1 / 0; }\ng()", 0)
	if r.err == nil || r.err.EName != "java.lang.ArithmeticException" || r.err.EValue != "/ by zero" || !r.statusErr {
		t.Fatalf("exception: %+v", r)
	}
	tb := strings.Join(r.err.Traceback, "\n")
	if !strings.HasPrefix(tb, "java.lang.ArithmeticException: / by zero\n\tat g(#") || strings.Contains(tb, "jdk.jshell") || strings.Contains(tb, "reflect") {
		t.Errorf("traceback:\n%s", tb)
	}
	r = runCode(t, c, "throw new IllegalStateException(\"bad\", new RuntimeException(\"root\"));", 0)
	if r.err == nil || r.err.EName != "java.lang.IllegalStateException" || !strings.Contains(strings.Join(r.err.Traceback, "\n"), "Caused by: java.lang.RuntimeException: root") {
		t.Errorf("cause: %+v", r)
	}

	// A compile error: the line in the cell and a caret; the snippets
	// before it ran, those after it did not.
	r = runCode(t, c, "int before = 1;\nint y = ;\nint after = 2;", 0)
	if r.err == nil || r.err.EName != "CompilationException" || r.err.EValue != "illegal start of expression" {
		t.Fatalf("compile error: %+v", r)
	}
	if want := []string{"cell line 2: illegal start of expression", "int y = ;", "        ^"}; strings.Join(r.err.Traceback, "\n") != strings.Join(want, "\n") {
		t.Errorf("compile error traceback %q, want %q", r.err.Traceback, want)
	}
	if r = runCode(t, c, "before", 0); len(r.results) != 1 || r.results[0]["text"] != "1" {
		t.Errorf("snippet before the error: %+v", r)
	}
	if r = runCode(t, c, "after", 0); r.err == nil || r.err.EName != "CompilationException" || !strings.Contains(r.err.EValue, "cannot find symbol") {
		t.Errorf("snippet after the error ran: %+v", r)
	}
}

func TestJavaStreamsOutput(t *testing.T) {
	c := startContext(t, "java")
	// The first line arrives while the cell still runs.
	var first time.Time
	start := time.Now()
	r := runCode(t, c, "System.out.println(\"one\");\nThread.sleep(700);\nSystem.out.println(\"two\");", 0)
	for _, ev := range r.events {
		if ev.Type == "stdout" && first.IsZero() {
			first = time.UnixMilli(ev.Timestamp)
		}
	}
	if r.stdout != "one\ntwo\n" || first.IsZero() || first.Sub(start) > time.Since(start)-500*time.Millisecond {
		t.Errorf("streaming: %+v (first output after %v of %v)", r, first.Sub(start), time.Since(start))
	}
	// Output without a newline is there before the run ends.
	if r = runCode(t, c, "System.out.print(\"no newline\");", 0); r.stdout != "no newline" {
		t.Errorf("unflushed output: %+v", r)
	}
}

func TestJavaInterruptAndTimeout(t *testing.T) {
	c := startContext(t, "java")
	runCode(t, c, "int y = 5;", 0)
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "while (true) { Thread.sleep(10); }", 0) }()
	waitBusy(t, c)
	if !c.Interrupt() {
		t.Fatal("Interrupt saw no run")
	}
	r := <-done
	if r.err == nil || r.err.EName != "Interrupted" {
		t.Fatalf("interrupted run: %+v", r)
	}
	if r := runCode(t, c, "y", 0); len(r.results) != 1 || r.results[0]["text"] != "5" {
		t.Fatalf("state lost after interrupt: %+v", r)
	}
	// A busy loop, stopped by the run's timeout.
	start := time.Now()
	r = runCode(t, c, "long n = 0; while (true) { n++; }", 500*time.Millisecond)
	if r.err == nil || r.err.EName != ENameTimeout || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %+v after %v", r, time.Since(start))
	}
	if r := runCode(t, c, "y + 1", 0); len(r.results) != 1 || r.results[0]["text"] != "6" {
		t.Fatalf("state lost after timeout: %+v", r)
	}
	// An interrupt after a run ended does not stop the next one.
	c.interrupts.Write([]byte{'\n'})
	if r := runCode(t, c, "Thread.sleep(200);\ny * 2", 0); r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "10" {
		t.Fatalf("a stale interrupt stopped a run: %+v", r)
	}
}

func TestJavaExitKillsContext(t *testing.T) {
	c := startContext(t, "java")
	r := runCode(t, c, "System.out.println(\"bye\");\nSystem.exit(3);", 0)
	if r.stdout != "bye\n" || r.err == nil || r.err.EName != ENameContextDied || !strings.Contains(r.err.EValue, "exit status 3") {
		t.Fatalf("exit: %+v", r)
	}
}
