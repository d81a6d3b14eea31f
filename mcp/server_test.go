package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/lifecycle"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// connect serves s to an in-memory client for the test.
func connect(t *testing.T, s *Server) *gomcp.ClientSession {
	t.Helper()
	ct, st := gomcp.NewInMemoryTransports()
	ctx := t.Context()
	ss, err := s.srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := gomcp.NewClient(&gomcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// newTestServer returns a server whose client talks to base.
func newTestServer(t *testing.T, base string, cfg Config) *Server {
	t.Helper()
	c, err := sdk.NewClient(sdk.Config{Domain: base, APIKey: "k", Retries: -1, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg.Client = c
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call calls a tool and returns its result and all its text.
func call(t *testing.T, cs *gomcp.ClientSession, tool string, args map[string]any) (*gomcp.CallToolResult, string) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &gomcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): protocol error: %v", tool, args, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*gomcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return res, b.String()
}

// wantToolError checks that a call failed as a tool error whose text
// says each of wants.
func wantToolError(t *testing.T, cs *gomcp.ClientSession, tool string, args map[string]any, wants ...string) string {
	t.Helper()
	res, text := call(t, cs, tool, args)
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded: %s", tool, args, text)
	}
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s(%v) error %q does not say %q", tool, args, text, w)
		}
	}
	return text
}

// allTools is every tool the server offers.
var allTools = []string{
	"sandbox_create", "sandbox_list", "sandbox_get", "sandbox_kill", "sandbox_renew", "sandbox_pause", "sandbox_resume", "sandbox_endpoint", "sandbox_url",
	"pool_list", "pool_get",
	"command_run", "command_start", "command_logs", "command_stop",
	"file_read", "file_write", "file_list", "file_search", "file_move", "file_delete",
	"code_run", "code_context_create", "code_context_list", "code_context_delete",
	"egress_get", "egress_allow", "egress_deny", "egress_remove",
	"vault_get", "vault_attach", "vault_detach",
}

func TestListTools(t *testing.T) {
	cs := connect(t, newTestServer(t, "127.0.0.1:1", Config{}))
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*gomcp.Tool{}
	for _, tool := range res.Tools {
		got[tool.Name] = tool
	}
	if len(got) != len(allTools) {
		t.Errorf("%d tools, want %d", len(got), len(allTools))
	}
	for _, name := range allTools {
		tool := got[name]
		if tool == nil {
			t.Errorf("no tool %s", name)
			continue
		}
		if len(tool.Description) < 40 || tool.Annotations == nil || tool.Annotations.Title == "" {
			t.Errorf("%s: thin description or no annotations: %q", name, tool.Description)
		}
		var in struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		}
		b, _ := json.Marshal(tool.InputSchema)
		if err := json.Unmarshal(b, &in); err != nil || in.Type != "object" {
			t.Errorf("%s: input schema %s", name, b)
		}
		for prop, raw := range in.Properties {
			if !strings.Contains(string(raw), `"description"`) {
				t.Errorf("%s: property %s has no description: %s", name, prop, raw)
			}
		}
		if tool.OutputSchema == nil {
			t.Errorf("%s: no output schema", name)
		}
	}
	if !strings.Contains(string(mustJSON(got["sandbox_get"].InputSchema)), `"minLength":1`) {
		t.Errorf("sandbox_id may be empty: %s", mustJSON(got["sandbox_get"].InputSchema))
	}
	if !strings.Contains(string(mustJSON(got["code_run"].InputSchema)), `"enum":["python","javascript","bash"]`) {
		t.Errorf("code_run language has no enum: %s", mustJSON(got["code_run"].InputSchema))
	}

	tmpls, err := cs.ListResourceTemplates(t.Context(), nil)
	if err != nil || len(tmpls.ResourceTemplates) != 1 || tmpls.ResourceTemplates[0].URITemplate != FileURITemplate {
		t.Errorf("resource templates: %+v, %v", tmpls, err)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestInvalidArguments checks that bad arguments are tool errors that
// say what is wrong, before anything reaches a server (there is none).
func TestInvalidArguments(t *testing.T) {
	cs := connect(t, newTestServer(t, "127.0.0.1:1", Config{}))
	cases := []struct {
		tool string
		args map[string]any
		want []string
	}{
		{"sandbox_get", map[string]any{}, []string{`missing required arguments: ["sandbox_id"]`}},
		{"sandbox_get", map[string]any{"sandbox_id": ""}, []string{"sandbox_id: must not be empty"}},
		{"sandbox_get", map[string]any{"sandbox_id": "  "}, []string{"sandbox_id is empty", "sandbox_list"}},
		{"sandbox_get", map[string]any{"sandbox_id": 42}, []string{"sandbox_id"}},
		{"sandbox_get", map[string]any{"sandbox_id": "x", "bogus": 1}, []string{`unknown arguments ["bogus"]`}},
		{"sandbox_create", map[string]any{}, []string{"image is required", "python:3.11", "pool_list"}},
		{"sandbox_create", map[string]any{"pool": "a/b"}, []string{`pool "a/b" is not a pool name`, "pool_list"}},
		{"pool_get", map[string]any{}, []string{`missing required arguments: ["pool"]`}},
		{"pool_get", map[string]any{"pool": " "}, []string{"is not a pool name", "pool_list"}},
		{"pool_list", map[string]any{"bogus": 1}, []string{`unknown arguments ["bogus"]`}},
		{"sandbox_create", map[string]any{"image": "x", "timeout_seconds": -5}, []string{"timeout_seconds: minimum: -5 is less than 1"}},
		{"sandbox_create", map[string]any{"image": "x", "env": map[string]any{"A=B": "c"}}, []string{`env name "A=B"`}},
		{"sandbox_renew", map[string]any{"sandbox_id": "x"}, []string{"timeout_seconds"}},
		{"sandbox_renew", map[string]any{"sandbox_id": "x", "timeout_seconds": 0}, []string{"timeout_seconds"}},
		{"file_list", map[string]any{"sandbox_id": "x", "path": "/", "offset": -1}, []string{"offset"}},
		{"sandbox_get", map[string]any{"sandbox_id": "x", "max_output_chars": 10}, []string{"max_output_chars"}},
		{"sandbox_endpoint", map[string]any{"sandbox_id": "x", "port": 70000}, []string{"port"}},
		{"sandbox_url", map[string]any{"sandbox_id": "x"}, []string{"port"}},
		{"sandbox_url", map[string]any{"sandbox_id": "x", "port": 8080, "expires_seconds": 5}, []string{"expires_seconds"}},
		{"sandbox_url", map[string]any{"sandbox_id": "x", "port": 8080, "expires_seconds": 9999999}, []string{"expires_seconds"}},
		{"command_run", map[string]any{"sandbox_id": "x"}, []string{"command"}},
		{"command_run", map[string]any{"sandbox_id": "x", "command": "   "}, []string{"command is empty"}},
		{"command_run", map[string]any{"sandbox_id": "x", "command": "ls", "timeout_seconds": 0}, []string{"timeout_seconds"}},
		{"command_run", map[string]any{"sandbox_id": "x", "command": "ls", "timeout_seconds": "10"}, []string{"timeout_seconds"}},
		{"command_run", map[string]any{"sandbox_id": "x", "command": "ls", "max_output_chars": 10}, []string{"max_output_chars"}},
		{"command_logs", map[string]any{"sandbox_id": "x", "command_id": "c", "cursor": -1}, []string{"cursor"}},
		{"file_read", map[string]any{"sandbox_id": "x", "path": "notes.txt"}, []string{"relative", "/tmp/notes.txt"}},
		{"file_read", map[string]any{"sandbox_id": "x", "path": "/a", "encoding": "utf16"}, []string{"encoding"}},
		{"file_write", map[string]any{"sandbox_id": "x", "path": "/a", "mode": "rwx"}, []string{`mode "rwx"`}},
		{"file_write", map[string]any{"sandbox_id": "x", "path": "/a", "mode": "999"}, []string{"octal"}},
		{"file_move", map[string]any{"sandbox_id": "x", "source": "/a", "destination": "b"}, []string{"destination", "relative"}},
		{"file_delete", map[string]any{"sandbox_id": "x", "path": "/"}, []string{"refusing to delete /"}},
		{"file_list", map[string]any{"sandbox_id": "x", "path": "/", "depth": 0}, []string{"depth"}},
		{"code_run", map[string]any{"sandbox_id": "x", "code": "1", "language": "cobol"}, []string{"language"}},
		{"code_run", map[string]any{"sandbox_id": "x", "code": ""}, []string{"code"}},
		{"code_context_create", map[string]any{"sandbox_id": "x"}, []string{"language"}},
	}
	for _, c := range cases {
		text := wantToolError(t, cs, c.tool, c.args, c.want...)
		if strings.Contains(text, "cannot reach") {
			t.Errorf("%s(%v) reached for the server before checking its arguments: %s", c.tool, c.args, text)
		}
	}
}

// TestErrorsExplained checks the messages of server errors and an
// unreachable server, against a fake lifecycle server.
func TestErrorsExplained(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderRequestID, "req-1")
		w.Header().Set("Content-Type", "application/json")
		switch r.PathValue("id") {
		case "gone-1":
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"code":"` + api.CodeDockerSandboxNotFound + `","message":"sandbox gone-1 not found"}`))
			return
		case "gone-2":
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"code":"` + api.CodeKubernetesSandboxNotFound + `","message":"sandbox gone-2 not found"}`))
			return
		}
		json.NewEncoder(w).Encode(api.Sandbox{ID: r.PathValue("id"), Status: api.SandboxStatus{State: sdk.StateRunning}})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		// An endpoint nobody listens on: the sandbox is unreachable.
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: "127.0.0.1:1"})
	})
	// A server without the pause route answers as the lifecycle server
	// answers every path it does not serve.
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"code":"` + api.CodeSandboxRouteNotFound + `","message":"no route for POST ` + r.URL.Path + `"}`))
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/renew-expiration", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(`{"code":"UNAUTHORIZED","message":"bad key"}`))
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	cs := connect(t, newTestServer(t, hs.URL, Config{}))

	text := wantToolError(t, cs, "sandbox_get", map[string]any{"sandbox_id": "gone-1"},
		"sandbox gone-1 not found", "sandbox_list", api.CodeDockerSandboxNotFound, "req-1")
	t.Log(text)
	wantToolError(t, cs, "sandbox_get", map[string]any{"sandbox_id": "gone-2"},
		"sandbox gone-2 not found", "sandbox_list", api.CodeKubernetesSandboxNotFound)
	text = wantToolError(t, cs, "sandbox_pause", map[string]any{"sandbox_id": "sb-1"},
		"no route for POST /v1/sandboxes/sb-1/pause", "Check the ids and paths given", api.CodeSandboxRouteNotFound)
	if strings.Contains(text, "sandbox sb-1 not found") || strings.Contains(text, "sandbox_list") {
		t.Errorf("a route missing on the server is explained as a missing sandbox: %s", text)
	}
	wantToolError(t, cs, "command_run", map[string]any{"sandbox_id": "sb-1", "command": "true"},
		"cannot reach sandbox sb-1", "sandbox_resume")
	wantToolError(t, cs, "sandbox_renew", map[string]any{"sandbox_id": "sb-1", "timeout_seconds": 60},
		"bad key", "API key", "HTTP 401")

	// No server at all.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cs = connect(t, newTestServer(t, addr, Config{}))
	wantToolError(t, cs, "sandbox_list", nil, "cannot reach the OpenSandbox server at "+addr)
}

// TestPanicIsToolError checks that a panicking handler fails its call,
// not the server.
func TestPanicIsToolError(t *testing.T) {
	s := newTestServer(t, "127.0.0.1:1", Config{})
	add(s, &gomcp.Tool{Name: "boom", Description: "panics"}, func(context.Context, SandboxArg) (*gomcp.CallToolResult, DoneOutput, error) {
		panic("kaboom")
	})
	cs := connect(t, s)
	wantToolError(t, cs, "boom", map[string]any{"sandbox_id": "x"}, "internal error in boom", "kaboom")
	if _, err := cs.ListTools(t.Context(), nil); err != nil {
		t.Fatalf("server gone after a panic: %v", err)
	}
}

func TestFileURI(t *testing.T) {
	for _, p := range []string{"/tmp/a.txt", "/with space/ü.txt", "/a/b/c"} {
		uri := FileURI("sb-1", p)
		id, got, err := parseFileURI(uri)
		if err != nil || id != "sb-1" || got != p {
			t.Errorf("parseFileURI(FileURI(%q)) = %q, %q, %v (uri %s)", p, id, got, err, uri)
		}
	}
	for _, bad := range []string{"file:///tmp/a", "sandbox://sb-1/tmp/a", "sandbox:///files/a", "sandbox://sb-1/files/"} {
		if _, _, err := parseFileURI(bad); err == nil {
			t.Errorf("parseFileURI(%q) accepted", bad)
		}
	}
}

func TestHTTPToken(t *testing.T) {
	s := newTestServer(t, "127.0.0.1:1", Config{})
	hs := httptest.NewServer(s.Handler("s3cret"))
	defer hs.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	for _, c := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer wrong", http.StatusUnauthorized},
		{"Basic s3cret", http.StatusUnauthorized},
		{"Bearer s3cret", http.StatusOK},
		{"bearer  s3cret ", http.StatusOK},
		{"Bearer s3cretX", http.StatusUnauthorized},
		{"s3cret", http.StatusUnauthorized},
	} {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", hs.URL+HTTPPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Authorization %q: HTTP %d, want %d", c.auth, resp.StatusCode, c.want)
		}
	}
}

// TestNullArguments: a call whose arguments are null or absent is a tool
// error about what is missing, never the end of the server (the SDK would
// write the schema's defaults into a nil map).
func TestNullArguments(t *testing.T) {
	s := newTestServer(t, "127.0.0.1:1", Config{})
	cs := connect(t, s)
	for _, tool := range []string{"file_list", "file_read", "command_run", "code_run", "sandbox_get"} {
		for _, args := range []any{nil, json.RawMessage("null")} {
			res, err := cs.CallTool(t.Context(), &gomcp.CallToolParams{Name: tool, Arguments: args})
			if err != nil {
				t.Fatalf("%s(%v): protocol error: %v", tool, args, err)
			}
			if !res.IsError {
				t.Errorf("%s(%v) succeeded", tool, args)
			}
		}
	}
	if _, err := cs.ListTools(t.Context(), nil); err != nil {
		t.Fatalf("server gone: %v", err)
	}
}

// TestToolSchemasForModels: no schema has a ["null", T] union, which some
// function-calling backends refuse; every tool takes max_output_chars,
// bounded, with the server's default; pause, resume and renew say they
// destroy nothing.
func TestToolSchemasForModels(t *testing.T) {
	cs := connect(t, newTestServer(t, "127.0.0.1:1", Config{MaxOutput: 12345}))
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range res.Tools {
		for which, sc := range map[string]any{"input": tool.InputSchema, "output": tool.OutputSchema} {
			if b := mustJSON(sc); strings.Contains(string(b), `"null"`) || strings.Contains(string(b), `"type":[`) {
				t.Errorf("%s: %s schema has a type union: %s", tool.Name, which, b)
			}
		}
		var in struct {
			Properties map[string]struct {
				Type    string   `json:"type"`
				Minimum *float64 `json:"minimum"`
				Maximum *float64 `json:"maximum"`
				Default any      `json:"default"`
			} `json:"properties"`
		}
		json.Unmarshal(mustJSON(tool.InputSchema), &in)
		mo, ok := in.Properties["max_output_chars"]
		if !ok || mo.Type != "integer" || mo.Minimum == nil || *mo.Minimum != minMaxOutput || mo.Maximum == nil || *mo.Maximum != maxMaxOutput || mo.Default != 12345.0 {
			t.Errorf("%s: max_output_chars %+v", tool.Name, mo)
		}
		switch tool.Name {
		case "sandbox_pause", "sandbox_resume", "sandbox_renew":
			if a := tool.Annotations; a.DestructiveHint == nil || *a.DestructiveHint {
				t.Errorf("%s: destructiveHint %v, want false", tool.Name, a.DestructiveHint)
			}
		}
	}
}

// TestSchemaLimitsFromServer: timeout_seconds states the bounds the
// server answers on GET /limits, 0 for no expiry included, and leaves
// them to the server when it does not say them.
func TestSchemaLimitsFromServer(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{Lifecycle: func(c *lifecycle.Config) {
		c.MinTimeout, c.MaxTimeout = 60*time.Second, 24*time.Hour
	}})
	c, err := sdk.NewClient(sdk.Config{Domain: ts.Addr, APIKey: ts.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := New(Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, s)
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	bounds := map[string]string{}
	for _, tool := range res.Tools {
		var in struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		json.Unmarshal(mustJSON(tool.InputSchema), &in)
		bounds[tool.Name] = string(in.Properties["timeout_seconds"])
	}
	if c := bounds["sandbox_create"]; !strings.Contains(c, `"minimum":0`) || !strings.Contains(c, `"maximum":86400`) || !strings.Contains(c, "0: no expiry") {
		t.Errorf("sandbox_create timeout_seconds: %s", c)
	}
	if r := bounds["sandbox_renew"]; !strings.Contains(r, `"minimum":1`) || !strings.Contains(r, `"maximum":86400`) {
		t.Errorf("sandbox_renew timeout_seconds: %s", r)
	}
	// A server that does not answer: no bounds but 1, and the
	// description says the server decides.
	unknown := connect(t, newTestServer(t, "127.0.0.1:1", Config{}))
	res, err = unknown.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range res.Tools {
		if tool.Name == "sandbox_create" {
			if b := string(mustJSON(tool.InputSchema)); strings.Contains(b, `"maximum":86400`) || !strings.Contains(b, "did not say its bounds") {
				t.Errorf("sandbox_create without limits: %s", b)
			}
		}
	}
}

// TestBudgetText: a tool's text beyond its budget is cut at lines, with
// a note naming max_output_chars.
func TestBudgetText(t *testing.T) {
	short := strings.Repeat("x\n", 100)
	if got := budgetText(short, 200); got != short {
		t.Fatalf("text within budget and slack changed: %q", got)
	}
	long := lines(1, 10000)
	got := budgetText(long, 1000)
	if utf8.RuneCountInString(got) > 1000+300 || !strings.HasPrefix(got, "1\n2\n") || !strings.Contains(got, "lines (") ||
		!strings.Contains(got, "max_output_chars 1000") || !strings.Contains(got, "\n10000\n") {
		t.Fatalf("budgeted text: %q", got)
	}
}

// TestSandboxProse: sandboxes read as a line with a relative expiry.
func TestSandboxProse(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	at := now.Add(9*time.Minute + 58*time.Second)
	got := sandboxText(SandboxInfo{SandboxID: "sb-1", State: "Running", Image: "python:3.11",
		Metadata: map[string]string{"b": "2", "a": "1"}, ExpiresAt: &at}, now)
	if want := "sandbox sb-1: Running, image python:3.11, metadata a=1,b=2, expires in 9m58s (at 2026-01-02T15:09:58Z)"; got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if got := sandboxText(SandboxInfo{SandboxID: "sb-2", State: "Failed", Reason: "IMAGE_PULL", Message: "no such image"}, now); got != "sandbox sb-2: Failed (IMAGE_PULL no such image), never expires (lives until sandbox_kill)" {
		t.Fatalf("failed sandbox: %q", got)
	}
}

// TestListingPages: a listing comes in pages that fit the budget, the
// structured content holds the page only, and each page but the last
// says how to read on; the pages together are the whole listing.
func TestListingPages(t *testing.T) {
	infos := make([]api.FileInfo, 3000)
	for i := range infos {
		infos[i] = api.FileInfo{Path: fmt.Sprintf("/data/file-%05d.txt", i), Type: "file", Size: int64(i), Mode: 644}
	}
	var seen []string
	offset := 0
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("no end of pages")
		}
		out, txt := listing(infos, offset, 5000, "file_list", "empty")
		if utf8.RuneCountInString(txt) > 5000 {
			t.Fatalf("page of %d characters for a budget of 5000", utf8.RuneCountInString(txt))
		}
		if out.Total != 3000 || out.Offset != offset || len(out.Entries) == 0 {
			t.Fatalf("page at %d: %+v", offset, out)
		}
		for _, e := range out.Entries {
			seen = append(seen, e.Path)
		}
		if !out.Truncated {
			if !strings.HasSuffix(txt, "of 3000: the last page]") {
				t.Fatalf("last page ends %q", txt[len(txt)-80:])
			}
			break
		}
		if !strings.HasSuffix(txt, fmt.Sprintf("more: call file_list with offset %d]", out.NextOffset)) {
			t.Fatalf("page ends %q", txt[len(txt)-80:])
		}
		offset = out.NextOffset
	}
	if len(seen) != 3000 || seen[0] != infos[0].Path || seen[2999] != infos[2999].Path {
		t.Fatalf("pages held %d entries", len(seen))
	}
	if _, txt := listing(infos, 5000, 5000, "file_list", "empty"); !strings.Contains(txt, "past the last") {
		t.Fatalf("offset past the end: %q", txt)
	}
}
