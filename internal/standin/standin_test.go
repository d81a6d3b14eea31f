package standin

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// TestStandIn: an address routed into the namespace answers from the
// host, the name server answers its names and only those, and everything
// is gone afterwards.
func TestStandIn(t *testing.T) {
	var name string
	var target, nameserver netip.Addr
	t.Run("serve", func(t *testing.T) {
		gw := Pick(t, netip.MustParsePrefix("10.187.0.0/16"), 1)
		n := New(t, gw, netip.Addr{})
		name = n.Name
		target = Pick(t, netip.MustParsePrefix("10.187.0.0/16"), 7)
		nameserver = Pick(t, netip.MustParsePrefix("10.187.0.0/16"), 53)
		n.Add(target)
		n.Add(nameserver)
		if why := Unused(target); !strings.Contains(why, "route") {
			t.Fatalf("Unused(%s) after Add = %q, want a route", target, why)
		}
		url := n.ServeHTTP(netip.AddrPortFrom(target, 80), "stand-in")
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "stand-in" {
			t.Fatalf("GET %s: %q", url, body)
		}
		dns := n.ServeDNS(nameserver, map[string]netip.Addr{"web.test.": target})
		for _, network := range []string{"udp", "tcp"} {
			r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, netip.AddrPortFrom(nameserver, 53).String())
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			addrs, err := r.LookupNetIP(ctx, "ip4", "web.test")
			cancel()
			if err != nil || !slices.Equal(addrs, []netip.Addr{target}) {
				t.Fatalf("%s: web.test = %v, %v", network, addrs, err)
			}
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			_, err = r.LookupNetIP(ctx, "ip4", "other.test")
			cancel()
			if de, ok := err.(*net.DNSError); !ok || !de.IsNotFound {
				t.Fatalf("%s: other.test: %v, want not found", network, err)
			}
		}
		if q := dns.Queries(); len(q) < 4 || !strings.HasPrefix(q[0], "web.test. A from ") {
			t.Fatalf("queries %q", q)
		}
	})
	if name == "" {
		return
	}
	for _, a := range []netip.Addr{target, nameserver} {
		if why := Unused(a); why != "" {
			t.Errorf("%s still in use after the test: %s", a, why)
		}
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), name) {
		t.Errorf("namespace %s left behind", name)
	}
}

func FuzzReply(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("web.test.", dns.TypeA)
	msg, _ := q.Pack()
	f.Add(msg)
	q.SetQuestion("alias.test.", dns.TypeAAAA)
	msg, _ = q.Pack()
	f.Add(msg)
	f.Add([]byte{0, 1, 0, 0, 0, 1})
	d := NewDNS(map[string]netip.Addr{"web.test.": netip.MustParseAddr("10.0.0.1")})
	d.SetCNAME("alias.test", "web.test")
	d.SetCNAME("loop.test", "loop.test")
	f.Fuzz(func(t *testing.T, msg []byte) {
		reply, err := d.replyWire(msg, "fuzz")
		if err != nil {
			return
		}
		m := new(dns.Msg)
		if err := m.Unpack(reply); err != nil || !m.Response {
			t.Fatalf("reply %x does not parse as a response: %v", reply, err)
		}
	})
}

// TestReserve: an address reserved by one test is not handed to another
// until released, also within one process (separate lock files are
// separate flock owners).
func TestReserve(t *testing.T) {
	testenv.MustHaveRoot(t)
	a := netip.MustParseAddr("192.0.2.251")
	unlock, ok := reserve(t, a)
	if !ok {
		t.Fatalf("%s is reserved by another test run; run again", a)
	}
	if u, ok := reserve(t, a); ok {
		u()
		t.Fatal("a reserved address was reserved a second time")
	}
	unlock()
	u, ok := reserve(t, a)
	if !ok {
		t.Fatal("a released address could not be reserved")
	}
	u()
}
