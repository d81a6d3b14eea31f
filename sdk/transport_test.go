package sdk

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Config
		base    string
		wantErr string
	}{
		{name: "defaults", base: "http://localhost:8080/v1"},
		{name: "all", env: map[string]string{EnvDomain: "sandbox.example:9000", EnvAPIKey: "k", EnvProtocol: "HTTPS", EnvRequestTimeout: "2.5", EnvUseServerProxy: "yes"},
			want: Config{Domain: "sandbox.example:9000", APIKey: "k", Protocol: "https", RequestTimeout: 2500 * time.Millisecond, UseServerProxy: true},
			base: "https://sandbox.example:9000/v1"},
		{name: "url domain", env: map[string]string{EnvDomain: "http://10.1.2.3:8080/prefix/", EnvRequestTimeout: "1m"},
			want: Config{Domain: "http://10.1.2.3:8080/prefix/", RequestTimeout: time.Minute}, base: "http://10.1.2.3:8080/prefix/v1"},
		{name: "already v1", env: map[string]string{EnvDomain: "https://h/v1"}, want: Config{Domain: "https://h/v1"}, base: "https://h/v1"},
		{name: "bad timeout", env: map[string]string{EnvRequestTimeout: "soon"}, wantErr: EnvRequestTimeout},
		{name: "zero timeout", env: map[string]string{EnvRequestTimeout: "0"}, wantErr: "positive"},
		{name: "bad proxy", env: map[string]string{EnvUseServerProxy: "maybe"}, wantErr: EnvUseServerProxy},
		{name: "bad protocol", env: map[string]string{EnvProtocol: "ftp"}, wantErr: "protocol"},
		{name: "bad scheme", env: map[string]string{EnvDomain: "ftp://h"}, wantErr: "domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{EnvDomain, EnvAPIKey, EnvProtocol, EnvRequestTimeout, EnvUseServerProxy} {
				t.Setenv(k, tc.env[k])
			}
			cfg, err := ConfigFromEnv()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg != tc.want {
				t.Errorf("config %+v, want %+v", cfg, tc.want)
			}
			base, err := cfg.baseURL()
			if err != nil || base.String() != tc.base {
				t.Errorf("base URL %v (%v), want %s", base, err, tc.base)
			}
		})
	}
}

func TestErrorFrom(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		body     string
		wantCode string
		wantMsg  string
		kind     error
	}{
		{"envelope", 404, `{"code":"` + api.CodeDockerSandboxNotFound + `","message":"sandbox x: not found"}`, api.CodeDockerSandboxNotFound, "sandbox x: not found", ErrNotFound},
		{"execd 401", 401, `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`, "", "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN", ErrUnauthorized},
		{"fastapi", 422, `{"detail":[{"loc":["query","pageSize"],"msg":"must be <= 200"}]}`, "", "query.pageSize: must be <= 200", ErrInvalid},
		{"plain text", 400, "invalid policy: unsupported action \"block\"\n", "", `invalid policy: unsupported action "block"`, ErrInvalid},
		{"empty", 502, "", "", "", ErrUnavailable},
		{"code only", 416, `{"code":"UNKNOWN"}`, "UNKNOWN", "", ErrInvalid},
		{"conflict", 409, `{"code":"X","message":"busy"}`, "X", "busy", ErrConflict},
		{"not implemented", 501, `{"code":"X","message":"no"}`, "X", "no", ErrNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			h.Set(api.HeaderRequestID, "abc123")
			resp := &http.Response{StatusCode: tc.status, Header: h, Body: io.NopCloser(strings.NewReader(tc.body))}
			e := errorFrom("do thing", resp)
			if e.Code != tc.wantCode || e.Message != tc.wantMsg || e.RequestID != "abc123" || e.StatusCode != tc.status {
				t.Errorf("got %+v", e)
			}
			if !errors.Is(e, tc.kind) {
				t.Errorf("%v does not match %v", e, tc.kind)
			}
			if !strings.Contains(e.Error(), "request_id=abc123") || !strings.HasPrefix(e.Error(), "do thing: ") {
				t.Errorf("Error() = %q", e.Error())
			}
		})
	}
}

// flaky answers each request with the next status of a script; the last
// status repeats.
func flaky(t *testing.T, statuses ...int) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		st := statuses[min(i, len(statuses)-1)]
		w.Header().Set(api.HeaderRequestID, "rid")
		w.WriteHeader(st)
		if st == 200 {
			io.WriteString(w, `{"id":"sb","status":{"state":"Running"},"entrypoint":[],"createdAt":"2026-01-01T00:00:00Z"}`)
		} else {
			io.WriteString(w, `{"code":"E","message":"try later"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRetriesOnlyIdempotentCalls(t *testing.T) {
	ctx := context.Background()

	// A GET is retried through 503s until it succeeds.
	srv, n := flaky(t, 503, 502, 200)
	c, _ := NewClient(Config{Domain: srv.URL})
	if sb, err := c.Get(ctx, "sb"); err != nil || sb.ID != "sb" {
		t.Fatalf("get: %v, %v", sb, err)
	}
	if n.Load() != 3 {
		t.Errorf("%d attempts, want 3", n.Load())
	}

	// Retries stop after Config.Retries, with the last answer's error.
	srv, n = flaky(t, 503)
	c, _ = NewClient(Config{Domain: srv.URL, Retries: 2})
	_, err := c.Get(ctx, "sb")
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 503 || ae.RequestID != "rid" || n.Load() != 3 {
		t.Errorf("after retries: %v (%d attempts)", err, n.Load())
	}

	// A create is never retried.
	srv, n = flaky(t, 503, 200)
	c, _ = NewClient(Config{Domain: srv.URL})
	if _, err := c.Create(ctx, CreateOptions{Image: "x", SkipHealthCheck: true}); !errors.Is(err, ErrUnavailable) || n.Load() != 1 {
		t.Errorf("create: %v after %d attempts", err, n.Load())
	}

	// Negative retries disable them; 4xx are never retried.
	srv, n = flaky(t, 503, 200)
	c, _ = NewClient(Config{Domain: srv.URL, Retries: -1})
	if _, err := c.Get(ctx, "sb"); err == nil || n.Load() != 1 {
		t.Errorf("no retries: %v after %d attempts", err, n.Load())
	}
	srv, n = flaky(t, 404, 200)
	c, _ = NewClient(Config{Domain: srv.URL})
	if _, err := c.Get(ctx, "sb"); !errors.Is(err, ErrNotFound) || n.Load() != 1 {
		t.Errorf("404: %v after %d attempts", err, n.Load())
	}
}

func TestRetriesAfterNetworkErrors(t *testing.T) {
	// A server that drops the first connection without answering.
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		io.WriteString(w, `{"status":"healthy"}`)
	}))
	defer srv.Close()
	c, _ := NewClient(Config{Domain: srv.URL})
	if h, err := c.Health(context.Background()); err != nil || h.Status != "healthy" {
		t.Fatalf("health: %v, %v", h, err)
	}

	// Nothing listening: a NetworkError that matches ErrUnavailable.
	c, _ = NewClient(Config{Domain: "127.0.0.1:1", Retries: -1})
	_, err := c.List(context.Background(), ListOptions{})
	var ne *NetworkError
	if !errors.As(err, &ne) || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "cannot reach http://127.0.0.1:1/v1/sandboxes") {
		t.Errorf("unreachable: %v", err)
	}
}

func TestRequestTimeout(t *testing.T) {
	release := make(chan struct{})
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c, _ := NewClient(Config{Domain: srv.URL, RequestTimeout: 200 * time.Millisecond})
	start := time.Now()
	_, err := c.Get(context.Background(), "sb")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after 200ms") {
		t.Errorf("err = %v", err)
	}
	if attempts.Load() != 1 {
		t.Errorf("a timed-out request was tried %d times", attempts.Load())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
	// The caller's cancellation is reported as such.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c, _ = NewClient(Config{Domain: srv.URL, RequestTimeout: time.Minute})
	if _, err := c.Get(ctx, "sb"); !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timed out after") {
		t.Errorf("caller's deadline: %v", err)
	}
}

func TestAPIKeyNeverSentToSandboxes(t *testing.T) {
	var sandboxSaw http.Header
	execd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sandboxSaw = r.Header.Clone()
	}))
	defer execd.Close()
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.HeaderAPIKey) != "secret" {
			w.WriteHeader(401)
			return
		}
		io.WriteString(w, `{"endpoint":"`+strings.TrimPrefix(execd.URL, "http://")+`","headers":{"X-EXECD-ACCESS-TOKEN":"tok"}}`)
	}))
	defer server.Close()
	c, _ := NewClient(Config{Domain: server.URL, APIKey: "secret"})
	if err := c.Sandbox("sb").Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if sandboxSaw.Get(api.HeaderAPIKey) != "" || sandboxSaw.Get(api.HeaderExecdToken) != "tok" {
		t.Errorf("the sandbox saw headers %v", sandboxSaw)
	}
}

func TestModeDigits(t *testing.T) {
	for _, tc := range []struct {
		mode   uint32
		digits int
	}{{0o644, 644}, {0o755, 755}, {0o4755, 4755}, {0o1777, 1777}, {0, 0}, {0o7, 7}} {
		m, err := ParseModeDigits(tc.digits)
		if err != nil {
			t.Fatal(err)
		}
		if got := ModeDigits(m); got != tc.digits {
			t.Errorf("ModeDigits(ParseModeDigits(%d)) = %d", tc.digits, got)
		}
	}
	for _, bad := range []int{8, 19, 800, 77777, -1} {
		if _, err := ParseModeDigits(bad); err == nil {
			t.Errorf("ParseModeDigits(%d) accepted", bad)
		}
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"echo":           "echo",
		"a b":            "'a b'",
		"":               "''",
		"it's":           `'it'"'"'s'`,
		"$HOME":          "'$HOME'",
		"/usr/bin/x-1.2": "/usr/bin/x-1.2",
		"a=b,c:d@e%f+g":  "a=b,c:d@e%f+g",
	} {
		if got := ShellQuote(in); got != want {
			t.Errorf("ShellQuote(%q) = %s, want %s", in, got, want)
		}
	}
	if got := ShellQuote("sh", "-c", "echo $HOME"); got != "sh -c 'echo $HOME'" {
		t.Errorf("several words: %s", got)
	}
}

func TestExecutionSignal(t *testing.T) {
	for tb, want := range map[string]string{
		"signal: killed": "killed",
		"the session's shell exited (signal: segmentation fault (core dumped)); start a new session": "segmentation fault",
		"exit status 3": "",
	} {
		e := &Execution{ExitCode: -1, Error: &api.ExecutionError{Traceback: []string{tb}}}
		if got := e.Signal(); got != want {
			t.Errorf("Signal() of %q = %q, want %q", tb, got, want)
		}
	}
}
