package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/egress"
)

func TestConfigFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}
	c, err := configFromEnv(env(map[string]string{}))
	if err != nil || c.Mode != egress.ModeStrict || c.APIAddr != ":18080" || c.MaxRules != egress.DefaultMaxRules ||
		c.Initial.Mode() != egress.PolicyDenyAll {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	c, err = configFromEnv(env(map[string]string{
		"OPENSANDBOX_EGRESS_RULES":         `{"defaultAction":"allow","egress":[{"action":"deny","target":"a.test"}]}`,
		"OPENSANDBOX_EGRESS_MODE":          "dns+nft",
		"OPENSANDBOX_EGRESS_MAX_RULES":     "0",
		"OPENSANDBOX_EGRESS_DNS_UPSTREAMS": "192.0.2.53, 192.0.2.54:5353,[2001:db8::53]:53",
		"OPENSANDBOX_EGRESS_ALWAYS_DENY":   "10.0.0.0/8",
		"OPENSANDBOX_EGRESS_ALWAYS_ALLOW":  "otel.internal.test",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != egress.ModeDNSNft || c.MaxRules != 0 || len(c.Initial.Egress) != 1 ||
		!slices.Equal(c.Upstreams, []string{"192.0.2.53:53", "192.0.2.54:5353", "[2001:db8::53]:53"}) ||
		!slices.Equal(c.Overlay.Deny, []string{"10.0.0.0/8"}) || !slices.Equal(c.Overlay.Allow, []string{"otel.internal.test"}) {
		t.Fatalf("read %+v", c)
	}
	for name, kv := range map[string]map[string]string{
		"bad mode":       {"OPENSANDBOX_EGRESS_MODE": "nft"},
		"bad rules":      {"OPENSANDBOX_EGRESS_RULES": `{"egress":[{"action":"block","target":"a.test"}]}`},
		"bad max rules":  {"OPENSANDBOX_EGRESS_MAX_RULES": "-1"},
		"bad upstream":   {"OPENSANDBOX_EGRESS_DNS_UPSTREAMS": "dns.example"},
		"bad always":     {"OPENSANDBOX_EGRESS_ALWAYS_DENY": "bad..name"},
		"not JSON rules": {"OPENSANDBOX_EGRESS_RULES": `{`},
	} {
		if _, err := configFromEnv(env(kv)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestFirewallConfig(t *testing.T) {
	p, err := egress.ParsePolicy([]byte(`{"defaultAction":"allow","egress":[
		{"action":"allow","target":"10.1.2.3"},
		{"action":"deny","target":"203.0.113.0/24"},
		{"action":"allow","target":"203.0.113.7"},
		{"action":"allow","target":"a.test"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	ns := []netip.Addr{netip.MustParseAddr("192.0.2.53")}
	c := firewallConfig(egress.ModeDNSNft, egress.Overlay{Deny: []string{"198.51.100.0/24"}}, p, ns)
	str := func(ps []netip.Prefix) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.String())
		}
		return strings.Join(out, " ")
	}
	if got := str(c.AllowPrefixes); got != "10.1.2.3/32" {
		t.Errorf("allow %s: the address shadowed by the earlier deny range must be left out", got)
	}
	deny := str(c.DenyPrefixes)
	if !strings.HasPrefix(deny, "198.51.100.0/24 203.0.113.0/24 ") || strings.Contains(deny, "10.0.0.0/8") ||
		!strings.Contains(deny, "169.254.0.0/16") || !strings.Contains(deny, "127.0.0.0/8") {
		t.Errorf("deny %s: want the overlay, the rule, and the special ranges but 10/8 (an allow rule reaches into it)", deny)
	}
	if !c.DefaultAllow || c.Mode != egress.ModeDNSNft || !slices.Equal(c.Nameservers, ns) {
		t.Errorf("%+v", c)
	}
	p.DefaultAction = egress.ActionDeny
	if c := firewallConfig(egress.ModeStrict, egress.Overlay{}, p, ns); c.DefaultAllow || strings.Contains(str(c.DenyPrefixes), "169.254") {
		t.Errorf("default deny: %+v; the special ranges are denied by default already", c)
	}
}

func TestVaultConfigFromEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) string {
		return func(k string) string { return kv[k] }
	}
	key := strings.Repeat("k", 32)
	c, err := configFromEnv(env(map[string]string{
		"OPENSANDBOX_EGRESS_MITMPROXY_TRANSPARENT": "True",
		"OPENSANDBOX_EGRESS_VAULT_KEY":             "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=",
		"OPENSANDBOX_EGRESS_VAULT_PLAIN_PEERS":     "172.17.0.1, 10.0.0.0/8",
		"OPENSANDBOX_EGRESS_VAULT_REDACT_BYTES":    "-1",
		"OPENSANDBOX_EGRESS_CA_DIR":                "/ca",
	}))
	if err != nil {
		t.Fatal(err)
	}
	v := c.Vault
	if !v.Enabled || v.Insecure || v.AllowHTTP || string(v.Key) != key || v.RedactBytes != -1 || v.CADir != "/ca" ||
		!slices.Equal(v.PlainPeers, []netip.Prefix{netip.MustParsePrefix("172.17.0.1/32"), netip.MustParsePrefix("10.0.0.0/8")}) ||
		c.StateDir != "/var/lib/osb-egress" {
		t.Fatalf("read %+v", c)
	}
	for name, kv := range map[string]map[string]string{
		"short key":       {"OPENSANDBOX_EGRESS_VAULT_KEY": "a2V5"},
		"bad peer":        {"OPENSANDBOX_EGRESS_VAULT_PLAIN_PEERS": "gateway"},
		"bad redact":      {"OPENSANDBOX_EGRESS_VAULT_REDACT_BYTES": "-2"},
		"bad upstream CA": {"OPENSANDBOX_EGRESS_UPSTREAM_CA": "not PEM"},
		"not strict":      {"OPENSANDBOX_EGRESS_MITMPROXY_TRANSPARENT": "1", "OPENSANDBOX_EGRESS_MODE": "dns"},
	} {
		if _, err := configFromEnv(env(kv)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
