package sandbox

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the domain free of any engine or framework: the standard
// library only, tests included.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{}}.Check(t)
}
