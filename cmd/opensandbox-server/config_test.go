package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

func TestInitConfigStartsAsIs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "sandbox.toml")
	if err := writeExample(path, "docker", false); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("config mode %o, want 600: it holds the API key", fi.Mode().Perm())
	}
	cfg, err := loadConfig(path, false)
	if err != nil {
		t.Fatalf("the written example does not load: %v", err)
	}
	if len(cfg.Server.APIKey) < 40 || cfg.Server.Listen != "127.0.0.1:8080" || cfg.Runtime.Type != "docker" ||
		cfg.Server.MaxSandboxTimeout != 24*time.Hour || cfg.Runtime.Docker.BindIP != "127.0.0.1" {
		t.Fatalf("example config: %+v", cfg)
	}
	if err := writeExample(path, "docker", false); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("overwrite without --force: %v", err)
	}
	if err := writeExample(path, "docker", true); err != nil {
		t.Fatal(err)
	}
	if err := writeExample(path, "nomad", true); err == nil {
		t.Fatal("unknown example accepted")
	}
}

func TestInitConfigKubernetes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandbox.toml")
	if err := writeExample(path, "kubernetes", false); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path, false)
	if err != nil {
		t.Fatalf("the written example does not load: %v", err)
	}
	k := cfg.Runtime.Kubernetes
	if cfg.Runtime.Type != "kubernetes" || k.ExecdImage != "opensandbox/execd:latest" || k.CPURequest != "100m" ||
		k.ScheduleTimeout != 15*time.Second || cfg.Runtime.Docker.DataDir != "" {
		t.Fatalf("example config: %+v", cfg.Runtime)
	}
	// Following the example's own hint works.
	text, _ := os.ReadFile(path)
	edited := strings.Replace(string(text), `runtime_class_name = ""`, `runtime_class_name = "gvisor"`, 1)
	os.WriteFile(path, []byte(edited), 0o600)
	if _, err := loadConfig(path, false); err != nil {
		t.Fatalf("with runtime_class_name set: %v", err)
	}
	bad := strings.Replace(string(text), `renew_deadline = "5s"`, `renew_deadline = "1s"`, 1)
	os.WriteFile(path, []byte(bad), 0o600)
	if _, err := loadConfig(path, false); err == nil || !strings.Contains(err.Error(), "renew_deadline") {
		t.Fatalf("a renew_deadline the election refuses: %v", err)
	}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(path, []byte(text), 0o600)
	return path
}

func TestLoadConfigErrors(t *testing.T) {
	key := `api_key = "0123456789abcdef0123"`
	tests := []struct {
		name, text, want string
	}{
		{"unknown key", "version = 1\n[server]\n" + key + "\nlisten_addr = \"x\"\n", "unknown keys: server.listen_addr"},
		{"no key", "version = 1\n", "no API key"},
		{"short key", "version = 1\n[server]\napi_key = \"short\"\n", "shorter than 16"},
		{"wrong version", "version = 2\n[server]\n" + key + "\n", "version = 2"},
		{"bad toml", "version = \n", "c.toml"},
		{"relative allowlist", "version = 1\n[server]\n" + key + "\nhost_volume_allowlist = [\"data\"]\n", "not an absolute path"},
		{"bad runtime", "version = 1\n[server]\n" + key + "\n[runtime]\ntype = \"lxc\"\n", "runtime.type"},
		{"bad duration", "version = 1\n[server]\n" + key + "\nmax_sandbox_timeout = \"forever\"\n", "c.toml"},
		{"star inside an extension key", "version = 1\n[server]\n" + key + "\nallowed_extensions = [\"a*b\"]\n", "server.allowed_extensions"},
		{"empty extension key", "version = 1\n[server]\n" + key + "\nallowed_extensions = [\"\"]\n", "server.allowed_extensions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(writeConfig(t, tt.text), false)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("loadConfig: %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := loadConfig(filepath.Join(t.TempDir(), "missing.toml"), false); err == nil || !strings.Contains(err.Error(), "init-config") {
		t.Fatalf("missing config: %v", err)
	}
}

func TestRefusalOptions(t *testing.T) {
	cfg, err := loadConfig(writeConfig(t, "version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\nallowed_extensions = [\"team.*\", \"billing\"]\nallow_local_registries = true\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	if s := cfg.Server; len(s.AllowedExtensions) != 2 || s.AllowedExtensions[0] != "team.*" || !s.AllowLocalRegistries {
		t.Fatalf("server config %+v", s)
	}
}

func TestLoadConfigKeySources(t *testing.T) {
	path := writeConfig(t, "version = 1\n")
	if _, err := loadConfig(path, false); !errors.Is(err, errNoAPIKey) {
		t.Fatalf("no key: %v", err)
	}
	cfg, err := loadConfig(path, true)
	if err != nil || !cfg.Server.Insecure {
		t.Fatalf("--insecure: %+v, %v", cfg, err)
	}
	t.Setenv(envAPIKey, "from-the-environment-0123")
	if cfg, err := loadConfig(path, false); err != nil || cfg.Server.APIKey != "from-the-environment-0123" {
		t.Fatalf("key from the environment: %v", err)
	}
}

func TestFindConfig(t *testing.T) {
	if p, _ := findConfig("/x.toml"); p != "/x.toml" {
		t.Fatal("--config not first")
	}
	t.Setenv(envConfigPath, "/env.toml")
	if p, _ := findConfig(""); p != "/env.toml" {
		t.Fatal("SANDBOX_CONFIG_PATH not second")
	}
	t.Setenv(envConfigPath, "")
	t.Setenv("HOME", "/home/someone")
	if p, _ := findConfig(""); p != "/home/someone/.sandbox.toml" {
		t.Fatalf("default: %s", p)
	}
}

func TestGenKey(t *testing.T) {
	a, b := genKey(), genKey()
	if a == b || len(a) != 43 {
		t.Fatalf("keys %q %q", a, b)
	}
}

func TestAllowlistMayNotHoldTheDataDir(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	os.MkdirAll(filepath.Join(data, "mounts"), 0o700)
	os.Symlink(filepath.Join(data, "mounts"), filepath.Join(tmp, "link-in"))
	os.Symlink(tmp, filepath.Join(tmp, "link-above"))
	for _, entry := range []string{
		"/var/lib",                               // above the default data dir
		tmp,                                      // above
		data,                                     // the data dir itself
		filepath.Join(data, "mounts"),            // inside: the volume pins' staging paths
		filepath.Join(tmp, "link-in"),            // inside, through a link
		filepath.Join(tmp, "link-above", "data"), // the data dir, through a link
		filepath.Join(tmp, "later"),              // above a data dir not made yet, through a link
	} {
		dataDir := data
		switch entry {
		case "/var/lib":
			dataDir = ""
		case filepath.Join(tmp, "later"):
			// The data dir does not exist yet; its parent is a link
			// into the entry.
			os.MkdirAll(entry, 0o755)
			os.Symlink(entry, filepath.Join(tmp, "to-later"))
			dataDir = filepath.Join(tmp, "to-later", "state")
		}
		text := fmt.Sprintf("version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\nhost_volume_allowlist = [%q]\n", entry)
		if dataDir != "" {
			text += fmt.Sprintf("[runtime.docker]\ndata_dir = %q\n", dataDir)
		}
		if _, err := loadConfig(writeConfig(t, text), false); err == nil || !strings.Contains(err.Error(), "tokens") {
			t.Errorf("allowlist entry %s with data dir %s: %v", entry, data, err)
		}
	}
	text := fmt.Sprintf("version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\nhost_volume_allowlist = [%q]\n[runtime.docker]\ndata_dir = %q\n", filepath.Join(tmp, "data-other"), data)
	if _, err := loadConfig(writeConfig(t, text), false); err != nil {
		t.Errorf("a sibling of the data dir: %v", err)
	}
}

func TestMetricsAuthConfig(t *testing.T) {
	key := "version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\n"
	for text, want := range map[string]bool{
		key:                            true,
		key + "metrics_auth = true\n":  true,
		key + "metrics_auth = false\n": false,
	} {
		cfg, err := loadConfig(writeConfig(t, text), false)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if got := *cfg.Server.MetricsAuth; got != want {
			t.Errorf("%q: metrics_auth %v, want %v", text, got, want)
		}
	}
}

// TestExampleNetworkDefaults: the examples spell out the runtimes'
// default blocked ranges, so they must say the same.
func TestExampleNetworkDefaults(t *testing.T) {
	for _, rt := range []string{"docker", "kubernetes"} {
		path := filepath.Join(t.TempDir(), "sandbox.toml")
		if err := writeExample(path, rt, false); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(path, false)
		if err != nil {
			t.Fatal(err)
		}
		blocked := cfg.Runtime.Docker.BlockedCIDRs
		if rt == "kubernetes" {
			blocked = cfg.Runtime.Kubernetes.BlockedCIDRs
		}
		if !slices.Equal(blocked, sandbox.DefaultBlockedCIDRs) {
			t.Errorf("%s example: blocked_cidrs = %q, the default is %q", rt, blocked, sandbox.DefaultBlockedCIDRs)
		}
	}
}
