package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps execd small and self-contained: it runs in every sandbox,
// so it must not pull in server-side code or heavy client libraries.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := []string{
		"github.com/opensandbox/opensandbox/api",
		"github.com/opensandbox/opensandbox/execd",
		"github.com/opensandbox/opensandbox/internal/httpx",
		"github.com/bmatcuk/doublestar/",
		"github.com/coder/websocket",
		"github.com/creack/pty",
		"golang.org/x/sys/",
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/opensandbox/opensandbox/cmd/execd" {
			continue
		}
		ok := false
		for _, prefix := range allowed {
			if strings.HasPrefix(dep, prefix) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("execd imports %s, which is not on its list of allowed dependencies", dep)
		}
	}
}
