package dnsproxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/opensandbox/opensandbox/egress"
)

// testDecider allows exact names and "*.suffix" patterns (any depth, not
// the apex), and refuses as answers loopback, private, link-local,
// unspecified and the addresses in refuse.
type testDecider struct {
	allow  []string
	refuse []netip.Addr
}

func (d testDecider) Name(n string) bool {
	for _, p := range d.allow {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(n, "."+suffix) {
				return true
			}
		} else if n == p {
			return true
		}
	}
	return false
}

func (d testDecider) Resolved(a netip.Addr) bool {
	// Deliberately no Unmap: the server must check mapped forms itself.
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsUnspecified() {
		return false
	}
	return !slices.Contains(d.refuse, a)
}

func (d testDecider) Addr(a netip.Addr) bool { return false }

// upstream is the test's authoritative server for names under .test. Its
// zone maps "name. TYPE" to the answer section; other questions get
// NXDOMAIN. UDP answers are truncated to the query's buffer size.
type upstream struct {
	addr    string
	zone    map[string][]dns.RR
	extra   map[string][]dns.RR
	udp     atomic.Int64
	tcp     atomic.Int64
	mu      sync.Mutex
	queries []*dns.Msg
}

func newUpstream(t *testing.T, zone map[string][]string) *upstream {
	t.Helper()
	return newUpstreamExtra(t, zone, nil)
}

// newUpstreamExtra is newUpstream whose answers to the questions in extra
// carry those records in their additional section.
func newUpstreamExtra(t *testing.T, zone, extra map[string][]string) *upstream {
	t.Helper()
	u := &upstream{zone: map[string][]dns.RR{}, extra: map[string][]dns.RR{}}
	for k, rrs := range zone {
		for _, s := range rrs {
			u.zone[k] = append(u.zone[k], mustRR(t, s))
		}
	}
	for k, rrs := range extra {
		for _, s := range rrs {
			u.extra[k] = append(u.extra[k], mustRR(t, s))
		}
	}
	pc, ln, err := listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: u.handler("udp")},
		{Listener: ln, Handler: u.handler("tcp")},
	} {
		up := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(up) }
		go srv.ActivateAndServe()
		<-up
		t.Cleanup(func() { srv.Shutdown() })
	}
	return u
}

func (u *upstream) handler(network string) dns.HandlerFunc {
	return func(w dns.ResponseWriter, req *dns.Msg) {
		if network == "udp" {
			u.udp.Add(1)
		} else {
			u.tcp.Add(1)
		}
		u.mu.Lock()
		u.queries = append(u.queries, req.Copy())
		u.mu.Unlock()
		q := req.Question[0]
		key := dns.CanonicalName(q.Name) + " " + dns.TypeToString[q.Qtype]
		m := new(dns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		if ans, ok := u.zone[key]; ok {
			for _, rr := range ans {
				m.Answer = append(m.Answer, dns.Copy(rr))
			}
			for _, rr := range u.extra[key] {
				m.Extra = append(m.Extra, dns.Copy(rr))
			}
		} else {
			m.Rcode = dns.RcodeNameError
			soa, _ := dns.NewRR("test. 60 IN SOA ns.test. admin.test. 1 60 60 60 60")
			m.Ns = []dns.RR{soa}
		}
		if opt := req.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), false)
		}
		if network == "udp" {
			m.Truncate(clientUDPSize(req))
		}
		w.WriteMsg(m)
	}
}

func (u *upstream) count() int64 { return u.udp.Load() + u.tcp.Load() }

// recorder collects what the server learns and denies.
type recorder struct {
	mu      sync.Mutex
	learned map[string][]netip.Addr
	ttls    map[string]time.Duration
	denials []egress.Denial
}

func (r *recorder) learn(name string, addrs []netip.Addr, ttl time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.learned[name] = append(r.learned[name], addrs...)
	r.ttls[name] = ttl
}

func (r *recorder) deny(d egress.Denial) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.denials = append(r.denials, d)
}

func (r *recorder) addrs(name string) []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.learned[name])
}

func (r *recorder) ttl(name string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ttls[name]
}

func (r *recorder) denied() []egress.Denial {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.denials)
}

// start runs a Server on a free loopback port with upstreams and d,
// recording into the returned recorder.
func start(t *testing.T, d egress.Decider, upstreams ...string) (*Server, *recorder) {
	t.Helper()
	rec := &recorder{learned: map[string][]netip.Addr{}, ttls: map[string]time.Duration{}}
	s, err := New(Config{
		Listen:    "127.0.0.1:0",
		Upstreams: upstreams,
		Decider:   d,
		Learn:     rec.learn,
		Deny:      rec.deny,
		Timeout:   5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rec
}

// ask sends one query for name and type over network to the server.
func ask(t *testing.T, s *Server, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return exchange(t, s, network, m)
}

func exchange(t *testing.T, s *Server, network string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 20 * time.Second}
	r, _, err := c.Exchange(m, s.Addr())
	if err != nil {
		t.Fatalf("query %s %s over %s: %v", m.Question[0].Name, dns.TypeToString[m.Question[0].Qtype], network, err)
	}
	return r
}

// answerAddrs lists the A and AAAA addresses of r's answer section.
func answerAddrs(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(rr.A.To4())
			out = append(out, a)
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(rr.AAAA.To16())
			out = append(out, a)
		}
	}
	return out
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func wantRcode(t *testing.T, r *dns.Msg, want int) {
	t.Helper()
	if r.Rcode != want {
		t.Fatalf("rcode = %s, want %s; answer:\n%v", dns.RcodeToString[r.Rcode], dns.RcodeToString[want], r)
	}
}

func TestAllowedName(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"allowed.test. A":    {"allowed.test. 300 IN A 198.51.100.10"},
		"allowed.test. AAAA": {"allowed.test. 300 IN AAAA 2001:db8::10"},
		"allowed.test. TXT":  {`allowed.test. 300 IN TXT "hello"`},
		"allowed.test. MX":   {"allowed.test. 300 IN MX 10 mail.allowed.test."},
	})
	s, rec := start(t, testDecider{allow: []string{"allowed.test"}}, up.addr)
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			r := ask(t, s, network, "Allowed.Test.", dns.TypeA)
			wantRcode(t, r, dns.RcodeSuccess)
			if got := answerAddrs(r); !slices.Equal(got, addrs("198.51.100.10")) {
				t.Errorf("A answer = %v", got)
			}
			if r.Question[0].Name != "Allowed.Test." {
				t.Errorf("question = %q, want the client's spelling", r.Question[0].Name)
			}
			r = ask(t, s, network, "allowed.test", dns.TypeAAAA)
			if got := answerAddrs(r); !slices.Equal(got, addrs("2001:db8::10")) {
				t.Errorf("AAAA answer = %v", got)
			}
			r = ask(t, s, network, "allowed.test", dns.TypeTXT)
			if len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != "hello" {
				t.Errorf("TXT answer = %v", r.Answer)
			}
			r = ask(t, s, network, "allowed.test", dns.TypeMX)
			if len(r.Answer) != 1 || r.Answer[0].Header().Rrtype != dns.TypeMX {
				t.Errorf("MX answer = %v", r.Answer)
			}
		})
	}
	if got := rec.addrs("allowed.test"); !slices.Contains(got, netip.MustParseAddr("198.51.100.10")) ||
		!slices.Contains(got, netip.MustParseAddr("2001:db8::10")) {
		t.Errorf("learned for allowed.test = %v", got)
	}
	if up.udp.Load() == 0 || up.tcp.Load() != 0 {
		t.Errorf("upstream queries udp=%d tcp=%d, want UDP only", up.udp.Load(), up.tcp.Load())
	}
	if d := rec.denied(); len(d) != 0 {
		t.Errorf("denials = %v", d)
	}
}

func TestDeniedNameNeverReachesUpstream(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"denied.test. A": {"denied.test. 300 IN A 198.51.100.66"},
	})
	s, rec := start(t, testDecider{allow: []string{"allowed.test"}}, up.addr)
	for _, network := range []string{"udp", "tcp"} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeHTTPS} {
			r := ask(t, s, network, "denied.test", qtype)
			wantRcode(t, r, dns.RcodeNameError)
			if len(r.Answer) != 0 {
				t.Errorf("%s answer = %v", network, r.Answer)
			}
		}
	}
	if n := up.count(); n != 0 {
		t.Errorf("upstream saw %d queries, want 0", n)
	}
	d := rec.denied()
	if len(d) != 8 {
		t.Fatalf("denials = %v, want 8", d)
	}
	if d[0].Kind != "dns" || d[0].Name != "denied.test" || d[0].Reason == "" || d[0].Time.IsZero() {
		t.Errorf("denial = %+v", d[0])
	}
	if got := rec.addrs("denied.test"); len(got) != 0 {
		t.Errorf("learned %v for a denied name", got)
	}
}

func TestWildcardDecidedByDecider(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"a.wild.test. A":   {"a.wild.test. 300 IN A 198.51.100.1"},
		"a.b.wild.test. A": {"a.b.wild.test. 300 IN A 198.51.100.2"},
		"wild.test. A":     {"wild.test. 300 IN A 198.51.100.3"},
	})
	s, _ := start(t, testDecider{allow: []string{"*.wild.test"}}, up.addr)
	for _, c := range []struct {
		name  string
		rcode int
	}{
		{"a.wild.test", dns.RcodeSuccess},
		{"A.B.WILD.TEST", dns.RcodeSuccess},
		{"wild.test", dns.RcodeNameError},
		{"notwild.test", dns.RcodeNameError},
	} {
		r := ask(t, s, "udp", c.name, dns.TypeA)
		if r.Rcode != c.rcode {
			t.Errorf("%s: rcode %s, want %s", c.name, dns.RcodeToString[r.Rcode], dns.RcodeToString[c.rcode])
		}
	}
}

func TestRebindingAddressesRemoved(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"loop.test. A":      {"loop.test. 300 IN A 127.0.0.1"},
		"private.test. A":   {"private.test. 300 IN A 10.1.2.3"},
		"metadata.test. A":  {"metadata.test. 300 IN A 169.254.169.254"},
		"loop6.test. AAAA":  {"loop6.test. 300 IN AAAA ::1"},
		"mapped.test. AAAA": {"mapped.test. 300 IN AAAA ::ffff:10.0.0.1"},
		"refused.test. A":   {"refused.test. 300 IN A 203.0.113.99"},
		// The refused address spelt IPv4-mapped, which testDecider does
		// not unmap: the server checks both forms.
		"refused6.test. AAAA": {"refused6.test. 300 IN AAAA ::ffff:203.0.113.99"},
		"mixed.test. A": {
			"mixed.test. 300 IN A 10.0.0.1",
			"mixed.test. 300 IN A 203.0.113.5",
			"mixed.test. 300 IN A 169.254.169.254",
		},
		"via.test. A": {
			"via.test. 300 IN CNAME inner.test.",
			"inner.test. 300 IN A 169.254.169.254",
		},
	})
	d := testDecider{
		allow:  []string{"loop.test", "private.test", "metadata.test", "loop6.test", "mapped.test", "refused.test", "refused6.test", "mixed.test", "via.test", "inner.test"},
		refuse: addrs("203.0.113.99"),
	}
	s, rec := start(t, d, up.addr)
	for _, c := range []struct {
		name  string
		qtype uint16
		want  []netip.Addr // nil: NXDOMAIN
	}{
		{"loop.test", dns.TypeA, nil},
		{"private.test", dns.TypeA, nil},
		{"metadata.test", dns.TypeA, nil},
		{"loop6.test", dns.TypeAAAA, nil},
		{"mapped.test", dns.TypeAAAA, nil},
		{"refused.test", dns.TypeA, nil},
		{"refused6.test", dns.TypeAAAA, nil},
		{"via.test", dns.TypeA, nil},
		{"mixed.test", dns.TypeA, addrs("203.0.113.5")},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ask(t, s, "udp", c.name, c.qtype)
			if c.want == nil {
				wantRcode(t, r, dns.RcodeNameError)
				if len(r.Answer) != 0 {
					t.Errorf("answer = %v", r.Answer)
				}
				if got := rec.addrs(c.name); len(got) != 0 {
					t.Errorf("learned %v", got)
				}
				found := false
				for _, d := range rec.denied() {
					found = found || (d.Name == c.name && d.Reason == reasonResolves && d.Addr.IsValid())
				}
				if !found {
					t.Errorf("no denial for %s in %v", c.name, rec.denied())
				}
				return
			}
			wantRcode(t, r, dns.RcodeSuccess)
			if got := answerAddrs(r); !slices.Equal(got, c.want) {
				t.Errorf("answer = %v, want %v", got, c.want)
			}
			if got := rec.addrs(c.name); !slices.Equal(got, c.want) {
				t.Errorf("learned %v, want %v", got, c.want)
			}
		})
	}
}

func TestCNAMEToDeniedName(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"alias.test. A": {
			"alias.test. 300 IN CNAME hop.test.",
			"hop.test. 300 IN CNAME denied.test.",
			"denied.test. 300 IN A 198.51.100.66",
		},
		// The chain in reverse order must be followed all the same.
		"reversed.test. A": {
			"denied.test. 300 IN A 198.51.100.66",
			"hop.test. 300 IN CNAME denied.test.",
			"reversed.test. 300 IN CNAME hop.test.",
		},
	})
	s, rec := start(t, testDecider{allow: []string{"alias.test", "reversed.test", "hop.test"}}, up.addr)
	for _, name := range []string{"alias.test", "reversed.test"} {
		r := ask(t, s, "udp", name, dns.TypeA)
		wantRcode(t, r, dns.RcodeNameError)
		if len(r.Answer) != 0 {
			t.Errorf("%s: answer = %v", name, r.Answer)
		}
		for _, n := range []string{name, "hop.test", "denied.test"} {
			if got := rec.addrs(n); len(got) != 0 {
				t.Errorf("learned %v for %s", got, n)
			}
		}
	}
	d := rec.denied()
	if len(d) != 2 || d[0].Name != "alias.test" || !strings.Contains(d[0].Reason, "denied.test") {
		t.Errorf("denials = %+v", d)
	}
}

func TestCNAMEChainLearnedAndStrangersDropped(t *testing.T) {
	up := newUpstreamExtra(t, map[string][]string{
		"www.test. A": {
			"www.test. 300 IN CNAME cdn.test.",
			"cdn.test. 120 IN A 198.51.100.20",
			"cdn.test. 60 IN A 198.51.100.21",
			// Not on the chain: a record a hostile upstream slips in.
			"stranger.test. 300 IN A 198.51.100.99",
		},
	}, map[string][]string{"www.test. A": {"glue.test. 300 IN A 198.51.100.98"}})
	s, rec := start(t, testDecider{allow: []string{"www.test", "cdn.test", "stranger.test", "glue.test"}}, up.addr)
	r := ask(t, s, "udp", "www.test", dns.TypeA)
	wantRcode(t, r, dns.RcodeSuccess)
	want := addrs("198.51.100.20", "198.51.100.21")
	if got := answerAddrs(r); !slices.Equal(got, want) {
		t.Errorf("answer addresses = %v, want %v", got, want)
	}
	if len(r.Answer) != 3 || len(r.Extra) != 0 {
		t.Errorf("answer = %v, extra = %v; want the chain only, no additional records", r.Answer, r.Extra)
	}
	for _, n := range []string{"www.test", "cdn.test"} {
		if got := rec.addrs(n); !slices.Equal(got, want) {
			t.Errorf("learned for %s = %v, want %v", n, got, want)
		}
		if ttl := rec.ttl(n); ttl != 60*time.Second {
			t.Errorf("ttl for %s = %v, want the smallest, 60s", n, ttl)
		}
	}
	for _, n := range []string{"stranger.test", "glue.test"} {
		if got := rec.addrs(n); len(got) != 0 {
			t.Errorf("learned %v for %s, not on the chain", got, n)
		}
	}
}

func mustRR(t *testing.T, s string) dns.RR {
	t.Helper()
	rr, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

func TestTTL(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"zero.test. A": {"zero.test. 0 IN A 198.51.100.30"},
		"long.test. A": {"long.test. 86400 IN A 198.51.100.31"},
	})
	table := NewTable(0)
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	table.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s, err := New(Config{Listen: "127.0.0.1:0", Upstreams: []string{up.addr}, Decider: testDecider{allow: []string{"*.test"}}, Learn: table.Learn})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	r := ask(t, s, "udp", "zero.test", dns.TypeA)
	if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 0 {
		t.Fatalf("answer = %v, want the TTL 0 record", r.Answer)
	}
	r = ask(t, s, "udp", "long.test", dns.TypeA)
	if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 3600 {
		t.Fatalf("answer = %v, want the TTL capped at 3600", r.Answer)
	}
	zero, long := netip.MustParseAddr("198.51.100.30"), netip.MustParseAddr("198.51.100.31")
	for _, c := range []struct {
		after      time.Duration
		zero, long bool
	}{
		{0, true, true},
		{MinTTL - time.Second, true, true},
		{MinTTL + time.Second, false, true},
		{MaxTTL - time.Second, false, true},
		{MaxTTL + time.Second, false, false},
	} {
		mu.Lock()
		at := now
		now = now.Add(c.after)
		mu.Unlock()
		if got := table.Has("zero.test", zero); got != c.zero {
			t.Errorf("after %v: Has(zero.test) = %v, want %v", c.after, got, c.zero)
		}
		if got := table.Has("long.test", long); got != c.long {
			t.Errorf("after %v: Has(long.test) = %v, want %v", c.after, got, c.long)
		}
		mu.Lock()
		now = at
		mu.Unlock()
	}
}

func TestHTTPSHintsStripped(t *testing.T) {
	up := newUpstream(t, map[string][]string{
		"svc.test. HTTPS": {
			"svc.test. 300 IN HTTPS 1 . mandatory=alpn,ipv4hint alpn=h2,h3 port=8443 ipv4hint=198.51.100.40 ech=AEX+DQBBpQAgACB/BVTAa9Y= ipv6hint=2001:db8::40",
			"svc.test. 300 IN HTTPS 2 . mandatory=ipv6hint ipv6hint=2001:db8::41",
		},
		"_8443._https.svc.test. SVCB": {
			"_8443._https.svc.test. 300 IN SVCB 1 svc.test. alpn=h2 ipv4hint=198.51.100.42",
		},
	})
	s, rec := start(t, testDecider{allow: []string{"svc.test", "_8443._https.svc.test"}}, up.addr)
	r := ask(t, s, "udp", "svc.test", dns.TypeHTTPS)
	wantRcode(t, r, dns.RcodeSuccess)
	if len(r.Answer) != 2 {
		t.Fatalf("answer = %v", r.Answer)
	}
	got := []string{r.Answer[0].String(), r.Answer[1].String()}
	want := []string{
		"svc.test.\t300\tIN\tHTTPS\t1 . mandatory=\"alpn\" alpn=\"h2,h3\" port=\"8443\"",
		"svc.test.\t300\tIN\tHTTPS\t2 .",
	}
	if !slices.Equal(got, want) {
		t.Errorf("answer =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	r = ask(t, s, "tcp", "_8443._https.svc.test", dns.TypeSVCB)
	if len(r.Answer) != 1 || strings.Contains(r.Answer[0].String(), "hint") {
		t.Errorf("SVCB answer = %v", r.Answer)
	}
	if l := rec.addrs("svc.test"); len(l) != 0 {
		t.Errorf("learned %v from hints", l)
	}
}

func TestTruncationRetriedOverTCP(t *testing.T) {
	var big []string
	for i := range 100 {
		big = append(big, fmt.Sprintf("big.test. 300 IN A 198.51.100.%d", i+1))
	}
	up := newUpstream(t, map[string][]string{"big.test. A": big})
	s, rec := start(t, testDecider{allow: []string{"big.test"}}, up.addr)

	// Over TCP, the client gets everything; the proxy had to use TCP
	// upstream because the UDP answer was truncated.
	r := ask(t, s, "tcp", "big.test", dns.TypeA)
	wantRcode(t, r, dns.RcodeSuccess)
	if r.Truncated || len(answerAddrs(r)) != 100 {
		t.Fatalf("TCP answer: truncated=%v, %d addresses", r.Truncated, len(answerAddrs(r)))
	}
	if up.tcp.Load() == 0 {
		t.Error("upstream saw no TCP query after its truncated UDP answer")
	}
	if got := rec.addrs("big.test"); len(got) != 100 {
		t.Errorf("learned %d addresses, want 100", len(got))
	}

	// Over UDP without EDNS, the client's 512 bytes get a truncated
	// answer with TC set, so that it retries over TCP.
	r = ask(t, s, "udp", "big.test", dns.TypeA)
	if !r.Truncated {
		t.Errorf("UDP answer of %d records without TC", len(r.Answer))
	}
	if n := len(answerAddrs(r)); n >= 100 {
		t.Errorf("UDP answer holds %d addresses in 512 bytes?", n)
	}

	// With a large EDNS buffer it all fits.
	m := new(dns.Msg)
	m.SetQuestion("big.test.", dns.TypeA)
	m.SetEdns0(4096, false)
	r = exchange(t, s, "udp", m)
	if r.Truncated || len(answerAddrs(r)) != 100 {
		t.Errorf("UDP answer with a 4096 buffer: truncated=%v, %d addresses", r.Truncated, len(answerAddrs(r)))
	}
}

// closedAddr is a loopback UDP and TCP address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	pc, ln, err := listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	ln.Close()
	return addr
}

func TestUpstreamDown(t *testing.T) {
	down := closedAddr(t)
	s, _ := start(t, testDecider{allow: []string{"allowed.test"}}, down)
	for _, network := range []string{"udp", "tcp"} {
		wantRcode(t, ask(t, s, network, "allowed.test", dns.TypeA), dns.RcodeServerFailure)
	}

	// The next upstream is asked when the first is down.
	up := newUpstream(t, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
	s2, _ := start(t, testDecider{allow: []string{"allowed.test"}}, down, up.addr)
	r := ask(t, s2, "udp", "allowed.test", dns.TypeA)
	wantRcode(t, r, dns.RcodeSuccess)
	if got := answerAddrs(r); !slices.Equal(got, addrs("198.51.100.10")) {
		t.Errorf("answer = %v", got)
	}
}

func TestUpstreamMismatchedAnswerRefused(t *testing.T) {
	// An upstream that answers another question than the one asked.
	other := mustRR(t, "other.test. 300 IN A 198.51.100.50")
	addr := serveUDP(t, func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Question[0].Name = "other.test."
		m.Answer = []dns.RR{dns.Copy(other)}
		w.WriteMsg(m)
	})
	s, rec := start(t, testDecider{allow: []string{"allowed.test", "other.test"}}, addr)
	wantRcode(t, ask(t, s, "udp", "allowed.test", dns.TypeA), dns.RcodeServerFailure)
	if got := rec.addrs("other.test"); len(got) != 0 {
		t.Errorf("learned %v", got)
	}
}

func TestRefusedQueries(t *testing.T) {
	up := newUpstream(t, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
	s, rec := start(t, testDecider{allow: []string{"allowed.test", "*.allowed.test", "*.test"}}, up.addr)

	wantRcode(t, ask(t, s, "udp", "allowed.test", dns.TypeANY), dns.RcodeNotImplemented)
	wantRcode(t, ask(t, s, "tcp", "allowed.test", dns.TypeAXFR), dns.RcodeNotImplemented)

	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeTXT)
	m.Question[0].Qclass = dns.ClassCHAOS
	wantRcode(t, exchange(t, s, "udp", m), dns.RcodeNotImplemented)

	// A dot inside a label reads, in text, like a name under
	// allowed.test, but is not one.
	m = new(dns.Msg)
	m.SetQuestion(`x.evil\.allowed.test.`, dns.TypeA)
	wantRcode(t, exchange(t, s, "udp", m), dns.RcodeNameError)
	m.SetQuestion(`x.evil\000.allowed.test.`, dns.TypeA)
	wantRcode(t, exchange(t, s, "udp", m), dns.RcodeNameError)

	if n := up.count(); n != 0 {
		t.Errorf("upstream saw %d queries, want 0", n)
	}
	if d := rec.denied(); len(d) != 2 {
		t.Errorf("denials = %v, want the two escaped names", d)
	}
}

func TestUpstreamQueryCarriesNoClientOptions(t *testing.T) {
	up := newUpstream(t, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
	s, _ := start(t, testDecider{allow: []string{"allowed.test"}}, up.addr)
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	m.SetEdns0(4096, true)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.ParseIP("198.51.100.0")})
	wantRcode(t, exchange(t, s, "udp", m), dns.RcodeSuccess)
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.queries) != 1 {
		t.Fatalf("upstream saw %d queries", len(up.queries))
	}
	got := up.queries[0].IsEdns0()
	if got == nil || len(got.Option) != 0 || !got.Do() {
		t.Errorf("upstream query OPT = %v, want DO and no options", got)
	}
}

func TestMalformedPacketsDropped(t *testing.T) {
	up := newUpstream(t, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
	s, _ := start(t, testDecider{allow: []string{"allowed.test"}}, up.addr)

	good := new(dns.Msg)
	good.SetQuestion("allowed.test.", dns.TypeA)
	wire, err := good.Pack()
	if err != nil {
		t.Fatal(err)
	}
	junk := [][]byte{
		{},
		{0x12},
		wire[:5],
		wire[:14],                        // header promises a question that is not there
		append(slices.Clone(wire), 0xc0), // trailing garbage
		func() []byte { b := slices.Clone(wire); b[2] |= 0x80; return b }(), // a response
		func() []byte { b := slices.Clone(wire); b[5] = 2; return b }(),     // two questions
		[]byte(strings.Repeat("\xff", 600)),
	}
	conn, err := net.Dial("udp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, b := range junk {
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range junk {
		tc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		framed := append([]byte{byte(len(b) >> 8), byte(len(b))}, b...)
		tc.Write(framed)
		tc.Close()
	}
	// Still serving, on both transports.
	for _, network := range []string{"udp", "tcp"} {
		wantRcode(t, ask(t, s, network, "allowed.test", dns.TypeA), dns.RcodeSuccess)
	}
}

func TestNewChecksConfig(t *testing.T) {
	d := testDecider{}
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"no upstreams", Config{Decider: d}},
		{"upstream without port", Config{Decider: d, Upstreams: []string{"198.51.100.1"}}},
		{"no decider", Config{Upstreams: []string{"198.51.100.1:53"}}},
		{"bad listen", Config{Decider: d, Upstreams: []string{"198.51.100.1:53"}, Listen: "nowhere"}},
	} {
		if _, err := New(c.cfg); err == nil {
			t.Errorf("%s: New succeeded", c.name)
		}
	}
	s, err := New(Config{Decider: d, Upstreams: []string{"198.51.100.1:53"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Listen != "127.0.0.1:15353" || s.cfg.Timeout != DefaultTimeout {
		t.Errorf("defaults: Listen %q, Timeout %v", s.cfg.Listen, s.cfg.Timeout)
	}
}

func TestStartCloseTwice(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0", Decider: testDecider{}, Upstreams: []string{closedAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr()
	if err := s.Start(); err == nil {
		t.Error("second Start succeeded")
	}
	s.Close()
	s.Close()
	// Its port is free again.
	pc, ln, err := listen(addr)
	if err != nil {
		t.Fatalf("port of a closed server: %v", err)
	}
	pc.Close()
	ln.Close()
}

func TestControlOnUpstreamSockets(t *testing.T) {
	var big []string
	for i := range 100 {
		big = append(big, fmt.Sprintf("big.test. 300 IN A 198.51.100.%d", i+1))
	}
	up := newUpstream(t, map[string][]string{"big.test. A": big})
	var mu sync.Mutex
	seen := map[string]int{}
	s, err := New(Config{
		Listen:    "127.0.0.1:0",
		Upstreams: []string{up.addr},
		Decider:   testDecider{allow: []string{"big.test"}},
		Control: func(network, address string, c syscall.RawConn) error {
			if address != up.addr {
				t.Errorf("Control for %s, want the upstream %s", address, up.addr)
			}
			mu.Lock()
			seen[network]++
			mu.Unlock()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	wantRcode(t, ask(t, s, "tcp", "big.test", dns.TypeA), dns.RcodeSuccess)
	mu.Lock()
	defer mu.Unlock()
	if seen["udp4"] != 1 || seen["tcp4"] != 1 {
		t.Errorf("Control calls = %v, want one UDP and one TCP socket", seen)
	}
}

func TestControlErrorFailsTheQuery(t *testing.T) {
	up := newUpstream(t, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
	s, err := New(Config{
		Listen:    "127.0.0.1:0",
		Upstreams: []string{up.addr},
		Decider:   testDecider{allow: []string{"allowed.test"}},
		Control: func(network, address string, c syscall.RawConn) error {
			return errors.New("cannot mark")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	wantRcode(t, ask(t, s, "udp", "allowed.test", dns.TypeA), dns.RcodeServerFailure)
	if n := up.count(); n != 0 {
		t.Errorf("upstream saw %d queries from unmarked sockets", n)
	}
}

// serveUDP runs h as a DNS server over UDP on loopback and returns its
// address.
func serveUDP(t *testing.T, h dns.HandlerFunc) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	up := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(up) }
	go srv.ActivateAndServe()
	<-up
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

func TestFailingUpstreamSkipped(t *testing.T) {
	var failed atomic.Int64
	for _, rcode := range []int{dns.RcodeServerFailure, dns.RcodeRefused} {
		bad := serveUDP(t, func(w dns.ResponseWriter, req *dns.Msg) {
			failed.Add(1)
			m := new(dns.Msg)
			m.SetRcode(req, rcode)
			w.WriteMsg(m)
		})
		good := newUpstream(t, map[string][]string{"allowed.test. A": {"allowed.test. 300 IN A 198.51.100.10"}})
		s, _ := start(t, testDecider{allow: []string{"allowed.test"}}, bad, good.addr)
		r := ask(t, s, "udp", "allowed.test", dns.TypeA)
		wantRcode(t, r, dns.RcodeSuccess)
		if good.count() != 1 {
			t.Errorf("after %s: the next upstream saw %d queries", dns.RcodeToString[rcode], good.count())
		}
		// The last upstream's failure is the client's SERVFAIL.
		s2, _ := start(t, testDecider{allow: []string{"allowed.test"}}, bad)
		wantRcode(t, ask(t, s2, "udp", "allowed.test", dns.TypeA), dns.RcodeServerFailure)
	}
	if failed.Load() != 4 {
		t.Errorf("failing upstreams saw %d queries, want 4", failed.Load())
	}
}
