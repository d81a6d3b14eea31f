package sdk

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps the SDK light enough to become its own module. Its
// tests are not held to it: they run the real server in-process.
func TestDeps(t *testing.T) {
	deptest.Checker{Allow: map[string]string{
		"api/...":                        "the wire types and codecs",
		"github.com/coder/websocket/...": "the WebSocket client terminals need",
	}}.Check(t)
}
