// Package deptest checks what a package depends on, so that the import
// rules of the project's layout are tests: each package's deps_test.go
// states its rules with a reason each, and Check fails on a dependency
// that breaks one, naming the chain of imports that brought it in.
//
// Only tests import deptest.
package deptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// Checker is the rules of one package: the package in the test's
// working directory, or in Dir.
//
// A pattern names an import path, or with "/..." an import path and
// every package below it. A pattern whose first element has no dot is
// relative to this module ("runtime/...", "api"); any other is a full
// import path ("github.com/coder/websocket/..."). The standard library is
// always allowed.
type Checker struct {
	// Dir is the package's directory. Default: the working directory,
	// which go test sets to the package under test.
	Dir string
	// Tests adds what the package's tests depend on (go list -deps
	// -test): the rules then hold for test code too.
	Tests bool
	// Allow, if not nil, lists everything outside the standard library
	// the package may depend on: pattern → why it may. Empty but not
	// nil: the standard library only.
	Allow map[string]string
	// AllowModuleOnly limits Allow to this module's packages; other
	// modules' packages are then not checked by it.
	AllowModuleOnly bool
	// Forbid lists what the package must not depend on: pattern → why
	// not.
	Forbid map[string]string
}

// Check reports each dependency of the package that breaks c's rules,
// and each module-relative pattern that names no package any more (a
// rule about a package that moved would hold forever unnoticed).
func (c Checker) Check(t testing.TB) {
	t.Helper()
	problems, err := c.problems()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// pkg is what go list -json says of one package.
type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string
	Module     *struct{ Path, Dir string }
}

// graph is a package's dependencies, test variants folded into the
// packages they are variants of.
type graph struct {
	root    string              // the package checked
	module  string              // its module path
	dir     string              // its module's directory
	imports map[string][]string // import path → what it imports
	std     map[string]bool     // standard library packages
}

// testsSuffix names the package compiled with its in-package tests.
const testsSuffix = " (tests)"

// plain strips go list's test-variant suffix: "p [p.test]" is p.
func plain(path string) string {
	path, _, _ = strings.Cut(path, " ")
	return path
}

func (c Checker) load() (*graph, error) {
	args := []string{"list", "-deps", "-json"}
	if c.Tests {
		args = append(args, "-test")
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Dir = c.Dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	root := exec.Command("go", "list", "-f", "{{.ImportPath}}", ".")
	root.Dir = c.Dir
	rootOut, err := root.Output()
	if err != nil {
		return nil, fmt.Errorf("go list .: %v", err)
	}
	g := &graph{root: strings.TrimSpace(string(rootOut)), imports: map[string][]string{}, std: map[string]bool{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list: %w", err)
		}
		path := plain(p.ImportPath)
		if path == g.root && path != p.ImportPath {
			path = g.root + testsSuffix // the package compiled with its tests
		}
		if p.Standard {
			g.std[path] = true
			continue
		}
		if plain(p.ImportPath) == g.root && p.Module != nil {
			g.module, g.dir = p.Module.Path, p.Module.Dir
		}
		for _, imp := range p.Imports {
			imp = plain(imp)
			if !slices.Contains(g.imports[path], imp) {
				g.imports[path] = append(g.imports[path], imp)
			}
		}
		if _, ok := g.imports[path]; !ok {
			g.imports[path] = nil
		}
	}
	if g.module == "" {
		return nil, fmt.Errorf("go list: no module for %s", g.root)
	}
	return g, nil
}

// self is this package, which every deps_test.go imports.
var self = reflect.TypeFor[Checker]().PkgPath()

// own reports whether path is the checked package, one of its test
// packages (the external p_test and the p.test main), or this package.
func (g *graph) own(path string) bool {
	return path == g.root || path == g.root+testsSuffix || path == g.root+"_test" || path == g.root+".test" || path == self
}

// full turns a pattern into a full import path pattern.
func (g *graph) full(pattern string) string {
	first, _, _ := strings.Cut(pattern, "/")
	if strings.Contains(first, ".") {
		return pattern
	}
	return g.module + "/" + pattern
}

// matches reports whether path matches pattern.
func (g *graph) matches(pattern, path string) bool {
	p := g.full(pattern)
	if base, ok := strings.CutSuffix(p, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == p
}

// short is path relative to the module, for messages.
func (g *graph) short(path string) string {
	if rest, ok := strings.CutPrefix(path, g.module+"/"); ok {
		return rest
	}
	return path
}

// chain returns how the package (or its tests) comes to depend on dep:
// the shortest chain of imports, written "a → b → dep".
func (g *graph) chain(dep string) string {
	prev := map[string]string{}
	var queue []string
	for _, r := range []string{g.root, g.root + testsSuffix, g.root + "_test"} {
		if _, ok := g.imports[r]; ok {
			queue = append(queue, r)
			prev[r] = ""
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == dep {
			var links []string
			for q := p; q != ""; q = prev[q] {
				links = append(links, g.short(q))
			}
			slices.Reverse(links)
			return strings.Join(links, " → ")
		}
		for _, imp := range g.imports[p] {
			if _, seen := prev[imp]; !seen && !g.std[imp] {
				prev[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return g.short(dep)
}

func (c Checker) problems() ([]string, error) {
	g, err := c.load()
	if err != nil {
		return nil, err
	}
	var deps []string
	for path := range g.imports {
		if !g.own(path) && !g.std[path] {
			deps = append(deps, path)
		}
	}
	sort.Strings(deps)
	what := "it"
	if c.Tests {
		what = "it or its tests"
	}
	var problems []string
	for _, dep := range deps {
		for _, pattern := range sortedKeys(c.Forbid) {
			if g.matches(pattern, dep) {
				problems = append(problems, fmt.Sprintf("%s must not depend on %s (%s): %s; %s does: %s",
					g.short(g.root), pattern, g.short(dep), c.Forbid[pattern], what, g.chain(dep)))
			}
		}
		if c.Allow == nil || (c.AllowModuleOnly && !strings.HasPrefix(dep+"/", g.module+"/")) {
			continue
		}
		allowed := false
		for pattern := range c.Allow {
			allowed = allowed || g.matches(pattern, dep)
		}
		if !allowed {
			problems = append(problems, fmt.Sprintf("%s depends on %s, which is not on its list (%s); %s does: %s",
				g.short(g.root), g.short(dep), strings.Join(sortedKeys(c.Allow), ", "), what, g.chain(dep)))
		}
	}
	for _, rules := range []map[string]string{c.Forbid, c.Allow} {
		for _, pattern := range sortedKeys(rules) {
			full := g.full(pattern)
			rel, ours := strings.CutPrefix(strings.TrimSuffix(full, "/..."), g.module+"/")
			if !ours {
				continue
			}
			if _, err := os.Stat(filepath.Join(g.dir, filepath.FromSlash(rel))); err != nil {
				problems = append(problems, fmt.Sprintf("the rule about %s names no package of this module: %v", pattern, err))
			}
		}
	}
	return problems, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
