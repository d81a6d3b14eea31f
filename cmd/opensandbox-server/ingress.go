package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/lifecycle"
)

// Ingress modes of [ingress] mode.
const (
	ingressDirect  = "direct"
	ingressGateway = "gateway"
)

// ingressConfig is the [ingress] table: how clients reach sandbox ports,
// and the gateway this server may serve itself.
type ingressConfig struct {
	// Mode is "direct" (the runtime's endpoints) or "gateway" (through
	// an ingress gateway). Default "direct".
	Mode string `toml:"mode"`
	// RouteMode is how a gateway endpoint names the sandbox and port:
	// "header", "uri" or "wildcard". Default "header".
	RouteMode string `toml:"route_mode"`
	// Address is the gateway's host[:port] as clients reach it (header
	// and uri modes). Default: Listen's, when it names a host.
	Address string `toml:"address"`
	// Domain is the domain whose subdomains reach the gateway, host[:port]
	// (wildcard mode; "*.example.com" is read as "example.com").
	Domain string `toml:"domain"`
	// SigningKeys are "ID:BASE64" keys; the first signs access tokens and
	// links, all verify.
	SigningKeys []string `toml:"signing_keys"`
	// SigningKeysFile holds the keys instead, one a line; it is read
	// again when it changes, so keys rotate without a restart.
	SigningKeysFile string `toml:"signing_keys_file"`
	// Listen, when set, serves the gateway in this server on a second
	// listener.
	Listen string `toml:"listen"`
	// TLSCert and TLSKey make that listener HTTPS (HTTP/2 included).
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`

	// keys are the signing keys read from SigningKeys or SigningKeysFile
	// by validate; nil without keys.
	keys *ingress.Keys
	// addressFromListen is set when Address is Listen's: once bound, the
	// listener's address replaces it (port 0 included).
	addressFromListen bool
}

func (c *ingressConfig) setDefaults() {
	if c.Mode == "" {
		c.Mode = ingressDirect
	}
	if c.RouteMode == "" {
		c.RouteMode = lifecycle.RouteHeader
	}
	c.Domain = strings.TrimPrefix(c.Domain, "*.")
}

// validate checks the table, naming the key at fault, reads the signing
// keys, and fills in Address from Listen.
func (c *ingressConfig) validate() error {
	switch c.Mode {
	case ingressDirect:
		for key, set := range map[string]bool{"listen": c.Listen != "", "address": c.Address != "", "domain": c.Domain != ""} {
			if set {
				return fmt.Errorf("ingress.%s is set, but ingress.mode is %q: set mode = %q to use a gateway", key, c.Mode, ingressGateway)
			}
		}
	case ingressGateway:
	default:
		return fmt.Errorf("ingress.mode: %q is not %s or %s", c.Mode, ingressDirect, ingressGateway)
	}
	if len(c.SigningKeys) > 0 && c.SigningKeysFile != "" {
		return errors.New("ingress.signing_keys and ingress.signing_keys_file are both set: keep the keys in one of them")
	}
	for i, s := range c.SigningKeys {
		if _, err := ingress.ParseKey(s); err != nil {
			return fmt.Errorf("ingress.signing_keys[%d]: %v (make one with opensandbox-server gen-signing-key)", i, err)
		}
	}
	if len(c.SigningKeys) > 0 {
		keys, err := ingress.ParseKeys(c.SigningKeys)
		if err != nil {
			return fmt.Errorf("ingress.signing_keys: %v", err)
		}
		c.keys = keys
	}
	if c.SigningKeysFile != "" {
		keys, err := ingress.ReadKeysFile(c.SigningKeysFile)
		if err != nil {
			return fmt.Errorf("ingress.signing_keys_file: %v", err)
		}
		if keys.Empty() {
			return fmt.Errorf("ingress.signing_keys_file: %s holds no key", c.SigningKeysFile)
		}
		c.keys = keys
	}
	if c.Mode == ingressDirect {
		return nil
	}
	if c.Listen != "" {
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil {
			return fmt.Errorf("ingress.listen %q: want host:port (%v)", c.Listen, err)
		}
		if c.Address == "" && c.RouteMode != lifecycle.RouteWildcard {
			if host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
				return fmt.Errorf("ingress.address: required when ingress.listen (%q) listens on every address: set the host[:port] clients reach the gateway at", c.Listen)
			}
			c.Address = c.Listen
			c.addressFromListen = true
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("ingress.tls_cert and ingress.tls_key go together: set both or neither")
	}
	if c.TLSCert != "" {
		if c.Listen == "" {
			return errors.New("ingress.tls_cert is set without ingress.listen: it is for the gateway this server serves")
		}
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			return fmt.Errorf("ingress.tls_cert / ingress.tls_key: %v", err)
		}
	}
	switch c.RouteMode {
	case lifecycle.RouteHeader, lifecycle.RouteURI:
		if c.Address == "" {
			return fmt.Errorf("ingress.address: required with route_mode = %q (the gateway's host[:port] as clients reach it), or set ingress.listen", c.RouteMode)
		}
		if c.addressFromListen {
			break // the bound listener's address (its port, when 0, chosen then)
		}
		if err := lifecycle.CheckHostPort(c.Address); err != nil {
			return fmt.Errorf("ingress.address %q: %v", c.Address, err)
		}
	case lifecycle.RouteWildcard:
		if c.Domain == "" {
			return errors.New("ingress.domain: required with route_mode = \"wildcard\" (routes are {sandboxId}-{port}.{domain})")
		}
		if err := lifecycle.CheckHostPort(c.Domain); err != nil {
			return fmt.Errorf("ingress.domain %q: %v", c.Domain, err)
		}
	default:
		return fmt.Errorf("ingress.route_mode: %q is not header, uri or wildcard", c.RouteMode)
	}
	return nil
}

// lifecycle is the table as the lifecycle server takes it, signing with
// the keys of keys.
func (c *ingressConfig) lifecycle(keys *ingress.KeyFile) lifecycle.IngressConfig {
	return lifecycle.IngressConfig{
		Gateway:   c.Mode == ingressGateway,
		RouteMode: c.RouteMode,
		Address:   c.Address,
		Domain:    c.Domain,
		Keys:      func() lifecycle.IngressSigner { return keys.Keys() },
	}
}

// newKeySource keeps the signing keys: those of the configuration, or
// those of signing_keys_file, which the configuration's check has read,
// read again when the file changes (Watch).
func newKeySource(c *ingressConfig, log *slog.Logger) *ingress.KeyFile {
	ks, _ := ingress.NewKeyFile(c.SigningKeysFile, c.keys, log)
	return ks
}

// keyReloadEvery is how often a key file is looked at for changes.
const keyReloadEvery = 5 * time.Second

// gatewayServer is the ingress gateway this server serves on [ingress]
// listen: the proxy, and its health routes for requests that route
// nowhere (GET /healthz, /readyz without a route header or subdomain).
func gatewayServer(c *ingressConfig, keys *ingress.KeyFile, srv *lifecycle.Server, metrics *lifecycle.Metrics, log *slog.Logger) (*http.Server, error) {
	domain := c.Domain
	if h, _, err := net.SplitHostPort(domain); err == nil {
		domain = h
	}
	res := lifecycle.InProcessGateway{Server: srv}
	gw, err := ingress.New(ingress.Config{
		Keys:     keys.Keys,
		Resolver: res,
		Renewer:  res,
		Domain:   domain,
		Logger:   log,
		Metrics:  metrics.Registry(),
	})
	if err != nil {
		return nil, err
	}
	health := gw.Health()
	suffix := "." + strings.ToLower(domain)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.URL.Path == "/healthz" || r.URL.Path == "/readyz") && r.Header.Get(api.HeaderIngressTo) == "" &&
			r.Header.Get(api.HeaderIngressLegacy) == "" && (domain == "" || !strings.HasSuffix(strings.ToLower(hostOnly(r.Host)), suffix)) {
			health.ServeHTTP(w, r)
			return
		}
		gw.ServeHTTP(w, r)
	})
	return gw.HTTPServer(h, c.TLSCert != "", log), nil
}

// hostOnly is the host of a Host header, without its port.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}
