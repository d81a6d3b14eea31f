package api

import (
	"flag"
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
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		if filepath.Dir(path) == here && (f.Name.Name == "api" || f.Name.Name == "api_test") {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Errorf("%s: unquote %s: %v", fset.Position(lit.Pos()), lit.Value, err)
				return true
			}
			if code := codeRE.FindString(s); code != "" {
				rel, _ := filepath.Rel(root, fset.Position(lit.Pos()).Filename)
				t.Errorf("%s:%d: literal error code %s: use its constant in package api (api/codes.go)", rel, fset.Position(lit.Pos()).Line, code)
			}
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
	t.Logf("read %d Go files", files)
}
