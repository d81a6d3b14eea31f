package dnsproxy

import (
	"context"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/opensandbox/opensandbox/egress"
)

// MaxTTL caps the TTL of every record returned to a client, so that no
// client keeps using an address longer than a Table remembers it.
const MaxTTL = time.Hour

// Reasons given in the Denials the server reports.
const (
	reasonName     = "name not allowed"
	reasonNotHost  = "not a host name"
	reasonCNAME    = "CNAME to a name not allowed: "
	reasonResolves = "resolves to a blocked address"
)

// handle answers one query. It returns nil when the query gets no answer.
// The answer is not yet truncated to the client's UDP size.
func (s *Server) handle(ctx context.Context, req *dns.Msg) *dns.Msg {
	if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		return nil
	}
	q := req.Question[0]
	reply := new(dns.Msg)
	reply.SetReply(req)
	reply.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		reply.SetEdns0(upstreamUDPSize, opt.Do())
	}
	if q.Qclass != dns.ClassINET {
		reply.Rcode = dns.RcodeNotImplemented
		return reply
	}
	switch q.Qtype {
	case dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR, dns.TypeMAILA, dns.TypeMAILB, dns.TypeOPT:
		// ANY would hand over a whole RRset mix unfiltered by type; zone
		// transfers are not a stub's business.
		reply.Rcode = dns.RcodeNotImplemented
		return reply
	}
	name, ok := hostName(q.Name)
	if !ok {
		s.deny(q.Name, netip.Addr{}, reasonNotHost)
		reply.Rcode = dns.RcodeNameError
		return reply
	}
	if !s.cfg.Decider.Name(name) {
		s.deny(name, netip.Addr{}, reasonName)
		reply.Rcode = dns.RcodeNameError
		return reply
	}

	select {
	case s.inflight <- struct{}{}:
		defer func() { <-s.inflight }()
	default:
		reply.Rcode = dns.RcodeServerFailure
		return reply
	}
	up, err := s.exchange(ctx, upstreamQuery(req))
	if err != nil {
		s.log.Debug("dns query failed", "name", name, "err", err)
		reply.Rcode = dns.RcodeServerFailure
		return reply
	}
	s.filter(name, q, up, reply)
	return reply
}

// upstreamQuery is the query sent upstream for req: its question and
// checking-disabled and DNSSEC-OK bits, none of its other EDNS options
// (a client subnet or cookie of the sandbox's choosing).
func upstreamQuery(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.CheckingDisabled = req.CheckingDisabled
	m.Question = []dns.Question{req.Question[0]}
	do := false
	if opt := req.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	m.SetEdns0(upstreamUDPSize, do)
	return m
}

// filter fills reply from the upstream answer up to question q for the
// allowed name: only the records of the question's CNAME chain, every
// name on that chain allowed, every address one the policy accepts, no
// address hints or ECH keys in HTTPS/SVCB records, TTLs capped at MaxTTL.
// What remains is learned before the reply is sent.
func (s *Server) filter(name string, q dns.Question, up *dns.Msg, reply *dns.Msg) {
	reply.Rcode = up.Rcode
	if up.Rcode > 0xF && reply.IsEdns0() == nil {
		reply.Rcode = dns.RcodeServerFailure // an extended code needs EDNS to be said
		return
	}

	// The chain: the question name and, repeatedly, the targets of the
	// CNAMEs owned by a name already on it, whatever their order.
	chain := []string{dns.CanonicalName(q.Name)}
	onChain := map[string]bool{chain[0]: true}
	for grew := true; grew; {
		grew = false
		for _, rr := range up.Answer {
			c, ok := rr.(*dns.CNAME)
			if !ok || !onChain[dns.CanonicalName(c.Hdr.Name)] {
				continue
			}
			target := dns.CanonicalName(c.Target)
			if onChain[target] {
				continue
			}
			if t, ok := hostName(target); !ok || !s.cfg.Decider.Name(t) {
				s.deny(name, netip.Addr{}, reasonCNAME+strings.TrimSuffix(target, "."))
				reply.Rcode = dns.RcodeNameError
				return
			}
			onChain[target] = true
			chain = append(chain, target)
			grew = true
		}
	}

	var (
		addrs   []netip.Addr
		ttl     uint32 = uint32(MaxTTL / time.Second)
		blocked netip.Addr
	)
	for _, rr := range up.Answer {
		h := rr.Header()
		if !onChain[dns.CanonicalName(h.Name)] {
			continue // not about the question: nothing a client should cache
		}
		var a netip.Addr
		switch rr := rr.(type) {
		case *dns.A:
			a, _ = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			a, _ = netip.AddrFromSlice(rr.AAAA.To16())
		case *dns.HTTPS:
			stripHints(&rr.SVCB)
		case *dns.SVCB:
			stripHints(rr)
		case *dns.DNAME:
			continue // its synthesized CNAME, checked above, says the same
		}
		if h.Rrtype == dns.TypeA || h.Rrtype == dns.TypeAAAA {
			if !a.IsValid() {
				continue
			}
			if !s.resolved(a) {
				blocked = a
				continue
			}
			addrs = append(addrs, a)
			ttl = min(ttl, h.Ttl)
		}
		capTTL(h)
		reply.Answer = append(reply.Answer, rr)
	}
	if len(addrs) == 0 && blocked.IsValid() && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) {
		s.deny(name, blocked, reasonResolves)
		reply.Rcode = dns.RcodeNameError
		reply.Answer = nil
		return
	}
	for _, rr := range up.Ns {
		switch rr.Header().Rrtype {
		case dns.TypeSOA, dns.TypeNS, dns.TypeNSEC, dns.TypeNSEC3, dns.TypeRRSIG:
			capTTL(rr.Header())
			reply.Ns = append(reply.Ns, rr)
		}
	}
	// The additional section is dropped whole: its addresses (glue,
	// targets) belong to names nobody checked.

	if len(addrs) > 0 && s.cfg.Learn != nil {
		for _, n := range chain {
			s.cfg.Learn(strings.TrimSuffix(n, "."), addrs, time.Duration(ttl)*time.Second)
		}
	}
}

// resolved reports whether the policy accepts a as an answer. An
// IPv4-mapped IPv6 address must be acceptable in both spellings.
func (s *Server) resolved(a netip.Addr) bool {
	if !s.cfg.Decider.Resolved(a) {
		return false
	}
	return !a.Is4In6() || s.cfg.Decider.Resolved(a.Unmap())
}

// deny reports a refused query.
func (s *Server) deny(name string, a netip.Addr, reason string) {
	if s.cfg.Deny == nil {
		return
	}
	s.cfg.Deny(egress.Denial{Time: time.Now(), Kind: "dns", Name: name, Addr: a, Reason: reason})
}

// hostName turns a question name into the form the Decider takes: lower
// case, no trailing dot. It refuses the root and names whose labels need
// escaping (a dot or a control byte inside a label), whose text form a
// suffix match could misread: "x.allowed\.test." is not under "test.".
func hostName(qname string) (string, bool) {
	if strings.ContainsRune(qname, '\\') {
		return "", false
	}
	n := strings.TrimSuffix(dns.CanonicalName(qname), ".")
	return n, n != ""
}

// capTTL lowers h's TTL to MaxTTL.
func capTTL(h *dns.RR_Header) {
	if h.Ttl > uint32(MaxTTL/time.Second) {
		h.Ttl = uint32(MaxTTL / time.Second)
	}
}

// stripHints removes from an SVCB or HTTPS record the address hints (they
// would skip the check of the addresses) and the ECH configuration (it
// would let the client hide the name it connects to), and their codes
// from its mandatory list.
func stripHints(r *dns.SVCB) {
	stripped := func(k dns.SVCBKey) bool {
		return k == dns.SVCB_IPV4HINT || k == dns.SVCB_IPV6HINT || k == dns.SVCB_ECHCONFIG
	}
	kept := r.Value[:0]
	for _, kv := range r.Value {
		if stripped(kv.Key()) {
			continue
		}
		if m, ok := kv.(*dns.SVCBMandatory); ok {
			codes := m.Code[:0]
			for _, c := range m.Code {
				if !stripped(c) {
					codes = append(codes, c)
				}
			}
			m.Code = codes
			if len(codes) == 0 {
				continue
			}
		}
		kept = append(kept, kv)
	}
	clear(r.Value[len(kept):])
	r.Value = kept
}
