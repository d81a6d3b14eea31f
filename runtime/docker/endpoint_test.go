package docker

import (
	"maps"
	"strconv"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestBridgeEndpoint checks the endpoint strings against the protocol's
// Docker bridge rows: 8080 published and reached directly, every other
// port (execd's own included) {host}:{execd's host port}/proxy/{port}
// with the token.
func TestBridgeEndpoint(t *testing.T) {
	ports := map[int]string{api.ExecdPort: "0.0.0.0:32768", sandbox.PortApp: "0.0.0.0:32769"}
	token := map[string]string{sandbox.HeaderExecdToken: "tok"}
	e := strconv.Itoa(api.ExecdPort)
	tests := []struct {
		name    string
		host    string
		ports   map[int]string
		secure  bool
		port    int
		address string
		headers map[string]string
	}{
		{"execd", "127.0.0.1", ports, false, api.ExecdPort, "127.0.0.1:32768/proxy/" + e, token},
		{"execd, secure access", "127.0.0.1", ports, true, api.ExecdPort, "127.0.0.1:32768/proxy/" + e, token},
		{"app port", "127.0.0.1", ports, false, sandbox.PortApp, "127.0.0.1:32769", nil},
		{"app port, secure access", "127.0.0.1", ports, true, sandbox.PortApp, "127.0.0.1:32768/proxy/8080", token},
		{"app port not published", "127.0.0.1", map[int]string{api.ExecdPort: "0.0.0.0:32768"}, false, sandbox.PortApp, "127.0.0.1:32768/proxy/8080", token},
		{"other port", "sandbox.example.test", ports, false, 3000, "sandbox.example.test:32768/proxy/3000", token},
		{"egress port without a sidecar", "127.0.0.1", ports, false, sandbox.PortEgress, "127.0.0.1:32768/proxy/18080", token},
		{"IPv6 public host", "::1", ports, false, api.ExecdPort, "[::1]:32768/proxy/" + e, token},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := bridgeEndpoint(tt.host, tt.ports, "tok", tt.secure, tt.port)
			if ep.Address != tt.address || !maps.Equal(ep.Headers, tt.headers) {
				t.Fatalf("got %q %v, want %q %v", ep.Address, ep.Headers, tt.address, tt.headers)
			}
		})
	}
}

// TestEgressEndpoint: the egress API is published from the egress
// container under /proxy/18080, with the egress token and not execd's;
// without a token or a published port there is none.
func TestEgressEndpoint(t *testing.T) {
	r := &Runtime{cfg: Config{PublicHost: "127.0.0.1"}}
	ports := map[int]string{api.ExecdPort: "0.0.0.0:32768", sandbox.PortEgress: "0.0.0.0:32770"}
	ep, ok := r.egressEndpoint(ports, "etok")
	if !ok || ep.Address != "127.0.0.1:32770/proxy/18080" || !maps.Equal(ep.Headers, map[string]string{api.HeaderEgressAuth: "etok"}) {
		t.Fatalf("egress endpoint %+v, %v", ep, ok)
	}
	if _, ok := r.egressEndpoint(ports, ""); ok {
		t.Fatal("an egress endpoint without a token")
	}
	if _, ok := r.egressEndpoint(map[int]string{api.ExecdPort: "0.0.0.0:32768"}, "etok"); ok {
		t.Fatal("an egress endpoint without a published port")
	}
}
