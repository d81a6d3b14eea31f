package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/ingress"
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

// TestIngressConfig: [ingress] keys, their defaults, and an error naming
// the key for each way they cannot work.
func TestIngressConfig(t *testing.T) {
	head := "version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\n[ingress]\n"
	keyA, err := ingress.GenerateKey('a')
	if err != nil {
		t.Fatal(err)
	}
	keyB, _ := ingress.GenerateKey('b')
	keyFile := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keyFile, []byte("# signing first\n"+keyB+"\n\n"+keyA+"\n"), 0o600)
	emptyFile := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(emptyFile, []byte("# none yet\n"), 0o600)
	certFile, keyPEM := writeTestCert(t)

	ok := []struct {
		name, text string
		check      func(c *ingressConfig) bool
	}{
		{"defaults", "", func(c *ingressConfig) bool { return c.Mode == "direct" && c.RouteMode == "header" && c.keys == nil }},
		{"header", `mode = "gateway"` + "\naddress = \"gw.example.test:8443\"\nsigning_keys = [\"" + keyA + "\"]\n",
			func(c *ingressConfig) bool { return c.Address == "gw.example.test:8443" && c.keys.IDs() == "a" }},
		{"address from listen", `mode = "gateway"` + "\nroute_mode = \"uri\"\nlisten = \"127.0.0.1:8081\"\n",
			func(c *ingressConfig) bool { return c.Address == "127.0.0.1:8081" }},
		{"wildcard domain", `mode = "gateway"` + "\nroute_mode = \"wildcard\"\ndomain = \"*.sb.example.test\"\nlisten = \":8081\"\n",
			func(c *ingressConfig) bool { return c.Domain == "sb.example.test" && c.Address == "" }},
		{"key file", `mode = "gateway"` + "\naddress = \"gw\"\nsigning_keys_file = \"" + keyFile + "\"\n",
			func(c *ingressConfig) bool { return c.keys.IDs() == "ba" }},
		{"keys without a gateway sign nothing but are checked", "signing_keys = [\"" + keyA + "\"]\n",
			func(c *ingressConfig) bool { return c.Mode == "direct" }},
		{"tls", `mode = "gateway"` + "\nlisten = \"127.0.0.1:8443\"\ntls_cert = \"" + certFile + "\"\ntls_key = \"" + keyPEM + "\"\n",
			func(c *ingressConfig) bool { return c.TLSCert != "" }},
	}
	for _, tt := range ok {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadConfig(writeConfig(t, head+tt.text), false)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(&cfg.Ingress) {
				t.Fatalf("ingress %+v", cfg.Ingress)
			}
		})
	}

	bad := []struct{ name, text, want string }{
		{"bad mode", `mode = "tunnel"`, "ingress.mode"},
		{"listen without a gateway", `listen = "127.0.0.1:8081"`, "ingress.listen"},
		{"address without a gateway", `address = "gw"`, "ingress.address"},
		{"bad route mode", "mode = \"gateway\"\naddress = \"gw\"\nroute_mode = \"path\"", "ingress.route_mode"},
		{"no address", `mode = "gateway"`, "ingress.address"},
		{"address with a scheme", "mode = \"gateway\"\naddress = \"https://gw\"", "ingress.address"},
		{"address with a path", "mode = \"gateway\"\naddress = \"gw/x\"", "ingress.address"},
		{"no domain", "mode = \"gateway\"\nroute_mode = \"wildcard\"", "ingress.domain"},
		{"listen on every address, no address", "mode = \"gateway\"\nlisten = \"0.0.0.0:8081\"", "ingress.address"},
		{"bad listen", "mode = \"gateway\"\naddress = \"gw\"\nlisten = \"8081\"", "ingress.listen"},
		{"bad key", "mode = \"gateway\"\naddress = \"gw\"\nsigning_keys = [\"a:c2hvcnQ=\"]", "ingress.signing_keys[0]"},
		{"key without id", "mode = \"gateway\"\naddress = \"gw\"\nsigning_keys = [\"c2hvcnQ=\"]", "ingress.signing_keys[0]"},
		{"one id twice", "mode = \"gateway\"\naddress = \"gw\"\nsigning_keys = [\"" + keyA + "\", \"" + keyA + "\"]", "ingress.signing_keys"},
		{"keys twice", "mode = \"gateway\"\naddress = \"gw\"\nsigning_keys = [\"" + keyA + "\"]\nsigning_keys_file = \"" + keyFile + "\"", "ingress.signing_keys_file"},
		{"missing key file", "mode = \"gateway\"\naddress = \"gw\"\nsigning_keys_file = \"/nonexistent/keys\"", "ingress.signing_keys_file"},
		{"empty key file", "mode = \"gateway\"\naddress = \"gw\"\nsigning_keys_file = \"" + emptyFile + "\"", "ingress.signing_keys_file"},
		{"cert without key", "mode = \"gateway\"\nlisten = \"127.0.0.1:8443\"\ntls_cert = \"" + certFile + "\"", "ingress.tls_key"},
		{"tls without listen", "mode = \"gateway\"\naddress = \"gw\"\ntls_cert = \"" + certFile + "\"\ntls_key = \"" + keyPEM + "\"", "ingress.listen"},
		{"unreadable cert", "mode = \"gateway\"\nlisten = \"127.0.0.1:8443\"\ntls_cert = \"/nonexistent\"\ntls_key = \"" + keyPEM + "\"", "ingress.tls_cert"},
		{"unknown key", "mode = \"gateway\"\naddress = \"gw\"\nroute = \"uri\"", "unknown keys: ingress.route"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(writeConfig(t, head+tt.text+"\n"), false)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("loadConfig: %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// TestExampleGatewayHint: the one-machine gateway the example describes
// loads once its lines are set as the comment says.
func TestExampleGatewayHint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandbox.toml")
	if err := writeExample(path, "docker", false); err != nil {
		t.Fatal(err)
	}
	key, _ := ingress.GenerateKey('a')
	text, _ := os.ReadFile(path)
	s := string(text)
	for old, repl := range map[string]string{
		`mode = "direct"`:       `mode = "gateway"`,
		`route_mode = "header"`: `route_mode = "uri"`,
		`listen = ""`:           `listen = "127.0.0.1:8081"`,
		`signing_keys = []`:     `signing_keys = ["` + key + `"]`,
	} {
		if !strings.Contains(s, "\n"+old+"\n") {
			t.Fatalf("the example has no line %s", old)
		}
		s = strings.Replace(s, "\n"+old+"\n", "\n"+repl+"\n", 1)
	}
	os.WriteFile(path, []byte(s), 0o600)
	cfg, err := loadConfig(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if in := cfg.Ingress; in.Mode != "gateway" || in.Address != "127.0.0.1:8081" || in.keys.IDs() != "a" {
		t.Fatalf("ingress %+v", in)
	}
}

func TestGenSigningKey(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return strings.TrimSpace(out.String()), err
	}
	a, err := run("gen-signing-key")
	if err != nil {
		t.Fatal(err)
	}
	k, err := ingress.ParseKey(a)
	if err != nil || k.ID != 'a' {
		t.Fatalf("gen-signing-key printed %q: %v", a, err)
	}
	b, err := run("gen-signing-key", "--id", "7")
	if err != nil || !strings.HasPrefix(b, "7:") || b[2:] == a[2:] {
		t.Fatalf("--id 7: %q %v", b, err)
	}
	for _, id := range []string{"A", "ab", "", "-"} {
		if _, err := run("gen-signing-key", "--id", id); err == nil {
			t.Errorf("--id %q accepted", id)
		}
	}
}

// writeTestCert writes a self-signed certificate for 127.0.0.1 and its
// key, and returns their paths.
func writeTestCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile
}

func TestPoolExtensionsConfig(t *testing.T) {
	head := "version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\n[[pools]]\nname = \"demo\"\nimage = \"python:3.11\"\npool_max = 2\nbuffer_max = 1\n"
	cfg, err := loadConfig(writeConfig(t, head+"extensions = { \"ingress.public\" = \"true\" }\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	def, err := cfg.Pools[0].definition()
	if err != nil || def.Template.Extensions["ingress.public"] != "true" {
		t.Fatalf("pool definition %+v, %v", def.Template, err)
	}
	if _, err := loadConfig(writeConfig(t, head+"extensions = { \"ingress.public\" = \"maybe\" }\n"), false); err == nil || !strings.Contains(err.Error(), "pools[0]") || !strings.Contains(err.Error(), "ingress.public") {
		t.Fatalf("a bad extension: %v", err)
	}
}

// TestKeyFileReload: a changed key file is read again; one that no
// longer reads keeps the keys in use.
func TestKeyFileReload(t *testing.T) {
	a, _ := ingress.GenerateKey('a')
	b, _ := ingress.GenerateKey('b')
	path := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(path, []byte(a+"\n"), 0o600)
	cfg, err := loadConfig(writeConfig(t, "version = 1\n[server]\napi_key = \"0123456789abcdef0123\"\n[ingress]\nmode = \"gateway\"\naddress = \"gw\"\nsigning_keys_file = \""+path+"\"\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	ks := newKeySource(&cfg.Ingress, slog.New(slog.NewTextHandler(&logs, nil)))
	if ks.Keys().IDs() != "a" {
		t.Fatalf("keys %q", ks.Keys().IDs())
	}
	ks.Reload() // unchanged: nothing read
	if strings.Contains(logs.String(), "reloaded") {
		t.Fatalf("an unchanged file was read again: %s", logs.String())
	}
	os.WriteFile(path, []byte(b+"\n"+a+"\n# rotated\n"), 0o600)
	ks.Reload()
	if ks.Keys().IDs() != "ba" || !strings.Contains(logs.String(), "reloaded") {
		t.Fatalf("after rotation: keys %q; log %s", ks.Keys().IDs(), logs.String())
	}
	tok, _ := ks.Keys().AccessToken("sb")
	if signer := cfg.Ingress.lifecycle(ks).Keys(); signer.Empty() {
		t.Fatal("the lifecycle server's keys are empty")
	} else if got, _ := signer.AccessToken("sb"); got != tok {
		t.Fatal("the lifecycle server signs with other keys than the gateway's")
	}
	os.WriteFile(path, []byte("not a key, and longer\n"), 0o600)
	ks.Reload()
	if ks.Keys().IDs() != "ba" || !strings.Contains(logs.String(), "not reloaded") {
		t.Fatalf("a broken file: keys %q; log %s", ks.Keys().IDs(), logs.String())
	}
}
