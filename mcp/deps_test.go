package mcp

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the MCP server a client: of this module it may use only
// the SDK and the wire types, never server code. Its tests run the real
// server in-process, as the SDK's do, and are not held to it; but
// neither the MCP server nor its tests use the CLI, its sibling.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"sdk":     "the client it is built on",
		"api/...": "the wire types",
	}}.Check(t)
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"cli": "cli and mcp are two clients side by side; cmd/osb wires both",
	}}.Check(t)
}
