package execd

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the daemon apart from the server that starts its
// sandboxes: servers never import each other.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"api/...":      "the wire types it serves",
		"execd/...":    "its own parts",
		"internal/...": "HTTP helpers",
	}}.Check(t)
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"lifecycle":   "servers never import each other",
		"runtime/...": "the daemon runs inside a sandbox and knows no runtime",
		"sandbox":     "the domain of the server, not of the daemon",
	}}.Check(t)
}
