package egress

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the policy package a leaf the enforcers can share: the
// standard library and the wire types, nothing that serves or runs.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{
		"api": "the egress API's wire types",
	}}.Check(t)
}
