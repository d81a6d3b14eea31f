package sdk_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/sdk"
)

// webEntrypoint serves a page on port 8080 of a python sandbox.
var webEntrypoint = []string{"sh", "-c", "mkdir -p /tmp/www && echo hello-from-the-sdk-test > /tmp/www/index.html && exec python3 -m http.server 8080 --directory /tmp/www"}

// TestSignedEndpoint: on a server with an ingress gateway, WithExpiry
// gives an endpoint whose URL opens the sandbox's web page with no
// header, until it expires; the plain endpoint needs its headers.
func TestSignedEndpoint(t *testing.T) {
	testenv.MustHaveImage(t, pythonImage)
	srv := testserver.Start(t, testserver.Options{Gateway: lifecycle.RouteURI})
	c, err := sdk.NewClient(sdk.Config{Domain: srv.Addr, APIKey: srv.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sb, err := c.Create(t.Context(), sdk.CreateOptions{Image: pythonImage, Entrypoint: webEntrypoint,
		ReadyTimeout: max(sdk.DefaultReadyTimeout, testwait.TimeoutN(2))})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(t.Context())

	get := func(url string, h map[string]string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	plain, err := sb.Endpoint(t.Context(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	gwHost := strings.TrimPrefix(srv.GatewayURL, "http://")
	if plain.Endpoint != gwHost+"/"+sb.ID+"/8080" || plain.Headers[api.HeaderSecureAccess] == "" {
		t.Fatalf("plain endpoint %+v", plain)
	}
	var last string
	testwait.Until(t, "the page through the gateway", func() bool {
		code, body := get(plain.URL(c.Protocol()), plain.Headers)
		last = fmt.Sprint(code, " ", body)
		return code == 200 && strings.Contains(body, "hello-from-the-sdk-test")
	}, func() string { return last })
	if code, _ := get(plain.URL(c.Protocol()), nil); code != http.StatusUnauthorized {
		t.Errorf("the plain endpoint without its headers: %d, want 401", code)
	}

	signed, err := sb.Endpoint(t.Context(), 8080, sdk.WithExpiry(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	u := signed.URL(c.Protocol())
	if len(signed.Headers) != 0 || !strings.HasPrefix(u, srv.GatewayURL+"/"+sb.ID+"/8080/") || !strings.HasSuffix(u, "/") {
		t.Fatalf("signed endpoint %+v, URL %s", signed, u)
	}
	if code, body := get(u, nil); code != 200 || !strings.Contains(body, "hello-from-the-sdk-test") {
		t.Fatalf("signed URL %s: %d %s", u, code, body)
	}
	// Past its expiry the link is refused.
	soon, err := sb.Endpoint(t.Context(), 8080, sdk.WithExpiresAt(time.Now().Add(2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(time.Now().Add(3 * time.Second).Truncate(time.Second)))
	if code, body := get(soon.URL(c.Protocol()), nil); code != http.StatusUnauthorized {
		t.Errorf("an expired link: %d %s", code, body)
	}
	// An expiry in the past is the server's 400.
	_, err = sb.Endpoint(t.Context(), 8080, sdk.WithExpiresAt(time.Now().Add(-time.Minute)))
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Code != api.CodeSandboxInvalidParameter {
		t.Errorf("expiry in the past: %v", err)
	}
}

// TestSignedEndpointUnsupported: a server without a gateway answers
// WithExpiry with its API_NOT_SUPPORTED error, which the SDK hands back
// typed; UseServerProxy does not get in the way of asking.
func TestSignedEndpointUnsupported(t *testing.T) {
	c := newClient(t, func(cfg *sdk.Config) { cfg.UseServerProxy = true })
	sb := newSandbox(t, c, sdk.CreateOptions{})
	_, err := sb.Endpoint(t.Context(), 8080, sdk.WithExpiry(time.Hour))
	var ae *sdk.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Code != api.CodeSandboxAPINotSupported {
		t.Fatalf("signed endpoint without a gateway: %v", err)
	}
}

func TestEndpointURL(t *testing.T) {
	for _, tt := range []struct{ endpoint, scheme, want string }{
		{"127.0.0.1:8081", "http", "http://127.0.0.1:8081/"},
		{"gw.example.test/id/8080/exp/sig", "https", "https://gw.example.test/id/8080/exp/sig/"},
		{"id-8080.sb.example.test", "http", "http://id-8080.sb.example.test/"},
		{"https://already.example.test/x/", "http", "https://already.example.test/x/"},
	} {
		if got := (api.Endpoint{Endpoint: tt.endpoint}).URL(tt.scheme); got != tt.want {
			t.Errorf("URL(%q) of %q = %q, want %q", tt.scheme, tt.endpoint, got, tt.want)
		}
	}
}
