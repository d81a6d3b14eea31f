package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// credentials is one way of (mis)authenticating a request: headers to
// set and query parameters to add.
type credentials struct {
	name   string
	header map[string]string
	query  url.Values
}

// attackClient sends requests that carry exactly the credentials given,
// and gives each at most 20 s; a streaming answer is cut after its
// headers.
var attackClient = &http.Client{
	Timeout:       20 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// tryRequest sends method base+path with body (JSON, or nothing when
// empty), the credentials and the extra headers, and returns the status
// and up to 4 KiB of the answer.
func tryRequest(t *testing.T, method, base, path, body string, cred credentials, extra map[string]string) (int, string) {
	t.Helper()
	u, err := url.Parse(base + path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cred.query) > 0 {
		q := u.Query()
		for k, vs := range cred.query {
			for _, v := range vs {
				q.Add(k, v)
			}
		}
		u.RawQuery = q.Encode()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range cred.header {
		req.Header[k] = []string{v} // as written: no canonical form forced on odd names
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := attackClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s (%s): %v", method, path, cred.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return resp.StatusCode, "" // a connection or a stream that stays open: its start is enough
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(data)
}

// wsUpgrade are the headers of a WebSocket handshake.
var wsUpgrade = map[string]string{
	"Connection":            "Upgrade",
	"Upgrade":               "websocket",
	"Sec-WebSocket-Version": "13",
	"Sec-WebSocket-Key":     "dGhlIHNhbXBsZSBub25jZQ==",
}

// rawRequest sends a request whose target is written exactly as given
// (a client library would clean "//" or "/./") and returns the status
// and the answer's start.
func rawRequest(t *testing.T, addr, method, target string, header map[string]string) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n")
	for k, v := range header {
		b.WriteString(k + ": " + v + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(data)
}
