package e2e

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the end-to-end tests black-box: they drive the built
// binaries over HTTP, the SDK and the CLI, never the code inside them.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"lifecycle":   "the server is reached over HTTP",
		"runtime/...": "the runtimes are reached through the server",
		"execd/...":   "execd is reached over HTTP",
		"sandbox":     "the server's domain; clients see wire types",
		"cli":         "the CLI is run as the osb binary",
		"mcp":         "the MCP server is run as osb mcp",
		"cmd/...":     "the binaries are built and run, not imported",
	}}.Check(t)
}
