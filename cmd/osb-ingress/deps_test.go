package main

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the gateway binary to wiring: the gateway, the sources
// of sandboxes it picks from, and shared helpers; never the lifecycle
// server.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"ingress":      "the gateway it runs",
		"api/...":      "the wire types",
		"internal/...": "shared helpers",
		"runtime/...":  "sources of sandboxes that read the runtime's own objects (Kubernetes pods)",
		"sandbox":      "the domain types those sources speak",
	}}.Check(t)
}
