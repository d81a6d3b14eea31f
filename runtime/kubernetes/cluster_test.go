package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// testImage is an image the test cluster holds (make k8s-up imports it).
const testImage = "docker.io/opensandbox/busybox:latest"

var testEntrypoint = []string{"sleep", "100000"}

// missingImage is on a registry at a closed loopback port: the pull fails
// at once, without a packet leaving the machine.
const missingImage = "127.0.0.1:1/opensandbox/missing:latest"

// testKubeconfig returns the test cluster's kubeconfig, or fails the test
// (skips it outside CI) when the cluster does not answer.
func testKubeconfig(t testing.TB) string {
	t.Helper()
	path := os.Getenv("OSB_TEST_KUBECONFIG")
	if path == "" {
		path = filepath.Join(moduleRoot(), ".k8s", "kubeconfig")
	}
	if _, err := os.Stat(path); err != nil {
		testenv.Missing(t, "no test cluster (%v); start one with make k8s-up", err)
	}
	cs := clientFor(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		testenv.Missing(t, "the test cluster does not answer (%v); start it with make k8s-up", err)
	}
	return path
}

// moduleRoot is the repository's root directory.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func clientFor(t testing.TB, kubeconfig string) kubernetes.Interface {
	t.Helper()
	rest, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rest.QPS, rest.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(rest)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func randomSuffix() string {
	var b [5]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testNamespace makes a namespace for one test, deleted (with everything
// in it) when the test ends.
func testNamespace(t testing.TB, cs kubernetes.Interface) string {
	t.Helper()
	ns := "osb-test-" + randomSuffix()
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The namespace's default service account is made asynchronously; pods
	// are refused until it exists.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s has no default service account after 30 s", ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		zero := int64(0)
		cs.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	return ns
}

// testEnv is a namespace of the test cluster and the configuration of
// runtimes working in it.
type testEnv struct {
	kubeconfig string
	cs         kubernetes.Interface
	ns         string
}

func newTestEnv(t testing.TB) *testEnv {
	t.Helper()
	kc := testKubeconfig(t)
	cs := clientFor(t, kc)
	return &testEnv{kubeconfig: kc, cs: cs, ns: testNamespace(t, cs)}
}

// config is a runtime configuration in the test namespace with scope.
func (e *testEnv) config(scope string) Config {
	return Config{
		Kubeconfig: e.kubeconfig, Namespace: e.ns, LabelScope: scope,
		ImagePullPolicy: "IfNotPresent",
		DefaultCPU:      "500m", DefaultMemory: "256Mi",
		CPURequest: "10m", MemoryRequest: "16Mi",
		StartTimeout: max(2*time.Minute, testwait.TimeoutN(2*podStarts)), ScheduleTimeout: 2 * time.Second,
	}
}

// runtime starts a runtime; it is closed when the test ends.
func (e *testEnv) runtime(t testing.TB, cfg Config) *Runtime {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := New(cfg, logger)
	if err != nil {
		t.Fatalf("kubernetes runtime: %v", err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}
