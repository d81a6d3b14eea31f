package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// route is one method and path pattern of an HTTP API, as the code
// registers it ("GET", "/sandboxes/{id}").
type route struct {
	method, pattern string
}

func (r route) String() string { return r.method + " " + r.pattern }

// repoRoot is the directory of the module the e2e tests belong to.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// registeredRoutes reads the Go files (tests left out) of the packages in
// dirs, relative to the repository, and returns every route they
// register: the string literal given to a Handle or HandleFunc call
// ("POST /command"), and every composite literal that starts with a
// method and a path ({"GET", "/health", s.health}), the form of the
// lifecycle server's route table. The attack tests take their routes
// from here rather than from a list of their own, so a route added to
// the code is attacked without anyone remembering to add it.
//
// computed lists the Handle calls whose pattern is not a literal
// (file:line): their routes cannot be read, so a test compares them with
// the ones it knows, and a new one fails it until the reader learns it.
func registeredRoutes(t *testing.T, dirs ...string) (routes []route, computed []string) {
	t.Helper()
	add := func(method, pattern string) {
		r := route{method, pattern}
		if !slices.Contains(routes, r) {
			routes = append(routes, r)
		}
	}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(repoRoot(), dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") || len(n.Args) != 2 {
						return true
					}
					s, ok := stringLit(n.Args[0])
					if !ok {
						pos := fset.Position(n.Pos())
						computed = append(computed, filepath.Base(pos.Filename)+":"+strconv.Itoa(pos.Line))
						return true
					}
					method, pattern, found := strings.Cut(s, " ")
					if !found {
						method, pattern = "", s
					}
					add(method, pattern)
				case *ast.CompositeLit:
					if len(n.Elts) < 3 {
						return true
					}
					method, ok1 := stringLit(n.Elts[0])
					pattern, ok2 := stringLit(n.Elts[1])
					if ok1 && ok2 && slices.Contains(httpMethods, method) && strings.HasPrefix(pattern, "/") {
						add(method, pattern)
					}
				}
				return true
			})
		}
	}
	return routes, computed
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

var pathVar = regexp.MustCompile(`\{([a-zA-Z]+)(\.\.\.)?\}`)

// fillPattern replaces each {name} of a pattern with vars[name]; a name
// vars lacks fails the test, so a route with a new kind of parameter
// cannot be attacked with a path that does not reach it.
func fillPattern(t *testing.T, pattern string, vars map[string]string) string {
	t.Helper()
	return pathVar.ReplaceAllStringFunc(pattern, func(m string) string {
		name := pathVar.FindStringSubmatch(m)[1]
		v, ok := vars[name]
		if !ok {
			t.Fatalf("route %s has a parameter {%s} the attack table has no value for: add one", pattern, name)
		}
		return v
	})
}

// docCapabilities reads the capability set docs/configuration.md
// promises every sandbox ("all capabilities dropped but `CHOWN ...`").
func docCapabilities(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("all capabilities dropped but\\s+`([A-Z_ ]+)`").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/configuration.md no longer says which capabilities a sandbox keeps (\"all capabilities dropped but `...`\")")
	}
	return strings.Fields(string(m[1]))
}

// capabilityBits numbers the Linux capabilities (linux/capability.h).
var capabilityBits = map[string]uint{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
	"SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10,
	"NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15,
	"SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20,
	"SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
	"SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30,
	"SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
	"BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}

// capabilityMask is the /proc/PID/status form (16 hex digits) of a set.
func capabilityMask(t *testing.T, names []string) string {
	t.Helper()
	var mask uint64
	for _, n := range names {
		bit, ok := capabilityBits[n]
		if !ok {
			t.Fatalf("unknown capability %q", n)
		}
		mask |= 1 << bit
	}
	return strings.Repeat("0", 16-len(strconv.FormatUint(mask, 16))) + strconv.FormatUint(mask, 16)
}
