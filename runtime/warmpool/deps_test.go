package warmpool

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the pool policy below the runtimes that use it: it speaks
// the domain's types and knows no engine, cluster or server.
func TestDeps(t *testing.T) {
	deptest.Checker{AllowModuleOnly: true, Allow: map[string]string{
		"sandbox": "the domain it keeps pools of",
		"api":     "the execd claim request and the error codes",
	}, Forbid: map[string]string{
		"runtime/...": "the runtimes use the policy, never the other way",
		"lifecycle":   "the server drives runtimes, never the other way",
	}}.Check(t)
}
