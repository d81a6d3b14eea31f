package execd

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

const testToken = "test-token"

// newTestServer starts an execd server on loopback for one test and returns
// a client for it. mod, when not nil, adjusts the config first.
func newTestServer(t testing.TB, mod func(*Config)) (*Server, *testClient) {
	t.Helper()
	cfg := Config{
		AccessToken: testToken,
		TempDir:     t.TempDir(),
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.Close()
		s.Shutdown(time.Second)
	})
	return s, &testClient{t: t, base: hs.URL, token: cfg.AccessToken, hc: hs.Client()}
}

// testClient calls the API under test and fails the test on transport
// errors.
type testClient struct {
	t     testing.TB
	base  string
	token string
	hc    *http.Client
}

// request builds a request with the access token. body may be nil, a
// string or []byte (sent as is), an io.Reader, or a value sent as JSON.
func (c *testClient) request(method, path string, body any) *http.Request {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set(api.HeaderExecdToken, c.token)
	}
	if body != nil {
		if _, isReader := body.(io.Reader); !isReader {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	return req
}

// do sends a request and returns the response with its body read.
func (c *testClient) do(req *http.Request) (*http.Response, []byte) {
	c.t.Helper()
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("%s %s: read body: %v", req.Method, req.URL.Path, err)
	}
	return resp, data
}

// call sends a request, checks the status and decodes a JSON answer into
// out when out is not nil. It returns the raw body.
func (c *testClient) call(method, path string, body any, wantStatus int, out any) []byte {
	c.t.Helper()
	resp, data := c.do(c.request(method, path, body))
	if resp.StatusCode != wantStatus {
		c.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, resp.StatusCode, wantStatus, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			c.t.Fatalf("%s %s: decode %s: %v", method, path, data, err)
		}
	}
	return data
}

// wantError checks an error answer's status and code.
func (c *testClient) wantError(method, path string, body any, wantStatus int, wantCode string) api.ErrorResponse {
	c.t.Helper()
	var e api.ErrorResponse
	c.call(method, path, body, wantStatus, &e)
	if e.Code != wantCode {
		c.t.Fatalf("%s %s: code %q, want %q (message %q)", method, path, e.Code, wantCode, e.Message)
	}
	return e
}

// stream sends a request to a streaming route and decodes every event
// until the end of the response.
func (c *testClient) stream(path string, body any) []api.Event {
	c.t.Helper()
	resp, err := c.hc.Do(c.request(http.MethodPost, path, body))
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("POST %s: status %d; body %s", path, resp.StatusCode, data)
	}
	var events []api.Event
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			return events
		}
		if err != nil {
			c.t.Fatalf("POST %s: after %d events: %v", path, len(events), err)
		}
		events = append(events, ev)
	}
}
