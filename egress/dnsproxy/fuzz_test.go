package dnsproxy

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzHandle feeds arbitrary bytes to the query path and arbitrary bytes
// as the upstream's answer, and checks that the server never panics and
// that what it would send is packable and holds only checked names and
// addresses.
func FuzzHandle(f *testing.F) {
	seed := func(qname string, qtype uint16, answer ...string) {
		q := new(dns.Msg)
		q.SetQuestion(qname, qtype)
		q.SetEdns0(1232, true)
		qb, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		a := new(dns.Msg)
		a.SetReply(q)
		for _, s := range answer {
			rr, err := dns.NewRR(s)
			if err != nil {
				f.Fatal(err)
			}
			a.Answer = append(a.Answer, rr)
		}
		ab, err := a.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(qb, ab)
	}
	seed("ok.test.", dns.TypeA, "ok.test. 60 IN A 198.51.100.1", "ok.test. 60 IN A 10.0.0.1")
	seed("ok.test.", dns.TypeA, "ok.test. 60 IN CNAME bad.other.", "bad.other. 60 IN A 198.51.100.2")
	seed("ok.test.", dns.TypeAAAA, "ok.test. 60 IN CNAME a.test.", "a.test. 60 IN CNAME ok.test.", "a.test. 60 IN AAAA ::ffff:127.0.0.1")
	seed("ok.test.", dns.TypeHTTPS, "ok.test. 60 IN HTTPS 1 . mandatory=ipv4hint,alpn alpn=h2 ipv4hint=10.0.0.1 ech=AEX+DQBBpQAgACB/BVTAa9Y=")
	seed("bad.other.", dns.TypeTXT)
	f.Add([]byte{}, []byte{})

	d := testDecider{allow: []string{"*.test", "ok.test"}}
	f.Fuzz(func(t *testing.T, query, answer []byte) {
		req := new(dns.Msg)
		if err := req.Unpack(query); err != nil {
			return // the server drops what does not unpack, before handle
		}
		s, err := New(Config{Upstreams: []string{"127.0.0.1:1"}, Decider: d, Learn: func(name string, addrs []netip.Addr, ttl time.Duration) {
			if !d.Name(name) {
				t.Errorf("learned denied name %q", name)
			}
			for _, a := range addrs {
				if !d.Resolved(a) || !d.Resolved(a.Unmap()) {
					t.Errorf("learned refused address %v for %q", a, name)
				}
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		s.exchange = func(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
			r := new(dns.Msg)
			if err := r.Unpack(answer); err != nil {
				return nil, errors.New("unreadable answer")
			}
			return r, nil
		}
		reply := s.handle(context.Background(), req)
		if reply == nil {
			return
		}
		reply.Truncate(clientUDPSize(req))
		for _, rr := range reply.Answer {
			switch rr := rr.(type) {
			case *dns.A:
				if a, _ := netip.AddrFromSlice(rr.A.To4()); !d.Resolved(a) {
					t.Errorf("answer holds refused %v", a)
				}
			case *dns.AAAA:
				if a, _ := netip.AddrFromSlice(rr.AAAA.To16()); !d.Resolved(a) || !d.Resolved(a.Unmap()) {
					t.Errorf("answer holds refused %v", a)
				}
			case *dns.SVCB, *dns.HTTPS:
				var kvs []dns.SVCBKeyValue
				if h, ok := rr.(*dns.HTTPS); ok {
					kvs = h.Value
				} else {
					kvs = rr.(*dns.SVCB).Value
				}
				for _, kv := range kvs {
					switch kv.Key() {
					case dns.SVCB_IPV4HINT, dns.SVCB_IPV6HINT, dns.SVCB_ECHCONFIG:
						t.Errorf("answer keeps %v", kv.Key())
					}
				}
			}
		}
		if _, err := reply.Pack(); err != nil {
			t.Logf("reply does not pack: %v", err) // WriteMsg fails: the client gets nothing
		}
	})
}
