package fake_test

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the fake runtime to itself, tests included: it speaks
// domain types, never to another runtime, and the server drives it, not
// the other way.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"runtime/docker/...":     "runtimes never import each other; what they share lives in sandbox or a package of its own",
		"runtime/kubernetes/...": "runtimes never import each other; what they share lives in sandbox or a package of its own",
	}}.Check(t)
	deptest.Checker{Forbid: map[string]string{
		"lifecycle": "the server drives a runtime, never the other way",
		"sdk":       "a runtime is server code, not a client",
	}}.Check(t)
}
