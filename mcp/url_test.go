package mcp

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/sdk"
)

const pythonImage = "opensandbox/python:3.11"

// TestSandboxURL: on a server with an ingress gateway, sandbox_url gives
// a link that opens a web page served in the sandbox, with no header,
// valid for expires_seconds; on a server without one the tool says to
// use sandbox_endpoint.
func TestSandboxURL(t *testing.T) {
	testenv.MustHaveImage(t, pythonImage)
	for _, mode := range []string{lifecycle.RouteURI, lifecycle.RouteHeader} {
		t.Run(mode, func(t *testing.T) {
			ts := testserver.Start(t, testserver.Options{Gateway: mode})
			c, err := sdk.NewClient(sdk.Config{Domain: ts.Addr, APIKey: ts.APIKey})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			s, err := New(Config{Client: c, DefaultImage: pythonImage, DefaultTimeout: 10 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			cs := connect(t, s)
			var sb SandboxInfo
			ok(t, cs, "sandbox_create", map[string]any{"entrypoint": []string{"sh", "-c",
				"mkdir -p /tmp/www && echo hello-from-the-mcp-test > /tmp/www/index.html && exec python3 -m http.server 8080 --directory /tmp/www"}}, &sb)

			var out URLOutput
			text := ok(t, cs, "sandbox_url", map[string]any{"sandbox_id": sb.SandboxID, "port": 8080}, &out)
			if d := time.Until(out.ExpiresAt); d < 59*time.Minute || d > 61*time.Minute {
				t.Errorf("expires in %v, want the default hour", d)
			}
			if !strings.Contains(text, out.URL) || !strings.Contains(text, "valid until") {
				t.Errorf("text %q", text)
			}
			get := func() (int, string) {
				req, _ := http.NewRequestWithContext(t.Context(), "GET", out.URL, nil)
				for k, v := range out.Headers {
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
			switch mode {
			case lifecycle.RouteURI:
				if !out.Browser || len(out.Headers) != 0 || !strings.HasPrefix(out.URL, ts.GatewayURL+"/"+sb.SandboxID+"/8080/") {
					t.Fatalf("uri link %+v", out)
				}
			case lifecycle.RouteHeader:
				if out.Browser || out.Headers["OpenSandbox-Ingress-To"] == "" || !strings.Contains(text, "a browser cannot open") {
					t.Fatalf("header link %+v: %s", out, text)
				}
			}
			var last string
			testwait.Until(t, "the page through the link", func() bool {
				code, body := get()
				last = fmt.Sprint(code, " ", body)
				return code == 200 && strings.Contains(body, "hello-from-the-mcp-test")
			}, func() string { return last })

			ok(t, cs, "sandbox_url", map[string]any{"sandbox_id": sb.SandboxID, "port": 8080, "expires_seconds": 120}, &out)
			if d := time.Until(out.ExpiresAt); d < 110*time.Second || d > 121*time.Second {
				t.Errorf("expires_seconds 120: expires in %v", d)
			}
		})
	}
}

// TestSandboxURLWithoutGateway: a server without a gateway refuses
// signed links; the tool's error points to sandbox_endpoint.
func TestSandboxURLWithoutGateway(t *testing.T) {
	testenv.MustHaveImage(t, pythonImage)
	ts := testserver.Start(t, testserver.Options{})
	c, err := sdk.NewClient(sdk.Config{Domain: ts.Addr, APIKey: ts.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := New(Config{Client: c, DefaultImage: pythonImage, DefaultTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, s)
	var sb SandboxInfo
	ok(t, cs, "sandbox_create", map[string]any{}, &sb)
	res, text := call(t, cs, "sandbox_url", map[string]any{"sandbox_id": sb.SandboxID, "port": 8080})
	if !res.IsError || !strings.Contains(text, "sandbox_endpoint") || !strings.Contains(text, "gateway") {
		t.Fatalf("sandbox_url without a gateway: %v %s", res.IsError, text)
	}
}
