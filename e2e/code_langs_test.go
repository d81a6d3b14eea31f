package e2e

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// TestCodeLanguagesInOneSandbox runs python, javascript, typescript, java
// and go contexts of one code-interpreter sandbox at the same time: each
// keeps its state, reports its errors, and survives the interrupt that
// ends a run at its timeout.
func TestCodeLanguagesInOneSandbox(t *testing.T) {
	testenv.MustHaveImage(t, interpreterImage)
	s := startServer(t, serverOptions{})
	var sb struct{ ID string }
	s.osb("sandbox", "create", "-i", interpreterImage, "-t", "10m", "-o", "json").json(t, &sb)
	id := sb.ID

	type lang struct {
		name        string
		set, get    string // get prints 42 once set has run
		fail, ename string // a cell that fails, and what its error names
		loop        string // a cell that runs until interrupted
	}
	langs := []lang{
		{"python", "x = 6 * 7", "x", "1 / 0", "ZeroDivisionError", "while True: pass"},
		{"javascript", "let x = 6 * 7", "x", "null.f()", "TypeError", "for (;;) {}"},
		{"typescript", "const x: number = 6 * 7\ninterface P { a: number }", "x", "let y: = 3", "SyntaxError", "while (true) {}"},
		{"java", "import java.util.*;\nint x = 6 * 7;", "x", "int f() { return 1 / 0; }\nf()", "java.lang.ArithmeticException", "while (true) {}"},
		// Declarations persist in go, values do not: x is a package-level
		// var, initialized anew in every run.
		{"go", "import \"fmt\"\nvar x = 6 * 7\nfmt.Print()", "x", "var s []int\ns[1] = 2", "panic", "for {\n}"},
	}

	// The contexts are created one after the other (five interpreters
	// starting at once on a small, busy machine can pass the start
	// timeout); then runs, errors and interrupts of the five languages
	// overlap.
	results := make([][]osbResult, len(langs))
	ids := make([]string, len(langs))
	for i, l := range langs {
		var cc struct{ ID string }
		r := s.osb("code", "context", "create", id, "-l", l.name, "-o", "json")
		results[i] = append(results[i], r)
		if r.code == 0 && json.Unmarshal([]byte(r.out), &cc) == nil {
			ids[i] = cc.ID
		}
	}
	var wg sync.WaitGroup
	for i, l := range langs {
		if ids[i] == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			run := func(args ...string) {
				results[i] = append(results[i], s.osb(append([]string{"code", "run", id, "--context-id", ids[i]}, args...)...))
			}
			run("-c", l.set)
			run("-c", l.get)
			run("-c", l.fail)
			run("--timeout", "2s", "-c", l.loop)
			run("-c", l.get) // the state outlived the interrupt
		}()
	}
	wg.Wait()

	for i, l := range langs {
		rs := results[i]
		if len(rs) != 6 {
			t.Errorf("%s: context create: exit %d, stderr %q", l.name, rs[0].code, rs[0].err)
			continue
		}
		rs[1].exits(t, 0, "", "")
		rs[2].exits(t, 0, "42\n", "")
		if rs[3].code != 1 || !strings.Contains(rs[3].err, l.ename) {
			t.Errorf("%s error: exit %d, stderr %q; want exit 1 and %s", l.name, rs[3].code, rs[3].err, l.ename)
		}
		if rs[4].code != 1 || !strings.Contains(rs[4].err, "TimeoutError") {
			t.Errorf("%s interrupted at its timeout: exit %d, stderr %q", l.name, rs[4].code, rs[4].err)
		}
		rs[5].exits(t, 0, "42\n", "")
	}

	// The default context of a language is started on first use.
	s.osb("code", "run", id, "-l", "java", "-c", "String.join(\"-\", List.of(\"a\", \"b\"))").exits(t, 1, "", "*")
	s.osb("code", "run", id, "-l", "java", "-c", "String.join(\"-\", java.util.List.of(\"a\", \"b\"))").exits(t, 0, "\"a-b\"\n", "")
	s.osb("code", "run", id, "-l", "typescript", "-c", "const s: string[] = ['a', 'b']\ns.join('-')").exits(t, 0, "'a-b'\n", "")
}
