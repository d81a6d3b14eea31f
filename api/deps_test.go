package api

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the wire types importable by any client: the standard
// library only, tests included.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{}}.Check(t)
}
