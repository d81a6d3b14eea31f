package main

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/opensandbox/opensandbox/egress"
)

// TestPolicyOf: the policies of the update measure are valid, of the
// size asked, and allow the two names the measure needs.
func TestPolicyOf(t *testing.T) {
	for _, n := range []int{10, 1000} {
		b, err := json.Marshal(policyOf(n))
		if err != nil {
			t.Fatal(err)
		}
		p, err := egress.ParsePolicy(b)
		if err != nil {
			t.Fatalf("policyOf(%d) does not parse: %v", n, err)
		}
		if len(p.Egress) != n {
			t.Errorf("policyOf(%d) has %d rules", n, len(p.Egress))
		}
		m, err := egress.NewMatcher(egress.Overlay{}, p)
		if err != nil {
			t.Fatalf("policyOf(%d): matcher: %v", n, err)
		}
		for _, name := range []string{webName, flipName} {
			if !m.Name(name) {
				t.Errorf("policyOf(%d) does not allow %s", n, name)
			}
		}
	}
}

// TestHarnessTB: a Fatalf ends run with its message, and cleanups run
// once, the last one first.
func TestHarnessTB(t *testing.T) {
	tb := newHarnessTB()
	var order []int
	err := tb.run(func() {
		tb.Cleanup(func() { order = append(order, 1) })
		tb.Cleanup(func() { order = append(order, 2) })
		tb.Fatalf("stop at %d", 3)
		order = append(order, 99)
	})
	if err == nil || err.Error() != "stop at 3" {
		t.Fatalf("run = %v; want the Fatalf message", err)
	}
	tb.cleanup()
	tb.cleanup()
	if !slices.Equal(order, []int{2, 1}) {
		t.Errorf("cleanups ran %v; want [2 1]", order)
	}
	if err := tb.run(func() {}); err != nil {
		t.Errorf("run of a function that returns: %v", err)
	}
}
