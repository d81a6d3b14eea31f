package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sdk"
)

// TestKubernetesHelmGateway installs deploy/helm/opensandbox once into a
// fresh namespace of the local test cluster, in the gateway mode of the
// endpoint API, and then, from outside the cluster as a client on the
// host:
//
//	install: creates a sandbox through the server's Service and reaches
//	  its execd and a web app in it (testdata/ingressapp.py) through the
//	  gateway's Service with the headers the endpoint API gives; traffic
//	  through the gateway renews the sandbox on access (two gateways,
//	  two servers);
//	routes: path, header and subdomain (Host) routes to both of the
//	  app's ports, a signed route from the endpoint API in the header and
//	  in the path, what reaches the app;
//	streams: WebSocket echo, server-sent events one by one, HTTP/2
//	  without TLS, and 1 GiB through one gateway replica while its
//	  resident memory (its metrics listener) stays bounded;
//	replica: deletes one of the two gateway replicas, then kills another
//	  outright, under a steady request loop: the other keeps serving;
//	no-server: scales the servers to zero: routes keep working, through
//	  a gateway replica started after the servers went too.
func TestKubernetesHelmGateway(t *testing.T) {
	k := needCluster(t)
	helm := k.helm(t)
	k.importImages(t)
	ns := k.namespace(t)
	ctx, cancel := context.WithTimeout(t.Context(), 9*time.Minute)
	defer cancel()

	key, signing := randomKey(), randomSigningKey(t)
	k.must(t, "-n", ns, "create", "secret", "generic", "opensandbox-server", "--from-literal=api-key="+key)
	k.must(t, "-n", ns, "create", "secret", "generic", "opensandbox-ingress-keys", "--from-literal=keys="+signing)

	var st gatewayState
	ok := t.Run("install", func(t *testing.T) {
		start := time.Now()
		chart := filepath.Join(k.root, "deploy", "helm", "opensandbox")
		images := []string{"--set", "server.image.tag=" + e2eTag, "--set", "ingress.gateway.image.tag=" + e2eTag,
			"--set", "runtime.execd_image=" + e2eExecdImage}
		helm.must(t, append([]string{"install", "opensandbox", chart, "-n", ns}, images...)...)
		k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-ingress", "--timeout=120s")
		st.gateway = k.clusterIP(t, ns, "opensandbox-ingress") + ":80"
		server := k.clusterIP(t, ns, "opensandbox-server") + ":80"
		// The endpoint API answers the gateway's address, which is known
		// once its Service exists: an upgrade sets it, and the new
		// configuration rolls the servers. The test cluster has no DNS,
		// so the gateways reach the servers (to renew) at the ClusterIP.
		helm.must(t, append([]string{"upgrade", "opensandbox", chart, "-n", ns, "--reuse-values",
			"--set", "ingress.mode=gateway", "--set", "ingress.address=" + st.gateway, "--set", "ingress.domain=" + ingressDomain,
			"--set", "ingress.gateway.extraArgs={--server=http://" + server + ",--metrics-listen=:" + strconv.Itoa(gatewayMetricsPort) + "}"}, images...)...)
		k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-server", "--timeout=120s")
		k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-ingress", "--timeout=120s")
		c := newClient(t, "http://"+server, key, false)
		waitHealthy(t, ctx, c, server)
		t.Logf("installed and upgraded to gateway mode in %v", time.Since(start).Round(time.Millisecond))

		// Create waits for execd to answer at its endpoint: through the
		// gateway.
		start = time.Now()
		st.word = randomHex(8)
		st.want = appAsset(st.word)
		sb, err := c.Create(ctx, sdk.CreateOptions{Image: pythonImage, ReadyTimeout: 90 * time.Second,
			Timeout:    5 * time.Minute,
			Extensions: map[string]string{api.ExtensionRenewExtend: "1800"},
			Env:        map[string]string{"APP_WORD": st.word},
			Entrypoint: ingressAppCommand()})
		if err != nil {
			t.Fatalf("create a sandbox through the chart's server: %v", err)
		}
		st.sandbox = sb
		if exe, err := sb.Run(ctx, "echo hi", nil); err != nil || exe.Stdout != "hi\n" {
			t.Fatalf("command in the sandbox through the gateway: %+v, %v", exe, err)
		}
		ep, err := sb.Endpoint(ctx, appPort)
		if err != nil {
			t.Fatal(err)
		}
		if ep.Endpoint != st.gateway || ep.Headers[api.HeaderIngressTo] != sb.ID+"-"+strconv.Itoa(appPort) || ep.Headers[api.HeaderSecureAccess] == "" {
			t.Fatalf("endpoint of port 8080: %+v, want the gateway %s in header mode", ep, st.gateway)
		}
		st.headers = ep.Headers
		st.url = "http://" + st.gateway + "/asset.json"
		hc := &http.Client{Timeout: 5 * time.Second}
		// The sandbox is Running when execd answers; the app may still
		// be starting behind it.
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			code, body, err := st.get(hc, st.url)
			if err == nil && code == http.StatusOK && body == st.want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s through the gateway: %d %q %v", st.url, code, body, err)
			}
		}
		t.Logf("sandbox %s created, its command and web app reached through the gateway in %v", sb.ID, time.Since(start).Round(time.Millisecond))
		noAuth := map[string]string{api.HeaderIngressTo: sb.ID + "-" + strconv.Itoa(appPort)}
		if code, body, _ := (&gatewayState{headers: noAuth}).get(hc, st.url); code != http.StatusUnauthorized {
			t.Fatalf("without the access token: %d %s", code, body)
		}

		// The traffic above renewed the sandbox: its expiry, 5 minutes
		// after the create, is now 30 minutes after the first request.
		info, err := c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); info.ExpiresAt == nil || time.Until(*info.ExpiresAt) < 25*time.Minute; time.Sleep(250 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("expiry %v after traffic through the gateway, want about 30 minutes ahead", info.ExpiresAt)
			}
			if info, err = c.Get(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("renewed on access: expires in %v", time.Until(*info.ExpiresAt).Round(time.Second))
	})
	if !ok {
		return
	}

	t.Run("routes", func(t *testing.T) { st.routes(t, ctx) })
	t.Run("streams", func(t *testing.T) { st.streams(t, k, ns) })

	t.Run("replica", func(t *testing.T) {
		start := time.Now()
		pods := k.readyPods(t, ns, "opensandbox-ingress", 2)
		gone, survivor := pods[0], pods[1]
		// A deletion (a drain, a rolling update): through the Service,
		// no request fails.
		loop := st.traffic(ctx, map[string]string{"service": st.url, survivor.name: st.podURL(survivor)})
		time.Sleep(2 * time.Second)
		killed := time.Now()
		k.must(t, "-n", ns, "delete", "pod", gone.name, "--wait=false")
		k.waitPodGone(t, ns, gone.name, 60*time.Second)
		time.Sleep(time.Second)
		res := loop.stop()
		res.check(t, "deleting "+gone.name, killed, 0)

		// A kill: the pod is gone at once, without notice. The survivor
		// misses nothing; through the Service, requests may fail only
		// until the Service forgets the pod.
		k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-ingress", "--timeout=120s")
		pods = k.readyPods(t, ns, "opensandbox-ingress", 2)
		victim := pods[0]
		if victim.name == survivor.name {
			victim = pods[1]
		}
		loop = st.traffic(ctx, map[string]string{"service": st.url, survivor.name: st.podURL(survivor)})
		time.Sleep(2 * time.Second)
		killed = time.Now()
		k.must(t, "-n", ns, "delete", "pod", victim.name, "--grace-period=0", "--force")
		time.Sleep(8 * time.Second)
		res = loop.stop()
		res.check(t, "killing "+victim.name, killed, 5*time.Second)
		t.Logf("two replica losses under traffic in %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("no-server", func(t *testing.T) {
		start := time.Now()
		k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-ingress", "--timeout=120s")
		k.must(t, "-n", ns, "scale", "deployment/opensandbox-server", "--replicas=0")
		for deadline := time.Now().Add(60 * time.Second); len(k.podsOf(t, ns, "opensandbox-server")) > 0; time.Sleep(250 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("server pods still there a minute after scaling to zero: %v", k.podsOf(t, ns, "opensandbox-server"))
			}
		}
		if out, err := k.run("-n", ns, "get", "endpointslices", "-l", "kubernetes.io/service-name=opensandbox-server", "-o", "jsonpath={.items[*].endpoints}"); err != nil || strings.Contains(out, "addresses") {
			t.Fatalf("the server Service still has endpoints: %s %v", out, err)
		}
		// A gateway replica that starts now, with no server anywhere,
		// becomes ready and routes.
		pods := k.readyPods(t, ns, "opensandbox-ingress", 2)
		k.must(t, "-n", ns, "delete", "pod", pods[0].name, "--wait=false")
		k.waitPodGone(t, ns, pods[0].name, 60*time.Second)
		k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-ingress", "--timeout=120s")
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		for _, p := range k.readyPods(t, ns, "opensandbox-ingress", 2) {
			code, body, err := st.get(hc, st.podURL(p))
			if err != nil || code != http.StatusOK || body != st.want {
				t.Fatalf("through gateway %s with no server: %d %q %v", p.name, code, body, err)
			}
		}
		for i := range 20 {
			code, body, err := st.get(hc, st.url)
			if err != nil || code != http.StatusOK || body != st.want {
				t.Fatalf("request %d through the gateway's Service with no server: %d %q %v", i, code, body, err)
			}
		}
		t.Logf("with the servers scaled to zero, both gateways (one started since) route; %v", time.Since(start).Round(time.Millisecond))
	})
}

// gatewayState is what the subtests share: the gateway's address (its
// Service) and a route to the app's asset, with the headers that
// authorize it.
type gatewayState struct {
	gateway string
	url     string
	headers map[string]string
	sandbox *sdk.Sandbox
	// word is the app's, want the body of its asset.
	word, want string
	// signedPath is the base URL of a signed path route to appPort, once
	// routes made it.
	signedPath string
}

// The ports of a gateway pod: its listener, which the Service forwards
// to, and its metrics listener (--metrics-listen).
const gatewayPodPort, gatewayMetricsPort = 8090, 9090

// podURL is the URL of the app's asset through gateway pod p, bypassing
// the Service.
func (st *gatewayState) podURL(p serverPod) string {
	return "http://" + net.JoinHostPort(p.ip, strconv.Itoa(gatewayPodPort)) + "/asset.json"
}

// get sends GET url with the route's headers.
func (st *gatewayState) get(hc *http.Client, url string) (int, string, error) {
	return getWith(hc, url, st.headers)
}

// getWith sends GET url with header ("Host" sets the Host) and returns
// the status and the body.
func getWith(hc *http.Client, url string, header map[string]string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// auth is the header of the sandbox's access token alone, plus more
// header pairs.
func (st *gatewayState) auth(more ...string) map[string]string {
	h := map[string]string{api.HeaderSecureAccess: st.headers[api.HeaderSecureAccess]}
	for i := 0; i+1 < len(more); i += 2 {
		h[more[i]] = more[i+1]
	}
	return h
}

// routes checks every route form through the gateway's Service: path,
// header and subdomain (the Host naming the route) to both of the app's
// ports with the access token, and a signed route from the endpoint API
// in the header and in the path, without it.
func (st *gatewayState) routes(t *testing.T, ctx context.Context) {
	start := time.Now()
	hc := ingressClient()
	id, base := st.sandbox.ID, "http://"+st.gateway
	for _, port := range []int{appPort, appPort2} {
		route := id + "-" + strconv.Itoa(port)
		for _, c := range []struct {
			name, url string
			header    map[string]string
		}{
			{"path", base + "/" + id + "/" + strconv.Itoa(port) + "/headers?q=1", st.auth()},
			{"header", base + "/headers?q=1", st.auth(api.HeaderIngressTo, route)},
			{"legacy header", base + "/headers?q=1", st.auth(api.HeaderIngressLegacy, route)},
			{"subdomain", base + "/headers?q=1", st.auth("Host", route+"."+ingressDomain)},
		} {
			code, body, err := getWith(hc, c.url, c.header)
			var r appRequest
			if err != nil || code != http.StatusOK || json.Unmarshal([]byte(body), &r) != nil {
				t.Errorf("%s route to port %d: %d %q %v", c.name, port, code, body, err)
				continue
			}
			if r.Port != port || r.Path != "/headers?q=1" {
				t.Errorf("%s route: the app on port %d saw %q, want port %d and /headers?q=1", c.name, r.Port, r.Path, port)
			}
			for _, h := range []string{api.HeaderIngressTo, api.HeaderIngressLegacy, api.HeaderSecureAccess} {
				if v := r.header(h); v != "" {
					t.Errorf("%s route: the app got %s: %q", c.name, h, v)
				}
			}
			if r.header("X-Forwarded-For") == "" || r.header("X-Forwarded-Proto") != "http" {
				t.Errorf("%s route: forwarded headers %v", c.name, r.Headers)
			}
		}
	}

	// A signed route from the endpoint API: the gateway's address, the
	// route in the header, no token.
	ep, err := st.sandbox.Endpoint(ctx, appPort, sdk.WithExpiry(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	route := ep.Headers[api.HeaderIngressTo]
	exp, sig, _ := strings.Cut(strings.TrimPrefix(route, id+"-"+strconv.Itoa(appPort)+"-"), "-")
	if ep.Endpoint != st.gateway || len(ep.Headers) != 1 || !strings.HasPrefix(route, id+"-"+strconv.Itoa(appPort)+"-") || exp == "" || sig == "" {
		t.Fatalf("signed endpoint %+v: want the gateway %s and a signed route in %s alone", ep, st.gateway, api.HeaderIngressTo)
	}
	st.signedPath = base + "/" + id + "/" + strconv.Itoa(appPort) + "/" + exp + "/" + sig
	for _, c := range []struct {
		name, url string
		header    map[string]string
	}{
		{"signed header route", base + "/asset.json", ep.Headers},
		{"signed path route", st.signedPath + "/asset.json", nil},
	} {
		code, body, err := getWith(hc, c.url, c.header)
		if err != nil || code != http.StatusOK || body != st.want {
			t.Errorf("%s: %d %q %v, want the app's asset %s", c.name, code, body, err, st.want)
		}
	}
	for _, c := range []struct {
		name, url string
		header    map[string]string
	}{
		{"tampered signed header route", base + "/asset.json", map[string]string{api.HeaderIngressTo: tamper(route, len(route)-3)}},
		{"signed path route to another port", base + "/" + id + "/" + strconv.Itoa(appPort2) + "/" + exp + "/" + sig + "/asset.json", nil},
		{"path route without auth", base + "/" + id + "/" + strconv.Itoa(appPort) + "/asset.json", nil},
	} {
		code, body, err := getWith(hc, c.url, c.header)
		var e api.ErrorResponse
		if err != nil || code != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || e.Code != api.CodeIngressUnauthorized {
			t.Errorf("%s: %d %q %v, want 401 %s", c.name, code, body, err, api.CodeIngressUnauthorized)
		}
	}
	t.Logf("path, header, legacy header and subdomain routes to two ports, signed routes: %v", time.Since(start).Round(time.Millisecond))
}

// streams checks what must stream through the gateway: WebSocket echo
// and server-sent events through the Service, HTTP/2 without TLS, and a
// 1 GiB download through one gateway pod, whose resident memory its
// metrics listener reports while the body streams.
func (st *gatewayState) streams(t *testing.T, k *cluster, ns string) {
	start := time.Now()
	hc := ingressClient()
	id, base := st.sandbox.ID, "http://"+st.gateway
	token := http.Header{api.HeaderSecureAccess: {st.headers[api.HeaderSecureAccess]}}
	routeHeader := http.Header{}
	for name, v := range st.headers {
		routeHeader.Set(name, v)
	}
	pathRoute := base + "/" + id + "/" + strconv.Itoa(appPort)

	wsEcho(t, hc, "header route", "ws://"+st.gateway+"/ws", routeHeader)
	wsEcho(t, hc, "path route, other port", "ws://"+st.gateway+"/"+id+"/"+strconv.Itoa(appPort2)+"/ws", token)
	if st.signedPath != "" {
		wsEcho(t, hc, "signed path route", "ws"+strings.TrimPrefix(st.signedPath, "http")+"/ws", nil)
	}

	wantSSE(t, hc, "path route", pathRoute, token, 5, 500*time.Millisecond)

	h2 := h2cClient(hc.Transport.(*http.Transport))
	resp, body := getH2(t, h2, pathRoute+"/asset.json", token)
	wantAppAsset(t, "h2c path route", st.word, resp, body)
	resp, body = getH2(t, h2, st.url, routeHeader)
	wantAppAsset(t, "h2c header route", st.word, resp, body)

	// The download goes to one replica, so that the memory measured is
	// that of the process that carries it; its byte counter says it did.
	p := k.readyPods(t, ns, "opensandbox-ingress", 2)[0]
	metrics := "http://" + net.JoinHostPort(p.ip, strconv.Itoa(gatewayMetricsPort)) + "/metrics"
	mc := &http.Client{Timeout: 5 * time.Second}
	sent := func() float64 {
		t.Helper()
		m, err := scrapeMetrics(mc, metrics)
		if err != nil {
			t.Fatalf("metrics of gateway %s: %v", p.name, err)
		}
		return m["opensandbox_ingress_sent_bytes_total"]
	}
	rss := func() (int64, error) {
		m, err := scrapeMetrics(mc, metrics)
		if err != nil {
			return 0, err
		}
		v, ok := m["process_resident_memory_bytes"]
		if !ok || v <= 0 {
			return 0, fmt.Errorf("no process_resident_memory_bytes at %s", metrics)
		}
		return int64(v), nil
	}
	sentBefore := sent()
	dl := &http.Client{Transport: hc.Transport, Timeout: 3 * time.Minute}
	wantBoundedDownload(t, dl, "http://"+net.JoinHostPort(p.ip, strconv.Itoa(gatewayPodPort))+"/"+id+"/"+strconv.Itoa(appPort), token, rss, 50*time.Millisecond)
	if d := sent() - sentBefore; d < downloadSize {
		t.Errorf("gateway %s counted %.0f bytes sent during the download, want at least %d", p.name, d, downloadSize)
	}
	t.Logf("WebSocket, SSE, h2c and 1 GiB through %s: %v", p.name, time.Since(start).Round(time.Millisecond))
}

// attempt is one request of a traffic loop.
type attempt struct {
	via        string
	start, end time.Time
	err        error
}

type trafficLoop struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	all    []attempt
}

// traffic sends requests to each of urls, two at a time each, on new
// connections (so that the Service's choice of replica is made anew for
// each), until stop.
func (st *gatewayState) traffic(ctx context.Context, urls map[string]string) *trafficLoop {
	ctx, cancel := context.WithCancel(ctx)
	l := &trafficLoop{cancel: cancel}
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for via, url := range urls {
		for range 2 {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for ctx.Err() == nil {
					a := attempt{via: via, start: time.Now()}
					code, body, err := st.get(hc, url)
					if err == nil && (code != http.StatusOK || body != st.want) {
						err = fmt.Errorf("%d %q", code, body)
					}
					a.end, a.err = time.Now(), err
					if ctx.Err() != nil {
						return // cut by stop, not by the gateway
					}
					l.mu.Lock()
					l.all = append(l.all, a)
					l.mu.Unlock()
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}
	return l
}

func (l *trafficLoop) stop() trafficResult {
	l.cancel()
	l.wg.Wait()
	return trafficResult(l.all)
}

type trafficResult []attempt

// check fails the test for any request that failed, except those in
// flight when the replica went and, through the Service, those that
// started within window after it (the time a Service takes to forget a
// pod that vanished unannounced).
func (r trafficResult) check(t *testing.T, what string, killed time.Time, window time.Duration) {
	t.Helper()
	type tally struct{ ok, failed, excused int }
	by := map[string]*tally{}
	for _, a := range r {
		tl := by[a.via]
		if tl == nil {
			tl = &tally{}
			by[a.via] = tl
		}
		switch {
		case a.err == nil:
			tl.ok++
		case a.start.Before(killed) && a.end.After(killed):
			tl.excused++
		case a.via == "service" && a.start.Before(killed.Add(window)):
			tl.excused++
		default:
			tl.failed++
			t.Errorf("%s: request through %s started %v after, failed: %v", what, a.via, a.start.Sub(killed).Round(time.Millisecond), a.err)
		}
	}
	var after int
	for _, a := range r {
		if a.err == nil && a.start.After(killed.Add(window)) {
			after++
		}
	}
	if after < 20 {
		t.Errorf("%s: only %d requests succeeded after the replica went", what, after)
	}
	var b strings.Builder
	for via, tl := range by {
		fmt.Fprintf(&b, " %s: %d ok, %d failed, %d in flight or in the Service's window;", via, tl.ok, tl.failed, tl.excused)
	}
	t.Logf("%s under traffic:%s", what, b.String())
}

// helmCLI runs the helm that scripts/k8s/helm.sh builds against the test
// cluster, with a configuration of its own.
type helmCLI struct {
	bin, kubeconfig, home string
}

// helm returns the test cluster's helm, or marks it missing.
func (k *cluster) helm(t *testing.T) *helmCLI {
	t.Helper()
	bin := filepath.Join(k.root, ".k8s", "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		testenv.Missing(t, "no helm at %s (%v); make k8s-up builds it (scripts/k8s/helm.sh)", bin, err)
	}
	return &helmCLI{bin: bin, kubeconfig: k.kubeconfig, home: t.TempDir()}
}

func (h *helmCLI) must(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, append(args, "--kubeconfig", h.kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+h.home, "HELM_CONFIG_HOME="+h.home, "HELM_DATA_HOME="+h.home)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

func (k *cluster) clusterIP(t *testing.T, ns, service string) string {
	t.Helper()
	return strings.TrimSpace(k.must(t, "-n", ns, "get", "service", service, "-o", "jsonpath={.spec.clusterIP}"))
}

// waitPodGone waits until the pod no longer exists.
func (k *cluster) waitPodGone(t *testing.T, ns, pod string, timeout time.Duration) {
	t.Helper()
	if out, err := k.run("-n", ns, "wait", "--for=delete", "pod/"+pod, fmt.Sprintf("--timeout=%ds", int(timeout.Seconds()))); err != nil &&
		!strings.Contains(out, "not found") {
		t.Fatalf("pod %s still there after %v: %v\n%s", pod, timeout, err, out)
	}
}

// waitHealthy waits until the server at addr answers its health check.
// kube-proxy programs a new Service within about a second, but on a
// loaded machine a request to a just-made ClusterIP has hung for the
// whole of a 30 s client timeout: each attempt gets 5 s, all 90 s.
func waitHealthy(t *testing.T, ctx context.Context, c *sdk.Client, addr string) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := c.Health(actx)
		cancel()
		if err == nil && h.Status == "healthy" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health of %s: %+v, %v", addr, h, err)
		}
	}
}
