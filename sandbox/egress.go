package sandbox

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// EgressConfig is the server's [egress] section: how the outbound policy
// of a sandbox created with a networkPolicy is enforced. Runtimes start
// osb-egress beside such a sandbox with these settings;
// docs/configuration.md documents every key.
type EgressConfig struct {
	// Image is the osb-egress image. Default "opensandbox/egress:latest".
	Image string `toml:"image"`
	// Mode is the enforcement mode: "strict" (default), "dns+nft" or
	// "dns" (docs/egress.md says what each stops).
	Mode string `toml:"mode"`
	// DNSUpstreams are the name servers osb-egress forwards allowed
	// names to ("192.0.2.53" or "192.0.2.53:53"). Default: the ones the
	// sandbox's network gives it (its resolv.conf).
	DNSUpstreams []string `toml:"dns_upstreams"`
	// AlwaysDeny and AlwaysAllow are the platform operator's targets
	// (names, "*.suffix", addresses or ranges), applied before every
	// sandbox's own rules, deny first. Sandboxes cannot see or change
	// them.
	AlwaysDeny  []string `toml:"always_deny"`
	AlwaysAllow []string `toml:"always_allow"`
	// MaxRules caps the rules of one sandbox's policy. Default 4096; -1:
	// no cap.
	MaxRules int `toml:"max_rules"`
	// DefaultPolicy is the policy (JSON, as networkPolicy) of a sandbox
	// created without one. Empty (the default): such a sandbox has no
	// policy and no osb-egress.
	DefaultPolicy string `toml:"default_policy"`

	// The credential vault (docs/credential-vault.md).

	// VaultKeyFile holds the key that seals each sandbox's vault at rest
	// (32 bytes, raw or base64). Each sandbox's sealing key is derived
	// from it and the sandbox's ID. Default on Docker: a key generated
	// on first start in the runtime's data directory; on Kubernetes: a
	// random key per sandbox, kept in the sandbox's Secret.
	VaultKeyFile string `toml:"vault_key_file"`
	// VaultAllowHTTP lets bindings name the http scheme: the credential
	// then crosses the network in clear text. Off by default.
	VaultAllowHTTP bool `toml:"vault_allow_http"`
	// VaultPlainPeers are address ranges from which vault writes are
	// accepted over plain HTTP (besides loopback, and on Docker the
	// network's gateway when ports are published on a loopback address).
	VaultPlainPeers []string `toml:"vault_plain_peers"`
	// UpstreamCAFile is a PEM bundle of roots the intercepting proxy
	// trusts for upstream servers besides the system roots.
	UpstreamCAFile string `toml:"upstream_ca_file"`
	// VaultRedactBodyBytes bounds the response body bytes searched for
	// secrets (text types only). 0: 1 MiB; -1: body redaction off
	// (headers are always redacted).
	VaultRedactBodyBytes int64 `toml:"vault_redact_body_bytes"`

	// vaultKey is the key read from VaultKeyFile (LoadVaultKey).
	vaultKey []byte
	// upstreamCA is the content of UpstreamCAFile.
	upstreamCA []byte
}

// The enforcement modes of EgressConfig.Mode.
const (
	EgressStrict = "strict"
	EgressDNSNft = "dns+nft"
	EgressDNS    = "dns"
)

// SetDefaults fills in the defaults of the keys left empty.
func (c *EgressConfig) SetDefaults() {
	if c.Image == "" {
		c.Image = "opensandbox/egress:latest"
	}
	if c.Mode == "" {
		c.Mode = EgressStrict
	}
	if c.MaxRules == 0 {
		c.MaxRules = 4096
	}
}

// RuleCap is the rule cap as osb-egress reads it: 0 for none.
func (c *EgressConfig) RuleCap() int {
	if c.MaxRules < 0 {
		return 0
	}
	return c.MaxRules
}

// Validate checks the keys, naming the one at fault. The targets of the
// always lists and the default policy are checked by the egress package,
// where their syntax lives.
func (c *EgressConfig) Validate() error {
	switch c.Mode {
	case EgressStrict, EgressDNSNft, EgressDNS:
	default:
		return fmt.Errorf("egress.mode: %q is not strict, dns+nft or dns", c.Mode)
	}
	for _, p := range c.VaultPlainPeers {
		if _, err := parsePeer(p); err != nil {
			return fmt.Errorf("egress.vault_plain_peers: %w", err)
		}
	}
	if c.VaultRedactBodyBytes < -1 {
		return fmt.Errorf("egress.vault_redact_body_bytes: %d: want a size, 0 for the default, or -1 for off", c.VaultRedactBodyBytes)
	}
	if c.MaxRules < -1 {
		return fmt.Errorf("egress.max_rules: %d: want a count, or -1 for no cap", c.MaxRules)
	}
	for _, u := range c.DNSUpstreams {
		host := u
		if h, _, err := net.SplitHostPort(u); err == nil {
			host = h
		}
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("egress.dns_upstreams: %q is not an address or address:port", u)
		}
	}
	return nil
}

// parsePeer reads an address or a range of VaultPlainPeers.
func parsePeer(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or a range", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// LoadVaultFiles reads VaultKeyFile and UpstreamCAFile. With no key file
// set and defaultKeyFile not empty, the key is read from defaultKeyFile,
// which is made (mode 0600, a fresh random key) when missing. With
// neither, sandboxes get random keys (SandboxVaultKey).
func (c *EgressConfig) LoadVaultFiles(defaultKeyFile string) error {
	if c.UpstreamCAFile != "" {
		data, err := os.ReadFile(c.UpstreamCAFile)
		if err != nil {
			return fmt.Errorf("egress.upstream_ca_file: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(data) {
			return fmt.Errorf("egress.upstream_ca_file: %s holds no PEM certificate", c.UpstreamCAFile)
		}
		c.upstreamCA = data
	}
	path := c.VaultKeyFile
	if path == "" && defaultKeyFile != "" {
		path = defaultKeyFile
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			if err := writeNewKey(path); err != nil {
				return fmt.Errorf("vault key: %w", err)
			}
		}
	}
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("egress.vault_key_file: %w", err)
	}
	key, err := parseKey(data)
	if err != nil {
		return fmt.Errorf("egress.vault_key_file %s: %w", path, err)
	}
	c.vaultKey = key
	return nil
}

// writeNewKey makes a key file with a fresh random key, base64, mode
// 0600; an existing file is left alone.
func writeNewKey(path string) error {
	key := make([]byte, 32)
	rand.Read(key)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return nil
	} else if err != nil {
		return err
	}
	if _, err := f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// parseKey reads a 32-byte key, raw or base64 (standard or URL, padded
// or not), surrounding white space ignored.
func parseKey(data []byte) ([]byte, error) {
	if len(data) == 32 {
		return data, nil
	}
	s := strings.TrimSpace(string(data))
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil && len(k) == 32 {
			return k, nil
		}
	}
	return nil, errors.New("want 32 bytes, raw or base64")
}

// SandboxVaultKey is the key that seals sandbox id's vault, base64: derived
// from the server's vault key and the ID (HKDF-SHA256), or random when the
// server has no key (the runtime then keeps it with the sandbox).
func (c *EgressConfig) SandboxVaultKey(id ID) (string, error) {
	if c.vaultKey == nil {
		key := make([]byte, 32)
		rand.Read(key)
		return base64.StdEncoding.EncodeToString(key), nil
	}
	key, err := hkdf.Key(sha256.New, c.vaultKey, nil, "opensandbox vault "+string(id), 32)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(key), nil
}

// PlainPeers are VaultPlainPeers, parsed (Validate has checked them).
func (c *EgressConfig) PlainPeers() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range c.VaultPlainPeers {
		if p, err := parsePeer(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// UpstreamCA is the content of UpstreamCAFile, nil when none.
func (c *EgressConfig) UpstreamCA() []byte { return c.upstreamCA }

// Where a sandbox with the credential proxy finds the CA of its
// intercepting proxy: the directory, the CA alone, and a bundle of the
// system roots with the CA appended.
const (
	CredentialCADir    = "/etc/opensandbox/egress"
	CredentialCAFile   = CredentialCADir + "/ca.pem"
	CredentialCABundle = CredentialCADir + "/bundle.pem"
)

// CredentialCAEnv is the environment of a sandbox with the credential
// proxy: what points common TLS clients at the bundle (OpenSSL, Python
// requests, curl, git) and Node.js at the extra CA.
func CredentialCAEnv() []string {
	return []string{
		"SSL_CERT_FILE=" + CredentialCABundle,
		"REQUESTS_CA_BUNDLE=" + CredentialCABundle,
		"CURL_CA_BUNDLE=" + CredentialCABundle,
		"GIT_SSL_CAINFO=" + CredentialCABundle,
		"NODE_EXTRA_CA_CERTS=" + CredentialCAFile,
	}
}

// The environment osb-egress reads for the credential proxy, beside the
// contract's OPENSANDBOX_EGRESS_* of egress.md §6.
const (
	EnvEgressMITM        = "OPENSANDBOX_EGRESS_MITMPROXY_TRANSPARENT"
	EnvEgressVaultKey    = "OPENSANDBOX_EGRESS_VAULT_KEY"
	EnvEgressPlainPeers  = "OPENSANDBOX_EGRESS_VAULT_PLAIN_PEERS"
	EnvEgressAllowHTTP   = "OPENSANDBOX_EGRESS_VAULT_ALLOW_HTTP"
	EnvEgressRedactBytes = "OPENSANDBOX_EGRESS_VAULT_REDACT_BYTES"
	EnvEgressUpstreamCA  = "OPENSANDBOX_EGRESS_UPSTREAM_CA"
	EnvEgressCADir       = "OPENSANDBOX_EGRESS_CA_DIR"
	EnvEgressStateDir    = "OPENSANDBOX_EGRESS_STATE_DIR"
)

// CredentialProxyEnv is what osb-egress gets ("NAME=value") for a sandbox
// with the credential proxy: key seals its vault (SandboxVaultKey), and
// extraPeers are the runtime's own peers for plain-HTTP vault writes.
func (c *EgressConfig) CredentialProxyEnv(key string, extraPeers []netip.Prefix) []string {
	env := []string{EnvEgressMITM + "=true", EnvEgressVaultKey + "=" + key}
	var peers []string
	for _, p := range append(c.PlainPeers(), extraPeers...) {
		peers = append(peers, p.String())
	}
	if len(peers) > 0 {
		env = append(env, EnvEgressPlainPeers+"="+strings.Join(peers, ","))
	}
	if c.VaultAllowHTTP {
		env = append(env, EnvEgressAllowHTTP+"=true")
	}
	if c.VaultRedactBodyBytes != 0 {
		env = append(env, fmt.Sprintf("%s=%d", EnvEgressRedactBytes, c.VaultRedactBodyBytes))
	}
	if len(c.upstreamCA) > 0 {
		env = append(env, EnvEgressUpstreamCA+"="+string(c.upstreamCA))
	}
	return env
}
