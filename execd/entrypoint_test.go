package execd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// TestEntrypointStartFailed: an entrypoint that cannot start (missing,
// not executable, not a valid executable, not in PATH) is served as a
// status whose StartFailed is true; one that ran, whatever its end (exit
// 255 included, or a signal), is not.
func TestEntrypointStartFailed(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "plain")
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte("\x00\x01\x02 not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		argv   []string
		failed bool
		why    string
	}{
		{"missing", []string{filepath.Join(dir, "missing")}, true, "no such file"},
		{"not executable", []string{notExec}, true, "permission denied"},
		{"not a valid executable", []string{garbage}, true, "exec format error"},
		{"not in PATH", []string{"no-such-command-here"}, true, "not found"},
		{"exits 255", []string{"sh", "-c", "exit 255"}, false, "exit status 255"},
		{"killed", []string{"sh", "-c", "kill -9 $$"}, false, "signal: killed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, tc := newTestServer(t, nil)
			_, err := s.StartEntrypoint(c.argv)
			if (err != nil) != c.failed {
				t.Fatalf("StartEntrypoint: %v", err)
			}
			var st api.CommandStatus
			waitFor(t, "the entrypoint to end", func() bool {
				tc.call(http.MethodGet, "/command/status/"+api.EntrypointCommandID, nil, http.StatusOK, &st)
				return !st.Running
			})
			if st.StartFailed() != c.failed || !strings.Contains(st.Error, c.why) {
				t.Fatalf("status %+v: StartFailed %v, want %v with %q", st, st.StartFailed(), c.failed, c.why)
			}
		})
	}
}

// TestReady: GET and HEAD /ready answer without the token, 200 while the
// entrypoint started (or there is none, or it has exited since), 503
// ENTRYPOINT_FAILED when it could not start, and say nothing more. It is
// exactly that path: not other methods, not a path written another way,
// not under the /proxy/{execd's port} forwarder.
func TestReady(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-entrypoint")
	ready := func(t *testing.T, c *testClient, method string) (int, []byte) {
		t.Helper()
		req := c.request(method, api.ExecdReadyPath, nil)
		req.Header.Del(api.HeaderExecdToken)
		resp, body := c.do(req)
		return resp.StatusCode, body
	}
	wantReady := func(t *testing.T, c *testClient) {
		t.Helper()
		for _, m := range []string{http.MethodGet, http.MethodHead} {
			if status, body := ready(t, c, m); status != http.StatusOK || len(body) != 0 {
				t.Fatalf("%s /ready without a token: %d %q, want 200 and no body", m, status, body)
			}
		}
	}
	wantFailed := func(t *testing.T, c *testClient, secrets ...string) {
		t.Helper()
		status, body := ready(t, c, http.MethodGet)
		var e api.ErrorResponse
		if status != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Code != api.CodeEntrypointFailed {
			t.Fatalf("GET /ready: %d %q, want 503 %s", status, body, api.CodeEntrypointFailed)
		}
		for _, s := range secrets {
			if strings.Contains(string(body), s) {
				t.Fatalf("GET /ready without a token tells %q: %s", s, body)
			}
		}
		if status, body := ready(t, c, http.MethodHead); status != http.StatusServiceUnavailable || len(body) != 0 {
			t.Fatalf("HEAD /ready: %d %q, want 503 and no body", status, body)
		}
	}

	t.Run("no entrypoint", func(t *testing.T) {
		_, c := newTestServer(t, nil)
		wantReady(t, c)
	})
	t.Run("started, then exited", func(t *testing.T) {
		s, c := newTestServer(t, nil)
		if _, err := s.StartEntrypoint([]string{"sh", "-c", "exit 3"}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the entrypoint to exit", func() bool { return !s.Entrypoint().Running() })
		wantReady(t, c)
	})
	t.Run("could not start", func(t *testing.T) {
		s, c := newTestServer(t, nil)
		if _, err := s.StartEntrypoint([]string{missing, "--flag"}); err == nil {
			t.Fatal("StartEntrypoint of a missing file: no error")
		}
		wantFailed(t, c, missing, "no-such-entrypoint", "no such file", testToken)
		// The details stay behind the token.
		var st api.CommandStatus
		c.call(http.MethodGet, "/command/status/"+api.EntrypointCommandID, nil, http.StatusOK, &st)
		if !st.StartFailed() || !strings.Contains(st.Content, missing) {
			t.Fatalf("status with the token: %+v", st)
		}
	})
	t.Run("a claim's entrypoint could not start", func(t *testing.T) {
		_, c := newTestServer(t, func(cfg *Config) { cfg.Claimable = true })
		wantReady(t, c) // warm: no entrypoint yet
		c.call(http.MethodPost, "/claim", api.ClaimRequest{Token: "claimed-token-0123456789", Entrypoint: []string{missing}}, http.StatusOK, nil)
		c.token = "claimed-token-0123456789"
		wantFailed(t, c, missing, "claimed-token")
	})
	t.Run("only GET and HEAD of exactly /ready are open", func(t *testing.T) {
		s, c := newTestServer(t, func(cfg *Config) { cfg.Port = api.ExecdPort })
		s.StartEntrypoint([]string{missing})
		self := "/proxy/" + strconv.Itoa(api.ExecdPort)
		for _, tc := range []struct{ method, path string }{
			{http.MethodPost, "/ready"}, {http.MethodPut, "/ready"}, {http.MethodDelete, "/ready"}, {http.MethodOptions, "/ready"},
			{http.MethodGet, "//ready"}, {http.MethodGet, "/ready/"}, {http.MethodGet, "/./ready"}, {http.MethodGet, "/%72eady"},
			{http.MethodGet, "/READY"}, {http.MethodGet, "/ready/../ping"}, {http.MethodGet, self + "/ready"},
		} {
			if status, body := rawRequest(t, c.base, tc.method, tc.path); status != http.StatusUnauthorized {
				t.Errorf("%s %s without a token: %d %q, want 401", tc.method, tc.path, status, body)
			}
		}
		// With the token, /ready is not a route of the table: the
		// forwarder's path to execd itself does not serve it.
		req := c.request(http.MethodGet, self+api.ExecdReadyPath, nil)
		if resp, body := c.do(req); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s%s with the token: %d %q, want 404", self, api.ExecdReadyPath, resp.StatusCode, body)
		}
	})
}

// rawRequest sends method and target to the server at base exactly as
// written, without credentials, and returns the answer's status and body.
func rawRequest(t *testing.T, base, method, target string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: execd\r\nConnection: close\r\n\r\n", method, target)
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
