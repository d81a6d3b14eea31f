package main

import (
	"testing"

	"github.com/opensandbox/opensandbox/internal/deptest"
)

// TestDeps keeps execd small and self-contained: it runs in every sandbox,
// so it must not pull in server-side code or heavy client libraries.
func TestDeps(t *testing.T) {
	deptest.Checker{Allow: map[string]string{
		"api/...":                           "the wire types execd serves",
		"execd/...":                         "the daemon itself",
		"internal/httpx":                    "JSON bodies and the error envelope",
		"github.com/bmatcuk/doublestar/...": "file search patterns",
		"github.com/coder/websocket/...":    "PTY sessions over WebSocket",
		"github.com/creack/pty/...":         "PTY sessions",
		"golang.org/x/sys/...":              "system calls the standard library lacks",
	}}.Check(t)
}
