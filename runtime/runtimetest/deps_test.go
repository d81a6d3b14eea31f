package runtimetest

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the conformance suite about the domain: every runtime
// runs it from its own tests, so it knows none of them.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Forbid: map[string]string{
		"runtime/docker/...":     "the suite knows sandbox.Runtime, not the runtimes that run it",
		"runtime/kubernetes/...": "the suite knows sandbox.Runtime, not the runtimes that run it",
		"runtime/fake/...":       "the suite knows sandbox.Runtime, not the runtimes that run it",
		"lifecycle":              "the suite tests runtimes, not the server",
	}}.Check(t)
}
