package lifecycle

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the lifecycle server on the domain's side of the
// runtimes: cmd/opensandbox-server hands it a sandbox.Runtime, and it
// never knows which. Its tests drive it with the fake runtime (the one
// runtime they import, for its real state rules and scriptable faults),
// never with an engine's.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"sandbox":      "the domain it serves",
		"api/...":      "the wire types",
		"internal/...": "HTTP helpers and host paths",
		"egress":       "the policy model, to check network policies at create (standard library and api only)",
		"ingress":      "the gateway's resolver contract, to be an in-process gateway's source of sandboxes",
	}, Forbid: map[string]string{
		"runtime/...": "it is handed a sandbox.Runtime and never knows which",
		"execd/...":   "servers never import each other",
	}}.Check(t)
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"runtime/docker/...":     "tests use the fake runtime; Docker is tested from its own package and e2e",
		"runtime/kubernetes/...": "tests use the fake runtime; Kubernetes is tested from its own package",
		"execd/...":              "servers never import each other",
		"sdk":                    "the SDK is tested against this server from its own package, not the other way",
	}}.Check(t)
}
