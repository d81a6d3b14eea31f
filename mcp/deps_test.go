package mcp

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the MCP server a client: of this module it may use only
// the SDK and the wire types, never server code.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/opensandbox/opensandbox/"
	for _, dep := range strings.Fields(string(out)) {
		rest, ours := strings.CutPrefix(dep, module)
		if !ours || rest == "mcp" || rest == "sdk" || rest == "api" || strings.HasPrefix(rest, "api/") {
			continue
		}
		t.Errorf("mcp imports %s; of this module it may use only sdk and api", dep)
	}
}
