package nft

import (
	"net/netip"
	"slices"
)

// addrRange is an inclusive range of addresses of one family.
type addrRange struct {
	from, to netip.Addr
}

// mergeRanges turns the prefixes of one family (IPv4 when v4, else IPv6)
// into sorted ranges that neither overlap nor touch, as the kernel's
// interval sets require. IPv4-mapped IPv6 prefixes count as IPv4.
func mergeRanges(ps []netip.Prefix, v4 bool) []addrRange {
	var rs []addrRange
	for _, p := range ps {
		p = unmapPrefix(p)
		if !p.IsValid() || p.Addr().Is4() != v4 {
			continue
		}
		p = p.Masked()
		rs = append(rs, addrRange{from: p.Addr(), to: lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.from.Compare(b.from) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.to.Next() // zero when last.to is the family's highest address
			if !next.IsValid() || r.from.Compare(next) <= 0 {
				if r.to.Compare(last.to) > 0 {
					last.to = r.to
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// unmapPrefix turns ::ffff:a.b.c.d/n (n >= 96) into a.b.c.d/(n-96).
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// lastAddr is the highest address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
