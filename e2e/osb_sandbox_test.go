package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestOSBSandbox drives every `osb sandbox` command through the real
// binary against a real server, in each output format.
func TestOSBSandbox(t *testing.T) {
	s := startServer(t, serverOptions{})

	var created struct {
		ID, Status, Timeout, Image string
		ExpiresAt                  *time.Time `json:"expires_at"`
	}
	s.osb("sandbox", "create", "-i", busyboxImage, "-t", "30m", "-e", "GREETING=hi=there", "-m", "team=e2e", "-m", "run=1", "-o", "json").json(t, &created)
	if created.ID == "" || created.Status != "running" || created.Timeout != "0:30:00" || created.Image != busyboxImage {
		t.Fatalf("create: %+v", created)
	}
	if created.ExpiresAt == nil || time.Until(*created.ExpiresAt) < 29*time.Minute {
		t.Errorf("expires_at %v, want about 30 minutes from now", created.ExpiresAt)
	}
	id := created.ID

	// Table output names the sandbox; YAML has sorted keys.
	out := s.osb("sandbox", "get", id).ok(t)
	for _, want := range []string{"Sandbox Info", id, "Running", "metadata.team", "e2e"} {
		if !strings.Contains(out, want) {
			t.Errorf("get (table) lacks %q:\n%s", want, out)
		}
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("sandbox", "get", id, "-o", "yaml").ok(t)), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["id"] != id || doc["metadata"].(map[string]any)["run"] != "1" {
		t.Errorf("get (yaml): %v", doc)
	}
	var got struct {
		Status     struct{ State string }
		Entrypoint []string
	}
	s.osb("sandbox", "get", id, "-o", "json").json(t, &got)
	if got.Status.State != "Running" || strings.Join(got.Entrypoint, " ") != "tail -f /dev/null" {
		t.Errorf("get (json): %+v", got)
	}

	// List filters by state and metadata; -s is case-insensitive.
	var list struct {
		Items      []struct{ ID string }
		Pagination struct {
			TotalItems int `json:"total_items"`
		}
	}
	s.osb("sandbox", "list", "-s", "running", "-m", "team=e2e", "-o", "json").json(t, &list)
	if len(list.Items) != 1 || list.Items[0].ID != id || list.Pagination.TotalItems != 1 {
		t.Errorf("list: %+v", list)
	}
	s.osb("sandbox", "list", "-s", "paused", "-o", "json").json(t, &list)
	if len(list.Items) != 0 {
		t.Errorf("list of paused: %+v", list)
	}
	if out := s.osb("sandbox", "list", "-m", "team=nobody").ok(t); !strings.Contains(out, "No sandboxes found.") {
		t.Errorf("empty list says %q", out)
	}
	s.osb("sandbox", "list", "-s", "sleeping").fails(t, 1, "invalid sandbox state")

	// Endpoint, health, metrics.
	var ep struct {
		Endpoint string
		Headers  map[string]string
	}
	s.osb("sandbox", "endpoint", id, "-p", execdPort, "-o", "json").json(t, &ep)
	if !strings.HasPrefix(ep.Endpoint, "127.0.0.1:") || ep.Headers["X-EXECD-ACCESS-TOKEN"] == "" {
		t.Errorf("endpoint: %+v", ep)
	}
	var health struct {
		SandboxID string `json:"sandbox_id"`
		Healthy   bool
	}
	s.osb("sandbox", "health", id, "-o", "json").json(t, &health)
	if !health.Healthy || health.SandboxID != id {
		t.Errorf("health: %+v", health)
	}
	if out := s.osb("sandbox", "health", id).ok(t); !strings.Contains(out, "is healthy") {
		t.Errorf("health (table): %q", out)
	}
	var m struct {
		CPUCount float64 `json:"cpu_count"`
		MemTotal float64 `json:"memory_total_in_mib"`
	}
	s.osb("sandbox", "metrics", id, "-o", "json").json(t, &m)
	if m.CPUCount <= 0 || m.MemTotal <= 0 {
		t.Errorf("metrics: %+v", m)
	}

	// Renew, pause and resume.
	var renewed struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	s.osb("sandbox", "renew", id, "-t", "2h", "-o", "json").json(t, &renewed)
	if d := time.Until(renewed.ExpiresAt); d < 119*time.Minute || d > 121*time.Minute {
		t.Errorf("renewed to %v from now", d)
	}
	if out := s.osb("sandbox", "pause", id).ok(t); !strings.Contains(out, "paused") {
		t.Errorf("pause: %q", out)
	}
	s.osb("sandbox", "get", id, "-o", "json").json(t, &got)
	if got.Status.State != "Paused" {
		t.Errorf("after pause: %s", got.Status.State)
	}
	s.osb("sandbox", "resume", id).ok(t)
	s.osb("sandbox", "health", id, "-o", "json").json(t, &health)
	if !health.Healthy {
		t.Error("unhealthy after resume")
	}

	// Kill several at once; a missing one fails the command but not the
	// others.
	other := createQuick(t, s)
	var killed []struct {
		SandboxID string `json:"sandbox_id"`
		Status    string
	}
	r := s.osb("sandbox", "kill", id, other, "no-such-sandbox", "-o", "json")
	if r.code != 1 || !strings.Contains(r.err, "no-such-sandbox") {
		t.Errorf("kill with a missing id: exit %d, stderr %q", r.code, r.err)
	}
	r.code = 0
	r.json(t, &killed)
	if len(killed) != 2 || killed[0].Status != "terminated" {
		t.Errorf("kill: %+v", killed)
	}
	s.osb("sandbox", "get", id).fails(t, 1, "not found")
}

// createQuick creates a sandbox without waiting for it and returns its id.
func createQuick(t *testing.T, s *server) string {
	t.Helper()
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "--skip-health-check", "-o", "json").json(t, &c)
	return c.ID
}

// TestOSBCreateOptions checks what create sends: entrypoint words,
// environment, resources, no timeout, volumes and policy files.
func TestOSBCreateOptions(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct {
		ID, Timeout string
		ExpiresAt   *time.Time `json:"expires_at"`
	}
	s.osb("sandbox", "create", "-i", busyboxImage, "--timeout", "none", "-e", "A=1", "-e", "B=x=y",
		"--resource", "cpu=500m", "--resource", "memory=256Mi",
		"--entrypoint", "sh", "--entrypoint", "-c", "--entrypoint", "echo started; exec sleep 1000",
		"--ready-timeout", "60s", "-o", "json").json(t, &c)
	defer s.osb("sandbox", "kill", c.ID)
	if c.Timeout != "manual-cleanup" || c.ExpiresAt != nil {
		t.Errorf("timeout none: %+v", c)
	}
	env := s.execd(c.ID).mustRun("echo $A $B; cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
	if !strings.HasPrefix(env, "1 x=y\n268435456") {
		t.Errorf("environment and memory limit: %q", env)
	}

	// Bad input: one clear line, no request made.
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"defaultAction": "deny", "egress": [`), 0o644)
	s.osb("sandbox", "create", "-i", busyboxImage, "-m", "novalue").fails(t, 2, `invalid --metadata "novalue": want KEY=VALUE`)
	s.osb("sandbox", "create", "-i", busyboxImage, "-t", "soon").fails(t, 2, "invalid duration")
	s.osb("sandbox", "create", "-i", busyboxImage, "--network-policy-file", bad).fails(t, 1, "bad.json: invalid JSON")
	s.osb("sandbox", "create", "-i", busyboxImage, "--volumes-file", filepath.Join(dir, "missing.json")).fails(t, 1, "missing.json")
	s.osb("sandbox", "create").fails(t, 1, "an image is required")
	s.osb("sandbox", "create", "-i", "opensandbox/no-such-image:1").fails(t, 1, "no-such-image")
}

// TestOSBConfig covers osb config and the precedence of flags over the
// environment over the file.
func TestOSBConfig(t *testing.T) {
	s := startServer(t, serverOptions{})
	home := t.TempDir()
	path := filepath.Join(home, ".opensandbox", "config.toml")

	// Without a file, the environment is used.
	var shown map[string]any
	s.osbIn(nil, home, "config", "show", "-o", "json").json(t, &shown)
	if shown["domain"] != s.listen || shown["config_file_exists"] != false || shown["request_timeout"] != float64(30) {
		t.Errorf("show without a file: %v", shown)
	}
	if k := shown["api_key"].(string); strings.Contains(k, s.key[2:len(s.key)-2]) || len(k) != len(s.key) {
		t.Errorf("api key not masked: %q", k)
	}

	s.osbIn(nil, home, "config", "init").ok(t)
	if r := s.osbIn(nil, home, "config", "init"); r.code != 0 || !strings.Contains(r.err, "already exists") {
		t.Errorf("second init: exit %d, %q", r.code, r.err)
	}
	if out := s.osbIn(nil, home, "config", "set", "connection.api_key", "sk-very-secret-key").ok(t); strings.Contains(out, "very-secret") {
		t.Errorf("config set printed the key: %q", out)
	}
	for _, kv := range [][2]string{
		{"defaults.image", busyboxImage},
		{"defaults.timeout", "45m"},
		{"connection.request_timeout", "12"},
		{"output.color", "false"},
		{"connection.api_key", `we"ird\key`},
	} {
		s.osbIn(nil, home, "config", "set", kv[0], kv[1]).ok(t)
	}
	text, _ := os.ReadFile(path)
	for _, want := range []string{`image = "opensandbox/busybox"`, `timeout = "45m"`, "request_timeout = 12", "color = false", `api_key = "we\"ird\\key"`, "# domain ="} {
		if !strings.Contains(string(text), want) {
			t.Errorf("config file lacks %q:\n%s", want, text)
		}
	}
	s.osbIn(nil, home, "config", "set", "connection.protocol", "ftp").fails(t, 1, "want http or https")
	// A key set both commented out and for real: the real line changes.
	text, _ = os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(text), "# domain = \"localhost:8080\"", "# domain = \"localhost:8080\"\ndomain = \""+s.listen+"\"", 1)), 0o600)
	s.osbIn(nil, home, "config", "set", "connection.domain", s.listen).ok(t)
	s.osbIn(nil, home, "config", "set", "nosuch.key", "1").fails(t, 1, "unknown key")
	s.osbIn(nil, home, "config", "set", "defaults.timeout", "forever").fails(t, 1, "invalid duration")

	// The environment's key wins over the file's, a flag over both.
	s.osbIn(nil, home, "config", "show", "-o", "json").json(t, &shown)
	if shown["request_timeout"] != float64(12) || shown["default_image"] != busyboxImage || shown["color"] != false {
		t.Errorf("show with a file: %v", shown)
	}
	s.osbIn(nil, home, "sandbox", "list").ok(t)
	s.osbIn(nil, home, "--api-key", "wrong-key-0123456789", "sandbox", "list").fails(t, 1, "HTTP 401")

	// defaults.image and defaults.timeout apply to create.
	var c struct{ ID, Image, Timeout string }
	s.osbIn(nil, home, "sandbox", "create", "--skip-health-check", "-o", "json").json(t, &c)
	defer s.osb("sandbox", "kill", c.ID)
	if c.Image != busyboxImage || c.Timeout != "0:45:00" {
		t.Errorf("create with config defaults: %+v", c)
	}

	// A broken file is a clear error for every command but config's own.
	os.WriteFile(path, []byte("[connection\n"), 0o600)
	s.osbIn(nil, home, "sandbox", "list").fails(t, 1, "config.toml")
	s.osbIn(nil, home, "config", "init", "--force").ok(t)
	s.osbIn(nil, home, "sandbox", "list").ok(t)
}

// TestOSBBadConnection covers a server that is down and a wrong key.
func TestOSBBadConnection(t *testing.T) {
	s := startServer(t, serverOptions{})
	s.osb("--domain", "127.0.0.1:1", "sandbox", "list").fails(t, 1, "cannot reach http://127.0.0.1:1")
	s.osb("--api-key", "nope-nope-nope-nope", "sandbox", "get", "x").fails(t, 1, "request_id=")
	s.osb("sandbox", "get", "no-such-sandbox").fails(t, 1, "SANDBOX_NOT_FOUND")
	s.osb("sandbox", "frobnicate").fails(t, 2, "unknown command")
	s.osb("frobnicate").fails(t, 2, "unknown command")
	s.osb("sandbox", "list", "--frobnicate").fails(t, 2, "unknown flag")
	s.osb("sandbox", "list", "-o", "xml").fails(t, 2, "invalid output format")
	s.osb("sandbox", "list", "-o", "raw").fails(t, 1, "does not offer -o raw")
	s.osb("--request-timeout", "0", "sandbox", "list").fails(t, 2, "must be positive")
}
