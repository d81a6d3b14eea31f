package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"reflect"
	"strings"
	"testing"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/sdk"
)

// Images the tests use; make images builds them.
const (
	busyboxImage     = "opensandbox/busybox"
	interpreterImage = "opensandbox/code-interpreter"
)

// liveServer serves the tools against a real lifecycle server on the
// local Docker engine, with busybox as the default image.
func liveServer(t *testing.T) *gomcp.ClientSession {
	t.Helper()
	cs, _ := liveServerClient(t)
	return cs
}

// liveServerClient is liveServer and an SDK client of the same lifecycle
// server, to set up what the tools only read.
func liveServerClient(t *testing.T) (*gomcp.ClientSession, *sdk.Client) {
	t.Helper()
	testenv.MustHaveImage(t, busyboxImage)
	ts := testserver.Start(t, testserver.Options{})
	c, err := sdk.NewClient(sdk.Config{Domain: ts.Addr, APIKey: ts.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := New(Config{Client: c, DefaultImage: busyboxImage, DefaultTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return connect(t, s), c
}

// ok calls a tool that must succeed and decodes its structured output
// into out (may be nil); it returns the text.
func ok(t *testing.T, cs *gomcp.ClientSession, tool string, args map[string]any, out any) string {
	t.Helper()
	res, text := call(t, cs, tool, args)
	if res.IsError {
		t.Fatalf("%s(%v): tool error: %s", tool, args, text)
	}
	if out != nil {
		reflect.ValueOf(out).Elem().SetZero()
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", tool, b, err)
		}
	}
	return text
}

// TestSandboxTools walks every sandbox, command and file tool through a
// busybox sandbox.
func TestSandboxTools(t *testing.T) {
	cs := liveServer(t)
	var sb SandboxInfo
	ok(t, cs, "sandbox_create", map[string]any{"metadata": map[string]any{"task": "t1"}}, &sb)
	if sb.SandboxID == "" || sb.State != sdk.StateRunning || sb.Image != busyboxImage || sb.ExpiresAt == nil {
		t.Fatalf("created %+v", sb)
	}
	id := sb.SandboxID
	args := func(kv ...any) map[string]any {
		m := map[string]any{"sandbox_id": id}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}

	t.Run("lifecycle", func(t *testing.T) {
		var list ListOutput
		ok(t, cs, "sandbox_list", map[string]any{"metadata": map[string]any{"task": "t1"}, "states": []string{"Running"}}, &list)
		if len(list.Sandboxes) != 1 || list.Sandboxes[0].SandboxID != id {
			t.Errorf("list: %+v", list)
		}
		var got SandboxInfo
		text := ok(t, cs, "sandbox_get", args(), &got)
		if got.SandboxID != id || got.Metadata["task"] != "t1" || !strings.HasPrefix(text, "sandbox "+id+": Running") || !strings.Contains(text, ", expires in ") {
			t.Errorf("get: %+v\n%s", got, text)
		}
		var renewed RenewOutput
		ok(t, cs, "sandbox_renew", args("timeout_seconds", 3600), &renewed)
		if d := time.Until(renewed.ExpiresAt); d < 50*time.Minute || d > 61*time.Minute {
			t.Errorf("renewed to %v from now", d)
		}
		var ep EndpointOutput
		ok(t, cs, "sandbox_endpoint", args("port", sdk.PortExecd), &ep)
		if !strings.HasPrefix(ep.URL, "http://") || len(ep.Headers) == 0 {
			t.Errorf("endpoint: %+v", ep)
		}
	})

	t.Run("command_run", func(t *testing.T) {
		var out RunOutput
		text := ok(t, cs, "command_run", args("command", "echo hello; echo oops >&2"), &out)
		if out.ExitCode != 0 || out.Stdout != "hello\n" || out.Stderr != "oops\n" || !strings.Contains(text, "exit code: 0") {
			t.Errorf("echo: %+v\n%s", out, text)
		}
		text = ok(t, cs, "command_run", args("command", "echo $GREETING from $PWD; exit 3", "cwd", "/tmp", "env", map[string]any{"GREETING": "hi"}), &out)
		if out.ExitCode != 3 || out.Stdout != "hi from /tmp\n" || !strings.Contains(text, "exit code: 3") {
			t.Errorf("exit 3: %+v\n%s", out, text)
		}
		text = ok(t, cs, "command_run", args("command", "seq 1 100000", "max_output_chars", 1000), &out)
		if !out.StdoutTruncated || !strings.HasPrefix(out.Stdout, "1\n2\n") || !strings.HasSuffix(out.Stdout, "99999\n100000\n") ||
			!strings.Contains(text, " lines (") || !strings.Contains(text, "truncated") {
			t.Errorf("big output: %d characters, truncated %v:\n%s", len(out.Stdout), out.StdoutTruncated, text)
		}
		text = ok(t, cs, "command_run", args("command", "head -c 2000 /dev/urandom"), &out)
		if !out.StdoutBinary || !strings.Contains(text, "[binary output: not shown") || strings.ContainsRune(text, '\uFFFD') {
			t.Errorf("binary output: %+v\n%s", out, text)
		}
		text = ok(t, cs, "command_run", args("command", "sleep 30", "timeout_seconds", 1), &out)
		if !out.TimedOut || out.ExitCode != -1 || !strings.Contains(text, "timed out") {
			t.Errorf("timeout: %+v\n%s", out, text)
		}
		res, text := call(t, cs, "command_run", args("command", "pwd", "cwd", "/no/such/dir"))
		t.Logf("missing cwd: error %v: %s", res.IsError, text)
		if !strings.Contains(text, "/no/such/dir") {
			t.Errorf("missing cwd is not named: %s", text)
		}
	})

	t.Run("background", func(t *testing.T) {
		var st StartOutput
		ok(t, cs, "command_start", args("command", "for i in 1 2 3; do echo line$i; sleep 0.2; done; exit 4"), &st)
		var logs LogsOutput
		text := ok(t, cs, "command_logs", args("command_id", st.CommandID, "wait_seconds", 20), &logs)
		if logs.Running || logs.ExitCode == nil || *logs.ExitCode != 4 || logs.Output != "line1\nline2\nline3\n" || !strings.Contains(text, "exit code 4") {
			t.Fatalf("logs: %+v\n%s", logs, text)
		}
		var again LogsOutput
		text = ok(t, cs, "command_logs", args("command_id", st.CommandID, "cursor", logs.NextCursor), &again)
		if again.Output != "" || !strings.Contains(text, "none new") {
			t.Errorf("logs from next_cursor: %+v", again)
		}
		ok(t, cs, "command_start", args("command", "sleep 300"), &st)
		ok(t, cs, "command_stop", args("command_id", st.CommandID), nil)
		ok(t, cs, "command_logs", args("command_id", st.CommandID, "wait_seconds", 10), &logs)
		if logs.Running {
			t.Errorf("stopped command still runs: %+v", logs)
		}
		wantToolError(t, cs, "command_logs", args("command_id", "no-such-command"), "not found")
	})

	t.Run("files", func(t *testing.T) {
		var w WriteOutput
		ok(t, cs, "file_write", args("path", "/tmp/d/a.txt", "content", "hello\nwörld\n", "mode", "600"), &w)
		if w.BytesWritten != 13 {
			t.Errorf("write: %+v", w)
		}
		var r ReadOutput
		text := ok(t, cs, "file_read", args("path", "/tmp/d/a.txt"), &r)
		if text != "hello\nwörld\n" || r.Encoding != "text" || r.Size != 13 || r.Truncated {
			t.Errorf("read: %q %+v", text, r)
		}
		var list ListDirOutput
		text = ok(t, cs, "file_list", args("path", "/tmp/d"), &list)
		if len(list.Entries) != 1 || list.Entries[0].Mode != "0600" || list.Entries[0].Type != "file" || !strings.Contains(text, "/tmp/d/a.txt") {
			t.Errorf("list: %+v\n%s", list, text)
		}
		ok(t, cs, "file_move", args("source", "/tmp/d/a.txt", "destination", "/tmp/d/sub/b.txt"), nil)
		ok(t, cs, "file_search", args("path", "/tmp", "pattern", "**/*.txt"), &list)
		if len(list.Entries) != 1 || list.Entries[0].Path != "/tmp/d/sub/b.txt" {
			t.Errorf("search: %+v", list)
		}
		wantToolError(t, cs, "file_read", args("path", "/tmp/d/a.txt"), "/tmp/d/a.txt", "file_list")
		wantToolError(t, cs, "file_read", args("path", "/tmp/d"), "is a directory", "file_list")

		// A big text file is read in parts.
		ok(t, cs, "command_run", args("command", "seq 1 50000 > /tmp/big.txt"), nil)
		text = ok(t, cs, "file_read", args("path", "/tmp/big.txt", "max_bytes", 1000), &r)
		if !r.Truncated || r.NextOffset != 1000 || !strings.HasPrefix(text, "1\n2\n") || !strings.Contains(text, "offset 1000") {
			t.Errorf("part: %+v\n%s", r, text[len(text)-200:])
		}
		ok(t, cs, "file_read", args("path", "/tmp/big.txt", "offset", r.NextOffset, "max_bytes", 10), &r)
		if r.Content != "278\n279\n28" { // 1-9, 10-99 and 100-277 take 1000 bytes
			t.Errorf("next part: %q", r.Content)
		}

		// Binary content: written from base64, described, read as base64.
		bin := []byte{0, 1, 2, 0xff, 0xfe, 'a'}
		ok(t, cs, "file_write", args("path", "/tmp/bin", "content", base64.StdEncoding.EncodeToString(bin), "encoding", "base64"), nil)
		text = ok(t, cs, "file_read", args("path", "/tmp/bin"), &r)
		if r.Encoding != "binary" || r.Content != "" || !strings.Contains(text, "binary file (6 bytes") || !strings.Contains(text, "base64") {
			t.Errorf("binary: %+v\n%s", r, text)
		}
		ok(t, cs, "file_read", args("path", "/tmp/bin", "encoding", "base64"), &r)
		if got, _ := base64.StdEncoding.DecodeString(r.Content); !bytes.Equal(got, bin) {
			t.Errorf("base64 read %q", r.Content)
		}

		// An image comes back as an image.
		var pngBuf bytes.Buffer
		img := image.NewRGBA(image.Rect(0, 0, 4, 4))
		img.Set(1, 1, color.RGBA{255, 0, 0, 255})
		png.Encode(&pngBuf, img)
		ok(t, cs, "file_write", args("path", "/tmp/dot.png", "content", base64.StdEncoding.EncodeToString(pngBuf.Bytes()), "encoding", "base64"), nil)
		res, _ := call(t, cs, "file_read", args("path", "/tmp/dot.png"))
		if got := images(res); len(got) != 1 || got[0].MIMEType != "image/png" || !bytes.Equal(got[0].Data, pngBuf.Bytes()) {
			t.Errorf("image read: %+v", res.Content)
		}

		// The same file as a resource.
		rr, err := cs.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: FileURI(id, "/tmp/d/sub/b.txt")})
		if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hello\nwörld\n" {
			t.Errorf("resource: %+v, %v", rr, err)
		}
		rr, err = cs.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: FileURI(id, "/tmp/bin")})
		if err != nil || len(rr.Contents) != 1 || !bytes.Equal(rr.Contents[0].Blob, bin) {
			t.Errorf("binary resource: %+v, %v", rr, err)
		}
		if _, err := cs.ReadResource(t.Context(), &gomcp.ReadResourceParams{URI: FileURI(id, "/tmp/none")}); err == nil {
			t.Error("a missing file was read as a resource")
		}

		wantToolError(t, cs, "file_delete", args("path", "/tmp/d"), "is a directory", "recursive")
		ok(t, cs, "file_delete", args("path", "/tmp/d", "recursive", true), nil)
		ok(t, cs, "file_delete", args("path", "/tmp/bin"), nil)
		wantToolError(t, cs, "file_delete", args("path", "/tmp/bin"), "not found")
	})

	t.Run("no interpreter", func(t *testing.T) {
		wantToolError(t, cs, "code_run", args("code", "1"), "opensandbox/code-interpreter")
	})

	t.Run("pause", func(t *testing.T) {
		var got SandboxInfo
		ok(t, cs, "sandbox_pause", args(), &got)
		if got.State != sdk.StatePaused {
			t.Fatalf("paused: %+v", got)
		}
		text := wantToolError(t, cs, "command_run", args("command", "true", "timeout_seconds", 5), "sandbox_resume")
		t.Logf("command on a paused sandbox: %s", text)
		ok(t, cs, "sandbox_resume", args(), &got)
		if got.State != sdk.StateRunning {
			t.Fatalf("resumed: %+v", got)
		}
		var out RunOutput
		ok(t, cs, "command_run", args("command", "echo back"), &out)
		if out.Stdout != "back\n" {
			t.Errorf("after resume: %+v", out)
		}
	})

	ok(t, cs, "sandbox_kill", args(), nil)
	wantToolError(t, cs, "sandbox_get", args(), "sandbox "+id+" not found", "sandbox_list")
	wantToolError(t, cs, "command_run", args("command", "true"), "not found", "sandbox_list")
}

// images returns the image contents of a result.
func images(res *gomcp.CallToolResult) []*gomcp.ImageContent {
	var out []*gomcp.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*gomcp.ImageContent); ok {
			out = append(out, ic)
		}
	}
	return out
}

// TestCodeTools runs python and javascript in the code interpreter: state
// kept between runs, a plot as an image, an exception, contexts.
func TestCodeTools(t *testing.T) {
	testenv.MustHaveImage(t, interpreterImage)
	cs := liveServer(t)
	var sb SandboxInfo
	ok(t, cs, "sandbox_create", map[string]any{"image": interpreterImage}, &sb)
	args := func(kv ...any) map[string]any {
		m := map[string]any{"sandbox_id": sb.SandboxID}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	var out CodeOutput
	text := ok(t, cs, "code_run", args("code", "x = 6 * 7\nprint('hi')\nx"), &out)
	if out.Stdout != "hi\n" || len(out.Results) != 1 || out.Results[0].Text != "42" || out.Error != nil || out.ContextID == "" {
		t.Fatalf("run: %+v\n%s", out, text)
	}
	if !strings.Contains(text, "hi") || !strings.Contains(text, "42") {
		t.Errorf("run text: %s", text)
	}
	ok(t, cs, "code_run", args("code", "x + 1"), &out)
	if len(out.Results) != 1 || out.Results[0].Text != "43" {
		t.Errorf("state not kept: %+v", out)
	}

	res, text := call(t, cs, "code_run", args("code", "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"))
	imgs := images(res)
	if res.IsError || len(imgs) != 1 || imgs[0].MIMEType != "image/png" {
		t.Fatalf("plot: error %v, %d images: %s", res.IsError, len(imgs), text)
	}
	if _, err := png.Decode(bytes.NewReader(imgs[0].Data)); err != nil {
		t.Fatalf("plot is not a PNG: %v", err)
	}
	if !strings.Contains(text, "1 image(s) attached") || strings.Contains(text, "iVBOR") {
		t.Errorf("plot text: %s", text)
	}

	res, text = call(t, cs, "code_run", args("code", "def f():\n    return 1 / 0\nf()"))
	if res.IsError || !strings.Contains(text, "ZeroDivisionError") || !strings.Contains(text, "Traceback") || strings.Contains(text, "\x1b[") {
		t.Errorf("exception: error %v: %s", res.IsError, text)
	}

	ok(t, cs, "code_run", args("code", "const v = [1, 2, 3].map(n => n * 2); v", "language", "javascript"), &out)
	if len(out.Results) != 1 || !strings.Contains(out.Results[0].Text, "2, 4, 6") {
		t.Errorf("javascript: %+v", out)
	}

	var cc ContextInfo
	ok(t, cs, "code_context_create", args("language", "python"), &cc)
	ok(t, cs, "code_run", args("code", "'x' in globals()", "context_id", cc.ContextID), &out)
	if len(out.Results) != 1 || out.Results[0].Text != "False" || out.ContextID != cc.ContextID {
		t.Errorf("own context: %+v", out)
	}
	var list ContextList
	ok(t, cs, "code_context_list", args("language", "python"), &list)
	if len(list.Contexts) < 2 {
		t.Errorf("contexts: %+v", list)
	}
	ok(t, cs, "code_context_delete", args("context_id", cc.ContextID), nil)
	wantToolError(t, cs, "code_run", args("code", "1", "context_id", cc.ContextID), "code_context_list")
	ok(t, cs, "sandbox_kill", args(), nil)
}
