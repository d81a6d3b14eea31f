package sandbox

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the domain free of any engine or framework: the
// standard library only.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep != "github.com/opensandbox/opensandbox/sandbox" {
			t.Errorf("sandbox imports %s; it may use the standard library only", dep)
		}
	}
}
