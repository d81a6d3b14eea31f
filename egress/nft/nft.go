// Package nft programs the firewall of a sandbox's network namespace
// through netlink (github.com/google/nftables; no iptables or nft binary):
// DNS to the DNS proxy, strict mode's TCP to the transparent proxy, the
// address rules of dns+nft mode, a set of addresses learned from allowed
// DNS answers, and the filter that keeps sandbox processes away from
// osb-egress's own ports. It also holds the socket helpers the proxies
// need: the original destination of a redirected connection and the mark
// that lets osb-egress's own sockets through.
//
// Only cmd/osb-egress and the egress packages (dnsproxy, proxy) import it.
// It works on Linux only; elsewhere every call returns ErrUnsupported.
package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// TableName is the inet table that holds every rule and set of this
// package. Nothing else in the namespace should use it.
const TableName = "opensandbox_egress"

// The bounds of a learned address's lifetime: Learn raises shorter TTLs to
// MinLearnTTL (DNS answers with a TTL of 0 must still be usable for the
// connection that follows them) and lowers longer ones to MaxLearnTTL.
const (
	MinLearnTTL = 30 * time.Second
	MaxLearnTTL = time.Hour
)

// minLearnTTL is MinLearnTTL; tests lower it to watch entries expire.
var minLearnTTL = MinLearnTTL

// ErrUnsupported is returned on systems without nftables.
var ErrUnsupported = errors.New("nftables is supported on linux only")

// Config is the whole ruleset of a namespace. Apply installs it.
type Config struct {
	// Mode is egress.ModeStrict, egress.ModeDNSNft or egress.ModeDNS.
	Mode string
	// AllowPrefixes and DenyPrefixes are the IP and CIDR rules of the
	// policy (IPv4 and IPv6, a single address as a /32 or /128). nft
	// enforces them in dns+nft mode only, where a denied prefix wins over
	// an allowed one and over learned addresses; order does not matter.
	AllowPrefixes, DenyPrefixes []netip.Prefix
	// DefaultAllow lets dns+nft mode accept addresses no rule covers.
	DefaultAllow bool
	// Nameservers are the upstream resolvers osb-egress itself queries.
	// Only packets carrying egress.Mark reach them; the sandbox gets
	// nothing from them on any port (its DNS goes to the DNS proxy).
	Nameservers []netip.Addr
}

// validate checks the mode and the addresses.
func (c Config) validate() error {
	switch c.Mode {
	case egress.ModeStrict, egress.ModeDNSNft, egress.ModeDNS:
	default:
		return fmt.Errorf("mode %q: want %q, %q or %q", c.Mode, egress.ModeStrict, egress.ModeDNSNft, egress.ModeDNS)
	}
	for _, p := range append(append([]netip.Prefix(nil), c.AllowPrefixes...), c.DenyPrefixes...) {
		if !p.IsValid() {
			return fmt.Errorf("prefix %v is not valid", p)
		}
	}
	for _, a := range c.Nameservers {
		if !a.IsValid() {
			return fmt.Errorf("nameserver %v is not valid", a)
		}
	}
	return nil
}

// clampTTL bounds a learned address's lifetime.
func clampTTL(ttl time.Duration) time.Duration {
	return min(max(ttl, minLearnTTL), MaxLearnTTL)
}
