package mitm

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestNewCA(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ca, err := NewCA(now, 30*24*time.Hour, "sandbox sb-1")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(ca.CertPEM())
	if block == nil {
		t.Fatal("CertPEM is not PEM")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !c.IsCA || !c.BasicConstraintsValid:
		t.Error("not a CA")
	case c.MaxPathLen != 0 || !c.MaxPathLenZero:
		t.Errorf("MaxPathLen %d (zero %v), want 0", c.MaxPathLen, c.MaxPathLenZero)
	case c.KeyUsage&x509.KeyUsageCertSign == 0:
		t.Error("no CertSign key usage")
	case c.PublicKeyAlgorithm != x509.ECDSA:
		t.Errorf("key %v, want ECDSA", c.PublicKeyAlgorithm)
	case !c.NotBefore.Before(now) || !c.NotAfter.Equal(now.Add(30*24*time.Hour)):
		t.Errorf("valid %v to %v", c.NotBefore, c.NotAfter)
	case c.Subject.CommonName != "sandbox sb-1":
		t.Errorf("subject %q", c.Subject.CommonName)
	}
	other, err := NewCA(now, time.Hour, "x")
	if err != nil {
		t.Fatal(err)
	}
	if other.Certificate().SerialNumber.Cmp(c.SerialNumber) == 0 {
		t.Error("two CAs share a serial number")
	}
	for _, bad := range []struct {
		life time.Duration
		subj string
	}{{0, "x"}, {time.Hour, ""}} {
		if _, err := NewCA(now, bad.life, bad.subj); err == nil {
			t.Errorf("NewCA(%v, %q) succeeded", bad.life, bad.subj)
		}
	}
}

// verifyLeaf checks the leaf chains to ca for name, as a client would.
func verifyLeaf(t *testing.T, ca *CA, name string, at time.Time) *x509.Certificate {
	t.Helper()
	cert, err := ca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("leaf for %s does not verify: %v", name, err)
	}
	return leaf
}

func TestLeaf(t *testing.T) {
	now := time.Now()
	ca, err := NewCA(now, 7*24*time.Hour, "test")
	if err != nil {
		t.Fatal(err)
	}
	clock := now
	ca.now = func() time.Time { return clock }

	leaf := verifyLeaf(t, ca, "api.provider.test", now)
	if leaf.IsCA || leaf.NotAfter.Sub(now) > LeafLifetime || len(leaf.DNSNames) != 1 {
		t.Errorf("leaf: CA %v, expires in %v, names %q", leaf.IsCA, leaf.NotAfter.Sub(now), leaf.DNSNames)
	}
	a, _ := ca.Leaf("api.provider.test")
	b, _ := ca.Leaf("api.provider.test")
	if a != b {
		t.Error("the leaf was not cached")
	}
	if c, _ := ca.Leaf("other.test"); c == a {
		t.Error("two names share a leaf")
	}

	// Within LeafRenewBefore of its expiry the leaf is replaced.
	clock = now.Add(LeafLifetime - LeafRenewBefore + time.Minute)
	c, err := ca.Leaf("api.provider.test")
	if err != nil {
		t.Fatal(err)
	}
	if c == a {
		t.Error("a leaf near its expiry was served again")
	}
	if !c.Leaf.NotAfter.After(clock.Add(LeafRenewBefore)) {
		t.Errorf("renewed leaf expires %v", c.Leaf.NotAfter)
	}
	verifyLeaf(t, ca, "api.provider.test", clock)

	// Never past the CA.
	clock = now.Add(7*24*time.Hour - 3*time.Hour)
	d := verifyLeaf(t, ca, "late.test", clock)
	if !d.NotAfter.Equal(ca.Certificate().NotAfter) {
		t.Errorf("leaf expires %v, after the CA's %v", d.NotAfter, ca.Certificate().NotAfter)
	}
	clock = now.Add(8 * 24 * time.Hour)
	if _, err := ca.Leaf("expired.test"); err == nil {
		t.Error("an expired CA issued a leaf")
	}
}

func TestLeafCacheBounded(t *testing.T) {
	ca, err := NewCA(time.Now(), time.Hour*48, "test")
	if err != nil {
		t.Fatal(err)
	}
	first, _ := ca.Leaf("n0.test")
	for i := 1; i <= LeafCacheSize; i++ {
		if _, err := ca.Leaf(fmt.Sprintf("n%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	ca.mu.Lock()
	n := len(ca.leaves)
	ca.mu.Unlock()
	if n != LeafCacheSize {
		t.Errorf("cache holds %d leaves, want %d", n, LeafCacheSize)
	}
	again, _ := ca.Leaf("n0.test")
	if again == first {
		t.Error("the oldest leaf was not evicted")
	}
	last, _ := ca.Leaf(fmt.Sprintf("n%d.test", LeafCacheSize))
	if last2, _ := ca.Leaf(fmt.Sprintf("n%d.test", LeafCacheSize)); last2 != last {
		t.Error("a recent leaf was evicted")
	}
}

// Concurrent callers all get the one cached leaf per name, even those
// that raced to issue it first.
func TestLeafConcurrent(t *testing.T) {
	ca, err := NewCA(time.Now(), time.Hour*48, "test")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([][]*tls.Certificate, 8)
	for g := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				c, err := ca.Leaf(fmt.Sprintf("n%d.test", i%5))
				if err != nil {
					t.Error(err)
					return
				}
				got[g] = append(got[g], c)
			}
		}()
	}
	wg.Wait()
	for g := range got {
		for i, c := range got[g] {
			want, _ := ca.Leaf(fmt.Sprintf("n%d.test", i%5))
			if c != want {
				t.Errorf("goroutine %d call %d got a leaf other than the cached one", g, i)
			}
		}
	}
}

func TestCARoundTrip(t *testing.T) {
	ca, err := NewCA(time.Now(), 48*time.Hour, "test")
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.MarshalKey()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	// A leaf of the loaded CA verifies against the original certificate.
	verifyLeaf(t, loaded, "api.provider.test", time.Now())
	leaf, _ := loaded.Leaf("api.provider.test")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.provider.test", Roots: pool}); err != nil {
		t.Errorf("loaded CA's leaf vs the original: %v", err)
	}

	other, _ := NewCA(time.Now(), time.Hour, "other")
	otherKey, _ := other.MarshalKey()
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})
	for _, tc := range []struct {
		name      string
		cert, key []byte
	}{
		{"wrong key", ca.CertPEM(), otherKey},
		{"not PEM", []byte("nope"), key},
		{"garbage key", ca.CertPEM(), []byte{1, 2, 3}},
		{"leaf is no CA", leafPEM, key},
	} {
		if _, err := LoadCA(tc.cert, tc.key); err == nil {
			t.Errorf("%s: LoadCA succeeded", tc.name)
		}
	}
}
