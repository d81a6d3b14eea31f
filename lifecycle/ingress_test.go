package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

// testKeys returns a signing key set of one fresh key.
func testKeys(t *testing.T) *ingress.Keys {
	t.Helper()
	spec, err := ingress.GenerateKey('k')
	if err != nil {
		t.Fatal(err)
	}
	keys, err := ingress.ParseKeys([]string{spec})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// gatewayEnv serves the API over the fake runtime in gateway mode.
func gatewayEnv(t *testing.T, mode string, keys *ingress.Keys) (*testEnv, *fake.Runtime) {
	return newEnv(t, func(c *Config) {
		c.Ingress = IngressConfig{Gateway: true, RouteMode: mode, Address: "gw.example.test:8443", Domain: "sb.example.test"}
		if keys != nil {
			c.Ingress.Keys = func() IngressSigner { return keys }
		}
	})
}

// TestGatewayEndpoints: in gateway mode each route mode answers its form
// of the route with the sandbox's access token, which the gateway's keys
// accept for that sandbox only; the egress port keeps its egress token.
func TestGatewayEndpoints(t *testing.T) {
	keys := testKeys(t)
	for _, tt := range []struct {
		mode     string
		endpoint string // %s: sandbox id
		route    bool   // the route is in OpenSandbox-Ingress-To
	}{
		{RouteHeader, "gw.example.test:8443", true},
		{RouteURI, "gw.example.test:8443/%s/8080", false},
		{RouteWildcard, "%s-8080.sb.example.test", false},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			e, _ := gatewayEnv(t, tt.mode, keys)
			id := e.create("")
			var ep api.Endpoint
			e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080", "").wantStatus(t, 200).decode(t, &ep)
			want := strings.ReplaceAll(tt.endpoint, "%s", id)
			if ep.Endpoint != want {
				t.Errorf("endpoint %q, want %q", ep.Endpoint, want)
			}
			if tok := ep.Headers[api.HeaderSecureAccess]; !keys.CheckAccessToken(id, tok) {
				t.Errorf("access token %q is not the sandbox's", tok)
			}
			if keys.CheckAccessToken("another", ep.Headers[api.HeaderSecureAccess]) {
				t.Error("the access token is valid for another sandbox")
			}
			if got := ep.Headers[api.HeaderIngressTo]; tt.route && got != id+"-8080" || !tt.route && got != "" {
				t.Errorf("%s = %q", api.HeaderIngressTo, got)
			}
			if _, ok := ep.Headers[sandbox.HeaderExecdToken]; ok {
				t.Error("the gateway endpoint hands out the execd token; the gateway adds it")
			}
			// use_server_proxy still answers this server's proxy route.
			e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?use_server_proxy=true", "").wantStatus(t, 200).decode(t, &ep)
			if !strings.HasSuffix(ep.Endpoint, "/sandboxes/"+id+"/proxy/8080") {
				t.Errorf("use_server_proxy in gateway mode: %q", ep.Endpoint)
			}
			e.call("GET", "/v1/sandboxes/nope/endpoints/8080", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
		})
	}

	rt := newRouted("sandbox.invalid:1")
	rt.headers[sandbox.PortEgress] = map[string]string{api.HeaderEgressAuth: "egress-token"}
	e := newEnvWith(t, rt, func(c *Config) {
		c.Ingress = IngressConfig{Gateway: true, RouteMode: RouteHeader, Address: "gw.example.test", Keys: func() IngressSigner { return keys }}
	})
	id := e.create("")
	var ep api.Endpoint
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/18080", "").wantStatus(t, 200).decode(t, &ep)
	if ep.Headers[api.HeaderEgressAuth] != "egress-token" || ep.Headers[api.HeaderIngressTo] != id+"-18080" {
		t.Errorf("egress port through the gateway: %v", ep.Headers)
	}
	// execd's own port keeps execd's token, as a direct endpoint does: a
	// gateway that reads pods only (Kubernetes) cannot add it.
	ep = api.Endpoint{}
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+strconv.Itoa(api.ExecdPort), "").wantStatus(t, 200).decode(t, &ep)
	if tok := ep.Headers[sandbox.HeaderExecdToken]; tok == "" || tok != rt.Token(sandbox.ID(id)) || ep.Headers[api.HeaderIngressTo] != id+"-"+strconv.Itoa(api.ExecdPort) {
		t.Errorf("execd's port through the gateway: %v", ep.Headers)
	}
}

// TestGatewayEndpointWithoutKeys: a gateway without signing keys gets
// routes without a token (it can then serve public sandboxes only), and
// expires stays the 400 it is without a gateway.
func TestGatewayEndpointWithoutKeys(t *testing.T) {
	e, _ := gatewayEnv(t, RouteHeader, nil)
	id := e.create("")
	var ep api.Endpoint
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080", "").wantStatus(t, 200).decode(t, &ep)
	if ep.Endpoint != "gw.example.test:8443" || len(ep.Headers) != 1 || ep.Headers[api.HeaderIngressTo] != id+"-8080" {
		t.Fatalf("endpoint %+v", ep)
	}
	future := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires="+future, "").wantError(t, 400, api.CodeSandboxAPINotSupported)
	// Keys that are configured but empty are no keys.
	empty, _ := gatewayEnv(t, RouteHeader, &ingress.Keys{})
	id = empty.create("")
	empty.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires="+future, "").wantError(t, 400, api.CodeSandboxAPINotSupported)
}

// TestSignedEndpoints: expires gives the signed route of each mode,
// which the keys verify for that sandbox, port and expiry only, and no
// access token; a wildcard route fits a DNS label.
func TestSignedEndpoints(t *testing.T) {
	keys := testKeys(t)
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	expires := strconv.FormatInt(exp.Unix(), 10)
	expB36 := strconv.FormatInt(exp.Unix(), 36)
	for _, mode := range []string{RouteHeader, RouteURI, RouteWildcard} {
		t.Run(mode, func(t *testing.T) {
			e, _ := gatewayEnv(t, mode, keys)
			id := e.create("")
			var ep api.Endpoint
			e.call("GET", "/v1/sandboxes/"+id+"/endpoints/3000?expires="+expires, "").wantStatus(t, 200).decode(t, &ep)
			if _, ok := ep.Headers[api.HeaderSecureAccess]; ok {
				t.Errorf("a signed endpoint carries an access token: %v", ep.Headers)
			}
			var sig string
			switch mode {
			case RouteHeader:
				route := ep.Headers[api.HeaderIngressTo]
				prefix := id + "-3000-" + expB36 + "-"
				if ep.Endpoint != "gw.example.test:8443" || !strings.HasPrefix(route, prefix) {
					t.Fatalf("endpoint %+v", ep)
				}
				sig = strings.TrimPrefix(route, prefix)
			case RouteURI:
				prefix := "gw.example.test:8443/" + id + "/3000/" + expB36 + "/"
				if !strings.HasPrefix(ep.Endpoint, prefix) {
					t.Fatalf("endpoint %q, want %s{sig}", ep.Endpoint, prefix)
				}
				sig = strings.TrimPrefix(ep.Endpoint, prefix)
			case RouteWildcard:
				label, domain, _ := strings.Cut(ep.Endpoint, ".")
				prefix := id + "-3000-" + expB36 + "-"
				if domain != "sb.example.test" || !strings.HasPrefix(label, prefix) || len(label) > 63 {
					t.Fatalf("endpoint %q", ep.Endpoint)
				}
				sig = strings.TrimPrefix(label, prefix)
			}
			if err := keys.Verify(id, 3000, expB36, sig, time.Now()); err != nil {
				t.Errorf("signature %q: %v", sig, err)
			}
			if err := keys.Verify(id, 3001, expB36, sig, time.Now()); err == nil {
				t.Error("the signature verifies for another port")
			}
			if err := keys.Verify(id, 3000, expB36, sig, exp.Add(time.Second)); err == nil {
				t.Error("the signature verifies after its expiry")
			}
		})
	}
}

// TestExpiresValidation: lifecycle.md §5.8: decimal seconds after now,
// not with use_server_proxy.
func TestExpiresValidation(t *testing.T) {
	e, _ := gatewayEnv(t, RouteHeader, testKeys(t))
	id := e.create("")
	now := time.Now().Unix()
	for _, v := range []string{"", "abc", "-5", "+5", "0x10", "1.5", "01" + strconv.FormatInt(now+3600, 10),
		"0", strconv.FormatInt(now-10, 10), "99999999999999999999", "123456789012345678901"} {
		t.Run(v, func(t *testing.T) {
			e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires="+v, "").wantError(t, 400, api.CodeSandboxInvalidParameter)
		})
	}
	e.call("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/8080?expires=%d&use_server_proxy=true", id, now+3600), "").
		wantError(t, 400, api.CodeSandboxInvalidParameter)
	e.call("GET", fmt.Sprintf("/v1/sandboxes/nope/endpoints/8080?expires=%d", now+3600), "").
		wantError(t, 404, api.CodeDockerSandboxNotFound)
}

func TestIngressConfigChecked(t *testing.T) {
	for _, ic := range []IngressConfig{
		{Gateway: true},
		{Gateway: true, RouteMode: "path", Address: "gw"},
		{Gateway: true, RouteMode: RouteHeader},
		{Gateway: true, RouteMode: RouteHeader, Address: "https://gw"},
		{Gateway: true, RouteMode: RouteURI, Address: "gw/prefix"},
		{Gateway: true, RouteMode: RouteURI, Address: "gw:99999"},
		{Gateway: true, RouteMode: RouteWildcard, Address: "gw"},
		{Gateway: true, RouteMode: RouteWildcard, Domain: "*.example.test"},
	} {
		_, err := New(NewManager(fake.New(), ManagerConfig{}), Config{APIKey: testKey, Ingress: ic})
		if err == nil || !strings.Contains(err.Error(), "Ingress.") {
			t.Errorf("%+v: error %v, want one naming the Ingress field", ic, err)
		}
	}
}

// TestIngressTargets: the route gateways ask needs the API key, answers
// the sandbox's state, its direct endpoint while Running, whether it is
// public and its renew-on-access; an unknown sandbox is 404.
func TestIngressTargets(t *testing.T) {
	e, rt := newEnv(t)
	public := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":600,"extensions":{"ingress.public":"true","access.renew.extend.seconds":"900"}}`)
	private := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"extensions":{"ingress.public":"false"}}`)
	e.waitState(public, sandbox.StateRunning)
	e.waitState(private, sandbox.StateRunning)

	e.call("GET", api.IngressTargetsPath+public+"/8080", "", api.HeaderAPIKey, "").wantError(t, 401, api.CodeMissingAPIKey)
	e.call("GET", api.IngressTargetsPath+public+"/8080", "", api.HeaderAPIKey, "wrong").wantError(t, 401, api.CodeInvalidAPIKey)

	var tg api.IngressTarget
	e.call("GET", api.IngressTargetsPath+public+"/8080", "").wantStatus(t, 200).decode(t, &tg)
	if tg.SandboxID != public || tg.Port != 8080 || tg.State != "Running" || !tg.Public || tg.RenewExtendSeconds != 900 || tg.ExpiresAt == nil {
		t.Fatalf("target %+v", tg)
	}
	if tg.Endpoint != "fake.invalid:8080" || tg.Headers[sandbox.HeaderExecdToken] != rt.Token(sandbox.ID(public)) {
		t.Fatalf("target's direct endpoint %q %v", tg.Endpoint, tg.Headers)
	}
	tg = api.IngressTarget{}
	e.call("GET", api.IngressTargetsPath+private+"/3000", "").wantStatus(t, 200).decode(t, &tg)
	if tg.Public || tg.RenewExtendSeconds != 0 || tg.ExpiresAt != nil || tg.Endpoint != "fake.invalid:3000" {
		t.Fatalf("private target %+v", tg)
	}

	// Not Running: the state and reason, no endpoint.
	if err := rt.Pause(context.Background(), sandbox.ID(private)); err != nil {
		t.Fatal(err)
	}
	e.waitState(private, sandbox.StatePaused)
	tg = api.IngressTarget{}
	e.call("GET", api.IngressTargetsPath+private+"/3000", "").wantStatus(t, 200).decode(t, &tg)
	if tg.State != "Paused" || tg.Reason == "" || tg.Endpoint != "" || tg.Headers != nil {
		t.Fatalf("paused target %+v", tg)
	}

	e.call("GET", api.IngressTargetsPath+"nope/8080", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("GET", api.IngressTargetsPath+public+"/0", "").wantError(t, 400, api.CodeDockerInvalidPort)
	e.call("POST", api.IngressTargetsPath+public+"/8080", "").wantError(t, 405, api.CodeSandboxMethodNotAllowed)
}

// TestIngressRenew: the gateway's renew-on-access is the proxy route's:
// it moves the expiry to now + N, holds off for N/10, never shortens.
func TestIngressRenew(t *testing.T) {
	e, rt := newEnv(t)
	clk := &clock{now: time.Now()}
	e.srv.now = clk.Now
	ctx := context.Background()
	id := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":60,"extensions":{"access.renew.extend.seconds":"600"}}`)
	plain := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":60}`)
	renew := func(id string) result {
		t.Helper()
		return e.call("POST", api.IngressRenewPath+id, `{"port":8080}`)
	}
	expiry := func(id string) time.Time {
		t.Helper()
		sb, err := rt.Get(ctx, sandbox.ID(id))
		if err != nil || sb.ExpiresAt == nil {
			t.Fatalf("%v %v", sb, err)
		}
		return *sb.ExpiresAt
	}

	e.call("POST", api.IngressRenewPath+id, "", api.HeaderAPIKey, "").wantError(t, 401, api.CodeMissingAPIKey)
	if at := expiry(id); at.After(clk.Now().Add(61 * time.Second)) {
		t.Fatalf("an unauthenticated renew moved the expiry to %v", at)
	}
	r := renew(id).wantStatus(t, http.StatusNoContent)
	if len(r.body) != 0 {
		t.Errorf("204 with a body: %q", r.body)
	}
	if at := expiry(id); !at.Equal(clk.Now().Add(600 * time.Second).UTC()) {
		t.Fatalf("after renew: %v, want now+600s", at)
	}
	// Throttled for N/10.
	short := clk.Now().Add(100 * time.Second)
	if err := rt.SetExpiry(ctx, sandbox.ID(id), &short); err != nil {
		t.Fatal(err)
	}
	clk.advance(59 * time.Second)
	renew(id).wantStatus(t, http.StatusNoContent)
	if at := expiry(id); !at.Equal(short) {
		t.Fatalf("a throttled renew moved the expiry to %v", at)
	}
	clk.advance(2 * time.Second)
	e.call("POST", api.IngressRenewPath+id, "").wantStatus(t, http.StatusNoContent) // the body is optional
	if at := expiry(id); !at.Equal(clk.Now().Add(600 * time.Second).UTC()) {
		t.Fatalf("after the throttle: %v, want now+600s", at)
	}
	// Never shorter.
	far := clk.Now().Add(5000 * time.Second).UTC()
	if err := rt.SetExpiry(ctx, sandbox.ID(id), &far); err != nil {
		t.Fatal(err)
	}
	clk.advance(61 * time.Second)
	renew(id).wantStatus(t, http.StatusNoContent)
	if at := expiry(id); !at.Equal(far) {
		t.Fatalf("renew shortened the expiry from %v to %v", far, at)
	}
	// Without the extension nothing moves.
	before := expiry(plain)
	renew(plain).wantStatus(t, http.StatusNoContent)
	if at := expiry(plain); !at.Equal(before) {
		t.Fatalf("a sandbox without the extension renewed: %v -> %v", before, at)
	}
	renew("nope").wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("POST", api.IngressRenewPath+id, "{").wantError(t, 400, api.CodeSandboxInvalidParameter)
}

// TestIngressPublicValidated: ingress.public is "true" or "false", and
// cannot be asked together with secureAccess.
func TestIngressPublicValidated(t *testing.T) {
	e, _ := newEnv(t)
	for _, v := range []string{"yes", "TRUE", "1", ""} {
		e.call("POST", "/v1/sandboxes", `{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"extensions":{"ingress.public":"`+v+`"}}`).
			wantError(t, 400, api.CodeSandboxInvalidParameter)
	}
	e.call("POST", "/v1/sandboxes", `{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"secureAccess":true,"extensions":{"ingress.public":"true"}}`).
		wantError(t, 400, api.CodeSandboxInvalidParameter)
	e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"extensions":{"ingress.public":"true"}}`)
}

// noAddressYet is a runtime whose sandboxes have no address yet, as a
// pod before it is scheduled.
type noAddressYet struct{ *fake.Runtime }

func (noAddressYet) Endpoint(ctx context.Context, id sandbox.ID, port int) (sandbox.Endpoint, error) {
	return sandbox.Endpoint{}, fmt.Errorf("sandbox %s has no address yet: %w", id, sandbox.ErrUnavailable)
}

// TestGatewayEndpointWhileStarting: the gateway's route is answered
// before the runtime knows where the sandbox is (SDKs ask right after
// create); the egress port, whose token comes from the runtime, waits.
func TestGatewayEndpointWhileStarting(t *testing.T) {
	keys := testKeys(t)
	rt := noAddressYet{fake.New()}
	rt.StartDelay = time.Hour
	e := newEnvWith(t, rt, func(c *Config) {
		c.Ingress = IngressConfig{Gateway: true, RouteMode: RouteWildcard, Domain: "sb.example.test", Keys: func() IngressSigner { return keys }}
	})
	id := e.create("")
	var ep api.Endpoint
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+strconv.Itoa(api.ExecdPort), "").wantStatus(t, 200).decode(t, &ep)
	if ep.Endpoint != id+"-"+strconv.Itoa(api.ExecdPort)+".sb.example.test" || !keys.CheckAccessToken(id, ep.Headers[api.HeaderSecureAccess]) ||
		ep.Headers[sandbox.HeaderExecdToken] != rt.Token(sandbox.ID(id)) {
		t.Fatalf("endpoint of a starting sandbox %+v", ep)
	}
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/18080", "").wantError(t, 503, api.CodeSandboxUnavailable)
	e.call("GET", "/v1/sandboxes/nope/endpoints/8080", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
}

// TestPoolTemplateExtensions: a pool's template may make the sandboxes it
// hands out public (or renew on access); only a create naming the pool
// gets them, under the create's own; other keys are refused.
func TestPoolTemplateExtensions(t *testing.T) {
	rt := fake.NewPooled()
	t.Cleanup(func() { rt.Close() })
	e := newEnvWith(t, rt)
	pool := func(name, ext string) string {
		return `{"name":"` + name + `","template":{"image":{"uri":"img"},"resourceLimits":{},"extensions":` + ext + `},"capacitySpec":{"bufferMin":1,"bufferMax":1,"poolMin":0,"poolMax":5}}`
	}
	var got api.Pool
	e.call("POST", "/v1/pools", pool("demo", `{"ingress.public":"true","access.renew.extend.seconds":"600"}`)).wantStatus(t, 201).decode(t, &got)
	if got.Template.Extensions["ingress.public"] != "true" {
		t.Fatalf("pool %+v", got.Template)
	}
	for _, ext := range []string{`{"ingress.public":"yes"}`, `{"access.renew.extend.seconds":"5"}`, `{"docker.runtime":"runsc"}`, `{"poolRef":"x"}`} {
		e.call("POST", "/v1/pools", pool("bad", ext)).wantError(t, 400, api.CodeSandboxInvalidParameter)
	}
	target := func(id string) api.IngressTarget {
		t.Helper()
		var tg api.IngressTarget
		e.call("GET", api.IngressTargetsPath+id+"/8080", "").wantStatus(t, 200).decode(t, &tg)
		return tg
	}
	named := e.create(`{"extensions":{"poolRef":"demo"},"timeout":600}`)
	if tg := target(named); !tg.Public || tg.RenewExtendSeconds != 600 {
		t.Errorf("a sandbox of the pool: %+v", tg)
	}
	own := e.create(`{"extensions":{"poolRef":"demo","ingress.public":"false"},"timeout":600}`)
	if tg := target(own); tg.Public || tg.RenewExtendSeconds != 600 {
		t.Errorf("the create's own extension does not win: %+v", tg)
	}
	// A create that does not name the pool, served by it or not, is not
	// made public by it.
	plain := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":600}`)
	if tg := target(plain); tg.Public || tg.RenewExtendSeconds != 0 {
		t.Errorf("a create without poolRef: %+v", tg)
	}
	e.call("POST", "/v1/sandboxes", `{"extensions":{"poolRef":"nope"}}`).wantStatus(t, 404)
}

// TestServerResolverAgainstRoutes: the HTTP resolver remote gateways use
// (ingress.ServerResolver) reads these routes as they answer: targets,
// ErrNotFound for an unknown sandbox, renewals that move the expiry, and
// a wrong API key as an error that is not ErrNotFound.
func TestServerResolverAgainstRoutes(t *testing.T) {
	e, _ := newEnv(t)
	id := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"timeout":60,"extensions":{"access.renew.extend.seconds":"900","ingress.public":"true"}}`)
	e.waitState(id, sandbox.StateRunning)
	res, err := ingress.NewServerResolver(e.url+"/v1", testKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	tg, err := res.Target(ctx, id, 8080)
	if err != nil || tg.State != "Running" || !tg.Public || tg.RenewExtendSeconds != 900 || tg.Endpoint != "fake.invalid:8080" {
		t.Fatalf("Target: %+v, %v", tg, err)
	}
	if _, err := res.Target(ctx, "nope", 8080); !errors.Is(err, ingress.ErrNotFound) {
		t.Fatalf("unknown sandbox: %v, want ErrNotFound", err)
	}
	if err := res.Renew(ctx, id, 8080); err != nil {
		t.Fatal(err)
	}
	sb, _ := e.rt.Get(ctx, sandbox.ID(id))
	if d := time.Until(*sb.ExpiresAt); d < 800*time.Second {
		t.Fatalf("after Renew the sandbox expires in %v, want about 900s", d)
	}
	if err := res.Renew(ctx, "nope", 8080); !errors.Is(err, ingress.ErrNotFound) {
		t.Fatalf("renew of an unknown sandbox: %v", err)
	}
	wrong, _ := ingress.NewServerResolver(e.url, "wrong-key", nil)
	if _, err := wrong.Target(ctx, id, 8080); err == nil || errors.Is(err, ingress.ErrNotFound) {
		t.Fatalf("wrong API key: %v", err)
	}
}
