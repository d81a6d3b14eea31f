package sandbox

import (
	"fmt"
	"net"
	"net/netip"
)

// EgressConfig is the server's [egress] section: how the outbound policy
// of a sandbox created with a networkPolicy is enforced. Runtimes start
// osb-egress beside such a sandbox with these settings;
// docs/configuration.md documents every key.
type EgressConfig struct {
	// Image is the osb-egress image. Default "opensandbox/egress:latest".
	Image string `toml:"image"`
	// Mode is the enforcement mode: "strict" (default), "dns+nft" or
	// "dns" (docs/egress.md says what each stops).
	Mode string `toml:"mode"`
	// DNSUpstreams are the name servers osb-egress forwards allowed
	// names to ("192.0.2.53" or "192.0.2.53:53"). Default: the ones the
	// sandbox's network gives it (its resolv.conf).
	DNSUpstreams []string `toml:"dns_upstreams"`
	// AlwaysDeny and AlwaysAllow are the platform operator's targets
	// (names, "*.suffix", addresses or ranges), applied before every
	// sandbox's own rules, deny first. Sandboxes cannot see or change
	// them.
	AlwaysDeny  []string `toml:"always_deny"`
	AlwaysAllow []string `toml:"always_allow"`
	// MaxRules caps the rules of one sandbox's policy. Default 4096; -1:
	// no cap.
	MaxRules int `toml:"max_rules"`
	// DefaultPolicy is the policy (JSON, as networkPolicy) of a sandbox
	// created without one. Empty (the default): such a sandbox has no
	// policy and no osb-egress.
	DefaultPolicy string `toml:"default_policy"`
}

// The enforcement modes of EgressConfig.Mode.
const (
	EgressStrict = "strict"
	EgressDNSNft = "dns+nft"
	EgressDNS    = "dns"
)

// SetDefaults fills in the defaults of the keys left empty.
func (c *EgressConfig) SetDefaults() {
	if c.Image == "" {
		c.Image = "opensandbox/egress:latest"
	}
	if c.Mode == "" {
		c.Mode = EgressStrict
	}
	if c.MaxRules == 0 {
		c.MaxRules = 4096
	}
}

// RuleCap is the rule cap as osb-egress reads it: 0 for none.
func (c *EgressConfig) RuleCap() int {
	if c.MaxRules < 0 {
		return 0
	}
	return c.MaxRules
}

// Validate checks the keys, naming the one at fault. The targets of the
// always lists and the default policy are checked by the egress package,
// where their syntax lives.
func (c *EgressConfig) Validate() error {
	switch c.Mode {
	case EgressStrict, EgressDNSNft, EgressDNS:
	default:
		return fmt.Errorf("egress.mode: %q is not strict, dns+nft or dns", c.Mode)
	}
	if c.MaxRules < -1 {
		return fmt.Errorf("egress.max_rules: %d: want a count, or -1 for no cap", c.MaxRules)
	}
	for _, u := range c.DNSUpstreams {
		host := u
		if h, _, err := net.SplitHostPort(u); err == nil {
			host = h
		}
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("egress.dns_upstreams: %q is not an address or address:port", u)
		}
	}
	return nil
}
