package e2e

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sdk"
)

// The images the deployment test builds from this package's binaries and
// imports into the test cluster, under a tag of their own so that the
// :latest images others use on the shared cluster stay as they are.
const (
	e2eServerImage  = "opensandbox/server:e2e"
	e2eExecdImage   = "opensandbox/execd:e2e"
	e2eIngressImage = "opensandbox/ingress:e2e"
)

// e2eTag is the tag of the e2e images.
const e2eTag = "e2e"

// TestKubernetesDeployment installs deploy/kubernetes into a new namespace
// of the local test cluster (make k8s-up) and drives the two server
// replicas from outside the cluster, as a client on the host does: through
// the Service's ClusterIP (kube-proxy) and through each pod's IP. Then it
// deletes one replica and checks that the API keeps answering, from the
// other, with nothing lost.
func TestKubernetesDeployment(t *testing.T) {
	k := needCluster(t)
	k.importImages(t)
	ns := k.namespace(t)

	key := randomKey()
	overlay := writeOverlay(t, k.root, ns, key, randomSigningKey(t))
	k.must(t, "apply", "-k", overlay)
	k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-server", "--timeout=120s")
	// The gateway of the base runs too: its Role and projected token let
	// it list the sandbox pods, or it would never be ready.
	k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-ingress", "--timeout=120s")
	pods := k.serverPods(t, ns, 2)
	clusterIP := strings.TrimSpace(k.must(t, "-n", ns, "get", "service", "opensandbox-server", "-o", "jsonpath={.spec.clusterIP}"))

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	viaService := newClient(t, "http://"+clusterIP+":80", key, false)
	// kube-proxy programs a new Service within about a second of its
	// endpoints; until then connections to it are refused. On a loaded
	// machine, a ClusterIP just freed by another test's namespace can
	// still lead to that namespace's pods for a while (a run saw 404s
	// for 30 s), so the wait is generous; the first healthy answer ends it.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		h, err := viaService.Health(ctx)
		if err == nil && h.Status == "healthy" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health through the Service %s: %+v, %v", clusterIP, h, err)
		}
	}

	// A sandbox that must outlive the replica deleted below.
	kept, err := viaService.Create(ctx, sdk.CreateOptions{Image: "opensandbox/busybox",
		Metadata: map[string]string{"e2e": "kept"}, ReadyTimeout: 90 * time.Second})
	if err != nil {
		t.Fatalf("create the kept sandbox through the Service: %v", err)
	}

	// Through the Service the client reaches each sandbox at its pod IP;
	// through each replica it goes through that replica's proxy, so the
	// replica reaches the sandbox pod from inside the cluster.
	sandboxCycle(t, ctx, viaService, "service")
	for _, p := range pods {
		c := newClient(t, "http://"+p.ip+":8080", key, true)
		if h, err := c.Health(ctx); err != nil || h.Status != "healthy" {
			t.Fatalf("health of %s at %s: %+v, %v", p.name, p.ip, h, err)
		}
		sandboxCycle(t, ctx, c, p.name)
		mustList(t, ctx, c, kept.ID, p.name)
	}
	if t.Failed() {
		return
	}

	// One replica goes; the other keeps serving through the Service and
	// at its own address while the Deployment replaces the first.
	gone, survivor := pods[0], pods[1]
	k.must(t, "-n", ns, "delete", "pod", gone.name, "--wait=false")
	viaSurvivor := newClient(t, "http://"+survivor.ip+":8080", key, false)
	requests, deadline := 0, time.Now().Add(20*time.Second)
	for time.Now().Before(deadline) && !t.Failed() {
		mustList(t, ctx, viaService, kept.ID, "the Service, with "+gone.name+" deleted")
		mustList(t, ctx, viaSurvivor, kept.ID, survivor.name+", with "+gone.name+" deleted")
		requests += 2
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("%d list requests answered while %s was deleted and replaced", requests, gone.name)
	if exe, err := kept.Run(ctx, "echo still here", nil); err != nil || exe.Stdout != "still here\n" {
		t.Fatalf("command in the kept sandbox after the replica went: %+v, %v", exe, err)
	}

	k.must(t, "-n", ns, "rollout", "status", "deployment/opensandbox-server", "--timeout=120s")
	for _, p := range k.serverPods(t, ns, 2) {
		if p.name == survivor.name {
			continue
		}
		// The replacement knows the sandbox made before it existed and
		// reaches it through its proxy.
		c := newClient(t, "http://"+p.ip+":8080", key, true)
		mustList(t, ctx, c, kept.ID, "the replacement "+p.name)
		sb, err := c.Connect(ctx, kept.ID)
		if err != nil {
			t.Fatalf("connect to the kept sandbox through %s: %v", p.name, err)
		}
		if exe, err := sb.Run(ctx, "echo hi", nil); err != nil || exe.Stdout != "hi\n" {
			t.Fatalf("command in the kept sandbox through %s: %+v, %v", p.name, exe, err)
		}
	}
	if err := kept.Kill(ctx); err != nil {
		t.Errorf("kill the kept sandbox: %v", err)
	}
}

// sandboxCycle creates a busybox sandbox through c, runs a command, writes
// and reads back a file and deletes it, and checks that it is gone.
func sandboxCycle(t *testing.T, ctx context.Context, c *sdk.Client, via string) {
	t.Helper()
	start := time.Now()
	sb, err := c.Create(ctx, sdk.CreateOptions{Image: "opensandbox/busybox",
		Metadata: map[string]string{"e2e": via}, ReadyTimeout: 90 * time.Second})
	if err != nil {
		t.Errorf("create a sandbox through %s: %v", via, err)
		return
	}
	created := time.Since(start)
	if exe, err := sb.Run(ctx, "echo hi", nil); err != nil || exe.ExitCode != 0 || exe.Stdout != "hi\n" {
		t.Errorf("echo hi in %s through %s: %+v, %v", sb.ID, via, exe, err)
	}
	data := []byte("written through " + via + "\n")
	if err := sb.WriteFile(ctx, "/tmp/e2e.txt", data, 0o644); err != nil {
		t.Errorf("write a file in %s through %s: %v", sb.ID, via, err)
	} else if got, err := sb.ReadFile(ctx, "/tmp/e2e.txt"); err != nil || !bytes.Equal(got, data) {
		t.Errorf("read the file back from %s through %s: %q, %v", sb.ID, via, got, err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Errorf("delete %s through %s: %v", sb.ID, via, err)
		return
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := c.Get(ctx, sb.ID)
		if errors.Is(err, sdk.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("sandbox %s still there 30 s after its deletion through %s (%v)", sb.ID, via, err)
			return
		}
	}
	t.Logf("through %s: sandbox %s created and ready in %v; command, file and delete in %v", via, sb.ID,
		created.Round(time.Millisecond), (time.Since(start) - created).Round(time.Millisecond))
}

// mustList fails the test unless the list of sandboxes c answers holds id.
func mustList(t *testing.T, ctx context.Context, c *sdk.Client, id, via string) {
	t.Helper()
	var ids []string
	for sb, err := range c.All(ctx, sdk.ListOptions{}) {
		if err != nil {
			t.Fatalf("list sandboxes through %s: %v", via, err)
		}
		ids = append(ids, sb.ID)
	}
	if !slices.Contains(ids, id) {
		t.Fatalf("list through %s: %v, without sandbox %s", via, ids, id)
	}
}

func newClient(t *testing.T, url, key string, proxy bool) *sdk.Client {
	t.Helper()
	c, err := sdk.NewClient(sdk.Config{Domain: url, APIKey: key, UseServerProxy: proxy, RequestTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// importImages builds the e2e images of the server, execd and the gateway
// from this package's binaries and imports into the test cluster those
// that changed; it needs root (the node's containerd) and the busybox
// image sandboxes run.
func (k *cluster) importImages(t *testing.T) {
	t.Helper()
	testenv.MustHaveRoot(t)
	testenv.MustHaveImage(t, "opensandbox/busybox")
	buildBinaryImage(t, e2eServerImage, serverBin, "65532:65532")
	buildBinaryImage(t, e2eExecdImage, execdBin, "0")
	buildBinaryImage(t, e2eIngressImage, ingressBin, "65532:65532")
	imp := exec.Command(filepath.Join(k.root, "scripts", "k8s-images.sh"))
	imp.Env = append(os.Environ(), "K8S_IMAGES="+e2eServerImage+" "+e2eExecdImage+" "+e2eIngressImage)
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("import the images into the cluster: %v\n%s", err, out)
	}
}

// namespace makes a namespace for one test, deleted with everything in it
// (servers, gateways, sandboxes, their Secrets) when the test ends; on a
// failure its pods, events and logs are logged first.
func (k *cluster) namespace(t *testing.T) string {
	t.Helper()
	ns := "osb-e2e-" + randomHex(5)
	k.must(t, "create", "namespace", ns)
	t.Cleanup(func() {
		if out, err := k.run("delete", "namespace", ns, "--wait=true", "--timeout=90s"); err != nil {
			t.Logf("delete namespace %s: %v\n%s", ns, err, out)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			k.dump(t, ns)
		}
	})
	return ns
}

// randomSigningKey is a gateway signing key, as opensandbox-server
// gen-signing-key makes them.
func randomSigningKey(t *testing.T) string {
	t.Helper()
	key, err := ingress.GenerateKey('e')
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// cluster runs kubectl against the local test cluster.
type cluster struct {
	root, kubectl, kubeconfig string
}

// needCluster returns the local test cluster (OSB_TEST_KUBECONFIG, else
// .k8s/kubeconfig with .k8s/bin/kubectl), or marks the dependency missing
// when it is not there or its API server does not answer.
func needCluster(t *testing.T) *cluster {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	k := &cluster{root: root, kubectl: filepath.Join(root, ".k8s", "bin", "kubectl"),
		kubeconfig: cmp.Or(os.Getenv("OSB_TEST_KUBECONFIG"), filepath.Join(root, ".k8s", "kubeconfig"))}
	if _, err := os.Stat(k.kubeconfig); err != nil {
		testenv.Missing(t, "no test cluster (%v); start one with make k8s-up", err)
	}
	if _, err := os.Stat(k.kubectl); err != nil {
		testenv.Missing(t, "no kubectl of the test cluster (%v); make k8s-up builds it", err)
	}
	if out, err := k.run("get", "--raw", "/readyz", "--request-timeout=5s"); err != nil {
		testenv.Missing(t, "the test cluster does not answer (%v: %s); start it with make k8s-up", err, out)
	}
	return k
}

func (k *cluster) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.kubectl, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

func (k *cluster) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := k.run(args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// serverPod is one replica of the server.
type serverPod struct{ name, ip string }

// serverPods returns the server's pods that are Ready and not being
// deleted, failing the test unless there are want of them.
func (k *cluster) serverPods(t *testing.T, ns string, want int) []serverPod {
	t.Helper()
	return k.readyPods(t, ns, "opensandbox-server", want)
}

// readyPods returns the pods labelled app.kubernetes.io/name=name that
// are Ready and not being deleted, failing the test unless there are
// want of them.
func (k *cluster) readyPods(t *testing.T, ns, name string, want int) []serverPod {
	t.Helper()
	var pods []serverPod
	all := k.podsOf(t, ns, name)
	for _, p := range all {
		if p.ready && !p.deleting && p.ip != "" {
			pods = append(pods, serverPod{p.name, p.ip})
		}
	}
	if len(pods) != want {
		t.Fatalf("%d Ready pods of %s (%+v), want %d", len(pods), name, all, want)
	}
	return pods
}

// podInfo is one pod as podsOf reads it.
type podInfo struct {
	name, ip        string
	ready, deleting bool
}

// podsOf lists the pods labelled app.kubernetes.io/name=name, those
// being deleted included.
func (k *cluster) podsOf(t *testing.T, ns, name string) []podInfo {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Status struct {
				PodIP      string `json:"podIP"`
				Conditions []struct {
					Type, Status string
				} `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	out := k.must(t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/name="+name, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("pods of %s: %v", name, err)
	}
	var pods []podInfo
	for _, p := range list.Items {
		ready := slices.ContainsFunc(p.Status.Conditions, func(c struct{ Type, Status string }) bool {
			return c.Type == "Ready" && c.Status == "True"
		})
		pods = append(pods, podInfo{name: p.Metadata.Name, ip: p.Status.PodIP, ready: ready, deleting: p.Metadata.DeletionTimestamp != nil})
	}
	return pods
}

// dump logs what helps to understand a failure: the namespace's pods and
// events and the servers' logs.
func (k *cluster) dump(t *testing.T, ns string) {
	out, _ := k.run("-n", ns, "get", "pods,deployments,services,endpointslices", "-o", "wide")
	t.Logf("namespace %s:\n%s", ns, out)
	out, _ = k.run("-n", ns, "get", "events", "--sort-by=.lastTimestamp")
	t.Logf("events:\n%s", out)
	out, _ = k.run("-n", ns, "logs", "-l", "app.kubernetes.io/name=opensandbox-server", "--tail=40", "--prefix", "--all-containers")
	t.Logf("server logs:\n%s", out)
	out, _ = k.run("-n", ns, "logs", "-l", "app.kubernetes.io/name=opensandbox-ingress", "--tail=40", "--prefix", "--all-containers")
	t.Logf("gateway logs:\n%s", out)
}

// writeOverlay writes a kustomization that installs deploy/kubernetes/base
// into ns with the test's images, a Secret holding the API key and one
// holding the gateway's signing key, and returns its directory. The
// configuration is the base's, with the test's execd image.
func writeOverlay(t *testing.T, root, ns, key, signingKey string) string {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(root, "deploy", "kubernetes", "base")
	config, err := os.ReadFile(filepath.Join(base, "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	const latest = `execd_image = "opensandbox/execd:latest"`
	if !bytes.Contains(config, []byte(latest)) {
		t.Fatalf("base/config.toml has no line %s to point at the test's execd image", latest)
	}
	config = bytes.Replace(config, []byte(latest), []byte(`execd_image = "`+e2eExecdImage+`"`), 1)
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
  - %s
images:
  - name: opensandbox/server
    newTag: %[3]s
  - name: opensandbox/ingress
    newTag: %[3]s
configMapGenerator:
  - name: opensandbox-server-config
    behavior: replace
    files:
      - config.toml
secretGenerator:
  - name: opensandbox-server
    options:
      disableNameSuffixHash: true
    literals:
      - api-key=%[4]s
  - name: opensandbox-ingress-keys
    options:
      disableNameSuffixHash: true
    literals:
      - keys=%[5]s
`, ns, rel, e2eTag, key, signingKey)
	for name, data := range map[string][]byte{"kustomization.yaml": []byte(kustomization), "config.toml": config} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// buildBinaryImage makes image in the local Docker from one static binary,
// as scripts/images.sh does for bin/: the binary at /NAME as entrypoint, an
// empty /tmp, running as user. An image made from the same binary is kept,
// so that the cluster need not import it again.
func buildBinaryImage(t *testing.T, image, binary, user string) {
	t.Helper()
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	const label = "io.opensandbox.binary.sha256"
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	out, _ := exec.Command("docker", "image", "inspect", "--format", `{{index .Config.Labels "`+label+`"}}`, image).Output()
	if strings.TrimSpace(string(out)) == sum {
		return
	}
	old, _ := exec.Command("docker", "image", "inspect", "--format", "{{.Id}}", image).Output()
	name := filepath.Base(binary)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data))})
	tw.Write(data)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("docker", "import", "--change", `ENTRYPOINT ["/`+name+`"]`, "--change", "USER "+user,
		"--change", "LABEL "+label+"="+sum, "-", image)
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker import %s: %v\n%s", image, err, out)
	}
	if id := strings.TrimSpace(string(old)); id != "" {
		exec.Command("docker", "image", "rm", id).Run() // the replaced image, unless a container uses it
	}
}

// randomKey is an API key as opensandbox-server gen-key makes them.
func randomKey() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
