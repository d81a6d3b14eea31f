package main

import (
	"context"
	"debug/elf"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/standin"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

func TestParse(t *testing.T) {
	pos, o, err := parse([]string{"https", "https://a.test/", "-sni", "b.test", "-timeout", "5s", "-host", "c.test"})
	if err != nil || !slices.Equal(pos, []string{"https", "https://a.test/"}) || o.sni != "b.test" || o.host != "c.test" || o.timeout != 5*time.Second {
		t.Fatalf("parse = %q %+v %v", pos, o, err)
	}
	for _, args := range [][]string{nil, {"tcp"}, {"tcp", "a:1", "b:2"}, {"teleport", "x"}, {"dns", "a.test", "-bogus"}} {
		if r, usage := run(context.Background(), args); !usage || r.OK {
			t.Errorf("run(%q) = %+v, usage %v; want a usage error", args, r, usage)
		}
	}
}

// TestProbeLoopback needs no privilege: a TCP reply, a silent server
// that closes (not ok), UDP echo and a refused port.
func TestProbeLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if i == 0 {
				c.Write([]byte("hello from the server\n"))
			}
			c.Close() // the second connection: accepted and closed at once, as a refusing proxy does
		}
	}()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(append([]byte("echo "), buf[:n]...), from)
		}
	}()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closed.Close()
	cases := []struct {
		args   []string
		ok     bool
		detail string
	}{
		{[]string{"tcp", ln.Addr().String()}, true, "reply: hello from the server"},
		{[]string{"tcp", ln.Addr().String()}, false, "connected, no reply"},
		{[]string{"udp", pc.LocalAddr().String()}, true, "reply: echo netprobe"},
		{[]string{"tcp", closed.Addr().String()}, false, "refused"},
		{[]string{"ipv6", ln.Addr().String()}, false, ""},
	}
	for _, c := range cases {
		r, usage := run(context.Background(), append(c.args, "-timeout", "20s"))
		if usage || r.OK != c.ok || !strings.Contains(r.Detail, c.detail) {
			t.Errorf("netprobe %q = %+v, want ok=%v and %q", c.args, r, c.ok, c.detail)
		}
	}
}

// TestProbeStandIn runs every network probe from the host against the
// stand-in servers of a namespace: what a sandbox allowed everything
// would see, and the refusals it would see where nothing answers. Servers
// the probes must not reach count no hits.
func TestProbeStandIn(t *testing.T) {
	doc := netip.MustParsePrefix("203.0.113.0/24")
	doc6 := netip.MustParsePrefix("2001:db8:5e1::/48")
	n := standin.New(t, standin.Pick(t, netip.MustParsePrefix("198.51.100.0/24"), 1), standin.Pick(t, doc6, 1))
	web, ns, nobody, web6 := standin.Pick(t, doc, 7), standin.Pick(t, doc, 53), standin.Pick(t, doc, 9), standin.Pick(t, doc6, 7)
	for _, a := range []netip.Addr{web, ns, nobody, web6} {
		n.Add(a)
	}
	dir := t.TempDir()
	ca, ech := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ech")
	os.WriteFile(ca, n.CAPEM(), 0o644)
	os.WriteFile(ech, n.ECHConfigList(), 0o644)

	plain := n.ServeWeb(netip.AddrPortFrom(web, 80), "plain page")
	secure := n.ServeTLS(netip.AddrPortFrom(web, 443), "secure page")
	banner := n.ServeBanner(netip.AddrPortFrom(web, 2222), "SSH-2.0-standin")
	banner6 := n.ServeBanner(netip.AddrPortFrom(web6, 2222), "v6 banner")
	echo := n.ServeUDPEcho(netip.AddrPortFrom(web, 5353))
	d := n.ServeDNS(ns, map[string]netip.Addr{"web.test.": web})
	d.Set("dual.test", web, netip.MustParseAddr("2001:db8::7"))
	d.SetCNAME("alias.test", "web.test")
	doh := n.ServeDoH(netip.AddrPortFrom(ns, 443), d)
	dot := n.ServeDoT(ns, d)
	unused := n.ServeTLS(netip.AddrPortFrom(nobody, 443), "never")
	dnsAt := netip.AddrPortFrom(ns, 53).String()

	cases := []struct {
		args   []string
		ok     bool
		detail string
	}{
		{[]string{"tcp", banner.Addr.String()}, true, "reply: SSH-2.0-standin"},
		{[]string{"http", plain.URL, "-host", "web.test"}, true, "HTTP 200: plain page"},
		{[]string{"https", secure.URL, "-sni", "allowed.test", "-host", "denied.test", "-cafile", ca}, true, "HTTP 200: secure page [host=denied.test sni=allowed.test]"},
		{[]string{"https", secure.URL, "-nosni", "-cafile", ca}, true, "[host=" + web.String() + ":443 sni=]"},
		{[]string{"https", secure.URL, "-sni", "wrong.test", "-cafile", filepath.Join(dir, "ech")}, false, "no certificate"},
		{[]string{"dns", "web.test", "-server", dnsAt}, true, "NOERROR: A " + web.String()},
		{[]string{"dns", "alias.test", "-server", dnsAt, "-tcp"}, true, "NOERROR: CNAME web.test., A " + web.String()},
		{[]string{"dns", "dual.test", "-server", dnsAt, "-type", "AAAA"}, true, "AAAA 2001:db8::7"},
		{[]string{"dns", "web.test", "-server", dnsAt, "-type", "HTTPS"}, false, "no HTTPS record"},
		{[]string{"dns", "denied.test", "-server", dnsAt}, false, "NXDOMAIN"},
		{[]string{"udp", echo.Addr.String()}, true, "reply: netprobe"},
		{[]string{"dot", dot.Addr.String(), "web.test", "-sni", "dot.test", "-cafile", ca}, true, "NOERROR: A " + web.String()},
		{[]string{"doh", doh.URL, "web.test", "-sni", "doh.test", "-cafile", ca}, true, "NOERROR: A " + web.String()},
		{[]string{"ech", secure.URL, "-sni", "hidden.test", "-echconfig", ech, "-cafile", ca}, true, "ECH accepted=true, sni=hidden.test"},
		{[]string{"ech", secure.URL, "-sni", "hidden.test", "-cafile", ca}, true, "ECH rejected by a TLS server that answered (68 bytes of retry configs)"},
		{[]string{"ech", secure.URL, "-sni", "hidden.test"}, true, "outer certificate unverified"},
		{[]string{"tcp", netip.AddrPortFrom(nobody, 2222).String()}, false, "refused"},
		{[]string{"ipv6", banner6.Addr.String()}, true, "reply: v6 banner"},
		{[]string{"ipv6", banner.Addr.String()}, false, ""}, // an IPv4 address is no IPv6 attempt
	}
	for _, c := range cases {
		r, usage := run(context.Background(), append(c.args, "-timeout", "20s"))
		if usage || r.OK != c.ok || !strings.Contains(r.Detail, c.detail) {
			t.Errorf("netprobe %q = %+v, want ok=%v and %q", c.args, r, c.ok, c.detail)
		}
	}
	if got := secure.Seen(); len(got) < 3 || !got[len(got)-1].ECH || got[len(got)-1].SNI != "hidden.test" {
		t.Errorf("the TLS server saw %+v", got)
	}
	if unused.Hits() != 0 {
		t.Errorf("a server no probe named counts %d hits", unused.Hits())
	}
}

// TestBinary builds the static binary the e2e tests upload and runs the
// probes of privilege: as root in a namespace it may open raw sockets and
// change nftables; as nobody with no capabilities it may not.
func TestBinary(t *testing.T) {
	testenv.MustHaveRoot(t)
	testenv.MustHaveCommand(t, "setpriv")
	bin := standin.Netprobe(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("netprobe is dynamically linked (program header %v)", p.Type)
		}
	}
	f.Close()
	n := standin.New(t, standin.Pick(t, netip.MustParsePrefix("198.51.100.0/24"), 1), netip.Addr{})
	probe := func(asNobody bool, args ...string) standin.ProbeResult {
		t.Helper()
		argv := []string{"netns", "exec", n.Name}
		if asNobody {
			argv = append(argv, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all")
		}
		out, _ := exec.Command("ip", append(append(argv, bin), args...)...).Output() // the exit status repeats ok
		r, err := standin.ParseProbe(out)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, cmd := range []string{"raw", "nft"} {
		if r := probe(false, cmd); !r.OK {
			t.Errorf("netprobe %s as root: %+v, want ok", cmd, r)
		}
		if r := probe(true, cmd); r.OK || !strings.Contains(r.Detail, "not permitted") {
			t.Errorf("netprobe %s as nobody: %+v, want refused", cmd, r)
		}
	}
}
