package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// egressStandIn is a STAND-IN for the egress sidecar's policy API, not
// the sidecar: this product has no egress sidecar yet, so the test runs
// this small Python server inside a real sandbox on port 18080, where the
// sidecar would listen. It keeps the policy in memory and enforces
// nothing; it implements GET, PUT/POST, PATCH and DELETE /policy as
// /work/shared/protocol/egress.md §2-4 describe them (mode derivation,
// PATCH merge order, idempotent DELETE, plain-text errors), and requires
// the OPENSANDBOX-EGRESS-AUTH header only when it is given a token, which
// the test does only if the server's endpoint for port 18080 carries one.
const egressStandIn = `
import json, os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = os.environ.get("OPENSANDBOX_EGRESS_TOKEN", "")
LOCK = threading.Lock()
POLICY = {"defaultAction": "deny", "egress": []}

class Bad(Exception):
    pass

def mode():
    if POLICY["egress"]:
        return "enforcing"
    return "allow_all" if POLICY["defaultAction"] == "allow" else "deny_all"

def action(a):
    a = (a or "").strip().lower() or "deny"
    if a not in ("allow", "deny"):
        raise Bad('invalid policy: unsupported action "%s"' % a)
    return a

def rule(r):
    if not isinstance(r, dict):
        raise Bad("invalid policy: a rule must be an object")
    t = (r.get("target") or "").strip()
    if not t:
        raise Bad("invalid policy: empty target")
    return {"action": action(r.get("action")), "target": t}

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body):
        if isinstance(body, str):
            data, ctype = (body + "\n").encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(body).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_policy(self, change):
        if self.path != "/policy":
            return self.reply(404, "404 page not found")
        if TOKEN and self.headers.get("OPENSANDBOX-EGRESS-AUTH") != TOKEN:
            return self.reply(401, "unauthorized")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).strip()
        try:
            with LOCK:
                code, body = change(raw)
        except (Bad, ValueError) as e:
            return self.reply(400, str(e))
        self.reply(code, body)

    def do_GET(self):
        def get(raw):
            return 200, {"status": "ok", "mode": mode(), "enforcementMode": "dns", "policy": POLICY}
        self.handle_policy(get)

    def do_PUT(self):
        def put(raw):
            global POLICY
            if not raw:
                POLICY = {"defaultAction": "deny", "egress": []}
                return 200, {"status": "ok", "mode": "deny_all", "reason": "policy reset to default deny-all"}
            p = json.loads(raw) or {}
            POLICY = {"defaultAction": action(p.get("defaultAction")), "egress": [rule(r) for r in p.get("egress") or []]}
            return 200, {"status": "ok", "mode": mode(), "enforcementMode": "dns"}
        self.handle_policy(put)

    do_POST = do_PUT

    def do_PATCH(self):
        def patch(raw):
            rules = json.loads(raw or b"null")
            if not isinstance(rules, list) or not rules:
                raise Bad("invalid policy: want a non-empty array of rules")
            merged, seen = [], set()
            for r in map(rule, rules):
                if r["target"].lower() not in seen:
                    seen.add(r["target"].lower())
                    merged.append(r)
            merged += [r for r in POLICY["egress"] if r["target"].lower() not in seen]
            POLICY["egress"] = merged
            return 200, {"status": "ok", "mode": mode(), "enforcementMode": "dns"}
        self.handle_policy(patch)

    def do_DELETE(self):
        def delete(raw):
            targets = json.loads(raw or b"null")
            if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
                raise Bad("invalid request: want a non-empty array of targets")
            gone = {t.strip().lower() for t in targets}
            keep = [r for r in POLICY["egress"] if r["target"].lower() not in gone]
            body = {"status": "ok", "mode": "", "enforcementMode": "dns"}
            if len(keep) == len(POLICY["egress"]):
                body["reason"] = "no matching targets found"
            POLICY["egress"] = keep
            body["mode"] = mode()
            return 200, body
        self.handle_policy(delete)

ThreadingHTTPServer(("0.0.0.0", 18080), Handler).serve_forever()
`

// TestOSBEgress drives osb egress get, patch, delete and set through the
// real server's endpoint resolution and execd's port proxy, to the
// stand-in policy API above running inside a real sandbox.
func TestOSBEgress(t *testing.T) {
	s := startServer(t, serverOptions{})
	testenv.MustHaveImage(t, pythonImage)
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", pythonImage, "-t", "10m", "-o", "json").json(t, &c)
	id := c.ID

	// Nothing listens on 18080 yet: one clear line, exit 1.
	s.osb("egress", "get", id).fails(t, 1, "nothing answers on port 18080")
	s.osb("egress", "patch", id, "--rule", "allow=pypi.org").fails(t, 1, "no egress policy API")

	// Start the stand-in, with the token the endpoint asks for, if any.
	var ep struct{ Headers map[string]string }
	s.osb("sandbox", "endpoint", id, "-p", "18080", "-o", "json").json(t, &ep)
	token := ""
	for k, v := range ep.Headers {
		if http.CanonicalHeaderKey(k) == http.CanonicalHeaderKey("OPENSANDBOX-EGRESS-AUTH") {
			token = v
		}
	}
	sb := s.execd(id)
	sb.mustRun("cat > /tmp/egress-standin.py <<'EOF'\n" + egressStandIn + "\nEOF\n" +
		"OPENSANDBOX_EGRESS_TOKEN='" + token + "' setsid nohup python3 /tmp/egress-standin.py >/tmp/egress-standin.log 2>&1 < /dev/null &\n" +
		`python3 - <<'EOF'
import socket, time
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", 18080), 1).close()
        break
    except OSError:
        time.sleep(0.05)
else:
    raise SystemExit("the stand-in does not listen: " + open("/tmp/egress-standin.log").read())
EOF`)

	type rule struct{ Action, Target string }
	var pol struct {
		Mode            string
		EnforcementMode string `json:"enforcement_mode"`
		DefaultAction   string `json:"default_action"`
		Egress          []rule
	}
	r := s.osb("egress", "get", id, "-o", "json")
	r.json(t, &pol)
	if pol.Mode != "deny_all" || pol.EnforcementMode != "dns" || pol.DefaultAction != "deny" || pol.Egress == nil || len(pol.Egress) != 0 {
		t.Errorf("get of the initial policy: %+v\n%s", pol, r.out)
	}
	if !strings.Contains(r.out, `"egress": []`) {
		t.Errorf("an empty rule list is not []:\n%s", r.out)
	}
	// The same through the server's proxy route.
	if out := s.osb("--use-server-proxy", "egress", "get", id, "-o", "json").ok(t); out != r.out {
		t.Errorf("get through the server: %s, direct: %s", out, r.out)
	}

	// Patch: actions in any case, spaces trimmed; a second patch takes
	// precedence and replaces the rule for the same target.
	var patched struct {
		SandboxID    string `json:"sandbox_id"`
		PatchedRules []rule `json:"patched_rules"`
		Mode         string
	}
	s.osb("egress", "patch", id, "--rule", "allow=pypi.org", "--rule", " DENY = *.evil.example ", "-o", "json").json(t, &patched)
	if patched.SandboxID != id || patched.Mode != "enforcing" || len(patched.PatchedRules) != 2 || patched.PatchedRules[1] != (rule{"deny", "*.evil.example"}) {
		t.Errorf("patch: %+v", patched)
	}
	out := s.osb("egress", "patch", id, "--rule", "deny=pypi.org", "--rule", "allow=10.0.0.0/8").ok(t)
	if !strings.Contains(out, "Egress Policy Patched") || !strings.Contains(out, "deny pypi.org, allow 10.0.0.0/8") {
		t.Errorf("patch (table):\n%s", out)
	}
	s.osb("egress", "get", id, "-o", "json").json(t, &pol)
	want := []rule{{"deny", "pypi.org"}, {"allow", "10.0.0.0/8"}, {"deny", "*.evil.example"}}
	if pol.Mode != "enforcing" || !equalRules(pol.Egress, want) {
		t.Errorf("after two patches: %+v, want rules %v", pol, want)
	}
	out = s.osb("egress", "get", id).ok(t)
	for _, w := range []string{"Egress Policy", "enforcing", "default_action", "1  deny    pypi.org", "3  deny    *.evil.example"} {
		if !strings.Contains(out, w) {
			t.Errorf("get (table) lacks %q:\n%s", w, out)
		}
	}
	var y map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("egress", "get", id, "-o", "yaml").ok(t)), &y); err != nil || y["enforcement_mode"] != "dns" || len(y["egress"].([]any)) != 3 {
		t.Errorf("get (yaml): %v %v", y, err)
	}

	// Delete: matching in any case; deleting what is not there succeeds
	// and says so.
	var deleted struct {
		Targets []string `json:"deleted_targets"`
		Mode    string
		Reason  *string
	}
	s.osb("egress", "delete", id, "PyPI.org", "-o", "json").json(t, &deleted)
	if deleted.Mode != "enforcing" || deleted.Reason != nil || len(deleted.Targets) != 1 {
		t.Errorf("delete: %+v", deleted)
	}
	s.osb("egress", "delete", id, "pypi.org", "-o", "json").json(t, &deleted)
	if deleted.Reason == nil || *deleted.Reason != "no matching targets found" {
		t.Errorf("delete of a missing target: %+v", deleted)
	}
	if out := s.osb("egress", "delete", id, "nothing.example", "-o", "yaml").ok(t); !strings.Contains(out, "reason: no matching targets found") {
		t.Errorf("delete (yaml): %s", out)
	}

	// Set from a file, then from stdin with get's own JSON edited.
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.json")
	os.WriteFile(file, []byte(`{"defaultAction": "Allow", "egress": [{"action": "deny", "target": "blocked.example"}]}`), 0o644)
	if out := s.osb("egress", "set", id, "--file", file).ok(t); !strings.Contains(out, "Egress Policy Set") || !strings.Contains(out, "deny blocked.example") {
		t.Errorf("set (table):\n%s", out)
	}
	s.osb("egress", "get", id, "-o", "json").json(t, &pol)
	if pol.DefaultAction != "allow" || !equalRules(pol.Egress, []rule{{"deny", "blocked.example"}}) {
		t.Errorf("after set: %+v", pol)
	}
	doc := strings.Replace(s.osb("egress", "get", id, "-o", "json").ok(t), `"blocked.example"`, `"other.example"`, 1)
	var set struct {
		DefaultAction string `json:"default_action"`
		Mode          string
	}
	s.osbIn(strings.NewReader(doc), "", "egress", "set", id, "-f", "-", "-o", "json").json(t, &set)
	s.osb("egress", "get", id, "-o", "json").json(t, &pol)
	if set.Mode != "enforcing" || set.DefaultAction != "allow" || !equalRules(pol.Egress, []rule{{"deny", "other.example"}}) {
		t.Errorf("set from get's JSON: %+v, then %+v", set, pol)
	}
	os.WriteFile(file, []byte(`{"default_action": "deny"}`), 0o644)
	s.osb("egress", "set", id, "--file", file, "-o", "json").json(t, &set)
	if set.Mode != "deny_all" {
		t.Errorf("set to deny everything: %+v", set)
	}

	// Bad input.
	s.osb("egress", "patch", id, "--rule", "pypi.org").fails(t, 2, `invalid rule "pypi.org": use ACTION=TARGET`)
	s.osb("egress", "patch", id, "--rule", "block=pypi.org").fails(t, 2, `invalid rule action "block"`)
	s.osb("egress", "patch", id, "--rule", "allow=").fails(t, 2, "invalid rule")
	s.osb("egress", "patch", id).fails(t, 2, "--rule")
	s.osb("egress", "delete", id).fails(t, 2, "requires at least 2 arg(s)")
	s.osb("egress", "set", id).fails(t, 2, "--file is required")
	os.WriteFile(file, []byte(`{"defaultAction": "deny", "egress": [{"action": "block", "target": "x"}]}`), 0o644)
	s.osb("egress", "set", id, "--file", file).fails(t, 1, `egress[0]: action "block": want allow or deny`)
	os.WriteFile(file, []byte(`{"defaultAction": "deny", "rules": []}`), 0o644)
	s.osb("egress", "set", id, "--file", file).fails(t, 1, `unknown field "rules"`)
	s.osb("egress", "set", id, "--file", filepath.Join(dir, "missing.json")).fails(t, 1, "missing.json")
	s.osb("egress", "get", id, "-o", "raw").fails(t, 1, "does not offer -o raw")
	r = s.osb("egress", "get", "no-such-sandbox")
	r.fails(t, 1, "SANDBOX_NOT_FOUND")
	r.fails(t, 1, "request_id=")
}

func equalRules[R comparable](got, want []R) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestOSBDiagnostics reads the logs and events of a sandbox whose
// entrypoint prints known lines, in every output format.
func TestOSBDiagnostics(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "-t", "10m",
		"--entrypoint", "sh", "--entrypoint", "-c", "--entrypoint", "echo diag-line-one; echo diag-line-two >&2; exec sleep 1000",
		"-o", "json").json(t, &c)
	id := c.ID

	// The default is raw, scope container: the content as it is.
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r := s.osb("diagnostics", "logs", id)
		out = r.ok(t)
		if strings.Contains(out, "diag-line-two") || time.Now().After(deadline) {
			if r.err != "" {
				t.Errorf("logs (raw) wrote to stderr: %q", r.err)
			}
			break
		}
	}
	if !strings.Contains(out, "diag-line-one\n") || !strings.Contains(out, "diag-line-two\n") || !strings.HasSuffix(out, "\n") || strings.HasSuffix(out, "\n\n") {
		t.Errorf("logs (raw):\n%q", out)
	}

	var d struct {
		SandboxID     string `json:"sandbox_id"`
		Kind, Scope   string
		Delivery      string
		ContentType   string `json:"content_type"`
		Truncated     bool
		Content       *string
		ContentURL    *string `json:"content_url"`
		ContentLength *int64  `json:"content_length"`
		Warnings      []string
	}
	r := s.osb("diagnostics", "logs", id, "-o", "json")
	r.json(t, &d)
	if d.SandboxID != id || d.Kind != "logs" || d.Scope != "container" || d.Delivery != "inline" || d.Truncated ||
		d.Content == nil || !strings.Contains(*d.Content, "diag-line-one") || d.ContentLength == nil || *d.ContentLength != int64(len(*d.Content)) ||
		d.ContentURL != nil || d.Warnings == nil || !strings.HasPrefix(d.ContentType, "text/plain") {
		t.Errorf("logs (json): %+v\n%s", d, r.out)
	}
	var y map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("diagnostics", "logs", id, "--scope", "all", "-o", "yaml").ok(t)), &y); err != nil ||
		y["scope"] != "all" || !strings.Contains(y["content"].(string), "== lifecycle ==") || !strings.Contains(y["content"].(string), "diag-line-two") {
		t.Errorf("logs --scope all (yaml): %v %v", y, err)
	}
	out = s.osb("diagnostics", "logs", id, "-o", "table").ok(t)
	for _, w := range []string{"Diagnostic Logs", "scope:", "container", "truncated:", "false", "diag-line-one"} {
		if !strings.Contains(out, w) {
			t.Errorf("logs (table) lacks %q:\n%s", w, out)
		}
	}

	// Events: the default scope is runtime; lifecycle has the create.
	s.osb("diagnostics", "events", id, "-o", "json").json(t, &d)
	if d.Kind != "events" || d.Scope != "runtime" || d.Content == nil {
		t.Errorf("events (json): %+v", d)
	}
	out = s.osb("diagnostics", "events", id, "-s", "lifecycle").ok(t)
	if !strings.Contains(out, "lifecycle") || strings.Count(out, "\n") < 1 {
		t.Errorf("events -s lifecycle (raw):\n%s", out)
	}
	out = s.osb("diagnostics", "events", id, "--scope", "all", "-o", "table").ok(t)
	if !strings.Contains(out, "Diagnostic Events") || !strings.Contains(out, "scope:") {
		t.Errorf("events (table):\n%s", out)
	}

	// Bad input.
	r = s.osb("diagnostics", "logs", id, "-s", "kernel")
	r.fails(t, 1, "INVALID_SCOPE")
	r.fails(t, 1, "request_id=")
	s.osb("diagnostics", "events", id, "-s", "").fails(t, 2, "--scope must not be empty")
	r = s.osb("diagnostics", "logs", "no-such-sandbox")
	r.fails(t, 1, "SANDBOX_NOT_FOUND")
	r.fails(t, 1, "request_id=")
	s.osb("diagnostics", "logs").fails(t, 2, "accepts 1 arg(s)")
}

// TestOSBSnapshot snapshots a sandbox with a file written in it, waits for
// the snapshot, creates a sandbox from it and finds the file there.
func TestOSBSnapshot(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "-t", "10m", "-o", "json").json(t, &c)
	s.execd(c.ID).mustRun("echo kept-by-the-snapshot > /root/kept")

	var snap struct {
		ID, Status string
		SandboxID  string  `json:"sandbox_id"`
		Name       *string `json:"name"`
	}
	s.osb("snapshot", "create", c.ID, "--name", "e2e-snap", "--wait", "-o", "json").json(t, &snap)
	if snap.ID == "" || snap.SandboxID != c.ID || snap.Status != "Ready" || snap.Name == nil || *snap.Name != "e2e-snap" {
		t.Fatalf("snapshot create --wait: %+v", snap)
	}

	// A second one, not waited for: table output, no name.
	out := s.osb("snapshot", "create", c.ID).ok(t)
	if !strings.Contains(out, "Snapshot Created") || !strings.Contains(out, c.ID) {
		t.Errorf("snapshot create (table):\n%s", out)
	}

	var got struct {
		ID        string
		SandboxID string `json:"sandbox_id"`
		Name      *string
		Status    struct {
			State            string
			Reason, Message  *string
			LastTransitionAt *time.Time `json:"last_transition_at"`
		}
		CreatedAt time.Time `json:"created_at"`
	}
	s.osb("snapshot", "get", snap.ID, "-o", "json").json(t, &got)
	if got.ID != snap.ID || got.SandboxID != c.ID || got.Status.State != "Ready" || got.CreatedAt.IsZero() {
		t.Errorf("snapshot get (json): %+v", got)
	}
	out = s.osb("snapshot", "get", snap.ID).ok(t)
	for _, w := range []string{"Snapshot Info", snap.ID, "e2e-snap", "Ready"} {
		if !strings.Contains(out, w) {
			t.Errorf("snapshot get (table) lacks %q:\n%s", w, out)
		}
	}
	var y map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("snapshot", "get", snap.ID, "-o", "yaml").ok(t)), &y); err != nil || y["sandbox_id"] != c.ID {
		t.Errorf("snapshot get (yaml): %v %v", y, err)
	}

	// The round trip: a sandbox from the snapshot has the file.
	var restored struct {
		ID         string
		SnapshotID string `json:"snapshot_id"`
	}
	s.osb("sandbox", "create", "--snapshot-id", snap.ID, "-t", "10m", "-o", "json").json(t, &restored)
	if restored.SnapshotID != snap.ID {
		t.Errorf("create from the snapshot: %+v", restored)
	}
	if got := s.execd(restored.ID).mustRun("cat /root/kept"); got != "kept-by-the-snapshot" {
		t.Errorf("the restored sandbox has %q", got)
	}

	// List: by sandbox, by state, paged.
	var list struct {
		Items []struct {
			ID     string
			Status struct{ State string }
		}
		Pagination struct {
			Page        int
			PageSize    int  `json:"page_size"`
			TotalItems  int  `json:"total_items"`
			HasNextPage bool `json:"has_next_page"`
		}
	}
	s.osb("snapshot", "list", "--sandbox-id", c.ID, "-o", "json").json(t, &list)
	if len(list.Items) != 2 || list.Pagination.TotalItems != 2 {
		t.Errorf("snapshot list --sandbox-id: %+v", list)
	}
	s.osb("snapshot", "list", "--sandbox-id", c.ID, "--state", "ready", "--page-size", "1", "-o", "json").json(t, &list)
	if list.Pagination.PageSize != 1 || len(list.Items) != 1 || list.Items[0].Status.State != "Ready" {
		t.Errorf("snapshot list --state ready --page-size 1: %+v", list)
	}
	out = s.osb("snapshot", "list", "--sandbox-id", c.ID).ok(t)
	for _, w := range []string{"Snapshots", "SANDBOX_ID", snap.ID, "e2e-snap"} {
		if !strings.Contains(out, w) {
			t.Errorf("snapshot list (table) lacks %q:\n%s", w, out)
		}
	}
	if out := s.osb("snapshot", "list", "--sandbox-id", "no-such-sandbox").ok(t); !strings.Contains(out, "No snapshots found.") {
		t.Errorf("empty list: %q", out)
	}
	if out := s.osb("snapshot", "list", "--sandbox-id", "no-such-sandbox", "-o", "yaml").ok(t); !strings.Contains(out, "items: []") {
		t.Errorf("empty list (yaml): %q", out)
	}

	// Delete; then it is gone.
	if out := s.osb("snapshot", "delete", snap.ID).ok(t); !strings.Contains(out, "Snapshot deleted: "+snap.ID) {
		t.Errorf("snapshot delete: %q", out)
	}
	// Bad input.
	r := s.osb("snapshot", "get", snap.ID)
	r.fails(t, 1, api.CodeSnapshotNotFound)
	r.fails(t, 1, "request_id=")
	s.osb("snapshot", "delete", "no-such-snapshot").fails(t, 1, api.CodeSnapshotNotFound)
	s.osb("snapshot", "create", "no-such-sandbox").fails(t, 1, "SANDBOX_NOT_FOUND")
	s.osb("sandbox", "create", "--snapshot-id", "no-such-snapshot").fails(t, 1, api.CodeSnapshotNotFound)
	s.osb("snapshot", "list", "--page", "0").fails(t, 2, "at least 1")
	s.osb("snapshot", "create", c.ID, "--name", "").fails(t, 2, "--name must not be empty")
	s.osb("snapshot", "get").fails(t, 2, "accepts 1 arg(s)")
}

// TestOSBVersion checks osb version against a server built, like osb,
// with the version stamped as make build stamps it, and against a server
// that is down.
func TestOSBVersion(t *testing.T) {
	s := startServer(t, serverOptions{})

	// The binaries of the package are built without a version: "dev".
	var v struct {
		Client struct{ Version string }
		Server *struct {
			Version *string
			URL     string
			Status  string
		}
	}
	s.osb("version", "-o", "json").json(t, &v)
	if v.Client.Version == "" || v.Server == nil || v.Server.Version == nil || *v.Server.Version != "dev" ||
		v.Server.URL != "http://"+s.listen || v.Server.Status != "healthy" {
		t.Errorf("version (json): %+v", v)
	}
	if out := s.osb("--version").ok(t); out != "osb "+v.Client.Version+"\n" {
		t.Errorf("--version says %q, version says %q", out, v.Client.Version)
	}

	// Built as the Makefile builds them.
	const stamp = "v0.0.0-e2e-stamp"
	dir := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/",
		"-ldflags", "-X github.com/opensandbox/opensandbox/cli.Version="+stamp+" -X main.version="+stamp,
		"./cmd/osb", "./cmd/opensandbox-server", "./cmd/execd")
	build.Dir = filepath.Dir(filepath.Dir(file))
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	s.stop(syscall.SIGTERM)
	srv := exec.Command(filepath.Join(dir, "opensandbox-server"), "--config", s.config)
	srv.Env = append(os.Environ(), "OPENSANDBOX_SERVER_API_KEY=")
	logs := &syncBuffer{}
	srv.Stdout, srv.Stderr = logs, logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { srv.Wait(); close(exited) }()
	t.Cleanup(func() { srv.Process.Kill(); <-exited })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(s.base + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("the stamped server exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stamped server does not answer:\n%s", logs.String())
		}
	}
	stamped := func(args ...string) osbResult {
		cmd := exec.Command(filepath.Join(dir, "osb"), args...)
		cmd.Env = s.osbEnv(t.TempDir())
		var r osbResult
		r.args = args
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			r.code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				r.code = ee.ExitCode()
			}
		}
		r.out, r.err = out.String(), errb.String()
		return r
	}
	want := "osb version " + stamp + "\nserver version " + stamp + " (at http://" + s.listen + ")\n"
	if out := stamped("version").ok(t); out != want {
		t.Errorf("version (table) = %q, want %q", out, want)
	}
	if out := stamped("--version").ok(t); out != "osb "+stamp+"\n" {
		t.Errorf("--version = %q", out)
	}
	var raw map[string]map[string]any
	if err := json.Unmarshal([]byte(stamped("version", "-o", "json").ok(t)), &raw); err != nil ||
		raw["client"]["version"] != stamp || raw["server"]["version"] != stamp || raw["server"]["status"] != "healthy" {
		t.Errorf("version (json): %v %v", raw, err)
	}
	if out := stamped("version", "-o", "yaml").ok(t); !strings.Contains(out, "client:\n  version: "+stamp) {
		t.Errorf("version (yaml):\n%s", out)
	}

	// A server that is down: osb's version still, the failure on stderr.
	r := stamped("--domain", "127.0.0.1:1", "version")
	if r.code != 1 || r.out != "osb version "+stamp+"\n" || !strings.HasPrefix(r.err, "Error: the server at http://127.0.0.1:1 is unreachable") || strings.Count(r.err, "\n") != 1 {
		t.Errorf("version with the server down: exit %d, stdout %q, stderr %q", r.code, r.out, r.err)
	}
	r = stamped("--domain", "127.0.0.1:1", "version", "-o", "json")
	if r.code != 1 || !strings.Contains(r.out, `"server": null`) || !strings.Contains(r.out, stamp) || !strings.Contains(r.err, "unreachable") {
		t.Errorf("version -o json with the server down: exit %d, stdout %q, stderr %q", r.code, r.out, r.err)
	}
	stamped("version", "extra").fails(t, 2, "unknown command")
}

// TestOSBCompletion checks the completion script and the completion of
// sandbox and snapshot ids.
func TestOSBCompletion(t *testing.T) {
	s := startServer(t, serverOptions{})
	script := s.osb("completion", "bash").ok(t)
	check := exec.Command("bash", "-n")
	check.Stdin = strings.NewReader(script)
	if out, err := check.CombinedOutput(); err != nil || !strings.Contains(script, "__start_osb") {
		t.Fatalf("bash -n on the completion script: %v\n%s", err, out)
	}
	for _, sh := range []string{"zsh", "fish", "powershell"} {
		if out := s.osb("completion", sh).ok(t); len(out) < 100 {
			t.Errorf("completion %s: %q", sh, out)
		}
	}

	id := createQuick(t, s)
	other := createQuick(t, s)
	for _, args := range [][]string{
		{"sandbox", "get", ""},
		{"sandbox", "kill", other, ""},
		{"egress", "get", ""},
		{"diagnostics", "logs", ""},
		{"snapshot", "create", id[:4]},
	} {
		out := s.osb(append([]string{"__complete"}, args...)...).ok(t)
		if !strings.Contains(out, id+"\t"+busyboxImage+"\n") || !strings.HasSuffix(out, ":4\n") {
			t.Errorf("__complete %q:\n%s", args, out)
		}
		if args[1] == "kill" && strings.Contains(out, other+"\t") {
			t.Errorf("__complete %q offers an id already given:\n%s", args, out)
		}
	}
	// Only the first argument is a sandbox id.
	if out := s.osb("__complete", "sandbox", "get", id, "").ok(t); strings.Contains(out, id) {
		t.Errorf("second argument completed with ids:\n%s", out)
	}
	// A server that is down, or a broken configuration: no ids, no error.
	r := s.osb("--domain", "127.0.0.1:1", "__complete", "sandbox", "get", "")
	if r.ok(t) != ":4\n" || strings.Contains(r.err, "Error") {
		t.Errorf("__complete with the server down: %q %q", r.out, r.err)
	}
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".opensandbox"), 0o755)
	os.WriteFile(filepath.Join(home, ".opensandbox", "config.toml"), []byte("[connection\n"), 0o600)
	if r := s.osbIn(nil, home, "__complete", "sandbox", "get", ""); r.ok(t) != ":4\n" {
		t.Errorf("__complete with a broken config: %q %q", r.out, r.err)
	}
	s.osbIn(nil, home, "completion", "bash").ok(t)
}
