package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// The credential proxy on Docker. osb-egress makes the sandbox's CA on
// its first start and keeps the key to itself (sealed in its container's
// writable layer). Once osb-egress enforces, the server fetches the CA's
// certificate and writes it into the sandbox's container before that
// starts: sandbox.CredentialCAFile, sandbox.CredentialCABundle (the
// image's system roots and the CA), and the image's system bundle with
// the CA appended, so that clients that read neither variable of
// sandbox.CredentialCAEnv trust it as well.

// systemBundles are where images keep their roots, as Go's crypto/x509
// looks for them on Linux: Debian and Ubuntu, Fedora and RHEL, openSUSE,
// OpenELEC, CentOS, Alpine. The first one an image has gets the CA.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/cert.pem",
}

// caRoute is osb-egress's route that serves the CA certificate.
const caRoute = "/credential-proxy/ca.pem"

// installCredentialCA writes sandbox id's CA into its container cid.
// It is idempotent: the system bundle gets the CA once.
func (r *Runtime) installCredentialCA(ctx context.Context, id sandbox.ID, cid string) error {
	r.mu.Lock()
	token := ""
	if e, err := r.getLocked(id); err == nil {
		token = e.egressToken
	}
	r.mu.Unlock()
	info, err := r.eng.inspect(ctx, egressName(id))
	if err != nil {
		return &failure{"EGRESS_START_FAILED", fmt.Sprintf("inspect the egress container: %v", err)}
	}
	addr, ok := info.Ports[sandbox.PortEgress]
	if !ok {
		return &failure{"EGRESS_START_FAILED", "the egress API's port was not published"}
	}
	ca, err := fetchCA(ctx, addr, token)
	if err != nil {
		return &failure{"CREDENTIAL_CA_FAILED", err.Error()}
	}
	var sys []byte
	sysPath := ""
	for _, p := range systemBundles {
		data, ok, err := r.eng.readFile(ctx, cid, p, 16<<20)
		if err != nil {
			return &failure{"CREDENTIAL_CA_FAILED", err.Error()}
		}
		if ok {
			sys, sysPath = data, p
			break
		}
	}
	archive, err := caArchive(ca, sys, sysPath, time.Now())
	if err != nil {
		return &failure{"CREDENTIAL_CA_FAILED", err.Error()}
	}
	if err := r.eng.writeFiles(ctx, cid, archive); err != nil {
		return &failure{"CREDENTIAL_CA_FAILED", err.Error()}
	}
	return nil
}

// fetchCA reads the CA certificate from osb-egress at hostAddr.
func fetchCA(ctx context.Context, hostAddr, token string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, execdURL(hostAddr)+caRoute, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(api.HeaderEgressAuth, token)
	resp, err := probeClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the credential proxy's CA: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("fetch the credential proxy's CA: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the credential proxy's CA: osb-egress answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	if err := checkCAPEM(data); err != nil {
		return nil, fmt.Errorf("the credential proxy's CA: %w", err)
	}
	return data, nil
}

// checkCAPEM checks that data is one PEM certificate of a CA.
func checkCAPEM(data []byte) error {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) > 0 {
		return fmt.Errorf("not one PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	if !cert.IsCA {
		return fmt.Errorf("the certificate is not a CA's")
	}
	return nil
}

// caArchive is the tar stream of the files that make a sandbox trust ca:
// the CA alone, the bundle, and (when the image has one, sys at sysPath,
// that lacks the CA) the system bundle with the CA appended.
func caArchive(ca, sys []byte, sysPath string, now time.Time) (io.Reader, error) {
	haveSys := sysPath != ""
	bundle := ca
	if haveSys {
		bundle = joinPEM(sys, ca)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(path string, data []byte) error {
		hdr := &tar.Header{Name: path[1:], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), ModTime: now}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := add(sandbox.CredentialCAFile, ca); err != nil {
		return nil, err
	}
	if err := add(sandbox.CredentialCABundle, bundle); err != nil {
		return nil, err
	}
	if haveSys && !bytes.Contains(sys, bytes.TrimSpace(ca)) {
		if err := add(sysPath, bundle); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return &buf, nil
}

// joinPEM appends b to a, with a line break between them.
func joinPEM(a, b []byte) []byte {
	out := bytes.Clone(a)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, b...)
}

// vaultPeers are the addresses osb-egress accepts plain-HTTP vault writes
// from besides loopback: the gateways of the sandboxes' network, when the
// sandboxes' ports are published on a loopback address only. Then every
// connection from a gateway comes from this host (the engine's port
// forwarding, or a local process); with ports published on other
// addresses it may come from anywhere, and writes need TLS.
func (r *Runtime) vaultPeers(ctx context.Context) []netip.Prefix {
	bind, err := netip.ParseAddr(r.cfg.BindIP)
	if err != nil || !bind.IsLoopback() {
		return nil
	}
	n, err := r.eng.network(ctx, r.cfg.Network)
	if err != nil {
		r.log.Warn("find the network's gateway for credential vault writes", "network", r.cfg.Network, "err", err)
		return nil
	}
	var out []netip.Prefix
	for _, g := range n.gateways {
		out = append(out, netip.PrefixFrom(g, g.BitLen()))
	}
	return out
}
