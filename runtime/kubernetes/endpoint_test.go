package kubernetes

import (
	"maps"
	"strconv"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestPodEndpoint checks the direct Kubernetes forms: {podIP}:{port}, the
// token with execd's port, and execd's forwarder for the ports of a pod
// with secure access.
func TestPodEndpoint(t *testing.T) {
	token := map[string]string{sandbox.HeaderExecdToken: "tok"}
	e := strconv.Itoa(api.ExecdPort)
	tests := []struct {
		name    string
		ip      string
		secure  bool
		port    int
		address string
		headers map[string]string
	}{
		{"execd", "10.1.2.3", false, api.ExecdPort, "10.1.2.3:" + e, token},
		{"execd, secure access", "10.1.2.3", true, api.ExecdPort, "10.1.2.3:" + e, token},
		{"app port", "10.1.2.3", false, sandbox.PortApp, "10.1.2.3:8080", nil},
		{"other port", "10.1.2.3", false, 3000, "10.1.2.3:3000", nil},
		{"other port, secure access", "10.1.2.3", true, 3000, "10.1.2.3:" + e + "/proxy/3000", token},
		{"IPv6 pod", "fd00::7", false, 3000, "[fd00::7]:3000", nil},
		{"IPv6 pod, execd", "fd00::7", false, api.ExecdPort, "[fd00::7]:" + e, token},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := podEndpoint(tt.ip, "tok", tt.secure, tt.port)
			if ep.Address != tt.address || !maps.Equal(ep.Headers, tt.headers) {
				t.Fatalf("got %q %v, want %q %v", ep.Address, ep.Headers, tt.address, tt.headers)
			}
		})
	}
}
