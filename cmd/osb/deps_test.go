package main

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps osb a client: it wires the CLI and the MCP server, both
// SDK users, and no server code.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"cli":     "the commands",
		"mcp":     "osb mcp",
		"sdk":     "what cli and mcp are built on",
		"api/...": "the wire types",
	}}.Check(t)
}
