package standin

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/miekg/dns"
)

// DefaultTTL is the TTL, in seconds, of the records of a name whose TTL
// was never set.
const DefaultTTL = 5

// maxChain bounds how many CNAMEs an answer follows, so that a loop of
// aliases ends.
const maxChain = 8

// DNS is the record set of a name server the test controls. Its records
// may change while it serves: each query is answered from the records in
// force when it arrives. The same records answer on every transport it is
// served on (UDP and TCP port 53 by ServeDNS, any port by ServeDNSOn, DNS
// over TLS by ServeDoT, DNS over HTTPS by ServeDoH). It never asks anyone
// else: a name it does not know is NXDOMAIN.
type DNS struct {
	mu      sync.Mutex
	names   map[string]*entry // by canonical name ("a.test.")
	queries []string
}

// entry is what one name answers.
type entry struct {
	addrs []netip.Addr
	cname string // canonical; when set, addrs is empty
	ttl   uint32
}

// NewDNS returns a record set holding records (each name, fully
// qualified or not, with its address), to be served with ServeDNSOn,
// ServeDoT or ServeDoH.
func NewDNS(records map[string]netip.Addr) *DNS {
	d := &DNS{names: map[string]*entry{}}
	for name, a := range records {
		d.Set(name, a)
	}
	return d
}

// Set makes name answer addrs: its A query the IPv4 ones, its AAAA query
// the IPv6 ones, in the order given. It replaces what name answered
// before (addresses or a CNAME) and keeps its TTL. With no addrs the name
// is removed and answers NXDOMAIN.
func (d *DNS) Set(name string, addrs ...netip.Addr) {
	name = dns.CanonicalName(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.names[name]
	if len(addrs) == 0 {
		delete(d.names, name)
		return
	}
	if e == nil {
		e = &entry{ttl: DefaultTTL}
		d.names[name] = e
	}
	e.addrs, e.cname = append([]netip.Addr(nil), addrs...), ""
}

// SetCNAME makes name an alias of target: its answers are a CNAME record
// followed by what target answers (when this server knows target). It
// replaces the addresses name answered before and keeps its TTL.
func (d *DNS) SetCNAME(name, target string) {
	name = dns.CanonicalName(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.names[name]
	if e == nil {
		e = &entry{ttl: DefaultTTL}
		d.names[name] = e
	}
	e.addrs, e.cname = nil, dns.CanonicalName(target)
}

// SetTTL sets the TTL, in seconds, of name's records (0 asks resolvers
// not to cache them). The name must have been Set or SetCNAME first.
func (d *DNS) SetTTL(name string, ttl uint32) {
	name = dns.CanonicalName(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.names[name]; e != nil {
		e.ttl = ttl
	}
}

// Queries returns the questions asked so far on every transport, in
// order, each as "NAME TYPE from ADDR" ("web.test. A from 10.0.0.2:4711").
func (d *DNS) Queries() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.queries...)
}

// Reply builds the answer to the query req, asked from from, and notes
// the question. It returns nil when req is not a query with one question.
func (d *DNS) Reply(req *dns.Msg, from string) *dns.Msg {
	if req.Response || req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		return nil
	}
	q := req.Question[0]
	name := dns.CanonicalName(q.Name)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.queries = append(d.queries, fmt.Sprintf("%s %s from %s", name, dns.TypeToString[q.Qtype], from))
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = false
	if _, known := d.names[name]; !known {
		m.Rcode = dns.RcodeNameError
		return m
	}
	for range maxChain {
		e := d.names[name]
		if e == nil {
			break // an alias whose target this server does not know: the CNAME alone
		}
		hdr := dns.RR_Header{Name: name, Class: dns.ClassINET, Ttl: e.ttl}
		if e.cname != "" {
			hdr.Rrtype = dns.TypeCNAME
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: hdr, Target: e.cname})
			if q.Qtype == dns.TypeCNAME {
				break
			}
			name = e.cname
			continue
		}
		for _, a := range e.addrs {
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IP(a.AsSlice())})
			case q.Qtype == dns.TypeAAAA && a.Is6():
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(a.AsSlice())})
			}
		}
		break
	}
	return m
}

// ServeDNS implements dns.Handler: it answers on UDP and TCP alike and
// ignores what is not a query.
func (d *DNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	if reply := d.Reply(req, w.RemoteAddr().String()); reply != nil {
		w.WriteMsg(reply)
	}
}

// replyWire answers the query in wire form msg, for the transports that
// carry raw messages (DNS over HTTPS).
func (d *DNS) replyWire(msg []byte, from string) ([]byte, error) {
	req := new(dns.Msg)
	if err := req.Unpack(msg); err != nil {
		return nil, fmt.Errorf("unpack query: %w", err)
	}
	reply := d.Reply(req, from)
	if reply == nil {
		return nil, errNotAQuery
	}
	return reply.Pack()
}
