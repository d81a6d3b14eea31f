package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// TestOSBMCPStdio drives `osb mcp` as an MCP client launching it would:
// over its stdin and stdout, with the image and lifetime of new sandboxes
// taken from [defaults] of the osb configuration file.
func TestOSBMCPStdio(t *testing.T) {
	testenv.MustHaveImage(t, interpreterImage)
	s := startServer(t, serverOptions{})
	home := t.TempDir()
	writeConfig(t, home, "[defaults]\nimage = \""+busyboxImage+"\"\ntimeout = \"5m\"\n")
	cmd := s.osbCmd(home, "mcp")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to osb mcp: %v\nstderr: %s", err, stderr.String())
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // the test failed before closing
			cmd.Process.Kill()
		}
	})
	mcpTour(t, ctx, cs, 5*time.Minute)
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	// Closing stdin ends osb mcp on its own, cleanly.
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("osb mcp ended with %v; stderr: %s", cmd.ProcessState, stderr.String())
	}
	if strings.Contains(stderr.String(), "panic") {
		t.Errorf("stderr: %s", stderr.String())
	}
}

// TestOSBMCPHTTP drives `osb mcp --http` with the bearer token from the
// environment, checks that requests without it are refused, and that a
// token is made up and printed when none is given.
func TestOSBMCPHTTP(t *testing.T) {
	testenv.MustHaveImage(t, interpreterImage)
	s := startServer(t, serverOptions{})
	token := randomHex(16)
	cmd := s.osbCmd("", "mcp", "--http", "127.0.0.1:0", "--image", busyboxImage)
	cmd.Env = append(cmd.Env, "OSB_MCP_TOKEN="+token)
	url, _ := startMCPHTTP(t, cmd)

	// Without the token, or with another, nothing gets through.
	for _, auth := range []string{"", "Bearer " + randomHex(16), token} {
		req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: HTTP %d, want 401 with WWW-Authenticate", auth, resp.StatusCode)
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if _, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient("wrong"), MaxRetries: -1}, nil); err == nil {
		t.Fatal("a client with a wrong token connected")
	}
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(token)}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()
	mcpTour(t, ctx, cs, 10*time.Minute)

	// No token given: osb mcp makes one up and says it on stderr.
	url, stderr := startMCPHTTP(t, s.osbCmd("", "mcp", "--http", "127.0.0.1:0"))
	_, made, ok := strings.Cut(stderr, "Authorization: Bearer ")
	made, _, _ = strings.Cut(made, "\n")
	if !ok || len(made) != 64 {
		t.Fatalf("no token printed: %q", stderr)
	}
	cs2, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bearerClient(made)}, nil)
	if err != nil {
		t.Fatalf("connect with the printed token: %v", err)
	}
	if _, err := cs2.ListTools(ctx, nil); err != nil {
		t.Errorf("list tools with the printed token: %v", err)
	}
	cs2.Close()

	// Flags that make no sense are usage errors.
	s.osb("mcp", "--token", "x").fails(t, 2, "--token and --insecure go with --http")
	r := s.osbIn(nil, "", "mcp", "--http", "127.0.0.1:0", "--insecure", "--token", "x")
	r.fails(t, 2, "--insecure serves without a token")
}

// mcpTour is what both transports must do: list the tools, work in a
// busybox sandbox created with the configured defaults, plot in a code
// interpreter sandbox, kill both, and answer bad calls with tool errors.
// lifetime is the default lifetime osb mcp was given.
func mcpTour(t *testing.T, ctx context.Context, cs *mcp.ClientSession, lifetime time.Duration) {
	t.Helper()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tool := range tools.Tools {
		names[tool.Name] = true
		if tool.Description == "" || tool.InputSchema == nil || tool.OutputSchema == nil {
			t.Errorf("tool %s lacks a description or schema", tool.Name)
		}
	}
	for _, want := range []string{"sandbox_create", "sandbox_list", "sandbox_get", "sandbox_kill", "sandbox_renew", "sandbox_pause",
		"sandbox_resume", "sandbox_endpoint", "command_run", "command_start", "command_logs", "command_stop", "file_read", "file_write",
		"file_list", "file_search", "file_move", "file_delete", "code_run", "code_context_create", "code_context_list", "code_context_delete"} {
		if !names[want] {
			t.Errorf("no tool %s among %v", want, names)
		}
	}

	// A sandbox from the default image, with the default lifetime.
	var sb struct {
		SandboxID string    `json:"sandbox_id"`
		State     string    `json:"state"`
		Image     string    `json:"image"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	mcpOK(t, ctx, cs, "sandbox_create", nil, &sb)
	if sb.Image != busyboxImage || sb.State != "Running" {
		t.Fatalf("created %+v", sb)
	}
	if d := time.Until(sb.ExpiresAt); d > lifetime || d < lifetime-time.Minute {
		t.Errorf("sandbox expires in %v, want about %v", d, lifetime)
	}
	id := sb.SandboxID

	var run struct {
		ExitCode        int    `json:"exit_code"`
		Stdout          string `json:"stdout"`
		Stderr          string `json:"stderr"`
		StdoutTruncated bool   `json:"stdout_truncated"`
	}
	text := mcpOK(t, ctx, cs, "command_run", map[string]any{"sandbox_id": id, "command": "echo hello from $(hostname) && echo warn >&2"}, &run)
	if run.ExitCode != 0 || !strings.HasPrefix(run.Stdout, "hello from ") || run.Stderr != "warn\n" || !strings.Contains(text, "exit code: 0") {
		t.Errorf("command: %+v\n%s", run, text)
	}
	text = mcpOK(t, ctx, cs, "command_run", map[string]any{"sandbox_id": id, "command": "echo failing; exit 7"}, &run)
	if run.ExitCode != 7 || !strings.Contains(text, "exit code: 7") {
		t.Errorf("failing command: %+v\n%s", run, text)
	}
	text = mcpOK(t, ctx, cs, "command_run", map[string]any{"sandbox_id": id, "command": "yes abcdefghi | head -n 100000"}, &run)
	if !run.StdoutTruncated || !strings.Contains(text, "[... 98000 lines (980000 bytes) omitted ...]") || len(run.Stdout) > 21000 {
		t.Errorf("big output: truncated %v, %d characters kept; text ends %q", run.StdoutTruncated, len(run.Stdout), text[max(0, len(text)-200):])
	}

	mcpOK(t, ctx, cs, "file_write", map[string]any{"sandbox_id": id, "path": "/tmp/work/notes.md", "content": "# Notes\nline two\n"}, nil)
	text = mcpOK(t, ctx, cs, "file_read", map[string]any{"sandbox_id": id, "path": "/tmp/work/notes.md"}, nil)
	if text != "# Notes\nline two\n" {
		t.Errorf("read back %q", text)
	}
	text = mcpOK(t, ctx, cs, "file_list", map[string]any{"sandbox_id": id, "path": "/tmp/work"}, nil)
	if !strings.Contains(text, "/tmp/work/notes.md") {
		t.Errorf("listing: %s", text)
	}

	// A code interpreter sandbox draws a plot, which comes back as an
	// image.
	mcpOK(t, ctx, cs, "sandbox_create", map[string]any{"image": interpreterImage}, &sb)
	codeID := sb.SandboxID
	res := mcpCall(t, ctx, cs, "code_run", map[string]any{"sandbox_id": codeID,
		"code": "import matplotlib.pyplot as plt\nxs = list(range(10))\nplt.plot(xs, [x * x for x in xs])\nplt.title('squares')\nplt.show()\nprint('plotted', len(xs))"})
	var pngs int
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			if img.MIMEType != "image/png" {
				t.Errorf("image of type %s", img.MIMEType)
			}
			if _, err := png.Decode(bytes.NewReader(img.Data)); err != nil {
				t.Errorf("image does not decode as PNG: %v", err)
			}
			pngs++
		}
	}
	if res.IsError || pngs != 1 || !strings.Contains(mcpText(res), "plotted 10") {
		t.Errorf("plot: error %v, %d PNG images, text %q", res.IsError, pngs, mcpText(res))
	}
	text = mcpOK(t, ctx, cs, "code_run", map[string]any{"sandbox_id": codeID, "code": "xs[-1] ** 2"}, nil)
	if !strings.Contains(text, "81") {
		t.Errorf("state between runs: %s", text)
	}

	// Bad calls are tool errors that say what to do; the server lives on.
	mcpFails(t, ctx, cs, "command_run", map[string]any{"sandbox_id": id}, "command")
	mcpFails(t, ctx, cs, "command_run", map[string]any{"sandbox_id": id, "command": "true", "timeout_seconds": -1}, "timeout_seconds")
	mcpFails(t, ctx, cs, "file_read", map[string]any{"sandbox_id": id, "path": "relative.txt"}, "absolute path")
	mcpFails(t, ctx, cs, "file_read", map[string]any{"sandbox_id": id, "path": "/tmp/missing"}, "/tmp/missing")
	mcpFails(t, ctx, cs, "code_run", map[string]any{"sandbox_id": codeID, "code": "1", "language": "cobol"}, "language")
	mcpFails(t, ctx, cs, "sandbox_get", map[string]any{"sandbox_id": "no-such-sandbox"}, "sandbox no-such-sandbox not found", "sandbox_list")
	mcpFails(t, ctx, cs, "command_run", map[string]any{"sandbox_id": "no-such-sandbox", "command": "true"}, "not found")

	for _, kill := range []string{id, codeID} {
		mcpOK(t, ctx, cs, "sandbox_kill", map[string]any{"sandbox_id": kill}, nil)
		mcpFails(t, ctx, cs, "sandbox_get", map[string]any{"sandbox_id": kill}, "not found")
	}
}

// mcpCall calls a tool; a protocol error fails the test.
func mcpCall(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	if args == nil {
		args = map[string]any{}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): %v", tool, args, err)
	}
	return res
}

// mcpText is all the text of a result.
func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpOK calls a tool that must succeed, decodes its structured output
// into out (if not nil) and returns its text.
func mcpOK(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, out any) string {
	t.Helper()
	res := mcpCall(t, ctx, cs, tool, args)
	if res.IsError {
		t.Fatalf("%s(%v): %s", tool, args, mcpText(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v in %s", tool, err, b)
		}
	}
	return mcpText(res)
}

// mcpFails calls a tool that must fail with a tool error saying wants.
func mcpFails(t *testing.T, ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, wants ...string) {
	t.Helper()
	res := mcpCall(t, ctx, cs, tool, args)
	text := mcpText(res)
	if !res.IsError {
		t.Errorf("%s(%v) succeeded: %s", tool, args, text)
		return
	}
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s(%v): error %q does not say %q", tool, args, text, w)
		}
	}
}

// startMCPHTTP starts `osb mcp --http` and returns its URL, read from
// stderr, and what stderr said up to it. The process is killed when the
// test ends.
func startMCPHTTP(t *testing.T, cmd *exec.Cmd) (url, stderr string) {
	t.Helper()
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	found := make(chan string, 1)
	var seen strings.Builder
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			if _, u, ok := strings.Cut(line, "serving MCP on "); ok {
				found <- u
				break
			}
			seen.WriteString(line + "\n")
		}
		io.Copy(io.Discard, pipe)
	}()
	select {
	case u := <-found:
		return u, seen.String()
	case <-time.After(30 * time.Second):
		t.Fatalf("osb mcp --http did not say where it serves")
	}
	return "", ""
}

// bearerClient sends the token with every request.
func bearerClient(token string) *http.Client {
	return &http.Client{Transport: bearerTransport{token: token, next: http.DefaultTransport}}
}

type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// writeConfig writes ~/.opensandbox/config.toml under home.
func writeConfig(t *testing.T, home, text string) {
	t.Helper()
	dir := filepath.Join(home, ".opensandbox")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}
