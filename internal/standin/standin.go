// Package standin makes remote addresses local, for tests that must show
// an address is (un)reachable without ever sending a packet off the
// machine: a network namespace the test owns, a veth pair from the host
// into it, the stand-in addresses on the namespace's side, host routes for
// exactly those addresses (a /32 or /128 each, never a range, so the
// machine's real traffic to the rest of a range is untouched), and
// listeners inside the namespace. A block that fails reaches the test's
// own listener; nothing leaves the host.
//
// The listeners make a small internet for egress tests: name servers
// whose records change while they run (DNS, on UDP and TCP, over TLS and
// over HTTPS), HTTP and HTTPS servers that note the SNI and Host they saw,
// with certificates for any name from a per-Net test CA (and ECH), a TCP
// server that speaks first, and UDP echo. Each Server counts what reached
// it, so a test can show that a denied server saw nothing.
//
// Everything is removed in t.Cleanup, also when the test fails. It needs
// root and the ip command. Only tests import it.
package standin

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// Net is a network namespace that holds stand-in addresses.
type Net struct {
	t testing.TB
	// Name is the namespace's name (ip netns).
	Name string
	host string // the host's end of the veth pair
	peer string // the namespace's end
	// gw4 and gw6 are the host end's addresses, the namespace's way back.
	gw4, gw6 netip.Addr

	caOnce sync.Once
	ca     *authority // the test CA of the TLS servers, made on first use
	caErr  error
}

// New makes a namespace with a veth pair to the host. gw4 and gw6 are
// free addresses for the host's end, by which the namespace routes back
// (the host's NAT of container traffic needs an address on that end too);
// an invalid gw6 leaves the namespace without IPv6.
func New(t testing.TB, gw4, gw6 netip.Addr) *Net {
	t.Helper()
	testenv.MustHaveRoot(t)
	testenv.MustHaveCommand(t, "ip")
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	n := &Net{t: t, Name: "osbt-" + suffix, host: "osbt" + suffix + "h", peer: "osbt" + suffix + "n", gw4: gw4, gw6: gw6}
	for _, a := range []netip.Addr{gw4, gw6} {
		if a.IsValid() {
			mustBeUnused(t, a)
		}
	}
	n.ip("netns", "add", n.Name)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", n.host).Run()
		exec.Command("ip", "netns", "del", n.Name).Run()
	})
	n.ip("link", "add", n.host, "type", "veth", "peer", "name", n.peer)
	n.ip("link", "set", n.peer, "netns", n.Name)
	n.ip("addr", "add", gw4.String()+"/32", "dev", n.host)
	if gw6.IsValid() {
		n.ip("-6", "addr", "add", gw6.String()+"/128", "dev", n.host, "nodad")
	}
	n.ip("link", "set", n.host, "up")
	n.inNS("link", "set", "lo", "up")
	n.inNS("link", "set", n.peer, "up")
	n.inNS("route", "add", gw4.String()+"/32", "dev", n.peer)
	n.inNS("route", "add", "default", "via", gw4.String(), "dev", n.peer)
	if gw6.IsValid() {
		n.inNS("-6", "route", "add", gw6.String()+"/128", "dev", n.peer)
		n.inNS("-6", "route", "add", "default", "via", gw6.String(), "dev", n.peer)
	}
	return n
}

func (n *Net) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (n *Net) inNS(args ...string) {
	n.t.Helper()
	n.ip(append([]string{"-n", n.Name}, args...)...)
}

// Add gives the namespace addr and routes exactly that address from the
// host into it. The test fails if the machine already has the address or
// a route for it other than its default route: then a stand-in would
// take traffic that is not the test's.
func (n *Net) Add(addr netip.Addr) {
	n.t.Helper()
	mustBeUnused(n.t, addr)
	if addr.Is6() {
		n.inNS("-6", "addr", "add", addr.String()+"/128", "dev", n.peer, "nodad")
		n.ip("-6", "route", "add", addr.String()+"/128", "dev", n.host)
		return
	}
	n.inNS("addr", "add", addr.String()+"/32", "dev", n.peer)
	n.ip("route", "add", addr.String()+"/32", "dev", n.host)
}

// Unused reports why the machine already uses addr ("" if it does not):
// an address of an interface, or a route other than the default one that
// covers it (a Docker network, a VPN, the cluster of a test).
func Unused(addr netip.Addr) string {
	family := "-4"
	if addr.Is6() {
		family = "-6"
	}
	out, err := exec.Command("ip", "-o", family, "addr", "show").Output()
	if err != nil {
		return "ip addr: " + err.Error()
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" || f[i] == "inet6" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil && p.Addr() == addr {
					return "an interface has it: " + strings.TrimSpace(line)
				}
			}
		}
	}
	out, err = exec.Command("ip", "-o", family, "route", "show", "table", "all").Output()
	if err != nil {
		return "ip route: " + err.Error()
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		dst := f[0]
		if dst == "local" || dst == "broadcast" || dst == "unicast" || dst == "multicast" {
			if len(f) < 2 {
				continue
			}
			dst = f[1]
		}
		if dst == "default" {
			continue
		}
		if !strings.Contains(dst, "/") {
			dst += map[bool]string{true: "/128", false: "/32"}[addr.Is6()]
		}
		if p, err := netip.ParsePrefix(dst); err == nil && p.Contains(addr) && !strings.Contains(line, "multicast") {
			return "a route covers it: " + strings.TrimSpace(line)
		}
	}
	return ""
}

func mustBeUnused(t testing.TB, addr netip.Addr) {
	t.Helper()
	if why := Unused(addr); why != "" {
		t.Fatalf("stand-in address %s is in use on this machine (%s); the test will not take it over", addr, why)
	}
}

// Pick returns an address of prefix that the machine does not use,
// trying random ones; lastByte, when not 0, fixes the last byte (".7").
//
// The address is reserved for the test's life with a lock file, so that
// tests of other packages, which go test runs at the same time in other
// processes, never pick it too: two stand-ins of one address would take
// each other's traffic or fail to add their routes. When every candidate
// is held by another test (a fixed last byte in a /24 leaves one), Pick
// waits for it to be released, up to pickWait.
func Pick(t testing.TB, prefix netip.Prefix, lastByte byte) netip.Addr {
	t.Helper()
	deadline := time.Now().Add(pickWait)
	var why string
	for {
		for range 50 {
			a := candidate(prefix, lastByte)
			if !prefix.Contains(a) {
				continue
			}
			unlock, ok := reserve(t, a)
			if !ok {
				why = "held by another test"
				continue
			}
			if why = Unused(a); why == "" {
				t.Cleanup(unlock)
				return a
			}
			unlock()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no unused address in %s after %s (last candidate: %s)", prefix, pickWait, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pickWait bounds how long Pick waits for another test to release an
// address.
const pickWait = 5 * time.Minute

func candidate(prefix netip.Prefix, lastByte byte) netip.Addr {
	b := prefix.Addr().AsSlice()
	r := make([]byte, len(b))
	rand.Read(r)
	for i := range b {
		keep := max(0, min(8, prefix.Bits()-8*i))
		mask := byte(0xff << (8 - keep))
		b[i] = b[i]&mask | r[i]&^mask
	}
	if lastByte != 0 {
		b[len(b)-1] = lastByte
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// lockDir holds one lock file per reserved address.
const lockDir = "/run/lock/opensandbox-standin"

// reserve takes addr's lock file without waiting; unlock releases it.
// The kernel releases it too when the test process ends, however it
// ends, so a killed run leaves nothing held.
func reserve(t testing.TB, addr netip.Addr) (unlock func(), ok bool) {
	t.Helper()
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		t.Fatalf("stand-in address locks: %v", err)
	}
	f, err := os.OpenFile(lockDir+"/"+strings.ReplaceAll(addr.String(), ":", "_"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("stand-in address locks: %v", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false
		}
		t.Fatalf("stand-in address lock %s: %v", f.Name(), err)
	}
	return func() { f.Close() }, true
}

// inside runs f on a thread that has entered the namespace; sockets f
// makes stay in the namespace for their life. The thread is never
// returned to the Go scheduler, so nothing else ever runs in the
// namespace.
func (n *Net) inside(f func() error) error {
	done := make(chan error)
	go func() {
		// The thread goes back to its own namespace after f, so that it
		// can serve other goroutines again; if it cannot, it stays
		// locked and ends with the goroutine. (Had the goroutine run on
		// the process's main thread, which never ends, the process's
		// /proc/self/ns/net would otherwise name the stand-in namespace
		// for the rest of its life.)
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		ns, err := os.Open("/var/run/netns/" + n.Name)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("setns %s: %w", n.Name, err)
			return
		}
		err = f()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// Dial connects to addr from inside the namespace: the connection's
// source is one of the namespace's addresses, which the host routes
// without translating.
func (n *Net) Dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.inside(func() (err error) {
		c, err = net.DialTimeout(network, addr, 10*time.Second)
		return err
	})
	return c, err
}

// Listen opens a TCP listener at addr inside the namespace, closed when
// the test ends.
func (n *Net) Listen(addr netip.AddrPort) net.Listener {
	n.t.Helper()
	var ln net.Listener
	err := n.inside(func() (err error) {
		ln, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		n.t.Fatalf("listen on %s in %s: %v", addr, n.Name, err)
	}
	n.t.Cleanup(func() { ln.Close() })
	return ln
}

// ServeHTTP answers every request at addr, inside the namespace, with
// body, and returns addr's URL. ServeWeb does the same and returns the
// Server, which counts what reached it.
func (n *Net) ServeHTTP(addr netip.AddrPort, body string) string {
	n.t.Helper()
	return n.ServeWeb(addr, body).URL
}

// ServeDNS runs a name server on UDP and TCP port 53 of addr inside the
// namespace. It answers the names of records (fully qualified, "a.test.")
// with their address, other names with NXDOMAIN, and never asks anyone
// else. The records can be changed while it runs through the DNS it
// returns.
func (n *Net) ServeDNS(addr netip.Addr, records map[string]netip.Addr) *DNS {
	n.t.Helper()
	d := NewDNS(records)
	n.ServeDNSOn(netip.AddrPortFrom(addr, 53), d)
	return d
}

// ServeDNSOn serves d on UDP and TCP at ap inside the namespace (a name
// server on a port other than 53, or a second server with the same
// records).
func (n *Net) ServeDNSOn(ap netip.AddrPort, d *DNS) {
	n.t.Helper()
	var pc net.PacketConn
	var ln net.Listener
	err := n.inside(func() (err error) {
		if pc, err = net.ListenPacket("udp", ap.String()); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", ap.String())
		return err
	})
	if err != nil {
		n.t.Fatalf("DNS on %s in %s: %v", ap, n.Name, err)
	}
	udp := &dns.Server{PacketConn: pc, Handler: d}
	tcp := &dns.Server{Listener: ln, Handler: d}
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	n.t.Cleanup(func() {
		pc.Close()
		ln.Close()
	})
}

var errNotAQuery = errors.New("not a query")
