package httpx

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the HTTP helpers shared by every server free of any of
// them: the standard library and the wire types.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{
		"api": "the error envelope",
	}}.Check(t)
}
