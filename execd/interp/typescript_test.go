package interp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTypescriptStateResultsAndErrors(t *testing.T) {
	c := startContext(t, "typescript")
	if c.Version() == "" || !strings.Contains(c.Version(), ".") {
		t.Errorf("version %q", c.Version())
	}
	// Types are erased; declarations persist.
	r := runCode(t, c, "const x: number = 40\nfunction f(): number { return x + 2 }\ninterface P { a: number }\nconsole.log('hi')", 0)
	if r.stdout != "hi\n" || len(r.results) != 0 || r.err != nil {
		t.Fatalf("first run: %+v", r)
	}
	r = runCode(t, c, "f()", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "42" || r.counts[0] != 2 {
		t.Fatalf("state: %+v", r)
	}
	// Imports bind the names they say, for later cells too; type-only
	// imports vanish.
	r = runCode(t, c, "import * as fs from 'fs'\nimport path, { join as j } from 'path'\nimport type { Stats } from 'fs'\nlet q: P = { a: 1 }", 0)
	if r.err != nil {
		t.Fatalf("imports: %+v", r)
	}
	r = runCode(t, c, "[fs.existsSync('/'), path.sep, j('a', 'b'), q.a]", 0)
	if len(r.results) != 1 || r.results[0]["text"] != "[ true, '/', 'a/b', 1 ]" {
		t.Fatalf("imported names: %+v", r)
	}
	// enums, an object literal, top-level await, a redeclared const.
	for code, want := range map[string]string{
		"enum E { A, B }\nE.B": "1",
		"{ a: 1 }":             "{ a: 1 }",
		"await new Promise<void>((r) => setTimeout(r, 10))\n'w'": "'w'",
		"const x: string = 'again'\nx":                           "'again'",
		"export const z = 3\nz":                                  "3",
	} {
		if r := runCode(t, c, code, 0); r.err != nil || len(r.results) != 1 || r.results[0]["text"] != want {
			t.Errorf("%q: %+v, want %s", code, r, want)
		}
	}

	// A syntax error: the cell's line and a caret, and nothing runs.
	r = runCode(t, c, "globalThis.ran = 1\nlet y: = 3", 0)
	if r.err == nil || r.err.EName != "SyntaxError" || r.err.EValue != "Type expected." {
		t.Fatalf("syntax error: %+v", r)
	}
	if want := []string{"<cell-10>:2", "let y: = 3", "       ^", "", "SyntaxError: Type expected. (TS1110)"}; strings.Join(r.err.Traceback, "\n") != strings.Join(want, "\n") {
		t.Errorf("syntax error traceback %q, want %q", r.err.Traceback, want)
	}
	if r = runCode(t, c, "typeof globalThis.ran", 0); r.results[0]["text"] != "'undefined'" {
		t.Errorf("a cell that does not parse ran: %+v", r)
	}
	// A thrown error with its stack, in the cell's lines.
	r = runCode(t, c, "function g(): number {\n  throw new TypeError('bad')\n}\ng()", 0)
	if r.err == nil || r.err.EName != "TypeError" || r.err.EValue != "bad" {
		t.Fatalf("error: %+v", r)
	}
	if tb := strings.Join(r.err.Traceback, "\n"); !strings.Contains(tb, "at g (<cell-12>:2:") || strings.Contains(tb, "javascript.js") {
		t.Errorf("traceback:\n%s", tb)
	}
	// Types are not checked.
	if r = runCode(t, c, "const n: number = 'text' as any as number\nn", 0); r.err != nil || r.results[0]["text"] != "'text'" {
		t.Errorf("unchecked types: %+v", r)
	}
}

func TestTypescriptInterruptAndTimeout(t *testing.T) {
	c := startContext(t, "typescript")
	runCode(t, c, "const y: number = 5", 0)
	done := make(chan *runResult)
	go func() { done <- runCode(t, c, "for (;;) {}", 0) }()
	waitBusy(t, c)
	if !c.Interrupt() {
		t.Fatal("Interrupt saw no run")
	}
	if r := <-done; r.err == nil || r.err.EName != "Interrupted" {
		t.Fatalf("interrupted run: %+v", r)
	}
	start := time.Now()
	r := runCode(t, c, "let i: number = 0\nwhile (true) { i++ }", 300*time.Millisecond)
	if r.err == nil || r.err.EName != ENameTimeout || time.Since(start) > 3*time.Second {
		t.Fatalf("timeout: %+v after %v", r, time.Since(start))
	}
	if r := runCode(t, c, "y + 1", 0); len(r.results) != 1 || r.results[0]["text"] != "6" {
		t.Fatalf("state lost: %+v", r)
	}
}

func TestTypescriptStreamsOutput(t *testing.T) {
	c := startContext(t, "typescript")
	start := time.Now()
	r := runCode(t, c, "console.log('one')\nawait new Promise((r) => setTimeout(r, 700))\nconsole.log('two')", 0)
	var first time.Time
	for _, ev := range r.events {
		if ev.Type == "stdout" && first.IsZero() {
			first = time.UnixMilli(ev.Timestamp)
		}
	}
	if r.stdout != "one\ntwo\n" || first.IsZero() || first.Sub(start) > time.Since(start)-500*time.Millisecond {
		t.Errorf("streaming: %+v (first output after %v of %v)", r, first.Sub(start), time.Since(start))
	}
}

// A typescript module in the working directory's node_modules is the one
// used, before a system-wide one.
func TestTypescriptModuleFromWorkingDirectory(t *testing.T) {
	needInterpreter(t, "node")
	dir := t.TempDir()
	mod := filepath.Join(dir, "node_modules", "typescript")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		t.Fatal(err)
	}
	fake := "exports.version = 'local-0.0';\nexports.ScriptTarget = {}; exports.ModuleKind = {}; exports.DiagnosticCategory = { Error: 1 };\n" +
		"exports.createSourceFile = () => ({ statements: [] });\n" +
		"exports.transpileModule = (src) => ({ outputText: src.replace(/: number/g, '') + ' // local', diagnostics: [] });\n"
	if err := os.WriteFile(filepath.Join(mod, "index.js"), []byte(fake), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Start(t.Context(), Options{Language: "typescript", Dir: dir, Env: os.Environ(), Supervisor: testSupervisor(), DriverDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if c.Version() != "local-0.0" {
		t.Errorf("version %q: not the working directory's module", c.Version())
	}
	if r := runCode(t, c, "const a: number = 2\na * 21", 0); len(r.results) != 1 || r.results[0]["text"] != "42" {
		t.Errorf("run: %+v", r)
	}
}
