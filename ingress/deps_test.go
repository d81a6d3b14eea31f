package ingress

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the gateway apart from the servers: the lifecycle
// server embeds it, osb-ingress wraps it, and it reaches sandboxes only
// through a Resolver.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"api":            "the wire types, headers and codes",
		"internal/httpx": "the error envelope",
	}}.Check(t)
}
