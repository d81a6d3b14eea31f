package main

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	code := "import \"fmt\"\n\nfunc f() {\n\tif true {\n\t}\n}\nx := []int{\n\t1,\n}; fmt.Println(x) // note\n1 +"
	units, err := split(code, 4)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range units {
		got = append(got, u.src)
		if u.cell != 4 {
			t.Errorf("unit %q: cell %d", u.src, u.cell)
		}
	}
	want := []string{"import \"fmt\"", "func f() {\n\tif true {\n\t}\n}", "x := []int{\n\t1,\n};", "fmt.Println(x)", "1 +"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("units %q, want %q", got, want)
	}
	if u := units[3]; u.line != 9 || u.col != 4 {
		t.Errorf("position of %q: %d:%d", u.src, u.line, u.col)
	}
	units, _ = split("for i := 0; i < 2; i++ {\n}\nif x := 1; x > 0 {\n} else if y := 2; y > 1 {\n}\nswitch z := 3; z {\n}; a := 1", 1)
	got = nil
	for _, u := range units {
		got = append(got, u.src)
	}
	if want := []string{"for i := 0; i < 2; i++ {\n}", "if x := 1; x > 0 {\n} else if y := 2; y > 1 {\n}", "switch z := 3; z {\n};", "a := 1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("statements with clauses: %q, want %q", got, want)
	}
	if _, err := split("s := \"unterminated", 1); err == nil {
		t.Error("a bad token was not reported")
	}
}

func TestLocalNameAndReplace(t *testing.T) {
	for path, want := range map[string]string{"fmt": "fmt", "math/rand": "rand", "math/rand/v2": "rand", "gopkg.in/yaml.v3": "yaml"} {
		if got := (imp{path: path}).localName(); got != want {
			t.Errorf("%s: %s, want %s", path, got, want)
		}
	}
	imports := replaceImport(nil, imp{path: "math/rand"})
	imports = replaceImport(imports, imp{path: "fmt"})
	imports = replaceImport(imports, imp{path: "crypto/rand"})
	imports = replaceImport(imports, imp{name: "_", path: "embed"})
	var paths []string
	for _, i := range imports {
		paths = append(paths, i.path)
	}
	if strings.Join(paths, " ") != "fmt crypto/rand embed" {
		t.Errorf("imports %v", paths)
	}
}

func TestBuildErrors(t *testing.T) {
	out := "# command-line-arguments\n./cell3:2:6: undefined: y\ncell1:4:1: x declared but not used\ncell3:1:1: a declared but not used\nosb.go:1:1: something else\n"
	got := buildErrors(out, 3)
	want := []string{"cell [1] line 4:1: x declared but not used", "cell line 1:1: a declared but not used", "cell line 2:6: undefined: y", "osb.go:1:1: something else"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
