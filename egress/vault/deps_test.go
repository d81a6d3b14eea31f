package vault

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the vault beside the policy: the standard library, the
// wire types and the policy package, nothing that serves or runs.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{
		"api":                           "the egress API's wire types",
		"egress":                        "the policy, the Binder contract and the API's limits",
		"golang.org/x/net/publicsuffix": "wildcard bindings under a public suffix are refused",
	}}.Check(t)
}
