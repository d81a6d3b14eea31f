package dnsproxy

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkHandle measures the filter alone: an allowed name whose answer
// is a CNAME and four addresses, one of them refused, upstream in memory.
func BenchmarkHandle(b *testing.B) {
	s, err := New(Config{Upstreams: []string{"127.0.0.1:1"}, Decider: testDecider{allow: []string{"*.test"}},
		Learn: NewTable(0).Learn})
	if err != nil {
		b.Fatal(err)
	}
	answer := new(dns.Msg)
	answer.SetQuestion("www.bench.test.", dns.TypeA)
	answer.Response = true
	for _, r := range []string{
		"www.bench.test. 300 IN CNAME cdn.bench.test.",
		"cdn.bench.test. 300 IN A 198.51.100.1",
		"cdn.bench.test. 300 IN A 198.51.100.2",
		"cdn.bench.test. 300 IN A 198.51.100.3",
		"cdn.bench.test. 300 IN A 10.0.0.1",
	} {
		rr, err := dns.NewRR(r)
		if err != nil {
			b.Fatal(err)
		}
		answer.Answer = append(answer.Answer, rr)
	}
	s.exchange = func(ctx context.Context, m *dns.Msg) (*dns.Msg, error) { return answer.Copy(), nil }
	req := new(dns.Msg)
	req.SetQuestion("www.bench.test.", dns.TypeA)
	b.ReportAllocs()
	for b.Loop() {
		r := s.handle(context.Background(), req)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 4 {
			b.Fatalf("answer %v", r)
		}
	}
}

// BenchmarkQuery measures a query over UDP through the server to a
// loopback upstream: the DNS answer time a sandbox sees, minus caching.
func BenchmarkQuery(b *testing.B) {
	up := newUpstreamB(b, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
	s, err := New(Config{Listen: "127.0.0.1:0", Upstreams: []string{up}, Decider: testDecider{allow: []string{"allowed.test"}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	c := &dns.Client{Timeout: 10 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	b.ReportAllocs()
	for b.Loop() {
		r, _, err := c.Exchange(m, s.Addr())
		if err != nil || len(r.Answer) != 1 {
			b.Fatalf("answer %v, %v", r, err)
		}
	}
}

// newUpstreamB serves zone (as newUpstream) for a benchmark.
func newUpstreamB(b *testing.B, zone map[string][]string) string {
	b.Helper()
	answers := map[string][]dns.RR{}
	for k, rrs := range zone {
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				b.Fatal(err)
			}
			answers[k] = append(answers[k], rr)
		}
	}
	pc, ln, err := listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ln.Close()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		m.Answer = answers[fmt.Sprintf("%s %s", dns.CanonicalName(q.Name), dns.TypeToString[q.Qtype])]
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	b.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

func BenchmarkTableHas(b *testing.B) {
	tab := NewTable(0)
	for i := range DefaultTableSize {
		tab.Learn(fmt.Sprintf("n%d.test", i%1000), []netip.Addr{netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}, time.Hour)
	}
	a := netip.AddrFrom4([4]byte{10, 0, 3, 232}) // i = 1000: n0.test
	b.ReportAllocs()
	for b.Loop() {
		if !tab.Has("n0.test", a) {
			b.Fatal("Has = false")
		}
	}
}
