package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// writeFile writes text to a file of its own and returns its path.
func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sandbox.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noteKeys(notes []configNote) []string {
	keys := make([]string, len(notes))
	for i, n := range notes {
		keys[i] = n.Key
	}
	return keys
}

func TestLegacyExampleDocker(t *testing.T) {
	cfg, err := loadConfig("testdata/legacy-docker.toml", false)
	if err != nil {
		t.Fatal(err)
	}
	s, d := cfg.Server, cfg.Runtime.Docker
	if s.Listen != "127.0.0.1:9090" || s.APIKey != "legacy-docker-key-0123456789" || s.LogLevel != "debug" ||
		s.MaxSandboxTimeout != 2*time.Hour || !slices.Equal(s.HostVolumeAllowlist, []string{"/srv/sandbox-data", "/tmp/legacy-share"}) {
		t.Errorf("server: %+v", s)
	}
	if cfg.Runtime.Type != "docker" || d.PublicHost != "203.0.113.7" || d.PidsLimit != 1024 || d.Network != "opensandbox" {
		t.Errorf("runtime: %s %+v", cfg.Runtime.Type, d)
	}
	// Docker's default set less the file's drops, within this server's set.
	if want := []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "NET_BIND_SERVICE", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}; !slices.Equal(d.CapAdd, want) {
		t.Errorf("capabilities %v, want %v", d.CapAdd, want)
	}
	if cfg.Egress.Mode != "dns+nft" || cfg.Egress.Image != "opensandbox/egress:latest" {
		t.Errorf("egress: %+v", cfg.Egress)
	}
	// Defaults the file does not set are those of init-config's example.
	if d.DefaultCPU != "1" || d.DefaultMemory != "2Gi" || s.MinSandboxTimeout != 60*time.Second {
		t.Errorf("defaults: %+v %+v", s, d)
	}
	want := []string{"renew_intent.enabled", "renew_intent.min_interval_seconds", "renew_intent.redis.enabled",
		"renew_intent.redis.queue_key", "renew_intent.redis.consumer_concurrency", "runtime.execd_image",
		"egress.image", "egress.disable_ipv6", "docker.api_timeout", "docker.drop_capabilities"}
	if got := noteKeys(cfg.Notes); !slices.Equal(got, want) {
		t.Errorf("notes on %v, want %v:\n%v", got, want, cfg.Notes)
	}
	for _, n := range cfg.Notes {
		if n.Key == "docker.drop_capabilities" && !strings.Contains(n.Why, "SETFCAP") {
			t.Errorf("the note on drop_capabilities does not name SETFCAP, which the file kept: %s", n)
		}
	}
}

func TestLegacyExampleKubernetes(t *testing.T) {
	cfg, err := loadConfig("testdata/legacy-k8s.toml", false)
	if err != nil {
		t.Fatal(err)
	}
	s, k := cfg.Server, cfg.Runtime.Kubernetes
	if s.Listen != "0.0.0.0:8181" || s.LogLevel != "warn" || s.MaxSandboxTimeout != 0 || len(s.HostVolumeAllowlist) != 0 {
		t.Errorf("server: %+v", s)
	}
	if cfg.Runtime.Type != "kubernetes" || k.Kubeconfig != "/etc/legacy/kubeconfig" || k.Namespace != "legacy-sandboxes" ||
		k.ExecdImage != "opensandbox/execd:latest" {
		t.Errorf("runtime: %s %+v", cfg.Runtime.Type, k)
	}
	if cfg.Egress.Mode != "dns" {
		t.Errorf("egress: %+v", cfg.Egress)
	}
	want := []string{"renew_intent.enabled", "renew_intent.min_interval_seconds", "renew_intent.redis.enabled",
		"renew_intent.redis.queue_key", "renew_intent.redis.consumer_concurrency", "runtime.execd_image",
		"kubernetes.informer_enabled", "kubernetes.informer_resync_seconds", "kubernetes.informer_watch_timeout_seconds",
		"kubernetes.workload_provider", "kubernetes.batchsandbox_template_file", "egress.image", "egress.mode"}
	if got := noteKeys(cfg.Notes); !slices.Equal(got, want) {
		t.Errorf("notes on %v, want %v", got, want)
	}
}

// Secrets of 32 bytes, base64, for the secure-access keys of the
// existing server's format.
const (
	legacySecretA = "YWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE="
	legacySecretB = "YmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmJiYmI="
)

// TestLegacyMapping: one key (or a few) at a time, what it becomes, what
// note it gives, or the error that names it.
func TestLegacyMapping(t *testing.T) {
	const key = "api_key = \"legacy-key-0123456789abc\"\n"
	tests := []struct {
		name  string
		file  string
		check func(*fileConfig) bool
		note  string // a key with a note
		err   string // part of the error
	}{
		{name: "port alone listens on all interfaces, as the existing server does",
			file:  "[server]\nport = 8000\n" + key,
			check: func(c *fileConfig) bool { return c.Server.Listen == "0.0.0.0:8000" }},
		{name: "IPv6 host", file: "[server]\nhost = \"::1\"\n" + key,
			check: func(c *fileConfig) bool { return c.Server.Listen == "[::1]:8080" }},
		{name: "no max timeout is no limit", file: "[server]\nhost = \"127.0.0.1\"\n" + key,
			check: func(c *fileConfig) bool { return c.Server.MaxSandboxTimeout == 0 }},
		{name: "log.level wins over server.log_level", file: "[server]\nlog_level = \"DEBUG\"\nport = 1\n" + key + "[log]\nlevel = \"critical\"\n",
			check: func(c *fileConfig) bool { return c.Server.LogLevel == "error" }},
		{name: "log file", file: "[server]\nport = 1\n" + key + "[log]\nfile_enabled = true\nfile_path = \"/var/log/x.log\"\n",
			note: "log.file_path"},
		{name: "host_ip is the endpoint host", file: "[server]\nport = 1\n" + key + "[docker]\nhost_ip = \"10.1.2.3\"\n",
			check: func(c *fileConfig) bool { return c.Runtime.Docker.PublicHost == "10.1.2.3" }},
		{name: "a named network is used as is", file: "[server]\nport = 1\n" + key + "[docker]\nnetwork_mode = \"sandnet\"\n",
			check: func(c *fileConfig) bool { return c.Runtime.Docker.Network == "sandnet" }},
		{name: "drop ALL", file: "[server]\nport = 1\n" + key + "[docker]\ndrop_capabilities = [\"ALL\"]\n",
			check: func(c *fileConfig) bool { return c.Runtime.Docker.CapAdd != nil && len(c.Runtime.Docker.CapAdd) == 0 }},
		{name: "drop nothing grants no more than this server's set", file: "[server]\nport = 1\n" + key + "[docker]\ndrop_capabilities = []\n",
			check: func(c *fileConfig) bool {
				return !slices.Contains(c.Runtime.Docker.CapAdd, "NET_RAW") && len(c.Runtime.Docker.CapAdd) == 10
			},
			note: "docker.drop_capabilities"},
		{name: "gVisor", file: "[server]\nport = 1\n" + key + "[secure_runtime]\ntype = \"gvisor\"\ndocker_runtime = \"runsc\"\n",
			check: func(c *fileConfig) bool { return c.Runtime.Docker.Runtime == "runsc" }},
		{name: "kata adds its runtime to the allowed ones", file: "[server]\nport = 1\n" + key + "[secure_runtime]\ntype = \"kata\"\ndocker_runtime = \"kata-runtime\"\n",
			check: func(c *fileConfig) bool {
				return c.Runtime.Docker.Runtime == "kata-runtime" && slices.Contains(c.Runtime.Docker.AllowedRuntimes, "kata-runtime")
			}},
		{name: "runtime class on kubernetes", file: "[server]\nport = 1\n" + key + "[runtime]\ntype = \"kubernetes\"\n[secure_runtime]\ntype = \"gvisor\"\nk8s_runtime_class = \"gvisor\"\n[kubernetes]\nservice_account = \"sb\"\nimage_pull_policy = \"Always\"\nsandbox_create_timeout_seconds = 90\n",
			check: func(c *fileConfig) bool {
				k := c.Runtime.Kubernetes
				return k.RuntimeClassName == "gvisor" && k.ServiceAccount == "sb" && k.ImagePullPolicy == "Always" && k.StartTimeout == 90*time.Second
			}},
		{name: "docker keys on kubernetes", file: "[server]\nport = 1\n" + key + "[runtime]\ntype = \"kubernetes\"\n[docker]\npids_limit = 5\n",
			note: "docker.pids_limit"},
		{name: "gateway ingress, wildcard", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\n[ingress.gateway]\naddress = \"*.example.com\"\nroute.mode = \"wildcard\"\n",
			check: func(c *fileConfig) bool {
				in := c.Ingress
				return in.Mode == "gateway" && in.RouteMode == "wildcard" && in.Domain == "example.com" && in.Address == "" && in.keys == nil
			}},
		{name: "gateway ingress, header", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"gw.example.com:8443\"\ngateway.route.mode = \"header\"\n",
			check: func(c *fileConfig) bool {
				return c.Ingress.Mode == "gateway" && c.Ingress.RouteMode == "header" && c.Ingress.Address == "gw.example.com:8443"
			}},
		{name: "secure access keys, the active one first", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"gw.example.com\"\ngateway.route.mode = \"uri\"\n" +
			"[ingress.secure_access]\nactive_key = \"b\"\nkeys = [{key_id = \"a\", key = \"" + legacySecretA + "\"}, {key_id = \"b\", key = \"" + legacySecretB + "\"}]\n",
			check: func(c *fileConfig) bool {
				return c.Ingress.RouteMode == "uri" && c.Ingress.keys.IDs() == "ba" &&
					slices.Equal(c.Ingress.SigningKeys, []string{"b:" + legacySecretB, "a:" + legacySecretA})
			},
			note: "ingress.secure_access.keys"},
		{name: "store", file: "[server]\nport = 1\n" + key + "[store]\ntype = \"sqlite\"\npath = \"/var/lib/x.db\"\n",
			note: "store.path"},
		{name: "only a legacy-only table", file: "[docker]\npids_limit = 100\n[server]\n" + key,
			check: func(c *fileConfig) bool {
				return c.Runtime.Docker.PidsLimit == 100 && c.Server.Listen == "127.0.0.1:8080"
			}},

		{name: "no key", file: "[server]\nport = 1\n", err: "no API key"},
		{name: "unknown key", file: "[server]\nport = 1\n" + key + "[docker]\nnetwork_mod = \"bridge\"\n", err: "unknown keys: docker.network_mod"},
		{name: "podman", file: "[server]\nport = 1\n" + key + "[runtime]\ntype = \"podman\"\n", err: "runtime.type"},
		{name: "bad port", file: "[server]\nport = 70000\n" + key, err: "server.port"},
		{name: "short timeout", file: "[server]\nport = 1\nmax_sandbox_timeout_seconds = 30\n" + key, err: "server.max_sandbox_timeout_seconds"},
		{name: "bad log level", file: "[server]\nport = 1\nlog_level = \"LOUD\"\n" + key, err: "server.log_level"},
		{name: "relative host path", file: "[server]\nport = 1\n" + key + "[storage]\nallowed_host_paths = [\"data\"]\n", err: "storage.allowed_host_paths"},
		{name: "host network", file: "[server]\nport = 1\n" + key + "[docker]\nnetwork_mode = \"host\"\n", err: "docker.network_mode"},
		{name: "no network", file: "[server]\nport = 1\n" + key + "[docker]\nnetwork_mode = \"none\"\n", err: "docker.network_mode"},
		{name: "another container's network", file: "[server]\nport = 1\n" + key + "[docker]\nnetwork_mode = \"container:db\"\n", err: "docker.network_mode"},
		{name: "privileges may grow", file: "[server]\nport = 1\n" + key + "[docker]\nno_new_privileges = false\n", err: "docker.no_new_privileges = false"},
		{name: "unconfined seccomp", file: "[server]\nport = 1\n" + key + "[docker]\nseccomp_profile = \"unconfined\"\n", err: "docker.seccomp_profile"},
		{name: "custom seccomp", file: "[server]\nport = 1\n" + key + "[docker]\nseccomp_profile = \"/etc/strict.json\"\n", err: "docker.seccomp_profile"},
		{name: "unconfined apparmor", file: "[server]\nport = 1\n" + key + "[docker]\napparmor_profile = \"unconfined\"\n", err: "docker.apparmor_profile"},
		{name: "custom apparmor", file: "[server]\nport = 1\n" + key + "[docker]\napparmor_profile = \"strict\"\n", err: "docker.apparmor_profile"},
		{name: "no pids", file: "[server]\nport = 1\n" + key + "[docker]\npids_limit = 0\n", err: "docker.pids_limit"},
		{name: "unknown capability", file: "[server]\nport = 1\n" + key + "[docker]\ndrop_capabilities = [\"NET_FOO\"]\n", err: "docker.drop_capabilities"},
		{name: "secure runtime without its runtime", file: "[server]\nport = 1\n" + key + "[secure_runtime]\ntype = \"gvisor\"\n", err: "secure_runtime.type"},
		{name: "firecracker on docker", file: "[server]\nport = 1\n" + key + "[secure_runtime]\ntype = \"firecracker\"\nk8s_runtime_class = \"kata-fc\"\n", err: "firecracker"},
		{name: "bad ingress mode", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"tunnel\"\n", err: "ingress.mode"},
		{name: "bad route mode", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"gw\"\ngateway.route.mode = \"path\"\n", err: "ingress.gateway.route.mode"},
		{name: "wildcard without a wildcard domain", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"example.com\"\ngateway.route.mode = \"wildcard\"\n", err: "ingress.gateway.address"},
		{name: "gateway address with a scheme", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"https://gw\"\ngateway.route.mode = \"header\"\n", err: "ingress.address"},
		{name: "a short secure access key", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"gw\"\ngateway.route.mode = \"header\"\n[ingress.secure_access]\nactive_key = \"a\"\nkeys = [{key_id = \"a\", key = \"c2hvcnQ=\"}]\n", err: "ingress.secure_access.keys[0]"},
		{name: "no active key", file: "[server]\nport = 1\n" + key + "[ingress]\nmode = \"gateway\"\ngateway.address = \"gw\"\ngateway.route.mode = \"header\"\n[ingress.secure_access]\nactive_key = \"z\"\nkeys = [{key_id = \"a\", key = \"" + legacySecretA + "\"}]\n", err: "ingress.secure_access.active_key"},
		{name: "bad egress mode", file: "[server]\nport = 1\n" + key + "[egress]\nmode = \"nft\"\n", err: "egress.mode"},
		{name: "a version key means this server's format", file: "version = 1\n[server]\nport = 1\n" + key, err: "unknown keys: server.port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(writeFile(t, tt.file), false)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil && !tt.check(cfg) {
				t.Errorf("mapped to %+v", cfg)
			}
			if tt.note != "" && !slices.Contains(noteKeys(cfg.Notes), tt.note) {
				t.Errorf("no note on %s: %v", tt.note, cfg.Notes)
			}
		})
	}
}

// TestInitConfigFrom: a converted file loads as this server's format with
// the meaning the original had, and carries the notes as comments.
func TestInitConfigFrom(t *testing.T) {
	for _, from := range []string{"testdata/legacy-docker.toml", "testdata/legacy-k8s.toml"} {
		t.Run(filepath.Base(from), func(t *testing.T) {
			want, err := loadConfig(from, false)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "new.toml")
			var stdout bytes.Buffer
			cmd := newRootCommand()
			cmd.SetOut(&stdout)
			cmd.SetArgs([]string{"init-config", out, "--from", from})
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			text, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if isLegacy(text) {
				t.Fatal("the converted file is still read as the existing server's format")
			}
			got, err := loadConfig(out, false)
			if err != nil {
				t.Fatalf("the converted file does not load: %v\n%s", err, text)
			}
			if len(got.Notes) != 0 {
				t.Errorf("the converted file gives notes: %v", got.Notes)
			}
			notes := want.Notes
			want.Notes = nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("converted file means\n%+v\nthe original\n%+v", got, want)
			}
			for _, n := range noteKeys(notes) {
				if !strings.Contains(string(text), "#   "+n+": ") {
					t.Errorf("no comment on %s in\n%s", n, text)
				}
				if !strings.Contains(stdout.String(), "note: "+n+": ") {
					t.Errorf("no note on %s printed: %s", n, stdout.String())
				}
			}
			if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
				t.Errorf("mode %o, want 600", fi.Mode().Perm())
			}
			cmd = newRootCommand()
			cmd.SetArgs([]string{"init-config", out, "--from", from})
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--force") {
				t.Errorf("overwrite without --force: %v", err)
			}
		})
	}
}

// TestInitConfigFromNoKey: a file with no API key gets a fresh one, and a
// file in this server's format is not converted.
func TestInitConfigFromNoKey(t *testing.T) {
	from := writeFile(t, "[server]\nhost = \"127.0.0.1\"\nport = 8080\n")
	out := filepath.Join(t.TempDir(), "new.toml")
	notes, err := writeConverted(out, from, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(noteKeys(notes), "server.api_key") {
		t.Errorf("no note on the new key: %v", notes)
	}
	cfg, err := loadConfig(out, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Server.APIKey) < 40 {
		t.Errorf("api key %q", cfg.Server.APIKey)
	}
	if _, err := writeConverted(filepath.Join(t.TempDir(), "x.toml"), out, false); err == nil {
		t.Error("a file in this server's format was converted")
	}
}

// FuzzLoadConfig: no input makes the loader panic, and whatever a file in
// the existing server's format loads as, its conversion loads as the same.
func FuzzLoadConfig(f *testing.F) {
	for _, p := range []string{"testdata/legacy-docker.toml", "testdata/legacy-k8s.toml"} {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(strings.Replace(exampleDocker, "{{KEY}}", "fuzz-key-0123456789abcdef", 1)))
	f.Add([]byte("[docker]\ndrop_capabilities = [\"ALL\"]\n[server]\napi_key = \"0123456789abcdef0\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "in.toml")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(p, false)
		if err != nil || !isLegacy(data) {
			return
		}
		text, _, err := convertLegacy(data, "")
		if err != nil {
			t.Fatalf("loaded, but does not convert: %v", err)
		}
		out := filepath.Join(dir, "out.toml")
		if err := os.WriteFile(out, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := loadConfig(out, false)
		if err != nil {
			t.Fatalf("the conversion does not load: %v\n%s", err, text)
		}
		cfg.Notes = nil
		if !reflect.DeepEqual(got, cfg) {
			t.Fatalf("the conversion means\n%+v\nthe original\n%+v", got, cfg)
		}
	})
}

// lockedBuffer is a bytes.Buffer safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestLegacyConfigServes starts the server on Docker with the existing
// server's example file and asks its API, with the file's key and without.
func TestLegacyConfigServes(t *testing.T) {
	testenv.MustHaveDocker(t)
	var logs lockedBuffer
	ready := make(chan net.Addr, 1)
	m := &Main{ConfigPath: "testdata/legacy-docker.toml", Listen: "127.0.0.1:0", Ready: ready,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	// The file's data directory and scope would be the host's default
	// ones: the test keeps its own. No sandbox is created, so the execd
	// binary only has to be an executable file.
	d := &m.Config.Runtime.Docker
	d.DataDir = t.TempDir()
	d.LabelScope = "legacy-test-" + strconv.Itoa(os.Getpid())
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d.ExecdPath = self
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("the server stopped: %v\n%s", err, logs.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server did not start:\n%s", logs.String())
	}
	for _, tc := range []struct {
		key  string
		want int
	}{{"legacy-docker-key-0123456789", http.StatusOK}, {"", http.StatusUnauthorized}, {"wrong-key-0123456789", http.StatusUnauthorized}} {
		req, _ := http.NewRequest("GET", "http://"+addr.String()+"/v1/sandboxes", nil)
		if tc.key != "" {
			req.Header.Set(api.HeaderAPIKey, tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET /v1/sandboxes with key %q: %d, want %d", tc.key, resp.StatusCode, tc.want)
		}
	}
	for _, k := range []string{"runtime.execd_image", "docker.api_timeout", "renew_intent.enabled"} {
		if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "key="+k+" ") {
			t.Errorf("no warning on %s in the log", k)
		}
	}
}
