package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/sandbox"
)

// egressImage is the osb-egress image as the cluster's node lists it.
const egressImage = "docker.io/opensandbox/egress:latest"

// testDNS is an authoritative server for a few names under .test, on an
// address of this machine that the cluster's pods reach (the node's).
type testDNS struct {
	addr  string
	mu    sync.Mutex
	seen  []string
	extra map[string]string // names set by the test, beside testRecords
}

// set adds a record: name (fully qualified) resolves to addr.
func (d *testDNS) set(name, addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.extra == nil {
		d.extra = map[string]string{}
	}
	d.extra[name] = addr
}

// The addresses the test's names resolve to. No connection is made to
// them: the test only resolves names.
var testRecords = map[string]string{
	"allowed.test.": "203.0.113.10",
	"denied.test.":  "203.0.113.20",
	"later.test.":   "203.0.113.30",
}

func startTestDNS(t *testing.T, host string) *testDNS {
	t.Helper()
	d := &testDNS{}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		q := req.Question[0]
		d.mu.Lock()
		d.seen = append(d.seen, dns.CanonicalName(q.Name))
		addr, ok := testRecords[dns.CanonicalName(q.Name)]
		if a, found := d.extra[dns.CanonicalName(q.Name)]; found {
			addr, ok = a, true
		}
		d.mu.Unlock()
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR(fmt.Sprintf("%s 5 IN A %s", q.Name, addr))
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	// UDP and TCP on one port: a free UDP port may be taken for TCP.
	var pc net.PacketConn
	var ln net.Listener
	for range 20 {
		var err error
		if pc, err = net.ListenPacket("udp", net.JoinHostPort(host, "0")); err != nil {
			testenv.Missing(t, "cannot listen on the node's address %s (%v): the test's DNS server must be reachable from pods", host, err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		pc = nil
	}
	if pc == nil {
		t.Fatal("no port free for both UDP and TCP on " + host)
	}
	d.addr = pc.LocalAddr().String()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}} {
		up := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(up) }
		go srv.ActivateAndServe()
		<-up
		t.Cleanup(func() { srv.Shutdown() })
	}
	return d
}

// queries returns the names asked so far.
func (d *testDNS) queries() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seen...)
}

func (d *testDNS) asked(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.seen {
		if s == dns.CanonicalName(name) {
			return true
		}
	}
	return false
}

// nodeAddress returns the node's internal address, which pods reach and
// which, on the local test cluster, is an address of this machine; and
// fails (skips outside CI) when the node lacks the osb-egress image, so
// that no pull ever leaves the machine.
func nodeAddress(t *testing.T, env *testEnv) string {
	t.Helper()
	nodes, err := env.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("nodes: %v (%d)", err, len(nodes.Items))
	}
	node := nodes.Items[0]
	hasImage := false
	for _, img := range node.Status.Images {
		for _, n := range img.Names {
			hasImage = hasImage || n == egressImage
		}
	}
	if !hasImage {
		testenv.Missing(t, "node %s has no %s; run make images k8s-images", node.Name, egressImage)
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("node %s has no internal address", node.Name)
	return ""
}

// TestEgressOnCluster: a sandbox created with a policy that allows only
// allowed.test runs osb-egress as its first init container; its first
// process already finds the policy enforced (a denied name gets NXDOMAIN
// and never reaches the upstream; the allowed one resolves); the endpoint
// for 18080 is the pod's address with the egress token, which the API
// wants, and a PATCH applies at once; from inside the sandbox the API is
// unreachable, on 127.0.0.1 and on the pod's own address, token or not;
// delete removes the pod and its Secret.
func TestEgressOnCluster(t *testing.T) {
	env := newTestEnv(t)
	upstream := startTestDNS(t, nodeAddress(t, env))
	cfg := env.config("egress-" + randomSuffix())
	cfg.Egress.DNSUpstreams = []string{upstream.addr}
	rt := env.runtime(t, cfg)
	ctx := context.Background()

	id := sandbox.NewID()
	first := "nslookup allowed.test >/tmp/first-allowed 2>&1; nslookup denied.test >/tmp/first-denied 2>&1; exec sleep 100000"
	spec := sandbox.Spec{Image: testImage, Entrypoint: []string{"sh", "-c", first},
		NetworkPolicy: []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`)}
	if _, err := rt.Create(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)

	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(pod.Spec.InitContainers); len(got) == 0 || got[0] != containerEgress {
		t.Fatalf("init containers %v: osb-egress is not first", got)
	}
	var egressStarted, sandboxStarted time.Time
	for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		switch {
		case cs.Name == containerEgress && cs.State.Running != nil && cs.Started != nil && *cs.Started:
			egressStarted = cs.State.Running.StartedAt.Time
		case cs.Name == containerSandbox && cs.State.Running != nil:
			sandboxStarted = cs.State.Running.StartedAt.Time
		}
	}
	if egressStarted.IsZero() || sandboxStarted.IsZero() || sandboxStarted.Before(egressStarted) {
		t.Fatalf("osb-egress started %v (probe passed: %v), the sandbox %v", egressStarted, !egressStarted.IsZero(), sandboxStarted)
	}

	execd, err := rt.Endpoint(ctx, id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	// The entrypoint's first commands ran under the policy.
	var denied, allowed string
	testwait.Until(t, "the entrypoint's lookups", func() bool {
		denied = output(runCommand(t, execd, "cat /tmp/first-denied"))
		allowed = output(runCommand(t, execd, "cat /tmp/first-allowed"))
		return strings.Contains(denied, "denied.test") && strings.Contains(allowed, "allowed.test")
	}, func() string { return denied + "\n" + allowed })
	if !strings.Contains(denied, "NXDOMAIN") || strings.Contains(denied, "203.0.113.20") {
		t.Fatalf("the first lookup of a denied name: %s", denied)
	}
	if !strings.Contains(allowed, "203.0.113.10") {
		t.Fatalf("the first lookup of the allowed name: %s", allowed)
	}
	t.Logf("attempt first-process lookup of denied.test → %s", lastLine(denied))
	t.Logf("attempt first-process lookup of allowed.test → resolved, 203.0.113.10 in the answer: %v", strings.Contains(allowed, "203.0.113.10"))
	if upstream.asked("denied.test") || !upstream.asked("allowed.test") {
		t.Fatalf("the upstream saw %v: want allowed.test, never denied.test", upstream.queries())
	}

	// The egress API: on the pod's address, with the token.
	ep, err := rt.Endpoint(ctx, id, sandbox.PortEgress)
	if err != nil {
		t.Fatal(err)
	}
	token := ep.Headers[api.HeaderEgressAuth]
	if ep.Address != net.JoinHostPort(pod.Status.PodIP, "18080") || len(token) < 32 {
		t.Fatalf("egress endpoint %+v", ep)
	}
	call := func(method, body string, withToken bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+ep.Address+"/policy", strings.NewReader(body))
		if withToken {
			req.Header.Set(api.HeaderEgressAuth, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s /policy: %v", method, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call(http.MethodGet, "", true); code != http.StatusOK || !strings.Contains(body, "allowed.test") {
		t.Fatalf("GET /policy: %d %s", code, body)
	}
	if code, _ := call(http.MethodGet, "", false); code != http.StatusUnauthorized {
		t.Fatalf("GET /policy without the token: %d, want 401", code)
	}
	lookup := func(name string) string { return output(runCommand(t, execd, "nslookup "+name+" 2>&1")) }
	if out := lookup("later.test"); !strings.Contains(out, "NXDOMAIN") {
		t.Fatalf("later.test before it is allowed: %s", out)
	}
	if code, body := call(http.MethodPatch, `[{"action":"allow","target":"later.test"}]`, true); code != http.StatusOK {
		t.Fatalf("PATCH /policy: %d %s", code, body)
	}
	if out := lookup("later.test"); !strings.Contains(out, "203.0.113.30") {
		t.Fatalf("later.test once allowed: %s", out)
	}
	if out := lookup("denied.test"); !strings.Contains(out, "NXDOMAIN") {
		t.Fatalf("denied.test after the patch: %s", out)
	}

	// The API answers the node (the kubelet's probe, and this test), but
	// nothing inside the sandbox, with or without the token.
	resp, err := http.Get("http://" + ep.Address + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz from the node: %s", resp.Status)
	}
	// wget works inside (execd answers it, if only with 401); the API
	// refuses it. (busybox's wget -T crashes; timeout bounds it instead.)
	control := runCommand(t, execd, fmt.Sprintf("timeout 20 wget -q -O - http://127.0.0.1:%d/ping 2>&1; echo exit=$?", api.ExecdPort))
	if !strings.Contains(output(control), "401") {
		t.Fatalf("control: wget to execd from inside: %s", output(control))
	}
	for _, host := range []string{"127.0.0.1", pod.Status.PodIP} {
		for _, header := range []string{"", " --header 'OPENSANDBOX-EGRESS-AUTH: " + token + "'"} {
			cmd := fmt.Sprintf("timeout 20 wget -q -O -%s http://%s:18080/policy 2>&1; echo exit=$?", header, host)
			out := output(runCommand(t, execd, cmd))
			// Refused by the firewall on lo (127.0.0.1), or, for the pod's
			// own address, which strict mode's nat sends to the proxy
			// first, reset by the proxy (a private address the policy
			// does not allow); the firewall would refuse the proxy too.
			if !(strings.Contains(out, "Connection refused") || strings.Contains(out, "Connection reset by peer")) ||
				!strings.Contains(out, "exit=1") || strings.Contains(out, "allowed.test") {
				t.Fatalf("from inside, %s: %s", cmd, out)
			}
			t.Logf("attempt egress API from inside at %s (token: %v) → refused: %s", host, header != "", lastLine(out))
		}
	}

	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the pod and its secret to go", func() bool {
		_, perr := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
		_, serr := env.cs.CoreV1().Secrets(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(serr)
	}, func() string { return describe(rt, id) })
}

// output is the text a command printed, from execd's event stream.
func output(events string) string {
	var b strings.Builder
	for _, line := range strings.Split(events, "\n") {
		var ev struct{ Type, Text string }
		if json.Unmarshal([]byte(line), &ev) == nil && (ev.Type == "stdout" || ev.Type == "stderr") {
			b.WriteString(ev.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// lastLine is the last line of a command's output that says something,
// for the test's log.
func lastLine(out string) string {
	var last string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "exit=") {
			last = l
		}
	}
	return last
}

// TestEgressRefusedOnGVisor: a policy on a gVisor RuntimeClass is refused
// at create, before anything is made: osb-egress cannot filter gVisor's
// network stack.
func TestEgressRefusedOnGVisor(t *testing.T) {
	env := newTestEnv(t)
	class, err := env.cs.NodeV1().RuntimeClasses().Get(context.Background(), "gvisor", metav1.GetOptions{})
	if err != nil {
		testenv.Missing(t, "the test cluster has no RuntimeClass gvisor (%v); make k8s-up makes it", err)
	}
	cfg := env.config("egress-gv-" + randomSuffix())
	cfg.AllowedRuntimeClasses = []string{class.Name}
	rt := env.runtime(t, cfg)
	id := sandbox.NewID()
	_, err = rt.Create(context.Background(), id, sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint,
		Extensions:    map[string]string{extRuntimeClass: class.Name},
		NetworkPolicy: []byte(`{"defaultAction":"deny"}`)})
	if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "gVisor") {
		t.Fatalf("create with a policy on gvisor: %v, want a refusal naming gVisor", err)
	}
	if _, err := env.cs.CoreV1().Secrets(env.ns).Get(context.Background(), podName(id), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a refused create left its secret: %v", err)
	}
}
