package api

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/codes.golden from the code constants")

// codeConstants returns every Code* constant of package api as
// "Name = "value"" lines, in source order, failing on one whose value is
// not a plain string literal (the golden file pins literals only).
func codeConstants(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Code") {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Errorf("%s: %s is not a string literal; a code is spelled out in full", fset.Position(id.Pos()), id.Name)
						continue
					}
					lines = append(lines, id.Name+" = "+lit.Value)
				}
			}
		}
	}
	return lines
}

// TestCodesGolden pins the spelling of every error code: clients compare
// codes exactly, so changing one is a change of the wire protocol, made
// on purpose with go test -run TestCodesGolden -update.
func TestCodesGolden(t *testing.T) {
	lines := codeConstants(t)
	if len(lines) == 0 {
		t.Fatal("found no Code constants")
	}
	seen := map[string]string{}
	for _, l := range lines {
		name, value, _ := strings.Cut(l, " = ")
		if other, ok := seen[value]; ok {
			t.Errorf("%s and %s are both %s", other, name, value)
		}
		seen[value] = name
	}
	got := strings.Join(lines, "\n") + "\n"
	const golden = "testdata/codes.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		gotSet, wantSet := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for _, l := range gotSet {
			if l != "" && !slices.Contains(wantSet, l) {
				t.Errorf("not in %s: %s", golden, l)
			}
		}
		for _, l := range wantSet {
			if l != "" && !slices.Contains(gotSet, l) {
				t.Errorf("in %s but not in the code: %s", golden, l)
			}
		}
		t.Errorf("the codes differ from %s (order included); if the change is meant, run go test -run TestCodesGolden -update", golden)
	}
}

// codeRE matches what looks like a namespaced error code.
var codeRE = regexp.MustCompile(`[A-Z_]+::[A-Z_]+`)

// TestNoLiteralCodes keeps every namespaced error code in this package:
// a string literal in the module's Go code, tests included, that looks
// like one (DOCKER::SANDBOX_NOT_FOUND) must be a constant here instead,
// so that a code has one spelling and a client compares against that.
// Golden files that must spell codes out are data under testdata/, which
// this test does not read.
func TestNoLiteralCodes(t *testing.T) {
	moduleLiterals(t, func(pos string, lit *ast.BasicLit, s string) {
		if lit.Kind == token.STRING {
			if code := codeRE.FindString(s); code != "" {
				t.Errorf("%s: literal error code %s: use its constant in package api (api/codes.go)", pos, code)
			}
		}
	})
}

// TestNoLiteralExecdPort keeps execd's port in one constant, ExecdPort:
// the number may not appear in the module's Go code elsewhere, as a
// number or inside a string.
func TestNoLiteralExecdPort(t *testing.T) {
	port := strconv.Itoa(ExecdPort)
	moduleLiterals(t, func(pos string, lit *ast.BasicLit, s string) {
		if (lit.Kind == token.INT && s == port) || (lit.Kind == token.STRING && strings.Contains(s, port)) {
			t.Errorf("%s: %s: use api.ExecdPort", pos, lit.Value)
		}
	})
}

// moduleLiterals calls f with each string and integer literal of the
// module's Go files outside this package: its position relative to the
// module root, the literal, and its value (a string unquoted).
func moduleLiterals(t *testing.T, f func(pos string, lit *ast.BasicLit, value string)) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		if filepath.Dir(path) == here && (file.Name.Name == "api" || file.Name.Name == "api_test") {
			return nil
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || (lit.Kind != token.STRING && lit.Kind != token.INT) {
				return true
			}
			p := fset.Position(lit.Pos())
			rel, _ := filepath.Rel(root, p.Filename)
			pos := fmt.Sprintf("%s:%d", rel, p.Line)
			value := lit.Value
			if lit.Kind == token.STRING {
				if value, err = strconv.Unquote(lit.Value); err != nil {
					t.Errorf("%s: unquote %s: %v", pos, lit.Value, err)
					return true
				}
			}
			f(pos, lit, value)
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read only %d Go files under %s; the walk missed the module", files, root)
	}
}
