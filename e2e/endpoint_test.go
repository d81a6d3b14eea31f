package e2e

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// TestEndpointForms creates a Docker sandbox on the bridge network and
// checks the endpoint of execd's port, the app port, another port and the
// server-proxy form against the protocol, reaching the sandbox through
// each as a client does: "http://" + endpoint + route, with the headers.
func TestEndpointForms(t *testing.T) {
	testenv.MustHaveImage(t, pythonImage)
	s := startServer(t, serverOptions{})
	id := s.create(sandboxRequest(pythonImage, "sleep", "1000000"))
	s.waitState(id, "Running")
	endpoint := func(port, query string) api.Endpoint {
		t.Helper()
		var ep api.Endpoint
		s.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+port+query, nil, 200, &ep)
		if strings.Contains(ep.Endpoint, "://") {
			t.Fatalf("endpoint of %s%s has a scheme: %+v", port, query, ep)
		}
		return ep
	}
	published := func(port string) string {
		t.Helper()
		out := strings.TrimSpace(docker(t, "port", "osb-"+id, port+"/tcp"))
		_, p, err := net.SplitHostPort(strings.Split(out, "\n")[0])
		if err != nil {
			t.Fatalf("docker port %s: %q: %v", port, out, err)
		}
		return p
	}
	execdHostPort := published(execdPort)

	// execd: {host}:{execd's published port}/proxy/44772, with the token;
	// a command runs through it.
	ep := endpoint(execdPort, "")
	if want := "127.0.0.1:" + execdHostPort + "/proxy/" + execdPort; ep.Endpoint != want || ep.Headers[api.HeaderExecdToken] == "" || len(ep.Headers) != 1 {
		t.Fatalf("execd endpoint %+v, want %s with the token only", ep, want)
	}
	c := s.execd(id)
	if out := c.mustRun("echo direct-$((20+22))"); strings.TrimSpace(out) != "direct-42" {
		t.Fatalf("command through %s: %q", c.base, out)
	}
	token := ep.Headers[api.HeaderExecdToken]

	// Servers on the app port and on another one.
	c.mustRun("mkdir -p /tmp/www && echo served-by-the-sandbox > /tmp/www/marker.txt")
	c.mustRun("nohup python3 -m http.server 8080 --directory /tmp/www >/dev/null 2>&1 &")
	c.mustRun("nohup python3 -m http.server 9000 --directory /tmp/www >/dev/null 2>&1 &")
	get := func(what string, ep api.Endpoint) {
		t.Helper()
		var got string
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			req, _ := http.NewRequest("GET", "http://"+ep.Endpoint+"/marker.txt", nil)
			for k, v := range ep.Headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				got = err.Error()
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got = resp.Status + " " + string(b); resp.StatusCode == 200 && strings.TrimSpace(string(b)) == "served-by-the-sandbox" {
				return
			}
		}
		t.Fatalf("%s: GET http://%s/marker.txt: %q", what, ep.Endpoint, got)
	}

	// 8080: published and reached directly, no headers.
	ep = endpoint("8080", "")
	if want := "127.0.0.1:" + published("8080"); ep.Endpoint != want || len(ep.Headers) != 0 {
		t.Fatalf("app endpoint %+v, want %s without headers", ep, want)
	}
	get("app port", ep)

	// Any other port: through execd's forwarder, with the token.
	ep = endpoint("9000", "")
	if want := "127.0.0.1:" + execdHostPort + "/proxy/9000"; ep.Endpoint != want || ep.Headers[api.HeaderExecdToken] != token {
		t.Fatalf("endpoint of port 9000 %+v, want %s with the token", ep, want)
	}
	get("port 9000", ep)

	// Through the server's proxy route: {server}/sandboxes/{id}/proxy/{port},
	// the direct endpoint's headers and the token.
	for _, port := range []string{execdPort, "8080", "9000"} {
		ep = endpoint(port, "?use_server_proxy=true")
		want := s.listen + "/sandboxes/" + id + "/proxy/" + port
		if ep.Endpoint != want || ep.Headers[api.HeaderExecdToken] != token {
			t.Fatalf("server-proxy endpoint of %s: %+v, want %s with the token", port, ep, want)
		}
		if port != execdPort {
			get("port "+port+" through the server", ep)
		}
	}
	ep = endpoint(execdPort, "?use_server_proxy=true")
	viaServer := &container{t: t, id: id, base: "http://" + ep.Endpoint, token: token, hc: &http.Client{}}
	if out := viaServer.mustRun("echo proxied-$((40+2))"); strings.TrimSpace(out) != "proxied-42" {
		t.Fatalf("command through %s: %q", viaServer.base, out)
	}

	// The prefix is cut once: a second one is refused, clearly.
	req := mustRequest(c, "GET", "/proxy/"+execdPort+"/ping")
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "nested") {
		t.Fatalf("nested prefix: %s %q", resp.Status, body)
	}
}
