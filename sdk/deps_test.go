package sdk

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the SDK light enough to become its own module: the
// standard library, the wire types and codecs under api, and the
// WebSocket client terminals need.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/opensandbox/opensandbox/sdk",
			dep == "github.com/opensandbox/opensandbox/api",
			strings.HasPrefix(dep, "github.com/opensandbox/opensandbox/api/"),
			strings.HasPrefix(dep, "github.com/coder/websocket"):
		default:
			t.Errorf("sdk imports %s; it may use only the standard library, api and github.com/coder/websocket", dep)
		}
	}
}
