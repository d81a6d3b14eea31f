package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultBlockedCIDRs are the destinations sandboxes may not reach unless
// the operator says otherwise: where the host's own network, the rest of
// a cloud account, a cluster's nodes and services, and the cloud metadata
// services live. Runtimes block them by default.
var DefaultBlockedCIDRs = []string{
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", // private (RFC 1918)
	"100.64.0.0/10",  // shared address space, carrier-grade NAT (RFC 6598); Alibaba Cloud's metadata 100.100.100.200 is in it
	"169.254.0.0/16", // link-local: the metadata services of AWS, GCP, Azure, OpenStack, ECS
	"fc00::/7",       // IPv6 unique local (AWS's IPv6 metadata fd00:ec2::254 is in it)
	"fe80::/10",      // IPv6 link-local
}

// MetadataCIDRs are the cloud metadata services, where the credentials of
// the host's cloud identity live: link-local (AWS, GCP, Azure, OpenStack,
// ECS), Alibaba Cloud's, and AWS's IPv6 address. Runtimes keep them
// blocked whatever the blocked ranges say, unless told explicitly.
var MetadataCIDRs = []string{"169.254.0.0/16", "100.100.100.200/32", "fd00:ec2::254/128"}

// Destination is a range of addresses, and one port of them when Port is
// not 0: an entry of a runtime's blocked or allowed destinations.
type Destination struct {
	Prefix netip.Prefix
	Port   uint16
}

// String writes d as ParseDestination reads it: an address alone for a
// single address, IPv6 in brackets before a port.
func (d Destination) String() string {
	s := d.Prefix.String()
	if d.Prefix.IsSingleIP() {
		s = d.Prefix.Addr().String()
	}
	if d.Port == 0 {
		return s
	}
	if d.Prefix.Addr().Is6() {
		s = "[" + s + "]"
	}
	return s + ":" + strconv.Itoa(int(d.Port))
}

// ParseDestination reads an address or a range, IPv4 or IPv6
// ("10.1.2.3", "10.0.0.0/8", "fd00::/8"), followed by ":PORT" when
// withPort allows it ("10.1.2.3:443", "[fd00::1]:443", "[fd00::/64]:443").
// A range must be written from its start (10.0.0.0/8, not 10.1.2.3/8),
// so that a typo never widens or narrows it unseen; names, zones and
// IPv4-mapped IPv6 addresses are refused.
func ParseDestination(s string, withPort bool) (Destination, error) {
	host, port := s, ""
	if rest, ok := strings.CutPrefix(s, "["); ok {
		var after string
		host, after, ok = strings.Cut(rest, "]")
		if !ok {
			return Destination{}, errors.New("missing ]")
		}
		if after != "" {
			if port, ok = strings.CutPrefix(after, ":"); !ok {
				return Destination{}, fmt.Errorf("unexpected %q after ]", after)
			}
		}
		if !strings.Contains(host, ":") {
			return Destination{}, errors.New("brackets are for IPv6 addresses")
		}
	} else if strings.Count(s, ":") == 1 {
		host, port, _ = strings.Cut(s, ":")
	}
	var d Destination
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return d, err
		}
		if p != p.Masked() {
			return d, fmt.Errorf("%s has bits set past its length; the range starts at %s", p, p.Masked())
		}
		d.Prefix = p
	} else {
		a, err := netip.ParseAddr(host)
		if err != nil {
			return d, err
		}
		if a.Zone() != "" {
			return d, fmt.Errorf("%s: no zones", a)
		}
		d.Prefix = netip.PrefixFrom(a, a.BitLen())
	}
	if d.Prefix.Addr().Is4In6() {
		return d, fmt.Errorf("%s is an IPv4-mapped IPv6 address; write the IPv4 form (a sandbox that dials the mapped form sends IPv4)", host)
	}
	if port != "" {
		if !withPort {
			return d, errors.New("no port here")
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return d, fmt.Errorf("port %q: want 1-65535", port)
		}
		d.Port = uint16(n)
	}
	return d, nil
}
