package mitm

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the interceptor on the standard library's TLS and HTTP:
// the code that holds the secrets has no third-party dependency.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{
		"egress":           "the Binder contract and the Denial it reports",
		"api":              "egress's wire types",
		"internal/deptest": "this test",
	}}.Check(t)
}
