package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/runtime/kubernetes"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestParseFlagsKubernetes(t *testing.T) {
	env := func(string) string { return "" }
	m := NewMain()
	if err := m.ParseFlags([]string{"--kubernetes", "--namespace", "a,b", "--namespace=c"}, env, io.Discard); err != nil ||
		m.source.name != "kubernetes" || m.renewSource != nil {
		t.Fatalf("--kubernetes: %v, source %+v", err, m.source)
	}
	// With --server the pods are read, and the server renews.
	m = NewMain()
	if err := m.ParseFlags([]string{"--server", "http://127.0.0.1:1", "--kubernetes"}, env, io.Discard); err != nil ||
		m.source.name != "kubernetes" || m.renewSource == nil || m.renewSource.name != "server" {
		t.Fatalf("--kubernetes --server: %v, source %+v, renewing %+v", err, m.source, m.renewSource)
	}
	// The start-up line says where each part goes: the pods are read
	// (from the flags before the resolver resolves a default), the
	// server renews.
	m = NewMain()
	if err := m.ParseFlags([]string{"--kubernetes", "--namespace", "b,a", "--label-scope", "gw", "--server", "http://127.0.0.1:1"}, env, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := []any{"from", "the cluster's sandbox pods of label scope gw in namespaces b, a", "renewals", "the lifecycle server at http://127.0.0.1:1"}
	if got := sourcesAttrs(m.source, m.renewSource); !slices.Equal(got, want) {
		t.Errorf("--kubernetes --server: start-up line %q, want %q", got, want)
	}
	m = NewMain()
	if err := m.ParseFlags([]string{"--kubernetes"}, env, io.Discard); err != nil {
		t.Fatal(err)
	}
	want = []any{"from", "the cluster's sandbox pods of label scope default in namespaces the kubeconfig context's", "renewals", "none: sandboxes are not renewed on access"}
	if got := sourcesAttrs(m.source, nil); !slices.Equal(got, want) {
		t.Errorf("--kubernetes: start-up line %q, want %q", got, want)
	}

	var l stringList
	l.Set("a, b,,c")
	l.Set("d")
	if l.String() != "a,b,c,d" {
		t.Fatalf("namespaces %q", l.String())
	}
}

// TestBinaryKubernetes runs the built gateway with --kubernetes against
// the local test cluster (make k8s-up): a sandbox made by the Kubernetes
// runtime is served at its pod's address by token, refused without one,
// renewed on access through the --server, and 404 once deleted.
func TestBinaryKubernetes(t *testing.T) {
	kc := testKubeconfig(t)
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := "osb-ingress-" + strings.ToLower(string(sandbox.NewID())[:8])
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s has no default service account", ns)
		}
	}
	rt, err := kubernetes.New(kubernetes.Config{Kubeconfig: kc, Namespace: ns, LabelScope: "gw", NetworkPolicy: new(bool),
		CPURequest: "10m", MemoryRequest: "16Mi"}, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })

	key, err := ingress.GenerateKey('k')
	if err != nil {
		t.Fatal(err)
	}
	keys, err := ingress.ParseKeys([]string{key})
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, keyFile, key)
	renewals := newStandIn(t, "server-key")

	id := sandbox.NewID()
	exp := time.Now().Add(time.Hour)
	web := []string{"sh", "-c", "mkdir -p /www && echo hello from " + string(id) + " >/www/index.html && exec httpd -f -p 8080 -h /www"}
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: "docker.io/opensandbox/busybox:latest", Entrypoint: web, ExpiresAt: &exp,
		Extensions: map[string]string{api.ExtensionRenewExtend: "600"}}); err != nil {
		t.Fatal(err)
	}
	g := start(t, []string{envAPIKey + "=server-key"}, "--kubernetes", "--kubeconfig", kc, "--namespace", ns,
		"--label-scope", "gw", "--signing-keys-file", keyFile, "--server", renewals.URL)

	// Found in the cluster, renewed through the server.
	if from, to := g.sources(t); from != "the cluster's sandbox pods of label scope gw in namespaces "+ns ||
		to != "the lifecycle server at "+renewals.URL {
		t.Errorf("start-up log: finding sandboxes from %q, renewals to %q", from, to)
	}

	c := &http.Client{Timeout: 10 * time.Second}
	route := string(id) + "-8080"
	token, err := keys.AccessToken(string(id))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		code, body, _ := get(t, c, "http://"+g.addr+"/", api.HeaderIngressTo, route, api.HeaderSecureAccess, token)
		if code == http.StatusOK {
			if !strings.Contains(body, "hello from "+string(id)) {
				t.Fatalf("through the gateway: %q", body)
			}
			break
		}
		// Pending: 503 while the pod starts; then the web server may
		// not listen yet (502).
		if code != http.StatusServiceUnavailable && code != http.StatusBadGateway || time.Now().After(deadline) {
			t.Fatalf("GET through the gateway: %d %s", code, body)
		}
	}
	if code, body, _ := get(t, c, "http://"+g.addr+"/"+string(id)+"/8080/index.html", api.HeaderSecureAccess, token); code != http.StatusOK ||
		!strings.Contains(body, "hello from") {
		t.Fatalf("path route: %d %s", code, body)
	}
	if code, body, _ := get(t, c, "http://"+g.addr+"/", api.HeaderIngressTo, route); code != http.StatusUnauthorized {
		t.Fatalf("without a token: %d %s", code, body)
	}
	// Renew-on-access went to the server, once for the burst above.
	eventually(t, func() string {
		renewals.mu.Lock()
		defer renewals.mu.Unlock()
		if renewals.renews != 1 {
			return "renewals asked of the server: " + strconv.Itoa(renewals.renews) + ", want 1"
		}
		return ""
	})

	other := string(sandbox.NewID())
	otherToken, _ := keys.AccessToken(other)
	if code, body, _ := get(t, c, "http://"+g.addr+"/", api.HeaderIngressTo, other+"-8080", api.HeaderSecureAccess, otherToken); code != http.StatusNotFound {
		t.Fatalf("unknown sandbox: %d %s", code, body)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() string {
		if code, body, _ := get(t, c, "http://"+g.addr+"/", api.HeaderIngressTo, route, api.HeaderSecureAccess, token); code != http.StatusNotFound {
			return "deleted sandbox: " + strconv.Itoa(code) + " " + body
		}
		return ""
	})
}

// testKubeconfig returns the local test cluster's kubeconfig, or reports
// the cluster missing.
func testKubeconfig(t *testing.T) string {
	t.Helper()
	path := os.Getenv("OSB_TEST_KUBECONFIG")
	if path == "" {
		_, file, _, _ := runtime.Caller(0)
		path = filepath.Join(filepath.Dir(file), "..", "..", ".k8s", "kubeconfig")
	}
	if _, err := os.Stat(path); err != nil {
		testenv.Missing(t, "no test cluster (%v); start one with make k8s-up", err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	rc.Timeout = 5 * time.Second
	cs, err := k8s.NewForConfig(rc)
	if err == nil {
		_, err = cs.Discovery().ServerVersion()
	}
	if err != nil {
		testenv.Missing(t, "the test cluster does not answer (%v); start it with make k8s-up", err)
	}
	return path
}
