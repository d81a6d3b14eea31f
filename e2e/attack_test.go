package e2e

import (
	"strings"
	"testing"
)

// The attack suite: the files e2e/attack_*_test.go try the sandbox's
// boundary as untrusted code inside a sandbox, or a client without the
// right credentials, would. Each attempt is a subtest of its own, so a
// regression fails by name, and logs one line
//
//	attempt NAME → held|BROKEN: what happened
//
// (go test -v -run Attack ./e2e shows them all; make attack runs that).
// docs/security.md lists the claims and the attempt that tests each.

// attack runs one named attempt. try makes it and returns what happened,
// in a few words; it reports a boundary that did not hold with t.Errorf
// or t.Fatalf, which marks the attempt BROKEN.
func attack(t *testing.T, name string, try func(t *testing.T) string) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		result := "(stopped before it said)"
		defer func() {
			verdict := "held"
			if t.Failed() {
				verdict = "BROKEN"
			}
			t.Logf("attempt %s → %s: %s", name, verdict, strings.TrimSpace(result))
		}()
		result = try(t)
	})
}
