package deptest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testModule writes a module example.test/m where a imports b, b imports
// c, and the tests of a (an external test package) and of c (in the
// package) import d, and returns its directory.
func testModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":      "module example.test/m\n\ngo 1.22\n",
		"a/a.go":      "package a\n\nimport _ \"example.test/m/b\"\n",
		"a/a_test.go": "package a_test\n\nimport _ \"example.test/m/d\"\n",
		"b/b.go":      "package b\n\nimport _ \"example.test/m/c\"\n",
		"c/c.go":      "package c\n\nimport _ \"strings\"\n",
		"c/c_test.go": "package c\n\nimport _ \"example.test/m/d\"\n",
		"d/d.go":      "package d\n",
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestChecker(t *testing.T) {
	mod := testModule(t)
	a, c := filepath.Join(mod, "a"), filepath.Join(mod, "c")
	tests := []struct {
		name    string
		checker Checker
		want    []string // each a substring of one problem; none: no problem
	}{
		{"forbidden, through another package", Checker{Dir: a, Forbid: map[string]string{"c": "c is heavy"}},
			[]string{"a must not depend on c (c): c is heavy; it does: a → b → c"}},
		{"forbidden with a pattern", Checker{Dir: a, Forbid: map[string]string{"c/...": "no c"}},
			[]string{"a must not depend on c/... (c)"}},
		{"test dependency, tests not asked", Checker{Dir: a, Forbid: map[string]string{"d": "no d"}}, nil},
		{"test dependency, tests asked", Checker{Dir: a, Tests: true, Forbid: map[string]string{"d": "no d"}},
			[]string{"a must not depend on d (d): no d; it or its tests does: a_test → d"}},
		{"in-package test dependency", Checker{Dir: c, Tests: true, Forbid: map[string]string{"d": "no d"}},
			[]string{"c must not depend on d (d): no d; it or its tests does: c (tests) → d"}},
		{"not on the list", Checker{Dir: a, Allow: map[string]string{"b": "b is fine"}},
			[]string{"a depends on c, which is not on its list (b); it does: a → b → c"}},
		{"all on the list", Checker{Dir: a, Allow: map[string]string{"b": "", "c": ""}}, nil},
		{"the list with tests", Checker{Dir: a, Tests: true, Allow: map[string]string{"b": "", "c": ""}},
			[]string{"a depends on d, which is not on its list"}},
		{"standard library only, kept", Checker{Dir: c, Allow: map[string]string{}}, nil},
		{"standard library only, broken", Checker{Dir: a, Allow: map[string]string{}},
			[]string{"a depends on b,", "a depends on c,"}},
		{"a rule about nothing", Checker{Dir: c, Forbid: map[string]string{"gone/...": "moved"}},
			[]string{"the rule about gone/... names no package of this module"}},
		{"full import paths", Checker{Dir: a, Forbid: map[string]string{"example.test/m/b": "no b"}},
			[]string{"a must not depend on example.test/m/b (b)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.checker.problems()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("problems %q, want %d like %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %q does not say %q", got[i], w)
				}
			}
		})
	}
}

// TestCheckerReal runs on this module: its own package has nothing but
// the standard library.
func TestCheckerReal(t *testing.T) {
	Checker{Tests: true, Allow: map[string]string{}}.Check(t)
	got, err := Checker{Forbid: map[string]string{"sandbox": "a rule that holds"}}.problems()
	if err != nil || len(got) != 0 {
		t.Fatalf("problems %q, %v", got, err)
	}
}
