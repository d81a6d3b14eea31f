package interp

import (
	"testing"
	"time"
)

func TestTypescriptScratch(t *testing.T) {
	c := startContext(t, "typescript")
	t.Logf("version %s", c.Version())
	for _, code := range []string{"1+1", "const x: number = 40\nfunction f(): number { return x + 2 }", "f()",
		"import * as fs from 'fs'\nimport path, { join as j } from 'path'\nimport type { Stats } from 'fs'", "[fs.existsSync('/'), path.sep, j('a','b')]",
		"interface A { a: number }\nlet q: A = {a: 1}\nq", "let y: = 3", "{a: 1}", "enum E { A, B }\nE.B", "await new Promise(r => setTimeout(r, 10));\n7",
		"function g(): number { throw new TypeError('bad') }\ng()", "console.log('hi'); console.error('err')", "export const z = 1\nz", "let w: number = 1; w = 2; undefinedVar = 3"} {
		t0 := time.Now()
		r := runCode(t, c, code, 0)
		t.Logf("%q (%v): out=%q err=%q results=%v error=%+v", code, time.Since(t0), r.stdout, r.stderr, r.results, r.err)
	}
}
