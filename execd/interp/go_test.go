package interp

import (
	"strings"
	"testing"
	"time"
)

func TestGoStateResultsAndErrors(t *testing.T) {
	c := startContext(t, "go")
	if !strings.HasPrefix(c.Version(), "1.") {
		t.Errorf("version %q", c.Version())
	}
	r := runCode(t, c, "import \"fmt\"\nimport \"strings\"\n\ntype P struct{ X int }\n\nfunc (p P) String() string { return fmt.Sprintf(\"P(%d)\", p.X) }\n\nfunc f() int { return 40 + 2 }\n\nfmt.Println(\"hi\", f())", 0)
	if r.stdout != "hi 42\n" || len(r.results) != 0 || r.err != nil {
		t.Fatalf("first run: %+v", r)
	}
	// Declarations persist, the statements of earlier runs do not run
	// again; the unused import strings does not fail the build; a final
	// expression is the result.
	r = runCode(t, c, "p := P{f()}\np", 0)
	if r.stdout != "" || len(r.results) != 1 || r.results[0]["text"] != "P(42)" || len(r.counts) != 1 || r.counts[0] != 2 {
		t.Fatalf("state: %+v", r)
	}
	if r = runCode(t, c, "strings.Repeat(\"a\", 3)", 0); r.err != nil || len(r.results) != 0 {
		// A call is not shown: its value may be none.
		t.Errorf("a call as the last statement: %+v", r)
	}
	if r = runCode(t, c, "s := strings.Repeat(\"a\", 3)\ns", 0); len(r.results) != 1 || r.results[0]["text"] != "aaa" {
		t.Errorf("string result: %+v", r)
	}
	// A later declaration of a name replaces the earlier one; package
	// vars and consts persist, initialized anew in every run.
	r = runCode(t, c, "func f() int { return 7 }\nconst k = 3\nvar v = f() * k\nv", 0)
	if r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "21" {
		t.Fatalf("redeclared func: %+v", r)
	}
	if r = runCode(t, c, "v++\nfmt.Println(v, k)", 0); r.stdout != "22 3\n" {
		t.Errorf("package var: %+v", r)
	}
	if r = runCode(t, c, "fmt.Println(v)", 0); r.stdout != "21\n" {
		t.Errorf("package var in the next run: %+v", r)
	}
	if r = runCode(t, c, "import \"os\"\nfmt.Fprint(os.Stderr, \"oops\")", 0); r.stderr != "oops" || r.err != nil {
		t.Errorf("stderr run: %+v", r)
	}
	// Statements with clauses; a comment after the last expression.
	if r = runCode(t, c, "sum := 0\nfor i := 0; i < 4; i++ {\n\tif j := i; j > 0 {\n\t\tsum += j\n\t}\n}\nsum // the total", 0); len(r.results) != 1 || r.results[0]["text"] != "6" {
		t.Errorf("for and if with clauses: %+v", r)
	}
	// The cell's own main runs in its run only.
	if r = runCode(t, c, "func main() {\n\tfmt.Println(\"main\", f())\n}", 0); r.stdout != "main 7\n" || r.err != nil {
		t.Errorf("func main: %+v", r)
	}

	// Compile errors, at their positions in the cell, in order; the
	// declarations of a cell that does not compile are not kept.
	r = runCode(t, c, "func g() int { return 1 }\nx := 1\ny := undefinedName + 2", 0)
	if r.err == nil || r.err.EName != "CompileError" || !r.statusErr {
		t.Fatalf("compile error: %+v", r)
	}
	tb := strings.Join(r.err.Traceback, "\n")
	// (Go 1.20 and later say "declared and not used: x" and report y too,
	// earlier ones "x declared but not used".)
	n := len(r.err.Traceback)
	if n < 2 || !strings.HasPrefix(tb, "cell line 2:1: ") || !strings.Contains(r.err.EValue, "not used") ||
		r.err.Traceback[n-1] != "cell line 3:6: undefined: undefinedName" {
		t.Errorf("compile error traceback:\n%s", tb)
	}
	if r = runCode(t, c, "g()", 0); r.err == nil || !strings.Contains(strings.Join(r.err.Traceback, "\n"), "undefined: g") {
		t.Errorf("a failed cell's declaration was kept: %+v", r)
	}
	// A syntax error.
	r = runCode(t, c, "a := 1\nif a == { }", 0)
	if r.err == nil || r.err.EName != "CompileError" || !strings.HasPrefix(r.err.Traceback[0], "cell line 2:") {
		t.Errorf("syntax error: %+v", r)
	}
	// An error in an earlier cell's declaration names that cell.
	r = runCode(t, c, "type P int\n1", 0)
	if r.err == nil || !strings.Contains(strings.Join(r.err.Traceback, "\n"), "cell [1] line 6:") {
		t.Errorf("error in an earlier cell: %+v", r)
	}

	// A panic: its value and the frames of the cells.
	r = runCode(t, c, "func h(s []int) int { return s[3] }\n\nfmt.Println(\"before\")\nh(nil)", 0)
	if r.err == nil || r.err.EName != "panic" || !strings.Contains(r.err.EValue, "index out of range [3] with length 0") || r.stdout != "before\n" {
		t.Fatalf("panic: %+v", r)
	}
	tb = strings.Join(r.err.Traceback, "\n")
	if !strings.Contains(tb, "at h() (cell line 1)") || !strings.Contains(tb, "at main() (cell line 4)") || strings.Contains(tb, "runtime/") {
		t.Errorf("panic traceback:\n%s", tb)
	}
	// A cell that compiled keeps its declarations, even if it panicked.
	if r = runCode(t, c, "w := h([]int{1, 2, 3, 4})\nw", 0); r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "4" {
		t.Errorf("declaration of a cell that panicked: %+v", r)
	}
	// A cell that ends in the middle of a statement.
	r = runCode(t, c, "a := 1\na +", 0)
	if r.err == nil || r.err.EName != "CompileError" || !strings.HasPrefix(r.err.Traceback[0], "cell line 2: the cell ends in the middle of a statement") {
		t.Errorf("incomplete cell: %+v", r)
	}
	// os.Exit ends the program, not the context.
	r = runCode(t, c, "fmt.Println(\"bye\")\nos.Exit(3)", 0)
	if r.stdout != "bye\n" || r.err == nil || r.err.EName != "ExitError" || r.err.EValue != "exit status 3" {
		t.Fatalf("exit: %+v", r)
	}
	if r = runCode(t, c, "f()*6", 0); len(r.results) != 1 || r.results[0]["text"] != "42" {
		t.Fatalf("context after exit: %+v", r)
	}
}

func TestGoStreamsOutput(t *testing.T) {
	c := startContext(t, "go")
	runCode(t, c, "import (\n\t\"fmt\"\n\t\"time\"\n)", 0)
	var first time.Time
	start := time.Now()
	r := runCode(t, c, "fmt.Println(\"one\")\ntime.Sleep(700 * time.Millisecond)\nfmt.Println(\"two\")", 0)
	for _, ev := range r.events {
		if ev.Type == "stdout" && first.IsZero() {
			first = time.UnixMilli(ev.Timestamp)
		}
	}
	if r.stdout != "one\ntwo\n" || first.IsZero() || first.Sub(start) > time.Since(start)-500*time.Millisecond {
		t.Errorf("streaming: %+v (first output after %v of %v)", r, first.Sub(start), time.Since(start))
	}
	if r = runCode(t, c, "fmt.Print(\"no newline\")", 0); r.stdout != "no newline" {
		t.Errorf("unflushed output: %+v", r)
	}
}

func TestGoInterruptAndTimeout(t *testing.T) {
	c := startContext(t, "go")
	runCode(t, c, "import \"time\"\nconst y = 5", 0)
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "for {\n\ttime.Sleep(10 * time.Millisecond)\n}", 0) }()
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
	r = runCode(t, c, "n := 0\nfor {\n\tn++\n}", 1500*time.Millisecond)
	if r.err == nil || r.err.EName != ENameTimeout || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout: %+v after %v", r, time.Since(start))
	}
	if r := runCode(t, c, "y + 1", 0); len(r.results) != 1 || r.results[0]["text"] != "6" {
		t.Fatalf("state lost after timeout: %+v", r)
	}
	// A timeout that comes while the program is being built.
	start = time.Now()
	if r = runCode(t, c, "func z() int { return 1 }\ny", 50*time.Millisecond); r.err == nil || r.err.EName != ENameTimeout || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout while building: %+v after %v", r, time.Since(start))
	}
	if r := runCode(t, c, "y", 0); r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "5" {
		t.Fatalf("context after a timeout while building: %+v", r)
	}
	// An interrupt after a run ended does not stop the next one.
	c.interrupts.Write([]byte{'\n'})
	if r := runCode(t, c, "time.Sleep(200 * time.Millisecond)\ny * 2", 0); r.err != nil || len(r.results) != 1 || r.results[0]["text"] != "10" {
		t.Fatalf("a stale interrupt stopped a run: %+v", r)
	}
}
