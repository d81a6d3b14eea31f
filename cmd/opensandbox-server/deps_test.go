package main

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the server binary to wiring: the lifecycle server, the
// runtimes it picks from, and shared helpers; no client or daemon code.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"lifecycle":    "the server it runs",
		"runtime/...":  "the runtimes it picks from",
		"internal/...": "shared helpers",
		"sandbox":      "the domain types it hands between them",
		"api/...":      "the wire types",
		"egress":       "the policy model the lifecycle server checks network policies with (not the enforcer's subpackages)",
		"ingress":      "the signing keys, and the gateway it serves in-process on [ingress] listen",
	}}.Check(t)
}
