package standin

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// authority is the test CA of one Net: it signs a leaf certificate for
// every name a TLS client asks for, and holds the ECH key of the Net's
// TLS servers.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	pool *x509.CertPool

	echConfig []byte // one ECHConfig
	echKey    []byte // its X25519 private key

	mu     sync.Mutex
	leaves map[string]*tls.Certificate // by SNI name, or by address when there is none
}

// ECHPublicName is the public (outer) name of the ECH configuration of a
// Net's TLS servers: a client using ECHConfigList shows it in the clear
// and hides the real name.
const ECHPublicName = "ech-public.test"

func newAuthority() (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "opensandbox stand-in test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	a := &authority{cert: cert, key: key, pool: x509.NewCertPool(), leaves: map[string]*tls.Certificate{}}
	a.pool.AddCert(cert)
	a.pem = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	echKey, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ECH key: %w", err)
	}
	a.echKey = echKey.Bytes()
	a.echConfig = MarshalECHConfig(1, echKey.PublicKey().Bytes(), ECHPublicName)
	return a, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// leaf returns the certificate for hello: for its SNI name, or for the
// address it reached when it names none.
func (a *authority) leaf(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := hello.ServerName
	var ip net.IP
	if name == "" {
		if ta, ok := hello.Conn.LocalAddr().(*net.TCPAddr); ok {
			ip = ta.IP
			name = ip.String()
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.leaves[name]; c != nil {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for %q: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %q: %w", name, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	a.leaves[name] = c
	return c, nil
}

// serverConfig is the TLS configuration of the Net's servers: a leaf for
// any name, TLS 1.2 and 1.3, ECH with the Net's key. onHello, when not
// nil, sees every ClientHello.
func (a *authority) serverConfig(onHello func(*tls.ClientHelloInfo)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if onHello != nil {
				onHello(hello)
			}
			return a.leaf(hello)
		},
		EncryptedClientHelloKeys: []tls.EncryptedClientHelloKey{{Config: a.echConfig, PrivateKey: a.echKey, SendAsRetry: true}},
	}
}

// MarshalECHConfig encodes one ECHConfig (draft-ietf-tls-esni, version
// 0xfe0d) for an X25519 public key, HKDF-SHA256 and AES-128-GCM, with
// publicName as the outer name.
func MarshalECHConfig(id byte, publicKey []byte, publicName string) []byte {
	var c []byte
	c = append(c, id)
	c = append(c, 0x00, 0x20) // KEM: DHKEM(X25519, HKDF-SHA256)
	c = appendU16(c, len(publicKey))
	c = append(c, publicKey...)
	c = appendU16(c, 4)
	c = append(c, 0x00, 0x01, 0x00, 0x01) // HKDF-SHA256, AES-128-GCM
	c = append(c, 0)                      // maximum_name_length: let the client pad as it likes
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = appendU16(c, 0) // no extensions
	out := []byte{0xfe, 0x0d}
	out = appendU16(out, len(c))
	return append(out, c...)
}

// ECHConfigList wraps ECHConfigs into the list clients are given (the
// form of a DNS HTTPS record's ech parameter).
func ECHConfigList(configs ...[]byte) []byte {
	var body []byte
	for _, c := range configs {
		body = append(body, c...)
	}
	return append(appendU16(nil, len(body)), body...)
}

func appendU16(b []byte, n int) []byte {
	return append(b, byte(n>>8), byte(n))
}

func (n *Net) authority() *authority {
	n.t.Helper()
	n.caOnce.Do(func() { n.ca, n.caErr = newAuthority() })
	if n.caErr != nil {
		n.t.Fatalf("test CA: %v", n.caErr)
	}
	return n.ca
}

// CA returns the pool holding the test CA that signs the certificates of
// the namespace's TLS servers.
func (n *Net) CA() *x509.CertPool {
	n.t.Helper()
	return n.authority().pool
}

// CAPEM returns the test CA's certificate in PEM form, for clients in a
// sandbox (netprobe's -cafile).
func (n *Net) CAPEM() []byte {
	n.t.Helper()
	return n.authority().pem
}

// ECHConfigList returns the ECH configuration list of the namespace's TLS
// servers (public name ECHPublicName): a client given it hides its real
// SNI, and the servers accept it.
func (n *Net) ECHConfigList() []byte {
	n.t.Helper()
	return ECHConfigList(n.authority().echConfig)
}
