package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/standin"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// The egress attempts. A small internet of the test's own stands in for
// the real one: a namespace holding addresses of the documentation ranges
// (and the metadata address, made local), a DNS server authoritative for
// names under .test that osb-egress uses as its upstream, and web, TLS,
// banner, UDP, DNS-over-TLS and DNS-over-HTTPS servers that count who
// reached them. A sandbox of a server in strict mode runs netprobe (a
// static binary uploaded through execd) to try each way out; a sandbox of
// the same server without a policy runs the same attempts first, so each
// of them is shown to get through when nothing stops it.

const egressImage = "opensandbox/egress"

// egressNet is the test's internet.
type egressNet struct {
	sn      *standin.Net
	dns     *standin.DNS
	other   *standin.DNS // a name server the sandbox is not given
	allowed netip.Addr   // allowed.test, *.wild.test
	denied  netip.Addr   // denied.test
	byIP    netip.Addr   // reached by an IP rule
	doh     netip.Addr   // a DNS-over-HTTPS resolver, doh.test
	resolv  netip.Addr   // the name server osb-egress forwards to
	otherNS netip.Addr   // a name server of the sandbox's own choice

	web, tls, banner, udp map[netip.Addr]*standin.Server
	dot, dohSrv, meta     *standin.Server
}

func newEgressNet(t *testing.T) *egressNet {
	t.Helper()
	pick := func(last byte) netip.Addr {
		return standin.Pick(t, netip.MustParsePrefix("203.0.113.0/24"), last)
	}
	n := &egressNet{
		sn:      standin.New(t, standin.Pick(t, netip.MustParsePrefix("198.51.100.0/24"), 1), netip.Addr{}),
		allowed: pick(10), denied: pick(20), byIP: pick(30), doh: pick(40), resolv: pick(53), otherNS: pick(54),
		web: map[netip.Addr]*standin.Server{}, tls: map[netip.Addr]*standin.Server{},
		banner: map[netip.Addr]*standin.Server{}, udp: map[netip.Addr]*standin.Server{},
	}
	for _, a := range []netip.Addr{n.allowed, n.denied, n.byIP, n.doh, n.resolv, n.otherNS} {
		n.sn.Add(a)
	}
	for _, a := range []netip.Addr{n.allowed, n.denied, n.byIP} {
		name := map[netip.Addr]string{n.allowed: "allowed", n.denied: "denied", n.byIP: "by-ip"}[a]
		n.web[a] = n.sn.ServeWeb(netip.AddrPortFrom(a, 80), "web of "+name)
		n.tls[a] = n.sn.ServeTLS(netip.AddrPortFrom(a, 443), "tls of "+name)
		n.banner[a] = n.sn.ServeBanner(netip.AddrPortFrom(a, 2222), "banner of "+name)
		n.udp[a] = n.sn.ServeUDPEcho(netip.AddrPortFrom(a, 9999))
	}
	metadata := netip.MustParseAddr("169.254.169.254")
	n.sn.Add(metadata)
	n.meta = n.sn.ServeWeb(netip.AddrPortFrom(metadata, 80), "metadata")
	records := map[string]netip.Addr{
		"allowed.test.": n.allowed, "denied.test.": n.denied, "y.wild.test.": n.allowed, "x.wild.test.": n.allowed,
		"wild.test.": n.allowed, "doh.test.": n.doh, "flip.test.": n.allowed,
		"rebind-lo.test.": netip.MustParseAddr("127.0.0.1"), "rebind-meta.test.": metadata,
	}
	n.dns = n.sn.ServeDNS(n.resolv, records)
	n.dns.SetTTL("flip.test", 0)
	n.other = n.sn.ServeDNS(n.otherNS, records)
	n.sn.ServeDNSOn(netip.AddrPortFrom(n.otherNS, 5353), n.other)
	n.dot = n.sn.ServeDoT(n.denied, n.dns)
	n.dohSrv = n.sn.ServeDoH(netip.AddrPortFrom(n.doh, 443), n.dns)
	return n
}

// hits is the number of connections every server of the denied address,
// the DoT/DoH resolvers and the metadata stand-in accepted so far.
func (n *egressNet) deniedHits() int {
	return n.web[n.denied].Hits() + n.tls[n.denied].Hits() + n.banner[n.denied].Hits() + n.udp[n.denied].Hits() +
		n.dot.Hits() + n.dohSrv.Hits() + n.meta.Hits() + n.udp[n.allowed].Hits()
}

// egressPolicy is the policy of the attacked sandbox.
func (n *egressNet) policy() json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"defaultAction":"deny","egress":[
		{"action":"allow","target":"allowed.test"},
		{"action":"deny","target":"x.wild.test"},
		{"action":"allow","target":"*.wild.test"},
		{"action":"allow","target":"flip.test"},
		{"action":"allow","target":"rebind-lo.test"},
		{"action":"allow","target":"rebind-meta.test"},
		{"action":"allow","target":%q}]}`, n.byIP))
}

// probeIn uploads netprobe into a sandbox once and returns a function that
// runs it with args and reports its JSON line.
func probeIn(t *testing.T, c *container, bin []byte, ca []byte) func(args ...string) standin.ProbeResult {
	c.upload(map[string][]byte{"/tmp/netprobe": bin, "/tmp/ca.pem": ca}, map[string]api.FileMetadata{"/tmp/netprobe": {Mode: 755}})
	c.mustRun("chmod 755 /tmp/netprobe")
	return func(args ...string) standin.ProbeResult {
		t.Helper()
		r := c.run("/tmp/netprobe " + strings.Join(args, " "))
		p, err := standin.ParseProbe([]byte(r.stdout))
		if err != nil {
			t.Fatalf("netprobe %v: %v (stdout %q, stderr %q)", args, err, r.stdout, r.stderr)
		}
		return p
	}
}

// egressEndpoint is the egress API of sandbox id, as a client finds it.
type egressAPI struct {
	t     *testing.T
	base  string
	token string
}

func (s *server) egress(id string) *egressAPI {
	s.t.Helper()
	var ep api.Endpoint
	s.call("GET", "/v1/sandboxes/"+id+"/endpoints/18080", nil, 200, &ep)
	if !strings.HasSuffix(ep.Endpoint, "/proxy/18080") || ep.Headers[api.HeaderEgressAuth] == "" {
		s.t.Fatalf("egress endpoint %+v: want an address ending in /proxy/18080 and the egress token header", ep)
	}
	return &egressAPI{t: s.t, base: "http://" + ep.Endpoint, token: ep.Headers[api.HeaderEgressAuth]}
}

// do calls the egress API with the token (or with token, when given).
func (e *egressAPI) do(method, path, body string, token ...string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.base+path, strings.NewReader(body))
	tok := e.token
	if len(token) > 0 {
		tok = token[0]
	}
	if tok != "" {
		req.Header.Set(api.HeaderEgressAuth, tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *egressAPI) policy() api.PolicyStatus {
	e.t.Helper()
	code, body := e.do("GET", "/policy", "")
	var st api.PolicyStatus
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
		e.t.Fatalf("GET /policy: %d %s", code, body)
	}
	return st
}

// egressAttempt is one way out a sandbox tries.
type egressAttempt struct {
	name string
	args []string
	// control: a sandbox without a policy gets through with this attempt,
	// which shows the attempt can succeed.
	control bool
	// fronted: the proxy may carry it, to the allowed name's server (it
	// dials the name, not the address the sandbox picked).
	fronted bool
}

// TestAttackEgress: a sandbox with a strict policy reaches what it
// allows and nothing else, whichever way it tries.
func TestAttackEgress(t *testing.T) {
	testenv.MustHaveRoot(t)
	testenv.MustHaveImage(t, egressImage)
	network, gateway := testNetwork(t)
	n := newEgressNet(t)
	bin, err := os.ReadFile(standin.Netprobe(t))
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOptions{
		// Every sandbox's DNS, also the one without a policy, goes to the
		// test's name server: no query leaves the machine.
		docker: fmt.Sprintf("network = %q\ndns = [%q]", network, n.resolv),
		extra:  fmt.Sprintf("[egress]\nmode = \"strict\"\ndns_upstreams = [%q]\nmax_rules = 5000", n.resolv),
	})

	free := s.create(sandboxRequest(busyboxImage, "sleep", "infinity"))
	req := sandboxRequest(busyboxImage, "sleep", "infinity")
	req.NetworkPolicy = n.policy()
	id := s.create(req)
	s.waitState(free, "Running")
	s.waitState(id, "Running")
	c := s.execd(id)
	probe := probeIn(t, c, bin, n.sn.CAPEM())
	freeProbe := probeIn(t, s.execd(free), bin, n.sn.CAPEM())

	allowedURL := "https://allowed.test/"
	works := []struct {
		name string
		args []string
		want string
	}{
		{"an allowed name resolves", []string{"dns", "allowed.test"}, n.allowed.String()},
		{"plain HTTP to an allowed name", []string{"http", "http://allowed.test/"}, "web of allowed"},
		{"HTTPS to an allowed name", []string{"https", allowedURL, "-cafile", "/tmp/ca.pem"}, "tls of allowed"},
		{"a server-first protocol to an allowed name after DNS", []string{"tcp", "allowed.test:2222"}, "banner of allowed"},
		{"a name under an allowed wildcard", []string{"http", "http://y.wild.test/"}, "web of allowed"},
		{"an address an IP rule allows", []string{"http", "http://" + n.byIP.String() + "/"}, "web of by-ip"},
	}
	for _, w := range works {
		t.Run(w.name, func(t *testing.T) {
			p := probe(w.args...)
			if !p.OK || !strings.Contains(p.Detail, w.want) {
				t.Fatalf("%v: %+v; want it through with %q", w.args, p, w.want)
			}
		})
	}

	attempts := []egressAttempt{
		{"a denied name resolves", []string{"dns", "denied.test"}, true, false},
		{"the apex of an allowed wildcard resolves", []string{"dns", "wild.test"}, true, false},
		{"a name denied by an earlier rule than the wildcard resolves", []string{"dns", "x.wild.test"}, true, false},
		{"HTTP to the denied server by address", []string{"http", "http://" + n.denied.String() + "/"}, true, false},
		{"TCP to the denied server by address", []string{"tcp", n.denied.String() + ":2222"}, true, false},
		{"HTTPS to the denied server by address, no SNI", []string{"https", "https://" + n.denied.String() + "/", "-nosni"}, true, false},
		{"HTTPS to the denied server's address with an allowed SNI and a denied Host", []string{"https", "https://" + n.denied.String() + "/", "-sni", "allowed.test", "-cafile", "/tmp/ca.pem", "-host", "denied.test"}, true, true},
		{"HTTP to an allowed server's address with a denied Host", []string{"http", "http://" + n.allowed.String() + "/", "-host", "denied.test"}, false, false},
		{"HTTP to the denied server's address with an allowed Host", []string{"http", "http://" + n.denied.String() + "/", "-host", "allowed.test"}, true, true},
		{"DNS over TLS to port 853", []string{"dot", n.denied.String() + ":853", "denied.test"}, true, false},
		{"DNS over HTTPS to a resolver not allowed, by name", []string{"doh", "https://doh.test/dns-query", "denied.test"}, true, false},
		{"DNS over HTTPS to a resolver not allowed, by address", []string{"doh", "https://" + n.doh.String() + "/dns-query", "denied.test"}, true, false},
		{"DNS to another name server's port 53 for a denied name", []string{"dns", "denied.test", "-server", n.otherNS.String() + ":53"}, true, false},
		{"DNS over TCP to another name server", []string{"dns", "denied.test", "-tcp", "-server", n.otherNS.String() + ":53"}, true, false},
		{"DNS to another name server's port 5353", []string{"dns", "allowed.test", "-server", n.otherNS.String() + ":5353"}, true, false},
		{"UDP to an allowed name's address", []string{"udp", n.allowed.String() + ":9999"}, true, false},
		{"UDP (QUIC-style datagram) to the denied server", []string{"udp", n.denied.String() + ":9999"}, true, false},
		{"IPv6", []string{"ipv6", "[2001:db8::1]:80"}, false, false},
		{"a raw or packet socket", []string{"raw"}, false, false},
		{"nftables through netlink", []string{"nft"}, false, false},
		{"an allowed name that resolves to 127.0.0.1, by DNS", []string{"dns", "rebind-lo.test"}, true, false},
		{"an allowed name that resolves to the metadata address, by DNS", []string{"dns", "rebind-meta.test"}, true, false},
		{"an allowed name that resolves to the metadata address, by HTTP", []string{"http", "http://rebind-meta.test/"}, false, false},
		{"the metadata address directly", []string{"http", "http://169.254.169.254/"}, false, false},
		{"the host through the network's gateway", []string{"tcp", gateway + ":" + strconv.Itoa(freePortOnHost(t))}, false, false},
		{"the egress API on 127.0.0.1", []string{"http", "http://127.0.0.1:18080/healthz"}, false, false},
	}

	t.Run("control: without a policy every attempt gets through", func(t *testing.T) {
		for _, a := range attempts {
			if !a.control {
				continue
			}
			if p := freeProbe(a.args...); !p.OK {
				t.Errorf("control %s: %+v; the attempt could not have succeeded", a.name, p)
			}
		}
	})

	before := n.deniedHits()
	otherBefore := len(n.other.Queries())
	for _, a := range attempts {
		attack(t, "egress: "+a.name, func(t *testing.T) string {
			p := probe(a.args...)
			if p.OK && !(a.fronted && strings.Contains(p.Detail, "of allowed")) {
				t.Errorf("got through: %s", p.Detail)
			}
			return p.Detail
		})
	}
	attack(t, "egress: the fronted HTTPS request reached the allowed server, never the denied one", func(t *testing.T) string {
		p := probe("https", "https://"+n.denied.String()+"/", "-sni", "allowed.test", "-cafile", "/tmp/ca.pem")
		if p.OK && !strings.Contains(p.Detail, "tls of allowed") {
			t.Errorf("answered by another server: %s", p.Detail)
		}
		return p.Detail
	})
	attack(t, "egress: the denied servers, DoT, DoH, metadata and UDP servers saw no connection", func(t *testing.T) string {
		got := n.deniedHits() - before
		if got != 0 {
			t.Errorf("%d connections or datagrams reached them", got)
		}
		return fmt.Sprintf("%d hits", got)
	})
	attack(t, "egress: the name server the sandbox picked was never asked", func(t *testing.T) string {
		q := n.other.Queries()[otherBefore:]
		if len(q) > 0 {
			t.Errorf("asked %q", q)
		}
		return fmt.Sprintf("%d queries", len(q))
	})
	attack(t, "egress: the egress API on the sandbox's own address", func(t *testing.T) string {
		own := strings.TrimSpace(docker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", "osb-"+id+"-egress"))
		p := probe("http", "http://"+own+":18080/healthz")
		if p.OK {
			t.Errorf("reached: %s", p.Detail)
		}
		return p.Detail
	})
	attack(t, "egress: an allowed name whose DNS answer changes to 127.0.0.1 with a TTL of 0", func(t *testing.T) string {
		if p := probe("dns", "flip.test"); !p.OK {
			t.Fatalf("before the change: %+v", p)
		}
		n.dns.Set("flip.test", netip.MustParseAddr("127.0.0.1"))
		p := probe("dns", "flip.test")
		if p.OK {
			t.Errorf("resolved: %s", p.Detail)
		}
		return p.Detail
	})

	eg := s.egress(id)
	t.Run("the API", func(t *testing.T) {
		st := eg.policy()
		if st.Mode != "enforcing" || st.EnforcementMode != "strict" || st.Policy == nil || len(st.Policy.Egress) != 7 {
			t.Fatalf("GET /policy: %+v", st)
		}
		for _, tc := range []struct {
			method, body, token string
			want                int
		}{
			{"GET", "", "-", 401},
			{"GET", "", "wrong", 401},
			{"PATCH", "{", "", 400},
			{"PATCH", "[]", "", 400},
			{"PATCH", `[{"action":"block","target":"a.test"}]`, "", 400},
			{"PATCH", `[{"action":"allow","target":"bad..name"}]`, "", 400},
		} {
			var code int
			var body string
			switch tc.token {
			case "":
				code, body = eg.do(tc.method, "/policy", tc.body)
			case "-":
				code, body = eg.do(tc.method, "/policy", tc.body, "")
			default:
				code, body = eg.do(tc.method, "/policy", tc.body, tc.token)
			}
			if code != tc.want {
				t.Errorf("%s %s (token %q): %d %s; want %d", tc.method, tc.body, tc.token, code, body, tc.want)
			}
		}
		var rules []api.NetworkRule
		for i := range 5001 {
			rules = append(rules, api.NetworkRule{Action: "deny", Target: fmt.Sprintf("n%d.many.test", i)})
		}
		b, _ := json.Marshal(map[string]any{"defaultAction": "deny", "egress": rules})
		if code, body := eg.do("POST", "/policy", string(b)); code != 413 {
			t.Errorf("5,001 rules over a cap of 5,000: %d %s", code, body)
		}
		if st := eg.policy(); len(st.Policy.Egress) != 7 {
			t.Errorf("after the refused POST: %d rules", len(st.Policy.Egress))
		}
	})

	t.Run("changes apply live", func(t *testing.T) {
		// A connection opened before the deny stays up; a new one is
		// refused; a name added works within a second.
		if p := probe("dns", "allowed.test"); !p.OK {
			t.Fatalf("allowed.test: %+v", p)
		}
		c.mustRun("(echo one; sleep 6; echo two) | nc " + n.allowed.String() + " 2222 > /tmp/held.out 2>&1 &")
		testwait.Until(t, "the held connection to answer", func() bool {
			return strings.Contains(c.run("cat /tmp/held.out").stdout, "one")
		}, nil)
		if code, body := eg.do("PATCH", "/policy", `[{"action":"deny","target":"allowed.test"}]`); code != 200 {
			t.Fatalf("PATCH: %d %s", code, body)
		}
		if p := probe("http", "http://allowed.test/"); p.OK {
			t.Errorf("a new connection after the deny got through: %s", p.Detail)
		}
		testwait.Until(t, "the held connection to carry its second line", func() bool {
			return strings.Contains(c.run("cat /tmp/held.out").stdout, "two")
		}, func() string { return c.run("cat /tmp/held.out").stdout })

		start := time.Now()
		if code, body := eg.do("PATCH", "/policy", `[{"action":"allow","target":"denied.test"}]`); code != 200 {
			t.Fatalf("PATCH: %d %s", code, body)
		}
		p := probe("http", "http://denied.test/")
		if !p.OK || !strings.Contains(p.Detail, "web of denied") {
			t.Fatalf("the name added does not work: %+v", p)
		}
		t.Logf("a name added answered through the sandbox %v after the PATCH was sent", time.Since(start).Round(time.Millisecond))
		if code, body := eg.do("DELETE", "/policy", `["denied.test","allowed.test"]`); code != 200 {
			t.Fatalf("DELETE: %d %s", code, body)
		}
		if p := probe("http", "http://denied.test/"); p.OK {
			t.Errorf("denied.test after its allow rule was deleted: %+v", p)
		}
		if code, body := eg.do("PATCH", "/policy", `[{"action":"allow","target":"allowed.test"}]`); code != 200 {
			t.Fatalf("PATCH: %d %s", code, body)
		}
		if p := probe("http", "http://allowed.test/"); !p.OK {
			t.Errorf("allowed.test allowed again: %+v", p)
		}
		code, body := eg.do("GET", "/denials", "")
		if code != 200 || !strings.Contains(body, "denied.test") {
			t.Errorf("GET /denials: %d %.300s", code, body)
		}
	})

	t.Run("a killed osb-egress comes back enforcing the same policy, and nothing gets out meanwhile", func(t *testing.T) {
		want := eg.policy().Policy
		worker := egressWorkerPID(t, "osb-"+id+"-egress")
		if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		hits := n.deniedHits()
		for range 3 {
			if p := probe("http", "http://"+n.denied.String()+"/", "-timeout", "1s"); p.OK {
				t.Errorf("while osb-egress restarted: %s", p.Detail)
			}
		}
		testwait.Until(t, "osb-egress to restart", func() bool {
			resp, err := http.Get(eg.base + "/healthz") // refused while it restarts
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		}, nil)
		if got := eg.policy().Policy; !equalPolicy(got, want) {
			t.Errorf("policy after the restart %+v; want %+v", got, want)
		}
		if p := probe("http", "http://allowed.test/"); !p.OK {
			t.Errorf("allowed.test after the restart: %+v", p)
		}
		if d := n.deniedHits() - hits; d != 0 {
			t.Errorf("%d connections reached the denied server", d)
		}
	})

	t.Run("a restarted server finds the egress API and the policy", func(t *testing.T) {
		want := eg.policy().Policy
		s.stop(syscall.SIGKILL)
		s.start()
		s.waitState(id, "Running")
		if got := s.egress(id).policy().Policy; !equalPolicy(got, want) {
			t.Errorf("policy after the server restarted %+v; want %+v", got, want)
		}
	})

	t.Run("diagnostics show osb-egress's log and the refused attempts", func(t *testing.T) {
		// osb-egress keeps the recent refusals in memory: the worker
		// killed above took the earlier ones with it.
		if p := probe("dns", "denied.test"); p.OK {
			t.Fatalf("denied.test: %s", p.Detail)
		}
		content := func(path string) string {
			var d api.DiagnosticContent
			s.call("GET", "/v1/sandboxes/"+id+path, nil, 200, &d)
			if d.Content == nil {
				return ""
			}
			return *d.Content
		}
		if ev := content("/diagnostics/events?scope=runtime"); !strings.Contains(ev, "EGRESS_DENIED") || !strings.Contains(ev, "denied.test") {
			t.Errorf("runtime events: %.600s", ev)
		}
		if logs := content("/diagnostics/logs?scope=container"); !strings.Contains(logs, "--- osb-egress ---") || !strings.Contains(logs, `"msg":"enforcing"`) {
			t.Errorf("container logs: %.600s", logs)
		}
	})

	t.Run("delete removes the egress container", func(t *testing.T) {
		s.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
		s.waitGone(id)
		testwait.Until(t, "the egress container to go", func() bool {
			return exec.Command("docker", "inspect", "osb-"+id+"-egress").Run() != nil
		}, nil)
	})
}

// egressWorkerPID is the host PID of the osb-egress worker in container
// name: the child of its PID 1, the supervisor (any of whose threads may
// have started it).
func egressWorkerPID(t *testing.T, name string) int {
	t.Helper()
	pid := strings.TrimSpace(docker(t, "inspect", "-f", "{{.State.Pid}}", name))
	tasks, _ := filepath.Glob("/proc/" + pid + "/task/*/children")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			if child, err := strconv.Atoi(fields[0]); err == nil && child > 1 {
				return child
			}
		}
	}
	t.Fatalf("no worker under the supervisor (pid %s) of %s", pid, name)
	return 0
}

func equalPolicy(a, b *api.NetworkPolicy) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// freePortOnHost is a TCP port nothing on the host listens on at the
// moment: an attempt there would be refused if it arrived, and the guard
// drops it before it does.
func freePortOnHost(t *testing.T) int { return freePort(t) }

// TestEgressPool: the sandboxes of a pool whose template has a policy
// start enforcing it, and a create that names the pool gets one of them.
func TestEgressPool(t *testing.T) {
	testenv.MustHaveRoot(t)
	testenv.MustHaveImage(t, egressImage)
	network, _ := testNetwork(t)
	n := newEgressNet(t)
	bin, err := os.ReadFile(standin.Netprobe(t))
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, serverOptions{
		docker: fmt.Sprintf("network = %q\ndns = [%q]", network, n.resolv),
		extra:  fmt.Sprintf("[egress]\ndns_upstreams = [%q]", n.resolv),
	})
	policy := json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`)
	s.call("POST", "/pools", api.PoolRequest{
		Name:         "egress",
		Template:     &api.PoolTemplate{Image: &api.ImageSpec{URI: busyboxImage}, Entrypoint: []string{"sleep", "infinity"}, NetworkPolicy: policy},
		CapacitySpec: &api.CapacitySpec{BufferMin: 1, BufferMax: 1, PoolMin: 0, PoolMax: 2},
	}, 201, nil)
	testwait.Until(t, "the pool to hold a warm sandbox", func() bool {
		var p api.Pool
		s.call("GET", "/pools/egress", nil, 200, &p)
		return p.Status != nil && p.Status.Available == 1
	}, nil)
	req := api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "egress"}}
	id := s.create(req)
	s.waitState(id, "Running")
	var pool api.Pool
	s.call("GET", "/pools/egress", nil, 200, &pool)
	if pool.Status == nil || pool.Status.Claims != 1 {
		t.Fatalf("the create was not served from the pool: %+v", pool.Status)
	}
	probe := probeIn(t, s.execd(id), bin, n.sn.CAPEM())
	if p := probe("http", "http://allowed.test/"); !p.OK || !strings.Contains(p.Detail, "web of allowed") {
		t.Errorf("allowed.test from the claimed sandbox: %+v", p)
	}
	hits := n.deniedHits()
	for _, args := range [][]string{{"dns", "denied.test"}, {"http", "http://" + n.denied.String() + "/"}} {
		if p := probe(args...); p.OK {
			t.Errorf("%v from the claimed sandbox got through: %s", args, p.Detail)
		}
	}
	if d := n.deniedHits() - hits; d != 0 {
		t.Errorf("the denied server saw %d connections", d)
	}
	if st := s.egress(id).policy(); st.Policy == nil || len(st.Policy.Egress) != 1 || st.Policy.Egress[0].Target != "allowed.test" {
		t.Errorf("the claimed sandbox's policy: %+v", st)
	}
}

// TestEgressModes: the reference's modes, for users who ask for them, do
// what docs/egress.md says: dns+nft lets packets out only to addresses an
// allowed name resolved to (or an IP rule allows) but does not read SNI or
// Host; dns filters names only, and a connection by address walks past.
func TestEgressModes(t *testing.T) {
	testenv.MustHaveRoot(t)
	testenv.MustHaveImage(t, egressImage)
	network, _ := testNetwork(t)
	n := newEgressNet(t)
	bin, err := os.ReadFile(standin.Netprobe(t))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		name    string
		args    []string
		through bool
	}
	for _, mode := range []struct {
		name  string
		wants []want
	}{
		{"dns+nft", []want{
			{"an allowed name", []string{"http", "http://allowed.test/"}, true},
			{"a denied name", []string{"dns", "denied.test"}, false},
			{"the denied server by address", []string{"http", "http://" + n.denied.String() + "/"}, false},
			{"an address an IP rule allows", []string{"http", "http://" + n.byIP.String() + "/"}, true},
			{"UDP to the denied server", []string{"udp", n.denied.String() + ":9999"}, false},
			{"a denied Host to an allowed name's address (not read in this mode)", []string{"http", "http://" + n.allowed.String() + "/", "-host", "denied.test"}, true},
		}},
		{"dns", []want{
			{"an allowed name", []string{"http", "http://allowed.test/"}, true},
			{"a denied name", []string{"dns", "denied.test"}, false},
			{"the denied server by address (walks past this mode)", []string{"http", "http://" + n.denied.String() + "/"}, true},
		}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			s := startServer(t, serverOptions{
				docker: fmt.Sprintf("network = %q\ndns = [%q]", network, n.resolv),
				extra:  fmt.Sprintf("[egress]\nmode = %q\ndns_upstreams = [%q]", mode.name, n.resolv),
			})
			req := sandboxRequest(busyboxImage, "sleep", "infinity")
			req.NetworkPolicy = json.RawMessage(fmt.Sprintf(`{"egress":[{"action":"allow","target":"allowed.test"},{"action":"allow","target":%q}]}`, n.byIP))
			id := s.create(req)
			s.waitState(id, "Running")
			if st := s.egress(id).policy(); st.EnforcementMode != mode.name {
				t.Fatalf("enforcementMode %q", st.EnforcementMode)
			}
			probe := probeIn(t, s.execd(id), bin, n.sn.CAPEM())
			for _, w := range mode.wants {
				p := probe(w.args...)
				t.Logf("%s mode: %s → ok=%v: %s", mode.name, w.name, p.OK, p.Detail)
				if p.OK != w.through {
					t.Errorf("%s: got through = %v, docs/egress.md says %v", w.name, p.OK, w.through)
				}
			}
		})
	}
}
