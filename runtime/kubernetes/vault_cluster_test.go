package kubernetes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestVaultOnCluster: a pod sandbox created with credentialProxy trusts
// its proxy's CA (the files from the sidecar's volume, the environment
// that names them: Python verifies the proxy's certificate with them),
// and a request it sends without a key reaches the
// provider (HTTPS on the node's address, port 443, with a certificate of
// the test's own CA, which osb-egress trusts as an upstream root) with
// the vault's key; the sandbox's Secret holds the sealing key.
func TestVaultOnCluster(t *testing.T) {
	env := newTestEnv(t)
	node := nodeAddress(t, env)
	upstream := startTestDNS(t, node)
	upstream.set("provider.test.", node)

	caPEM, leaf := testProviderCert(t, "provider.test")
	var mu sync.Mutex
	var auths []string
	ln, err := net.Listen("tcp", net.JoinHostPort(node, "443"))
	if err != nil {
		t.Fatalf("the provider must listen on the node's port 443, which bindings intercept: %v", err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			auths = append(auths, r.Header.Get("Authorization"))
			mu.Unlock()
			io.WriteString(w, "provider answered "+r.URL.Path)
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{leaf}},
		ReadHeaderTimeout: time.Minute,
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := env.config("vault-" + randomSuffix())
	cfg.Egress.DNSUpstreams = []string{upstream.addr}
	cfg.Egress.UpstreamCAFile = caFile
	cfg.Egress.VaultPlainPeers = []string{sourceTowardsPods(t, env, env.runtime(t, env.config("vault-probe-"+randomSuffix())))}
	rt := env.runtime(t, cfg)
	ctx := context.Background()

	id := sandbox.NewID()
	// Python's ssl verifies against SSL_CERT_FILE: the request below also
	// shows that the sandbox trusts its proxy's CA.
	spec := sandbox.Spec{Image: "docker.io/opensandbox/python:3.11", Entrypoint: []string{"sleep", "100000"}, CredentialProxy: true,
		NetworkPolicy: []byte(fmt.Sprintf(`{"defaultAction":"deny","egress":[{"action":"allow","target":"provider.test"},{"action":"allow","target":%q}]}`, node))}
	if _, err := rt.Create(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	t.Cleanup(func() { rt.Delete(context.Background(), id) })

	sec, err := env.cs.CoreV1().Secrets(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil || len(sec.Data[secretVaultKey]) == 0 {
		t.Fatalf("the sandbox's Secret holds no vault key (%v)", err)
	}
	execd, err := rt.Endpoint(ctx, id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	if out := output(runCommand(t, execd, "echo $SSL_CERT_FILE; head -1 "+sandbox.CredentialCAFile)); !strings.Contains(out, sandbox.CredentialCABundle) ||
		!strings.Contains(out, "BEGIN CERTIFICATE") {
		t.Fatalf("the sandbox's trust: %s", out)
	}

	ep, err := rt.Endpoint(ctx, id, sandbox.PortEgress)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	rand.Read(b)
	key := "sk-cluster-" + hex.EncodeToString(b)
	body := fmt.Sprintf(`{"credentials":[{"name":"k","source":{"value":%q}}],
		"bindings":[{"name":"p","match":{"hosts":["provider.test"],"paths":["/v1/*"]},"auth":{"type":"bearer","credential":"k"}}]}`, key)
	req, _ := http.NewRequest(http.MethodPost, "http://"+ep.Address+"/credential-vault", strings.NewReader(body))
	req.Header.Set(api.HeaderEgressAuth, ep.Headers[api.HeaderEgressAuth])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /credential-vault: %s %s", resp.Status, answer)
	}

	out := output(runCommand(t, execd, `timeout 20 python3 -c 'import urllib.request; print(urllib.request.urlopen("https://provider.test/v1/models").read().decode())' 2>&1; echo exit=$?`))
	mu.Lock()
	got := append([]string(nil), auths...)
	mu.Unlock()
	if !strings.Contains(out, "provider answered /v1/models") || len(got) != 1 || got[0] != "Bearer "+key {
		t.Fatalf("through the binding: sandbox saw %q; the provider got %d request(s), key injected: %v", out, len(got), len(got) == 1 && got[0] == "Bearer "+key)
	}
	if strings.Contains(out, key) {
		t.Fatal("the key came back to the sandbox")
	}
	t.Logf("attempt a pod sandbox calls its provider through a binding → the provider got the key, the sandbox did not")
}

// sourceTowardsPods is the address this machine sends from to the
// cluster's pods: the peer osb-egress sees for the test's vault writes. A
// first sandbox shows where pods are.
func sourceTowardsPods(t *testing.T, env *testEnv, rt *Runtime) string {
	t.Helper()
	ctx := context.Background()
	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "100000"}}); err != nil {
		t.Fatal(err)
	}
	defer rt.Delete(ctx, id)
	waitState(t, rt, id, sandbox.StateRunning)
	pod, err := env.cs.CoreV1().Pods(env.ns).Get(ctx, podName(id), metav1.GetOptions{})
	if err != nil || pod.Status.PodIP == "" {
		t.Fatalf("the first sandbox's pod address: %v", err)
	}
	// A UDP "connection" sends nothing; it asks the kernel for the route.
	c, err := net.Dial("udp", net.JoinHostPort(pod.Status.PodIP, "9"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// testProviderCert makes a CA and a leaf for name signed by it.
func testProviderCert(t *testing.T, name string) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vault test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
