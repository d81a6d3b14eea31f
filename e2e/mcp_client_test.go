package e2e

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestMCPClient drives `osb mcp` with the official MCP TypeScript SDK
// (@modelcontextprotocol/sdk, pinned by testdata/jssdk/package-lock.json)
// against a real server and a busybox sandbox: testdata/jssdk/mcp.mjs
// calls every tool and checks what a model reads. The server bounds
// timeouts to 1s..24h, which the tool schemas must state.
func TestMCPClient(t *testing.T) {
	dir := jssdk(t)
	s := startServer(t, serverOptions{})
	line := runJSScript(t, dir, s, "mcp.mjs", "OSB_BIN="+osbBin, "HOME="+t.TempDir(),
		"OPEN_SANDBOX_DOMAIN="+s.listen, "OPEN_SANDBOX_API_KEY="+s.key)
	var sum struct {
		Failures      []string
		Tools         int
		Called        []string
		CreateTimeout struct{ Minimum, Maximum *float64 }
		RenewTimeout  struct{ Minimum, Maximum *float64 }
		Seq           struct{ Head, Tail, OmittedLines, OmittedBytes int }
		FileListPages int `json:"file_listPages"`
	}
	if err := json.Unmarshal([]byte(line), &sum); err != nil {
		t.Fatalf("summary: %v in %s", err, line)
	}
	for _, f := range sum.Failures {
		t.Error(f)
	}
	if sum.Tools == 0 || len(sum.Called) != sum.Tools {
		t.Errorf("called %d of %d tools: %v", len(sum.Called), sum.Tools, sum.Called)
	}
	for _, name := range []string{"sandbox_create", "command_run", "file_list", "file_search", "sandbox_kill"} {
		if !slices.Contains(sum.Called, name) {
			t.Errorf("%s not called", name)
		}
	}
	// The server's [server] min/max_sandbox_timeout, and null allowed:
	// 0 means no expiry.
	if c := sum.CreateTimeout; c.Minimum == nil || *c.Minimum != 0 || c.Maximum == nil || *c.Maximum != 86400 {
		t.Errorf("sandbox_create timeout_seconds bounds %v..%v, want 0..86400", c.Minimum, c.Maximum)
	}
	if r := sum.RenewTimeout; r.Minimum == nil || *r.Minimum != 1 || r.Maximum == nil || *r.Maximum != 86400 {
		t.Errorf("sandbox_renew timeout_seconds bounds %v..%v, want 1..86400", r.Minimum, r.Maximum)
	}
	if sum.Seq.Head == 0 || sum.Seq.Tail == 0 || sum.Seq.OmittedBytes == 0 {
		t.Errorf("seq output was not cut: %+v", sum.Seq)
	}
}
