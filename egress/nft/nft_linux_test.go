package nft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// The lab: a "sandbox" namespace whose firewall the test programs and a
// "remote" namespace that plays the internet, joined by a veth pair.
// Remote addresses live on the remote namespace's loopback and are
// reached through its veth address, the sandbox's default gateway.
var (
	sbxAddr     = netip.MustParseAddr("198.51.100.2")
	gwAddr      = netip.MustParseAddr("198.51.100.1")
	sbxAddr6    = netip.MustParseAddr("2001:db8::2")
	remoteAddr6 = netip.MustParseAddr("2001:db8::1")
	learnedIP   = netip.MustParseAddr("203.0.113.10") // learned in dns+nft tests
	otherIP     = netip.MustParseAddr("203.0.113.20") // covered by nothing
	allowedIP   = netip.MustParseAddr("203.0.113.33") // in an allow prefix
	deniedIP    = netip.MustParseAddr("203.0.113.40") // learned and allowed, but denied
	resolverIP  = netip.MustParseAddr("203.0.113.53") // osb-egress's upstream
)

const (
	probeTimeout = 20 * time.Second // a positive probe's deadline
	silenceFor   = 2 * time.Second  // how long a negative UDP/ICMP probe listens
)

type lab struct {
	sbx, rmt  *netNS
	remoteUDP chan string         // payloads the remote's UDP :9999 and :53 received
	dnsUDP    chan string         // payloads the sandbox's UDP :15353 received
	proxyDst  chan netip.AddrPort // OriginalDst of each connection at the sandbox's :15001
}

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{
		sbx:       newNetNS(t, "sbx"),
		rmt:       newNetNS(t, "rmt"),
		remoteUDP: make(chan string, 64),
		dnsUDP:    make(chan string, 64),
		proxyDst:  make(chan netip.AddrPort, 64),
	}
	l.sbx.ip(t, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", l.rmt.name)
	l.sbx.ip(t, "addr", "add", sbxAddr.String()+"/24", "dev", "v0")
	l.sbx.ip(t, "addr", "add", sbxAddr6.String()+"/64", "dev", "v0", "nodad")
	l.sbx.ip(t, "link", "set", "v0", "up")
	l.sbx.ip(t, "route", "add", "default", "via", gwAddr.String())
	l.sbx.ip(t, "-6", "route", "add", "default", "via", remoteAddr6.String())
	l.rmt.ip(t, "addr", "add", gwAddr.String()+"/24", "dev", "v1")
	l.rmt.ip(t, "addr", "add", remoteAddr6.String()+"/64", "dev", "v1", "nodad")
	l.rmt.ip(t, "link", "set", "v1", "up")
	for _, a := range []netip.Addr{learnedIP, otherIP, allowedIP, deniedIP, resolverIP} {
		l.rmt.ip(t, "addr", "add", a.String()+"/32", "dev", "lo")
	}

	// The remote: TCP :80 says "R" then echoes; UDP :9999 and :53 record.
	serveTCP(t, l.rmt, ":80", func(c net.Conn) {
		c.Write([]byte("R"))
		io.Copy(c, c)
	})
	serveUDP(t, l.rmt, ":9999", l.remoteUDP)
	serveUDP(t, l.rmt, ":53", l.remoteUDP)

	// The sandbox: stand-ins for osb-egress's proxies and API.
	serveTCP(t, l.sbx, ":"+strconv.Itoa(egress.ProxyPort), func(c net.Conn) {
		dst, err := OriginalDst(c.(*net.TCPConn))
		if err != nil {
			dst = netip.AddrPort{} // the test sees the zero value and reports it
		}
		select {
		case l.proxyDst <- dst:
		default:
		}
		c.Write([]byte("P"))
	})
	serveTCP(t, l.sbx, ":"+strconv.Itoa(egress.DNSPort), func(c net.Conn) { c.Write([]byte("D")) })
	serveUDP(t, l.sbx, ":"+strconv.Itoa(egress.DNSPort), l.dnsUDP)
	serveTCP(t, l.sbx, ":"+strconv.Itoa(egress.APIPort), func(c net.Conn) { c.Write([]byte("A")) })
	return l
}

// serveTCP listens in ns and runs h for each connection, then closes it.
func serveTCP(t *testing.T, ns *netNS, addr string, h func(net.Conn)) {
	t.Helper()
	var ln net.Listener
	ns.must(t, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				h(c)
			}()
		}
	}()
}

// serveUDP listens in ns and sends every datagram's payload to ch.
func serveUDP(t *testing.T, ns *netNS, addr string, ch chan string) {
	t.Helper()
	var pc net.PacketConn
	ns.must(t, func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			select {
			case ch <- string(buf[:n]):
			default:
			}
		}
	}()
}

// dial opens a TCP connection from ns, marked with egress.Mark if mark.
func dial(ns *netNS, addr netip.AddrPort, mark bool, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.do(func() (err error) {
		d := net.Dialer{Timeout: timeout}
		if mark {
			d.Control = MarkControl
		}
		c, err = d.Dial("tcp", addr.String())
		return err
	})
	return c, err
}

// reach connects from ns and returns the first byte the server sent:
// "R" remote, "P" transparent proxy, "D" DNS proxy, "A" egress API.
func reach(ns *netNS, addr netip.AddrPort, mark bool) (string, error) {
	c, err := dial(ns, addr, mark, probeTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(probeTimeout))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return "", fmt.Errorf("read from %v: %w", addr, err)
	}
	return string(b), nil
}

func wantReach(t *testing.T, ns *netNS, addr netip.AddrPort, mark bool, want string) {
	t.Helper()
	got, err := reach(ns, addr, mark)
	if err != nil || got != want {
		t.Errorf("connect from %s to %v (mark %v): got %q, %v; want %q", ns.name, addr, mark, got, err, want)
	}
}

// wantNoReach connects and expects a failure. The rules answer TCP with a
// reset, so the timeout only bounds a broken rule.
func wantNoReach(t *testing.T, ns *netNS, addr netip.AddrPort) {
	t.Helper()
	got, err := reach(ns, addr, false)
	if err == nil {
		t.Errorf("connect from %s to %v: reached %q, want no connection", ns.name, addr, got)
	}
}

// sendUDP sends one datagram from ns, marked if mark.
func sendUDP(ns *netNS, addr netip.AddrPort, payload string, mark bool) error {
	return ns.do(func() error {
		d := net.Dialer{}
		if mark {
			d.Control = MarkControl
		}
		c, err := d.Dial("udp", addr.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
}

// udpArrives sends payload every half second until it shows up on ch or
// within passes; it reports whether it arrived.
func udpArrives(t *testing.T, ns *netNS, addr netip.AddrPort, mark bool, ch chan string, within time.Duration) bool {
	t.Helper()
	payload := fmt.Sprintf("%s-%v-%d", t.Name(), addr, time.Now().UnixNano())
	deadline := time.After(within)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := sendUDP(ns, addr, payload, mark); err != nil && !errors.Is(err, syscall.EPERM) {
			t.Logf("send UDP to %v: %v", addr, err) // EPERM is a drop rule at work
		}
		for {
			select {
			case got := <-ch:
				if got == payload {
					return true
				}
				continue
			case <-tick.C:
			case <-deadline:
				return false
			}
			break
		}
	}
}

// pings sends ICMP echo requests from ns to dst until a reply comes or
// within passes.
func pings(t *testing.T, ns *netNS, dst netip.Addr, within time.Duration) bool {
	t.Helper()
	var got bool
	err := ns.do(func() error {
		pc, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer pc.Close()
		id := uint16(time.Now().UnixNano())
		deadline := time.Now().Add(within)
		for seq := uint16(1); time.Now().Before(deadline); seq++ {
			if _, err := pc.WriteTo(echoRequest(id, seq), &net.IPAddr{IP: dst.AsSlice()}); errors.Is(err, syscall.EPERM) {
				return nil // dropped on the way out
			} else if err != nil {
				return err
			}
			round := time.Now().Add(500 * time.Millisecond)
			if round.After(deadline) {
				round = deadline
			}
			pc.SetReadDeadline(round)
			buf := make([]byte, 1500)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					break // this round's wait is over
				}
				if n >= 8 && buf[0] == 0 && uint16(buf[4])<<8|uint16(buf[5]) == id {
					got = true
					return nil
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ping %v from %s: %v", dst, ns.name, err)
	}
	return got
}

// echoRequest builds an ICMP echo request with its checksum.
func echoRequest(id, seq uint16) []byte {
	b := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'o', 's', 'b', '!'}
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	cs := ^uint16(sum)
	b[2], b[3] = byte(cs>>8), byte(cs)
	return b
}

// openTable opens the sandbox's table. When the test ends a fresh Table
// removes it (the test may have closed this one) and this one is closed.
func openTable(t *testing.T, ns *netNS) *Table {
	t.Helper()
	tbl := openIn(t, ns)
	t.Cleanup(func() {
		err := ns.do(func() error {
			t2, err := Open()
			if err != nil {
				return err
			}
			defer t2.Close()
			return t2.Remove()
		})
		if err != nil {
			t.Errorf("remove table: %v", err)
		}
	})
	return tbl
}

// openIn opens a Table in ns, closed when the test ends.
func openIn(t *testing.T, ns *netNS) *Table {
	t.Helper()
	var tbl *Table
	ns.must(t, func() (err error) {
		tbl, err = Open()
		return err
	})
	t.Cleanup(func() { tbl.Close() })
	return tbl
}

func apply(t *testing.T, tbl *Table, cfg Config) {
	t.Helper()
	if err := tbl.Apply(cfg); err != nil {
		t.Fatal(err)
	}
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// baseline shows that, before any rule, every probe the tests make
// negative does get through, so a later silence means the rules.
func (l *lab) baseline(t *testing.T) {
	t.Helper()
	wantReach(t, l.sbx, ap(otherIP, 80), false, "R")
	wantReach(t, l.sbx, ap(remoteAddr6, 80), false, "R")
	wantReach(t, l.sbx, ap(netip.MustParseAddr("127.0.0.1"), egress.APIPort), false, "A")
	wantReach(t, l.rmt, ap(sbxAddr, egress.ProxyPort), false, "P")
	if !udpArrives(t, l.sbx, ap(otherIP, 9999), false, l.remoteUDP, probeTimeout) {
		t.Errorf("baseline: UDP to %v:9999 did not arrive", otherIP)
	}
	if !udpArrives(t, l.sbx, ap(remoteAddr6, 9999), false, l.remoteUDP, probeTimeout) {
		t.Errorf("baseline: UDP to [%v]:9999 did not arrive", remoteAddr6)
	}
	if !pings(t, l.sbx, otherIP, probeTimeout) {
		t.Errorf("baseline: no echo reply from %v", otherIP)
	}
	if t.Failed() {
		t.FailNow()
	}
	for len(l.proxyDst) > 0 {
		<-l.proxyDst // the probe of the proxy port above was no redirect
	}
}

// wantPortsGuarded checks the input rules: the API is closed to the
// sandbox's own processes and open to the outside; the proxies are the
// other way round.
func (l *lab) wantPortsGuarded(t *testing.T) {
	t.Helper()
	wantNoReach(t, l.sbx, ap(netip.MustParseAddr("127.0.0.1"), egress.APIPort))
	wantNoReach(t, l.sbx, ap(netip.IPv6Loopback(), egress.APIPort))
	wantReach(t, l.rmt, ap(sbxAddr, egress.APIPort), false, "A")
	wantNoReach(t, l.rmt, ap(sbxAddr, egress.ProxyPort))
	wantNoReach(t, l.rmt, ap(sbxAddr, egress.DNSPort))
	if udpArrives(t, l.rmt, ap(sbxAddr, egress.DNSPort), false, l.dnsUDP, silenceFor) {
		t.Errorf("UDP from the remote reached the DNS proxy port")
	}
}

func TestStrict(t *testing.T) {
	l := newLab(t)
	l.baseline(t)
	tbl := openTable(t, l.sbx)
	apply(t, tbl, Config{Mode: egress.ModeStrict, Nameservers: []netip.Addr{resolverIP}})

	t.Run("TCP lands on the proxy with its original destination", func(t *testing.T) {
		for _, dst := range []netip.AddrPort{ap(otherIP, 443), ap(learnedIP, 80), ap(sbxAddr, 22)} {
			wantReach(t, l.sbx, dst, false, "P")
			select {
			case got := <-l.proxyDst:
				if got != dst {
					t.Errorf("OriginalDst = %v, want %v", got, dst)
				}
			case <-time.After(probeTimeout):
				t.Errorf("the proxy saw no connection for %v", dst)
			}
		}
	})
	t.Run("DNS lands on the DNS proxy", func(t *testing.T) {
		for _, dst := range []netip.AddrPort{ap(otherIP, 53), ap(resolverIP, 53), ap(remoteAddr6, 53)} {
			if !udpArrives(t, l.sbx, dst, false, l.dnsUDP, probeTimeout) {
				t.Errorf("UDP to %v did not reach the DNS proxy", dst)
			}
		}
		wantReach(t, l.sbx, ap(otherIP, 53), false, "D")
	})
	t.Run("UDP, ICMP and IPv6 get nothing", func(t *testing.T) {
		if udpArrives(t, l.sbx, ap(otherIP, 9999), false, l.remoteUDP, silenceFor) {
			t.Errorf("UDP to %v:9999 arrived", otherIP)
		}
		if udpArrives(t, l.sbx, ap(remoteAddr6, 9999), false, l.remoteUDP, silenceFor) {
			t.Errorf("UDP to [%v]:9999 arrived", remoteAddr6)
		}
		if pings(t, l.sbx, otherIP, silenceFor) {
			t.Errorf("echo reply from %v", otherIP)
		}
		wantNoReach(t, l.sbx, ap(remoteAddr6, 80))
	})
	t.Run("marked sockets go straight out", func(t *testing.T) {
		wantReach(t, l.sbx, ap(otherIP, 80), true, "R")
		wantReach(t, l.sbx, ap(resolverIP, 80), true, "R")
		if !udpArrives(t, l.sbx, ap(resolverIP, 53), true, l.remoteUDP, probeTimeout) {
			t.Errorf("marked DNS to %v did not reach it", resolverIP)
		}
		if !udpArrives(t, l.sbx, ap(otherIP, 9999), true, l.remoteUDP, probeTimeout) {
			t.Errorf("marked UDP to %v:9999 did not reach it", otherIP)
		}
	})
	t.Run("ports", func(t *testing.T) {
		l.wantPortsGuarded(t)
		// The sandbox's own address is not loopback: the proxy gets it.
		wantReach(t, l.sbx, ap(sbxAddr, egress.APIPort), false, "P")
		<-l.proxyDst
	})
}

func TestDNSNft(t *testing.T) {
	l := newLab(t)
	l.baseline(t)
	tbl := openTable(t, l.sbx)
	cfg := Config{
		Mode:          egress.ModeDNSNft,
		AllowPrefixes: []netip.Prefix{netip.MustParsePrefix("203.0.113.32/28")},
		DenyPrefixes:  []netip.Prefix{netip.PrefixFrom(deniedIP, 32)},
		Nameservers:   []netip.Addr{resolverIP},
	}
	apply(t, tbl, cfg)
	parent := t
	if err := tbl.Learn([]netip.Addr{learnedIP, deniedIP, resolverIP}, time.Hour); err != nil {
		t.Fatal(err)
	}

	t.Run("learned, allowed, denied, unknown", func(t *testing.T) {
		wantReach(t, l.sbx, ap(learnedIP, 80), false, "R")
		wantReach(t, l.sbx, ap(allowedIP, 80), false, "R")
		wantNoReach(t, l.sbx, ap(otherIP, 80))
		wantNoReach(t, l.sbx, ap(deniedIP, 80))
		wantNoReach(t, l.sbx, ap(resolverIP, 80)) // learned, but a nameserver
		wantReach(t, l.sbx, ap(resolverIP, 80), true, "R")
		wantReach(t, l.sbx, ap(otherIP, 80), true, "R")
		if udpArrives(t, l.sbx, ap(otherIP, 9999), false, l.remoteUDP, silenceFor) {
			t.Errorf("UDP to unlearned %v arrived", otherIP)
		}
		if !udpArrives(t, l.sbx, ap(learnedIP, 9999), false, l.remoteUDP, probeTimeout) {
			t.Errorf("UDP to learned %v did not arrive", learnedIP)
		}
		if !udpArrives(t, l.sbx, ap(otherIP, 53), false, l.dnsUDP, probeTimeout) {
			t.Errorf("DNS did not reach the DNS proxy")
		}
	})
	t.Run("IPv6 learned", func(t *testing.T) {
		wantNoReach(t, l.sbx, ap(remoteAddr6, 80))
		if err := tbl.Learn([]netip.Addr{remoteAddr6}, time.Hour); err != nil {
			t.Fatal(err)
		}
		wantReach(t, l.sbx, ap(remoteAddr6, 80), false, "R")
	})
	t.Run("ports", func(t *testing.T) {
		l.wantPortsGuarded(t)
		wantNoReach(t, l.sbx, ap(sbxAddr, egress.APIPort))
		wantNoReach(t, l.sbx, ap(sbxAddr6, egress.APIPort))
	})
	t.Run("Apply keeps learned addresses and established connections", func(t *testing.T) {
		c, err := dial(l.sbx, ap(learnedIP, 80), false, probeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		deny := cfg
		deny.DenyPrefixes = append(slices.Clone(cfg.DenyPrefixes), netip.MustParsePrefix("203.0.113.8/29"))
		apply(t, tbl, deny)
		wantNoReach(t, l.sbx, ap(learnedIP, 80))
		c.SetDeadline(time.Now().Add(probeTimeout))
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("write on the connection opened before the deny: %v", err)
		}
		b := make([]byte, 2)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "Rx" {
			t.Fatalf("the connection opened before the deny: read %q, %v; want \"Rx\"", b, err)
		}
		apply(t, tbl, cfg)
		wantReach(t, l.sbx, ap(learnedIP, 80), false, "R")
	})
	t.Run("a new process keeps what was learned", func(t *testing.T) {
		if err := tbl.Close(); err != nil {
			t.Fatal(err)
		}
		// Between processes the rules stay: fail closed.
		wantNoReach(t, l.sbx, ap(otherIP, 80))
		wantReach(t, l.sbx, ap(learnedIP, 80), false, "R")
		if err := tbl.Apply(cfg); !errors.Is(err, ErrClosed) {
			t.Errorf("Apply on a closed Table = %v, want ErrClosed", err)
		}
		// Open again, as a restarted osb-egress would; the later
		// subtests use this Table, so it lives as long as the test.
		l.sbx.must(t, func() (err error) {
			tbl, err = Open()
			return err
		})
		parent.Cleanup(func() { tbl.Close() })
		apply(t, tbl, cfg)
		learned, err := tbl.Learned()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range []netip.Addr{learnedIP, deniedIP, remoteAddr6} {
			if !slices.Contains(learned, a) {
				t.Errorf("Learned() = %v after Close, Open and Apply: %v is missing", learned, a)
			}
		}
		wantReach(t, l.sbx, ap(learnedIP, 80), false, "R")
	})
	t.Run("learning again sets the remaining time", func(t *testing.T) {
		if err := tbl.Learn([]netip.Addr{allowedIP}, MinLearnTTL); err != nil {
			t.Fatal(err)
		}
		if err := tbl.Learn([]netip.Addr{allowedIP}, MaxLearnTTL); err != nil {
			t.Fatal(err)
		}
		elems, err := tbl.conn.GetSetElements(tbl.learnedSet(false))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range elems {
			if a, _ := netip.AddrFromSlice(e.Key); a == allowedIP {
				found = true
				if e.Expires < MaxLearnTTL/2 {
					t.Errorf("%v expires in %v after learning it for %v", a, e.Expires, MaxLearnTTL)
				}
			}
		}
		if !found {
			t.Errorf("%v is not in the learned set", allowedIP)
		}
	})
	t.Run("learned addresses expire", func(t *testing.T) {
		old := minLearnTTL
		minLearnTTL = time.Second
		t.Cleanup(func() { minLearnTTL = old })
		if err := tbl.Learn([]netip.Addr{otherIP}, 0); err != nil {
			t.Fatal(err)
		}
		wantReach(t, l.sbx, ap(otherIP, 80), false, "R")
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := reach(l.sbx, ap(otherIP, 80), false); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v still reachable a minute after its 1s lifetime", otherIP)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("default allow", func(t *testing.T) {
		open := cfg
		open.DefaultAllow = true
		apply(t, tbl, open)
		wantReach(t, l.sbx, ap(otherIP, 80), false, "R")
		wantNoReach(t, l.sbx, ap(deniedIP, 80))
		wantNoReach(t, l.sbx, ap(resolverIP, 80))
	})
}

func TestDNSOnly(t *testing.T) {
	l := newLab(t)
	l.baseline(t)
	tbl := openTable(t, l.sbx)
	apply(t, tbl, Config{
		Mode:         egress.ModeDNS,
		DenyPrefixes: []netip.Prefix{netip.PrefixFrom(deniedIP, 32)},
		Nameservers:  []netip.Addr{resolverIP},
	})
	wantReach(t, l.sbx, ap(otherIP, 80), false, "R")
	wantReach(t, l.sbx, ap(deniedIP, 80), false, "R") // address rules are not enforced in dns mode
	wantNoReach(t, l.sbx, ap(resolverIP, 80))
	if !udpArrives(t, l.sbx, ap(otherIP, 53), false, l.dnsUDP, probeTimeout) {
		t.Errorf("DNS did not reach the DNS proxy")
	}
	if !udpArrives(t, l.sbx, ap(otherIP, 9999), false, l.remoteUDP, probeTimeout) {
		t.Errorf("UDP to %v:9999 did not arrive in dns mode", otherIP)
	}
	l.wantPortsGuarded(t)
}

func TestModeSwitch(t *testing.T) {
	l := newLab(t)
	tbl := openTable(t, l.sbx)
	for _, mode := range []string{egress.ModeDNS, egress.ModeStrict, egress.ModeDNSNft, egress.ModeDNS, egress.ModeStrict} {
		apply(t, tbl, Config{Mode: mode})
		want := map[string]string{egress.ModeDNS: "R", egress.ModeStrict: "P"}[mode]
		if want == "" {
			wantNoReach(t, l.sbx, ap(otherIP, 80))
			continue
		}
		wantReach(t, l.sbx, ap(otherIP, 80), false, want)
		if mode == egress.ModeStrict {
			<-l.proxyDst
		}
	}
}

func TestApplyRejectsBadConfig(t *testing.T) {
	l := newLab(t)
	tbl := openTable(t, l.sbx)
	apply(t, tbl, Config{Mode: egress.ModeDNSNft})
	for _, cfg := range []Config{
		{Mode: "open"},
		{Mode: egress.ModeDNSNft, AllowPrefixes: []netip.Prefix{{}}},
		{Mode: egress.ModeDNSNft, Nameservers: []netip.Addr{{}}},
	} {
		if err := tbl.Apply(cfg); err == nil {
			t.Errorf("Apply(%+v) = nil, want an error", cfg)
		}
	}
	wantNoReach(t, l.sbx, ap(otherIP, 80)) // the last good rules stay
}

// TestManyPrefixes applies the rule cap's worth of separate prefixes of
// both families, twice, and checks the ends of the list are enforced.
func TestManyPrefixes(t *testing.T) {
	l := newLab(t)
	tbl := openTable(t, l.sbx)
	cfg := Config{Mode: egress.ModeDNSNft}
	for i := range 5000 {
		// 10.0.0.0, 10.0.0.2, ... every other address, so none merge.
		a := netip.AddrFrom4([4]byte{10, byte(i >> 7), byte(i << 1), 0})
		cfg.DenyPrefixes = append(cfg.DenyPrefixes, netip.PrefixFrom(a, 24))
		b := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, byte(i >> 8), byte(i), 0, 15: 1})
		cfg.AllowPrefixes = append(cfg.AllowPrefixes, netip.PrefixFrom(b, 128))
	}
	cfg.AllowPrefixes = append(cfg.AllowPrefixes, netip.PrefixFrom(allowedIP, 32), netip.PrefixFrom(deniedIP, 32))
	cfg.DenyPrefixes = append(cfg.DenyPrefixes, netip.PrefixFrom(deniedIP, 32))
	apply(t, tbl, cfg)
	apply(t, tbl, cfg)
	wantReach(t, l.sbx, ap(allowedIP, 80), false, "R")
	wantNoReach(t, l.sbx, ap(otherIP, 80))
	wantNoReach(t, l.sbx, ap(deniedIP, 80))
}
