package api

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the wire types importable by any client: the standard
// library only.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep != "github.com/opensandbox/opensandbox/api" {
			t.Errorf("api imports %s; it may use the standard library only", dep)
		}
	}
}
