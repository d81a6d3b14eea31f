package nft

import (
	"fmt"
	"net/netip"
	"testing"
)

func TestMergeRanges(t *testing.T) {
	cases := []struct {
		name string
		in   []string
		v4   bool
		want string
	}{
		{"empty", nil, true, "[]"},
		{"one address", []string{"203.0.113.7/32"}, true, "[203.0.113.7-203.0.113.7]"},
		{"unmasked prefix", []string{"203.0.113.7/24"}, true, "[203.0.113.0-203.0.113.255]"},
		{"nested", []string{"10.0.0.0/8", "10.1.0.0/16"}, true, "[10.0.0.0-10.255.255.255]"},
		{"adjacent", []string{"198.51.100.0/25", "198.51.100.128/25"}, true, "[198.51.100.0-198.51.100.255]"},
		{"apart and sorted", []string{"203.0.113.0/24", "198.51.100.0/24"}, true, "[198.51.100.0-198.51.100.255 203.0.113.0-203.0.113.255]"},
		{"everything", []string{"0.0.0.0/0", "203.0.113.0/24"}, true, "[0.0.0.0-255.255.255.255]"},
		{"top of the space", []string{"255.255.255.0/24", "255.255.255.255/32"}, true, "[255.255.255.0-255.255.255.255]"},
		{"mapped counts as v4", []string{"::ffff:203.0.113.0/120"}, true, "[203.0.113.0-203.0.113.255]"},
		{"other family left out", []string{"2001:db8::/32", "203.0.113.0/24"}, false, "[2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ps []netip.Prefix
			for _, s := range c.in {
				ps = append(ps, netip.MustParsePrefix(s))
			}
			rs := mergeRanges(ps, c.v4)
			got := "["
			for i, r := range rs {
				if i > 0 {
					got += " "
				}
				got += fmt.Sprintf("%v-%v", r.from, r.to)
			}
			got += "]"
			if got != c.want {
				t.Errorf("mergeRanges(%v, v4=%v) = %s, want %s", c.in, c.v4, got, c.want)
			}
		})
	}
}
