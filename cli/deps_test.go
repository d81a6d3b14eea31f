package cli

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the CLI an SDK user, tests included: it reaches servers
// only through the SDK, and the MCP server is its sibling, which
// cmd/osb wires beside it.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"sdk":     "the client it is built on",
		"api/...": "the wire types",
	}}.Check(t)
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"mcp":       "cli and mcp are two clients side by side; cmd/osb wires both",
		"lifecycle": "a client reaches the server over HTTP, through the SDK",
	}}.Check(t)
}
