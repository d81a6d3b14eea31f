package mitm

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"sync"
	"time"
)

// Leaf certificate lifetimes.
const (
	// LeafLifetime is the longest a leaf certificate is valid; never past
	// the CA's own expiry.
	LeafLifetime = 24 * time.Hour
	// LeafRenewBefore is how long before its expiry a cached leaf is
	// replaced by a new one.
	LeafRenewBefore = time.Hour
	// LeafCacheSize is how many names' leaves a CA keeps; the oldest is
	// dropped when a new name needs room.
	LeafCacheSize = 1024
	// backdate is how far before their creation certificates start to be
	// valid, so a client whose clock is a little behind accepts them.
	backdate = time.Hour
)

// CA is the per-sandbox certificate authority the sandbox trusts: it
// signs the leaf certificates the interceptor presents for the names it
// terminates. Its methods are safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	now     func() time.Time // time.Now; tests move it

	mu     sync.Mutex
	leaves map[string]*list.Element // of *leafEntry
	order  *list.List               // oldest issued first
}

type leafEntry struct {
	name     string
	cert     *tls.Certificate
	notAfter time.Time
}

// NewCA creates a self-signed ECDSA P-256 CA named subject, valid from a
// little before now for lifetime. It may sign only end-entity
// certificates (path length 0).
func NewCA(now time.Time, lifetime time.Duration, subject string) (*CA, error) {
	if lifetime <= 0 {
		return nil, errors.New("new CA: lifetime must be positive")
	}
	if subject == "" {
		return nil, errors.New("new CA: subject is required")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new CA: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("new CA: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: subject, Organization: []string{"OpenSandbox"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("new CA: sign: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new CA: parse own certificate: %w", err)
	}
	return newCA(cert, key), nil
}

// LoadCA rebuilds a CA from the PEM certificate CertPEM returned and the
// PKCS#8 DER key MarshalKey returned. The key must be the certificate's.
func LoadCA(certPEM, keyDER []byte) (*CA, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("load CA: no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("load CA: parse certificate: %w", err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, errors.New("load CA: certificate is not a CA")
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("load CA: parse key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("load CA: key is %T, want ECDSA", k)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("load CA: key does not match certificate")
	}
	return newCA(cert, key), nil
}

func newCA(cert *x509.Certificate, key *ecdsa.PrivateKey) *CA {
	return &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		key:     key,
		now:     time.Now,
		leaves:  make(map[string]*list.Element),
		order:   list.New(),
	}
}

// CertPEM returns the CA certificate, PEM-encoded: what the sandbox adds
// to its trust store.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// Certificate returns the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// MarshalKey returns the CA's private key as PKCS#8 DER. The caller
// seals it before it stores it anywhere.
func (ca *CA) MarshalKey() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("marshal CA key: %w", err)
	}
	return der, nil
}

// Leaf returns a certificate for name (a DNS name, or an IP address)
// signed by the CA, valid for at most LeafLifetime and never past the
// CA. Leaves are cached per name and reissued within LeafRenewBefore of
// their expiry; the cache keeps LeafCacheSize names.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	if name == "" {
		return nil, errors.New("leaf certificate: empty name")
	}
	now := ca.now()
	ca.mu.Lock()
	if el, ok := ca.leaves[name]; ok {
		e := el.Value.(*leafEntry)
		if now.Add(LeafRenewBefore).Before(e.notAfter) {
			ca.mu.Unlock()
			return e.cert, nil
		}
		ca.order.Remove(el)
		delete(ca.leaves, name)
	}
	ca.mu.Unlock()

	cert, notAfter, err := ca.issue(name, now)
	if err != nil {
		return nil, err
	}

	ca.mu.Lock()
	defer ca.mu.Unlock()
	if el, ok := ca.leaves[name]; ok {
		// Issued concurrently: keep the one already cached.
		return el.Value.(*leafEntry).cert, nil
	}
	for ca.order.Len() >= LeafCacheSize {
		oldest := ca.order.Front()
		ca.order.Remove(oldest)
		delete(ca.leaves, oldest.Value.(*leafEntry).name)
	}
	ca.leaves[name] = ca.order.PushBack(&leafEntry{name: name, cert: cert, notAfter: notAfter})
	return cert, nil
}

// issue signs a new leaf for name.
func (ca *CA) issue(name string, now time.Time) (*tls.Certificate, time.Time, error) {
	notAfter := now.Add(LeafLifetime)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	if !now.Before(notAfter) {
		return nil, time.Time{}, errors.New("leaf certificate: the CA has expired")
	}
	notBefore := now.Add(-backdate)
	if notBefore.Before(ca.cert.NotBefore) {
		notBefore = ca.cert.NotBefore
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("leaf certificate for %s: generate key: %w", name, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("leaf certificate for %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if a, err := netip.ParseAddr(name); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("leaf certificate for %s: sign: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("leaf certificate for %s: parse: %w", name, err)
	}
	return &tls.Certificate{
		Certificate: [][]byte{der},
		PrivateKey:  key,
		Leaf:        leaf,
	}, notAfter, nil
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
