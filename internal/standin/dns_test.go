package standin

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

// answers asks d name/qtype and returns the rcode and the answer records
// in presentation form, TTL included.
func answers(t *testing.T, d *DNS, name string, qtype uint16) (int, []string) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	m := d.Reply(q, "test")
	if m == nil {
		t.Fatalf("%s %s: no reply", name, dns.TypeToString[qtype])
	}
	var out []string
	for _, rr := range m.Answer {
		out = append(out, rr.String())
	}
	return m.Rcode, out
}

func TestDNSRecords(t *testing.T) {
	v4a, v4b := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("203.0.113.8")
	v6 := netip.MustParseAddr("2001:db8::7")
	d := NewDNS(map[string]netip.Addr{"Web.Test": v4a})
	d.Set("multi.test.", v4a, v6, v4b)
	d.SetCNAME("alias.test", "multi.test")
	d.SetCNAME("dangling.test", "unknown.test")
	d.SetCNAME("loop.test", "loop2.test")
	d.SetCNAME("loop2.test", "loop.test")
	d.Set("rebind.test", v4a)
	d.SetTTL("rebind.test", 0)

	cases := []struct {
		name  string
		qtype uint16
		rcode int
		want  []string
	}{
		{"web.test.", dns.TypeA, dns.RcodeSuccess, []string{"web.test.\t5\tIN\tA\t203.0.113.7"}},
		{"WEB.test.", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"multi.test.", dns.TypeA, dns.RcodeSuccess, []string{"multi.test.\t5\tIN\tA\t203.0.113.7", "multi.test.\t5\tIN\tA\t203.0.113.8"}},
		{"multi.test.", dns.TypeAAAA, dns.RcodeSuccess, []string{"multi.test.\t5\tIN\tAAAA\t2001:db8::7"}},
		{"multi.test.", dns.TypeHTTPS, dns.RcodeSuccess, nil},
		{"alias.test.", dns.TypeA, dns.RcodeSuccess, []string{"alias.test.\t5\tIN\tCNAME\tmulti.test.", "multi.test.\t5\tIN\tA\t203.0.113.7", "multi.test.\t5\tIN\tA\t203.0.113.8"}},
		{"alias.test.", dns.TypeCNAME, dns.RcodeSuccess, []string{"alias.test.\t5\tIN\tCNAME\tmulti.test."}},
		{"dangling.test.", dns.TypeA, dns.RcodeSuccess, []string{"dangling.test.\t5\tIN\tCNAME\tunknown.test."}},
		{"rebind.test.", dns.TypeA, dns.RcodeSuccess, []string{"rebind.test.\t0\tIN\tA\t203.0.113.7"}},
		{"other.test.", dns.TypeA, dns.RcodeNameError, nil},
	}
	for _, c := range cases {
		rcode, got := answers(t, d, c.name, c.qtype)
		if rcode != c.rcode || !slices.Equal(got, c.want) {
			t.Errorf("%s %s = %s %q, want %s %q", c.name, dns.TypeToString[c.qtype], dns.RcodeToString[rcode], got, dns.RcodeToString[c.rcode], c.want)
		}
	}
	if _, got := answers(t, d, "loop.test.", dns.TypeA); len(got) != maxChain {
		t.Errorf("a CNAME loop answers %d records, want %d: %q", len(got), maxChain, got)
	}

	// Records change while the server runs; a TTL survives the change.
	d.Set("rebind.test", v4b)
	if _, got := answers(t, d, "rebind.test.", dns.TypeA); !slices.Equal(got, []string{"rebind.test.\t0\tIN\tA\t203.0.113.8"}) {
		t.Errorf("after Set, rebind.test = %q", got)
	}
	d.Set("web.test")
	if rcode, _ := answers(t, d, "web.test.", dns.TypeA); rcode != dns.RcodeNameError {
		t.Errorf("after Set with no address, web.test answers %s, want NXDOMAIN", dns.RcodeToString[rcode])
	}
	if q := d.Queries(); len(q) == 0 || q[0] != "web.test. A from test" {
		t.Errorf("queries %q", q)
	}
}
