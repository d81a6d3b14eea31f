package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

const gatewayTestImage = "opensandbox/python:3.11"

// TestInProcessGateway runs the server binary's wiring on Docker with
// [ingress] listen: a web server in a sandbox is reached through the
// gateway this server serves, with the endpoint API's token, with a
// signed link and by nothing else; traffic renews the sandbox.
func TestInProcessGateway(t *testing.T) {
	testenv.MustHaveDocker(t)
	testenv.MustHaveImage(t, gatewayTestImage)
	execd, err := testserver.BuildExecd()
	if err != nil {
		t.Fatal(err)
	}
	signing, err := ingress.GenerateKey('g')
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := ingress.ParseKeys([]string{signing})
	const apiKey = "gateway-test-key-0123456789"
	scope := "gw-test-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { testserver.RemoveScope(scope) })
	cfgText := fmt.Sprintf(`version = 1
[server]
api_key = %q
min_sandbox_timeout = "1s"
[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
execd_path = %q
label_scope = %q
[ingress]
mode = "gateway"
route_mode = "uri"
listen = "127.0.0.1:0"
signing_keys = [%q]
`, apiKey, t.TempDir(), execd, scope, signing)
	path := filepath.Join(t.TempDir(), "sandbox.toml")
	os.WriteFile(path, []byte(cfgText), 0o600)

	var logs lockedBuffer
	ready, gwReady := make(chan net.Addr, 1), make(chan net.Addr, 1)
	m := &Main{ConfigPath: path, Listen: "127.0.0.1:0", Ready: ready, GatewayReady: gwReady,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	var apiAddr, gwAddr net.Addr
	for apiAddr == nil {
		select {
		case gwAddr = <-gwReady:
		case apiAddr = <-ready:
		case err := <-done:
			t.Fatalf("the server stopped: %v", err)
		case <-time.After(2 * time.Minute):
			t.Fatal("the server did not start")
		}
	}
	if gwAddr == nil {
		t.Fatal("no gateway listener")
	}
	base := "http://" + apiAddr.String()
	gw := "http://" + gwAddr.String()

	call := func(method, url, body string, headers map[string]string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	auth := map[string]string{api.HeaderAPIKey: apiKey}

	code, body := call("POST", base+"/v1/sandboxes", `{"image":{"uri":"`+gatewayTestImage+`"},"timeout":120,"resourceLimits":{},
		"entrypoint":["sh","-c","mkdir -p /tmp/www && echo hello-through-the-gateway > /tmp/www/index.html && exec python3 -m http.server 8080 --directory /tmp/www"],
		"extensions":{"access.renew.extend.seconds":"600"}}`, auth)
	if code != http.StatusAccepted {
		t.Fatalf("create: %d %s", code, body)
	}
	var created api.CreateSandboxResponse
	json.Unmarshal(body, &created)
	id := created.ID
	var sb api.Sandbox
	describe := func() string {
		return fmt.Sprintf("%+v\n%s", sb, testwait.Containers("label=opensandbox.scope="+scope))
	}
	testwait.Until(t, "the sandbox to run", func() bool {
		_, body := call("GET", base+"/v1/sandboxes/"+id, "", auth)
		json.Unmarshal(body, &sb)
		return sb.Status.State == "Running"
	}, describe)
	before := *sb.ExpiresAt

	// The endpoint API answers the gateway's uri route with the token.
	var ep api.Endpoint
	code, body = call("GET", base+"/v1/sandboxes/"+id+"/endpoints/8080", "", auth)
	if json.Unmarshal(body, &ep); code != 200 || ep.Endpoint != gwAddr.String()+"/"+id+"/8080" || ep.Headers[api.HeaderSecureAccess] == "" {
		t.Fatalf("endpoint: %d %s", code, body)
	}
	// The web server needs a moment after execd answers.
	var last string
	testwait.Until(t, "the page through the gateway", func() bool {
		code, body := call("GET", "http://"+ep.Endpoint+"/", "", ep.Headers)
		last = fmt.Sprintf("%d %s", code, body)
		return code == 200 && strings.Contains(string(body), "hello-through-the-gateway")
	}, func() string { return last })
	// The same sandbox by the header route.
	code, body = call("GET", gw+"/index.html", "", map[string]string{api.HeaderIngressTo: id + "-8080", api.HeaderSecureAccess: ep.Headers[api.HeaderSecureAccess]})
	if code != 200 || !strings.Contains(string(body), "hello-through-the-gateway") {
		t.Fatalf("header route: %d %s", code, body)
	}

	// Traffic renewed it: the expiry is now about now + 600 s.
	testwait.Until(t, "renew-on-access", func() bool {
		_, body := call("GET", base+"/v1/sandboxes/"+id, "", auth)
		json.Unmarshal(body, &sb)
		return sb.ExpiresAt != nil && sb.ExpiresAt.Sub(before) > 300*time.Second
	}, describe)

	// A signed link is openable with no header at all.
	exp := time.Now().Add(time.Hour).Unix()
	code, body = call("GET", fmt.Sprintf("%s/v1/sandboxes/%s/endpoints/8080?expires=%d", base, id, exp), "", auth)
	var signed api.Endpoint
	if json.Unmarshal(body, &signed); code != 200 || len(signed.Headers) != 0 || !strings.HasPrefix(signed.Endpoint, gwAddr.String()+"/"+id+"/8080/") {
		t.Fatalf("signed endpoint: %d %s", code, body)
	}
	code, body = call("GET", "http://"+signed.Endpoint+"/", "", nil)
	if code != 200 || !strings.Contains(string(body), "hello-through-the-gateway") {
		t.Fatalf("signed link: %d %s", code, body)
	}

	// Nothing else gets through, and nothing is told without auth.
	otherTok, _ := keys.AccessToken("another-sandbox")
	nopeTok, _ := keys.AccessToken("nope")
	tampered := signed.Endpoint[:len(signed.Endpoint)-2] + "x" + signed.Endpoint[len(signed.Endpoint)-1:]
	for _, tc := range []struct {
		name    string
		url     string
		headers map[string]string
		status  int
		code    string
	}{
		{"no token", "http://" + ep.Endpoint + "/", nil, 401, api.CodeIngressUnauthorized},
		{"the API key is no token", "http://" + ep.Endpoint + "/", auth, 401, api.CodeIngressUnauthorized},
		{"another sandbox's token", "http://" + ep.Endpoint + "/", map[string]string{api.HeaderSecureAccess: otherTok}, 401, api.CodeIngressUnauthorized},
		{"tampered link", "http://" + tampered + "/", nil, 401, api.CodeIngressUnauthorized},
		{"unknown sandbox, no token", gw + "/nope/8080/", nil, 401, api.CodeIngressUnauthorized},
		{"unknown sandbox with its token", gw + "/nope/8080/", map[string]string{api.HeaderSecureAccess: nopeTok}, 404, api.CodeIngressSandboxNotFound},
	} {
		code, body := call("GET", tc.url, "", tc.headers)
		var e api.ErrorResponse
		json.Unmarshal(body, &e)
		if code != tc.status || e.Code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, code, body, tc.status, tc.code)
		}
		if bytes.Contains(body, []byte("hello-through-the-gateway")) {
			t.Errorf("%s: the page got through", tc.name)
		}
	}
	if code, body := call("GET", gw+"/healthz", "", nil); code != 200 {
		t.Errorf("healthz: %d %s", code, body)
	}
	if code, body := call("GET", gw+"/readyz", "", nil); code != 200 {
		t.Errorf("readyz: %d %s", code, body)
	}
	// The gateway's series are on the server's /metrics.
	if _, body := call("GET", base+"/metrics", "", auth); !bytes.Contains(body, []byte("ingress")) {
		t.Errorf("no ingress series on /metrics")
	}
}

// TestInProcessGatewayTLS: with tls_cert and tls_key the gateway's
// listener speaks HTTPS, HTTP/2 included, with that certificate.
func TestInProcessGatewayTLS(t *testing.T) {
	testenv.MustHaveDocker(t)
	execd, err := testserver.BuildExecd()
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := writeTestCert(t)
	signing, _ := ingress.GenerateKey('t')
	scope := "gw-tls-test-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { testserver.RemoveScope(scope) })
	path := filepath.Join(t.TempDir(), "sandbox.toml")
	os.WriteFile(path, []byte(fmt.Sprintf(`version = 1
[server]
api_key = "gateway-test-key-0123456789"
[runtime.docker]
data_dir = %q
execd_path = %q
label_scope = %q
[ingress]
mode = "gateway"
route_mode = "header"
listen = "127.0.0.1:0"
signing_keys = [%q]
tls_cert = %q
tls_key = %q
`, t.TempDir(), execd, scope, signing, certFile, keyFile)), 0o600)
	ready, gwReady := make(chan net.Addr, 1), make(chan net.Addr, 1)
	m := &Main{ConfigPath: path, Listen: "127.0.0.1:0", Ready: ready, GatewayReady: gwReady, Logger: slog.New(slog.DiscardHandler)}
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	var gwAddr net.Addr
	select {
	case gwAddr = <-gwReady:
	case err := <-done:
		t.Fatalf("the server stopped: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the server did not start")
	}
	pemBytes, _ := os.ReadFile(certFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemBytes)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := client.Get("https://" + gwAddr.String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("https healthz: %d over %s", resp.StatusCode, resp.Proto)
	}
	// No route and no token: the envelope's 401, over TLS too.
	req, _ := http.NewRequest("GET", "https://"+gwAddr.String()+"/", nil)
	req.Header.Set(api.HeaderIngressTo, "some-sandbox-8080")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !bytes.Contains(body, []byte(api.CodeIngressUnauthorized)) {
		t.Fatalf("no token over TLS: %d %s", resp.StatusCode, body)
	}
}
