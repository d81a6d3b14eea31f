package interp

import (
	"testing"
	"time"
)

func TestJavaStateResultsAndErrors(t *testing.T) {
	start := time.Now()
	c := startContext(t, "java")
	t.Logf("java context started in %v, version %s", time.Since(start), c.Version())
	for _, code := range []string{"1+1", "import java.util.*;\nint x = 40;\nint f() { return x + 2; }\nSystem.out.println(\"hi\");", "f()", "\"a\".repeat(3)",
		"List<Integer> l = new ArrayList<>(List.of(1,2));\nl.add(3);\nl", "int g() { return 1/0; }\ng()", "int y = ;", "int z = 1\nz + 1", "System.err.print(\"oops\")", "zz"} {
		t0 := time.Now()
		r := runCode(t, c, code, 0)
		t.Logf("%q (%v): out=%q err=%q results=%v error=%+v", code, time.Since(t0), r.stdout, r.stderr, r.results, r.err)
	}
}
