package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/standin"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// The network attempts. Every address a sandbox tries is first made local
// (internal/standin): a namespace the test owns holds it, behind a route
// for that address alone, with the test's listener on it; the host
// reaches each listener before any sandbox tries, so a block that fails
// is seen (the listener answers) and nothing ever leaves the machine. The
// sandboxes run on a Docker network of the test's own, so that the
// guards of other servers on this engine are neither changed nor relied
// on; it is made as the server makes its default one.

// netProbe is a Python script a sandbox runs to reach HOST PORT over TCP
// (or, with "udp", to send a DNS query there): it prints the body of the
// answer, or what stopped it.
const netProbe = `import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
udp = len(sys.argv) > 3
try:
    if udp:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.connect((host, port))
        q = bytes.fromhex("abcd01000001000000000000") + b"\x03web\x04test\x00\x00\x01\x00\x01"
        s.send(q)
        print("reached: %d bytes of DNS answer" % len(s.recv(512)))
    else:
        s = socket.create_connection((host, port), timeout=3)
        s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        print(data.decode(errors="replace").split("\r\n\r\n", 1)[-1])
except Exception as e:
    print("%s: %s" % (type(e).__name__, e))
`

// netAttempt is one thing a sandbox tries: host and port (and udp) as
// netProbe takes them; want is the answer that means it got through.
type netAttempt struct {
	name, host string
	port       int
	udp        bool
	want       string
	// control: with the guard off the attempt must get through, which
	// shows the stand-in is reachable from a sandbox and what stopped it
	// before was the guard. Attempts that nothing on a default network
	// could make (IPv6) are not controls.
	control bool
}

func (a netAttempt) command() string {
	cmd := "python3 /tmp/netprobe.py " + a.host + " " + strconv.Itoa(a.port)
	if a.udp {
		cmd += " udp"
	}
	return cmd
}

// testNetwork makes a bridge network without inter-container traffic, as
// the server makes its own, and removes it and the guard rules the
// servers installed for it when the test ends.
func testNetwork(t *testing.T) (name, gateway string) {
	t.Helper()
	testenv.MustHaveCommand(t, "iptables")
	b := make([]byte, 5)
	rand.Read(b)
	name = "osbt-" + hex.EncodeToString(b)
	id := strings.TrimSpace(docker(t, "network", "create", "-o", "com.docker.network.bridge.enable_icc=false", name))
	t.Cleanup(func() {
		exec.Command("docker", "network", "rm", name).Run()
		removeGuardChain("OSB-GUARD-" + id[:12]) // the runtime's name for the network's chain
	})
	gateway = strings.TrimSpace(docker(t, "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", name))
	return name, gateway
}

// removeGuardChain removes a network's guard chain and the jumps to it.
func removeGuardChain(chain string) {
	out, _ := exec.Command("iptables", "-S", "OPENSANDBOX-GUARD").Output()
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == "-A" && strings.HasSuffix(line, "-j "+chain+"\n") {
			exec.Command("iptables", append([]string{"-D"}, f[1:]...)...).Run()
		}
	}
	exec.Command("iptables", "-F", chain).Run()
	exec.Command("iptables", "-X", chain).Run()
}

// hostAddress returns the host's address on the interface of its default
// route, if it has one.
func hostAddress() (netip.Addr, bool) {
	out, _ := exec.Command("ip", "-o", "-4", "route", "show", "default").Output()
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "dev" {
			out, _ = exec.Command("ip", "-o", "-4", "addr", "show", "dev", f[i+1], "scope", "global").Output()
			if g := strings.Fields(string(out)); len(g) > 3 {
				if p, err := netip.ParsePrefix(g[3]); err == nil {
					return p.Addr(), true
				}
			}
		}
	}
	return netip.Addr{}, false
}

// udpListener counts the datagrams that reach a UDP port on every
// address of the host.
type udpListener struct {
	port int
	mu   sync.Mutex
	got  int
}

func listenUDP(t *testing.T) *udpListener {
	pc, err := net.ListenPacket("udp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	u := &udpListener{port: pc.LocalAddr().(*net.UDPAddr).Port}
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			u.mu.Lock()
			u.got++
			u.mu.Unlock()
		}
	}()
	return u
}

func (u *udpListener) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got
}

// TestAttackNet: from a sandbox of a server with the default network
// settings, the cloud metadata addresses, every private, shared and
// link-local range, internal name servers and the host itself are out of
// reach, however the address is spelt; the sandbox's own DNS, on a
// resolver in a blocked range, still answers, and its published ports
// still work. With the lists emptied the same attempts reach the same
// listeners, so the attempts can fail.
func TestAttackNet(t *testing.T) {
	testenv.MustHaveRoot(t)
	testenv.MustHaveImage(t, pythonImage)
	network, gateway := testNetwork(t)

	pick := func(prefix string, last byte) netip.Addr {
		return standin.Pick(t, netip.MustParsePrefix(prefix), last)
	}
	sn := standin.New(t, pick("10.187.0.0/16", 1), pick("fd7a:5e1:7a1::/48", 1))
	addrs := map[string]netip.Addr{
		"metadata":         netip.MustParseAddr("169.254.169.254"),
		"alibaba metadata": netip.MustParseAddr("100.100.100.200"),
		"link-local":       pick("169.254.0.0/16", 7),
		"10/8":             pick("10.187.0.0/16", 7),
		"172.16/12":        pick("172.16.0.0/16", 7), // 172.17-31 are Docker's pools
		"192.168/16":       pick("192.168.0.0/16", 7),
		"cgnat":            pick("100.87.0.0/16", 7),
		"resolver":         pick("10.187.0.0/16", 53),
		"ula":              pick("fd7a:5e1:7a1::/48", 7),
	}
	for name, a := range addrs {
		sn.Add(a)
		url := sn.ServeHTTP(netip.AddrPortFrom(a, 80), "reached "+name)
		resp, err := http.Get(url) // the stand-in works: the host reaches it
		if err != nil {
			t.Fatalf("the host does not reach stand-in %s at %s: %v", name, url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "reached "+name {
			t.Fatalf("stand-in %s: %q", name, body)
		}
	}
	records := map[string]netip.Addr{"web.test.": addrs["10/8"], "metadata.test.": addrs["metadata"]}
	resolver := sn.ServeDNS(addrs["resolver"], records)
	internalDNS := sn.ServeDNS(addrs["10/8"], records) // a name server of the private network

	hostHTTP, err := net.Listen("tcp", ":0") // a service on every address of the host
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "reached host") })}
	go hostSrv.Serve(hostHTTP)
	t.Cleanup(func() { hostSrv.Close() })
	hostPort := hostHTTP.Addr().(*net.TCPAddr).Port
	hostUDP := listenUDP(t)

	attempts := []netAttempt{
		{name: "metadata 169.254.169.254", host: "169.254.169.254", port: 80, want: "reached metadata", control: true},
		{name: "metadata 169.254.169.254 spelt as one number", host: "2852039166", port: 80, want: "reached metadata", control: true},
		{name: "metadata 169.254.169.254 spelt in hex", host: "0xa9.0xfe.0xa9.0xfe", port: 80, want: "reached metadata", control: true},
		{name: "metadata as an IPv4-mapped IPv6 address", host: "::ffff:169.254.169.254", port: 80, want: "reached metadata", control: true},
		{name: "metadata through a name the sandbox's DNS answers", host: "metadata.test", port: 80, want: "reached metadata", control: true},
		{name: "Alibaba metadata 100.100.100.200", host: "100.100.100.200", port: 80, want: "reached alibaba metadata", control: true},
		{name: "link-local " + addrs["link-local"].String(), host: addrs["link-local"].String(), port: 80, want: "reached link-local", control: true},
		{name: "private 10/8 " + addrs["10/8"].String(), host: addrs["10/8"].String(), port: 80, want: "reached 10/8", control: true},
		{name: "private 172.16/12 " + addrs["172.16/12"].String(), host: addrs["172.16/12"].String(), port: 80, want: "reached 172.16/12", control: true},
		{name: "private 192.168/16 " + addrs["192.168/16"].String(), host: addrs["192.168/16"].String(), port: 80, want: "reached 192.168/16", control: true},
		{name: "shared (CGNAT) 100.64/10 " + addrs["cgnat"].String(), host: addrs["cgnat"].String(), port: 80, want: "reached cgnat", control: true},
		{name: "a private name server, queried directly", host: addrs["10/8"].String(), port: 53, udp: true, want: "reached", control: true},
		{name: "the sandbox's own resolver on another port", host: addrs["resolver"].String(), port: 80, want: "reached resolver", control: true},
		{name: "the host through the network's gateway " + gateway, host: gateway, port: hostPort, want: "reached host", control: true},
		{name: "IPv6 unique local " + addrs["ula"].String(), host: addrs["ula"].String(), port: 80, want: "reached ula"},
		{name: "IPv6 NAT64 spelling of the metadata address", host: "64:ff9b::a9fe:a9fe", port: 80, want: "reached metadata"},
	}
	if a, ok := hostAddress(); ok {
		attempts = append(attempts,
			netAttempt{name: "the host through its own address " + a.String(), host: a.String(), port: hostPort, want: "reached host", control: true})
	}

	s := startServer(t, serverOptions{docker: fmt.Sprintf("network = %q\ndns = [%q]", network, addrs["resolver"])})
	id := s.create(sandboxRequest(pythonImage, "sleep", "infinity"))
	s.waitStateN(id, "Running", 2)
	c := s.execd(id)
	c.mustRun("cat > /tmp/netprobe.py <<'EOF'\n" + netProbe + "EOF")

	for _, a := range attempts {
		attack(t, a.name, func(t *testing.T) string {
			out := strings.TrimSpace(c.run(a.command()).stdout)
			if strings.Contains(out, a.want) {
				t.Errorf("the sandbox got through: %q", out)
			}
			return out
		})
	}
	attack(t, "UDP to a service of the host", func(t *testing.T) string {
		before := hostUDP.count()
		out := strings.TrimSpace(c.run(netAttempt{host: gateway, port: hostUDP.port, udp: true}.command()).stdout)
		time.Sleep(200 * time.Millisecond)
		if n := hostUDP.count() - before; n > 0 {
			t.Errorf("the host's UDP service got %d datagrams", n)
		}
		return out
	})
	if q := internalDNS.Queries(); len(q) > 0 {
		t.Errorf("the private name server was asked %q", q)
	}

	// What must keep working.
	t.Run("DNS through a resolver on a blocked range answers", func(t *testing.T) {
		out := c.mustRun(`python3 -c "import socket; print(socket.gethostbyname('web.test'))"`)
		if strings.TrimSpace(out) != addrs["10/8"].String() {
			t.Fatalf("web.test = %q; the resolver saw %q", out, resolver.Queries())
		}
	})
	t.Run("a published port answers", func(t *testing.T) {
		c.mustRun("nohup python3 -m http.server 8080 --directory /tmp >/dev/null 2>&1 &")
		var ep api.Endpoint
		s.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080", nil, 200, &ep)
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if resp, err := http.Get("http://" + ep.Endpoint + "/netprobe.py"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if got = string(b); strings.Contains(got, "socket") {
					return
				}
			}
		}
		t.Fatalf("GET the sandbox's port 8080 at %s: %q", ep.Endpoint, got)
	})

	// The control: a server on the same network with both lists emptied
	// replaces the guard, and the same sandbox gets through to each
	// stand-in the guard stopped.
	startServer(t, serverOptions{docker: fmt.Sprintf("network = %q\ndns = [%q]\nblocked_cidrs = []\nblock_metadata = false", network, addrs["resolver"])})
	for _, a := range attempts {
		if !a.control {
			continue
		}
		out := strings.TrimSpace(c.run(a.command()).stdout)
		if !strings.Contains(out, a.want) {
			t.Errorf("control, guard off: %s: %q; the attempt could not have failed", a.name, out)
		}
	}
	before := hostUDP.count()
	c.run(netAttempt{host: gateway, port: hostUDP.port, udp: true}.command())
	time.Sleep(200 * time.Millisecond)
	if hostUDP.count() == before {
		t.Error("control, guard off: the host's UDP service got nothing")
	}
	if !strings.Contains(strings.Join(internalDNS.Queries(), " "), "web.test") {
		t.Errorf("control, guard off: the private name server was not asked (%q)", internalDNS.Queries())
	}
}
