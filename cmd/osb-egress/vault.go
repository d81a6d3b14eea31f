package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/egress/mitm"
	"github.com/opensandbox/opensandbox/egress/vault"
)

// The credential proxy's files in the state directory. The CA's
// certificate is public; its key and the vault are sealed with the
// sandbox's vault key.
const (
	caCertFile  = "ca.pem"
	caKeyFile   = "ca.key.sealed"
	vaultFile   = "vault.sealed"
	caLifetime  = 30 * 24 * time.Hour
	caKeyAAD    = "opensandbox egress CA key"
	vaultAAD    = "opensandbox credential vault"
	systemRoots = "/etc/ssl/certs/ca-certificates.crt"
)

// caRoute serves the CA certificate to the lifecycle server, which
// installs it into the sandbox's container (with the egress token).
const caRoute = "/credential-proxy/ca.pem"

// vaultSetup is the credential proxy of a sandbox that has it.
type vaultSetup struct {
	live        vault.Live
	ca          *mitm.CA
	interceptor *mitm.Interceptor
	handler     http.Handler
	deny        func(egress.Denial)
}

// setupVault loads the sealed vault and CA (making the CA on the first
// start), writes the CA for the sandbox's container when asked, and
// builds the interceptor; dial opens its upstream connections (the
// transparent proxy's DialName). Without the credential proxy only the
// vault's API is made, which refuses every write with 412.
func setupVault(cfg config, live *egress.Live, deny func(egress.Denial), dial func(context.Context, string, uint16) (net.Conn, error),
	ready func() error, log *slog.Logger) (*vaultSetup, error) {
	v := &vaultSetup{deny: deny}
	hcfg := vault.HandlerConfig{
		Token:       cfg.Token,
		Enabled:     cfg.Vault.Enabled && !cfg.Vault.Insecure,
		Ready:       ready,
		AllowHTTP:   cfg.Vault.AllowHTTP,
		HostAllowed: func(host string) error { return live.Load().BindingHostAllowed(host) },
		PlainPeers:  cfg.Vault.PlainPeers,
		Live:        &v.live,
		Logger:      log,
	}
	if cfg.Vault.Insecure {
		log.Warn("OPENSANDBOX_EGRESS_MITMPROXY_SSL_INSECURE is set: upstream verification is never turned off, so the credential vault refuses writes")
	}
	if cfg.Vault.Enabled {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
		ca, err := loadOrMakeCA(cfg.StateDir, cfg.Vault.Key)
		if err != nil {
			return nil, fmt.Errorf("credential proxy CA: %w", err)
		}
		v.ca = ca
		if cfg.Vault.Key != nil {
			store := &vault.FileStore{Path: filepath.Join(cfg.StateDir, vaultFile), Key: cfg.Vault.Key, AAD: vaultAAD}
			loaded, ok, err := store.Load()
			if err != nil {
				return nil, fmt.Errorf("credential vault: %w", err)
			}
			if ok {
				v.live.Store(loaded)
			}
			hcfg.Store = store
		} else {
			log.Warn("no vault key: the credential vault is kept in memory only and lost when osb-egress restarts")
		}
		if cfg.Vault.CADir != "" {
			if err := writeCAFiles(cfg.Vault.CADir, ca.CertPEM()); err != nil {
				return nil, fmt.Errorf("credential proxy CA: %w", err)
			}
		}
		roots, err := upstreamRoots(cfg.Vault.UpstreamCA)
		if err != nil {
			return nil, err
		}
		v.interceptor, err = mitm.New(mitm.Config{
			CA:              ca,
			Binder:          v.live.Binder,
			Dial:            dial,
			RootCAs:         roots,
			RedactBodyBytes: cfg.Vault.RedactBytes,
			Event:           deny,
			Logger:          log,
		})
		if err != nil {
			return nil, err
		}
	}
	h, err := vault.NewHandler(hcfg)
	if err != nil {
		return nil, err
	}
	v.handler = h
	return v, nil
}

// intercept is the transparent proxy's Intercept: the connections a
// binding covers go to the interceptor; those to a bound host on a port
// or scheme no binding names are reported and spliced as usual.
func (v *vaultSetup) intercept(scheme, name string, dst netip.AddrPort) func(net.Conn, []byte) {
	if v.interceptor == nil {
		return nil
	}
	b := v.live.Load()
	if b == nil {
		return nil
	}
	if b.Intercepts(name, dst.Port(), scheme) {
		if scheme == "https" {
			return func(c net.Conn, peeked []byte) { v.interceptor.ServeTLS(c, peeked, name, dst) }
		}
		return func(c net.Conn, peeked []byte) { v.interceptor.ServeHTTP1(c, peeked, name, dst) }
	}
	if b.HostBound(name) {
		v.deny(egress.Denial{Time: time.Now(), Kind: mitm.EventKind, Name: name, Addr: dst.Addr(), Port: dst.Port(),
			Reason: fmt.Sprintf("not intercepted: no binding for %s on port %d", scheme, dst.Port())})
	}
	return nil
}

// close stops the interceptor's connections.
func (v *vaultSetup) close() {
	if v.interceptor != nil {
		v.interceptor.Close()
	}
}

// serveCA answers caRoute with the CA's certificate, for the token's
// holder; 404 without a credential proxy.
func (v *vaultSetup) serveCA(w http.ResponseWriter, r *http.Request, token string) {
	if !egress.Authorized(r, token) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if v.ca == nil {
		http.Error(w, "the credential proxy is not enabled for this sandbox", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Write(v.ca.CertPEM())
}

// loadOrMakeCA returns the sandbox's CA from dir, or makes one and keeps
// it there, its key sealed with key. Without a key the CA lives in memory
// only.
func loadOrMakeCA(dir string, key []byte) (*mitm.CA, error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	if key != nil {
		certPEM, cerr := os.ReadFile(certPath)
		sealed, kerr := os.ReadFile(keyPath)
		switch {
		case cerr == nil && kerr == nil:
			der, err := vault.OpenBytes(key, sealed, caKeyAAD)
			if err != nil {
				return nil, fmt.Errorf("open %s: %w", keyPath, err)
			}
			ca, err := mitm.LoadCA(certPEM, der)
			if err != nil {
				return nil, fmt.Errorf("load %s: %w", certPath, err)
			}
			return ca, nil
		case !errors.Is(cerr, fs.ErrNotExist) && cerr != nil:
			return nil, cerr
		case !errors.Is(kerr, fs.ErrNotExist) && kerr != nil:
			return nil, kerr
		}
	}
	ca, err := mitm.NewCA(time.Now(), caLifetime, "OpenSandbox credential proxy")
	if err != nil {
		return nil, err
	}
	if key == nil {
		return ca, nil
	}
	der, err := ca.MarshalKey()
	if err != nil {
		return nil, err
	}
	sealed, err := vault.SealBytes(key, der, caKeyAAD)
	if err != nil {
		return nil, err
	}
	// The key first: a certificate without its key would be a CA that
	// cannot sign after a restart.
	if err := egress.WriteFileAtomic(keyPath, sealed); err != nil {
		return nil, err
	}
	if err := egress.WriteFileAtomic(certPath, ca.CertPEM()); err != nil {
		return nil, err
	}
	return ca, nil
}

// writeCAFiles writes ca.pem and bundle.pem (the image's system roots and
// the CA) into dir, for the sandbox's container.
func writeCAFiles(dir string, caPEM []byte) error {
	bundle := caPEM
	if sys, err := os.ReadFile(systemRoots); err == nil && len(sys) > 0 {
		bundle = append(bytes.TrimRight(sys, "\n"), '\n')
		bundle = append(bundle, caPEM...)
	}
	for name, data := range map[string][]byte{"ca.pem": caPEM, "bundle.pem": bundle} {
		if err := egress.WriteFileAtomic(filepath.Join(dir, name), data); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(dir, name), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// upstreamRoots are the system's roots and the operator's extra ones.
func upstreamRoots(extra []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(extra) > 0 && !pool.AppendCertsFromPEM(extra) {
		return nil, errors.New("upstream CA: no PEM certificate")
	}
	return pool, nil
}
