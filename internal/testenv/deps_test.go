package testenv

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the test environment checks importable by every test:
// the standard library only.
func TestDeps(t *testing.T) {
	deptest.Checker{Tests: true, Allow: map[string]string{}}.Check(t)
}
