package main

import (
	"bufio"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/sandbox"
)

// config is what the worker reads from its environment.
type config struct {
	// Initial is the policy to start with when the policy file holds
	// none (OPENSANDBOX_EGRESS_RULES; empty: deny all).
	Initial egress.Policy
	// PolicyFile keeps the policy in force across restarts; "" keeps it
	// in memory only.
	PolicyFile string
	Mode       string
	Token      string
	MaxRules   int
	// APIAddr is where the egress API listens (default ":18080").
	APIAddr string
	// Upstreams are the name servers allowed names are resolved with.
	Upstreams []string
	Overlay   egress.Overlay
	// StateDir keeps the credential proxy's sealed vault and CA key.
	StateDir string
	Vault    vaultConfig
}

// vaultConfig is the credential proxy's part of the configuration.
type vaultConfig struct {
	// Enabled turns on the intercepting proxy and the vault's writes
	// (OPENSANDBOX_EGRESS_MITMPROXY_TRANSPARENT).
	Enabled bool
	// Insecure is OPENSANDBOX_EGRESS_MITMPROXY_SSL_INSECURE: upstream
	// verification is never turned off, so a truthy value keeps vault
	// writes refused (412), as the contract says.
	Insecure bool
	// Key seals the vault and the CA's key at rest; nil keeps both in
	// memory only.
	Key         []byte
	PlainPeers  []netip.Prefix
	AllowHTTP   bool
	RedactBytes int64
	// UpstreamCA are roots trusted for upstream servers besides the
	// system's (PEM).
	UpstreamCA []byte
	// CADir, when set, receives ca.pem and bundle.pem for the sandbox's
	// container (a volume they share).
	CADir string
}

// configFromEnv reads the worker's settings. A setting that cannot be
// read stops the worker: it must never run with less than it was asked
// to enforce.
func configFromEnv(getenv func(string) string) (config, error) {
	c := config{
		PolicyFile: getenv("OPENSANDBOX_EGRESS_POLICY_FILE"),
		Mode:       getenv("OPENSANDBOX_EGRESS_MODE"),
		Token:      getenv("OPENSANDBOX_EGRESS_TOKEN"),
		APIAddr:    getenv("OPENSANDBOX_EGRESS_HTTP_ADDR"),
		MaxRules:   egress.DefaultMaxRules,
	}
	var err error
	if c.Initial, err = egress.ParsePolicy([]byte(getenv("OPENSANDBOX_EGRESS_RULES"))); err != nil {
		return c, fmt.Errorf("OPENSANDBOX_EGRESS_RULES: %w", err)
	}
	switch c.Mode {
	case "":
		c.Mode = egress.ModeStrict
	case egress.ModeStrict, egress.ModeDNSNft, egress.ModeDNS:
	default:
		return c, fmt.Errorf("OPENSANDBOX_EGRESS_MODE: %q is not strict, dns+nft or dns", c.Mode)
	}
	if c.APIAddr == "" {
		c.APIAddr = ":" + strconv.Itoa(egress.APIPort)
	}
	if s := getenv("OPENSANDBOX_EGRESS_MAX_RULES"); s != "" {
		if c.MaxRules, err = strconv.Atoi(s); err != nil || c.MaxRules < 0 {
			return c, fmt.Errorf("OPENSANDBOX_EGRESS_MAX_RULES: %q is not a count", s)
		}
	}
	c.Overlay = egress.Overlay{Deny: list(getenv("OPENSANDBOX_EGRESS_ALWAYS_DENY")), Allow: list(getenv("OPENSANDBOX_EGRESS_ALWAYS_ALLOW"))}
	if _, err := egress.NewMatcher(c.Overlay, c.Initial); err != nil {
		return c, fmt.Errorf("OPENSANDBOX_EGRESS_ALWAYS_DENY/ALLOW: %w", err)
	}
	c.StateDir = getenv("OPENSANDBOX_EGRESS_STATE_DIR")
	if c.StateDir == "" {
		c.StateDir = "/var/lib/osb-egress"
	}
	if c.Vault, err = vaultFromEnv(getenv); err != nil {
		return c, err
	}
	if c.Vault.Enabled && c.Mode != egress.ModeStrict {
		return c, fmt.Errorf("OPENSANDBOX_EGRESS_MITMPROXY_TRANSPARENT: the credential proxy needs the strict mode, not %s", c.Mode)
	}
	for _, u := range list(getenv("OPENSANDBOX_EGRESS_DNS_UPSTREAMS")) {
		hp, err := hostPort53(u)
		if err != nil {
			return c, fmt.Errorf("OPENSANDBOX_EGRESS_DNS_UPSTREAMS: %w", err)
		}
		c.Upstreams = append(c.Upstreams, hp)
	}
	return c, nil
}

// list splits a comma-separated list, dropping empty items.
func list(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// hostPort53 reads "addr" or "addr:port" (IPv6 in brackets with a port)
// as an upstream name server.
func hostPort53(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.String(), nil
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	if err != nil {
		return "", fmt.Errorf("%q is not an address or address:port", s)
	}
	return net.JoinHostPort(a.String(), "53"), nil
}

// resolvConfServers are the name servers of a resolv.conf: where the
// namespace's DNS went before osb-egress took it over.
func resolvConfServers(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if hp, err := hostPort53(fields[1]); err == nil {
				out = append(out, hp)
			}
		}
	}
	return out, sc.Err()
}

// vaultFromEnv reads the credential proxy's settings.
func vaultFromEnv(getenv func(string) string) (vaultConfig, error) {
	v := vaultConfig{
		Enabled:   truthy(getenv(sandbox.EnvEgressMITM)),
		Insecure:  truthy(getenv("OPENSANDBOX_EGRESS_MITMPROXY_SSL_INSECURE")),
		AllowHTTP: truthy(getenv(sandbox.EnvEgressAllowHTTP)),
		CADir:     getenv(sandbox.EnvEgressCADir),
	}
	if s := getenv(sandbox.EnvEgressVaultKey); s != "" {
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
		if err != nil || len(key) != 32 {
			return v, fmt.Errorf("%s: want 32 bytes in base64", sandbox.EnvEgressVaultKey)
		}
		v.Key = key
	}
	for _, p := range list(getenv(sandbox.EnvEgressPlainPeers)) {
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return v, fmt.Errorf("%s: %q is not an address or a range", sandbox.EnvEgressPlainPeers, p)
			}
			pf = netip.PrefixFrom(a, a.BitLen())
		}
		v.PlainPeers = append(v.PlainPeers, pf.Masked())
	}
	if s := getenv(sandbox.EnvEgressRedactBytes); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < -1 {
			return v, fmt.Errorf("%s: %q: want a size, or -1 for off", sandbox.EnvEgressRedactBytes, s)
		}
		v.RedactBytes = n
	}
	if s := getenv(sandbox.EnvEgressUpstreamCA); s != "" {
		if !x509.NewCertPool().AppendCertsFromPEM([]byte(s)) {
			return v, fmt.Errorf("%s: no PEM certificate", sandbox.EnvEgressUpstreamCA)
		}
		v.UpstreamCA = []byte(s)
	}
	return v, nil
}

// truthy reads a boolean setting as the reference sidecar does.
func truthy(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}
