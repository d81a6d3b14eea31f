// Package egress is the outbound policy of a sandbox: the policy model of
// the egress API (rules, first match wins, a default action), the matcher
// that answers "may this sandbox reach that?", and the /policy API that
// changes it while the sandbox runs.
//
// osb-egress (cmd/osb-egress) runs it beside each sandbox that has a
// policy, in the sandbox's network namespace: egress/nft programs the
// namespace's firewall, egress/dnsproxy answers the sandbox's DNS, and
// egress/proxy sees every outbound TCP connection in strict mode. Each of
// them asks a Decider.
package egress

import (
	"net/netip"
	"time"
)

// The ports osb-egress uses inside the sandbox's network namespace. The
// API port is the one clients ask the lifecycle server an endpoint for;
// the others are reached only through the namespace's redirects.
const (
	// APIPort serves the egress API (/policy, /healthz).
	APIPort = 18080
	// DNSPort is the DNS proxy; every query to port 53 is redirected
	// there.
	DNSPort = 15353
	// ProxyPort is the transparent TCP proxy of strict mode; every
	// outbound TCP connection is redirected there.
	ProxyPort = 15001
)

// Mark is the socket mark of osb-egress's own outbound sockets (its DNS
// upstream queries and the connections its proxy dials). The namespace's
// rules let marked packets through unchanged. Setting a mark needs
// CAP_NET_ADMIN, which only osb-egress holds, so a sandbox process cannot
// mark its own packets.
const Mark = 0x05b0e6e5

// The enforcement modes: what the namespace's firewall and proxies check.
const (
	// ModeStrict sends every outbound TCP connection through the proxy,
	// which checks its TLS SNI or HTTP Host against the policy and dials
	// the allowed name itself; other TCP reaches only addresses an allowed
	// name resolved to (or an allowed IP rule); UDP other than DNS and
	// all IPv6 are dropped.
	ModeStrict = "strict"
	// ModeDNSNft filters DNS and lets packets out only to addresses an
	// allowed name resolved to or an IP rule allows.
	ModeDNSNft = "dns+nft"
	// ModeDNS filters DNS only; a connection to an address skips it.
	ModeDNS = "dns"
)

// Decider answers policy questions. Implementations are safe for
// concurrent use; answers follow the policy in force when asked.
type Decider interface {
	// Name reports whether the sandbox may reach the host name (lower
	// case, no trailing dot).
	Name(name string) bool
	// Resolved reports whether an address that an allowed name resolved
	// to may be used: not when an IP or CIDR rule denies it, nor when it
	// is loopback, private, link-local, metadata or otherwise special and
	// no IP or CIDR rule allows it (DNS rebinding).
	Resolved(a netip.Addr) bool
	// Addr reports whether the sandbox may reach an address it names
	// directly, with no name: the first IP or CIDR rule that covers it
	// decides; otherwise special addresses are denied and others follow
	// the default action.
	Addr(a netip.Addr) bool
}

// Denial is one outbound attempt the policy refused.
type Denial struct {
	Time time.Time `json:"time"`
	// Kind is "dns" (a query answered NXDOMAIN), "tcp" or "tls" or
	// "http" (a connection refused by the proxy), or "udp".
	Kind string `json:"kind"`
	// Name is the host name asked for, when there was one.
	Name string `json:"name,omitempty"`
	// Addr and Port are the destination, when there was one.
	Addr netip.Addr `json:"addr,omitzero"`
	Port uint16     `json:"port,omitempty"`
	// Reason says why, in a few words.
	Reason string `json:"reason"`
}
