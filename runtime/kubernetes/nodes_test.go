package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/sandbox"
)

func node(name, cpu, memory, gpus string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}}}
	if gpus != "" {
		n.Status.Allocatable[resourceGPU] = resource.MustParse(gpus)
	}
	return n
}

func withCapacity(n *corev1.Node, cpu, memory string) *corev1.Node {
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory)}
	return n
}

func TestLargestNode(t *testing.T) {
	tests := []struct {
		name  string
		nodes []*corev1.Node
		want  sandbox.HostSize
	}{
		{"no node", nil, sandbox.HostSize{}},
		{"one node", []*corev1.Node{node("n1", "1900m", "7Gi", "")},
			sandbox.HostSize{CPUMillis: 1900, MemoryBytes: 7 << 30, GPUsKnown: true, Where: "the cluster's node (n1)"}},
		{"largest per resource", []*corev1.Node{node("cpu", "64", "8Gi", ""), node("mem", "4", "512Gi", ""), node("gpu", "8", "64Gi", "4")},
			sandbox.HostSize{CPUMillis: 64000, MemoryBytes: 512 << 30, GPUs: 4, GPUsKnown: true, Where: "the largest node of the cluster"}},
		// What the node has, not what it sets aside for pods: a limit of
		// 4 CPUs on a 4-CPU node is one the node can honour.
		{"capacity over allocatable", []*corev1.Node{withCapacity(node("n4", "3920m", "15Gi", ""), "4", "16Gi")},
			sandbox.HostSize{CPUMillis: 4000, MemoryBytes: 16 << 30, GPUsKnown: true, Where: "the cluster's node (n4)"}},
	}
	for _, tt := range tests {
		if got := largestNode(tt.nodes); got != tt.want {
			t.Errorf("%s: largestNode = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	slim, _ := slimNode(node("n", "1", "1Gi", "1"))
	if n := slim.(*corev1.Node); n.Name != "n" || len(n.Status.Allocatable) != 3 || n.Status.Images != nil {
		t.Errorf("slimNode kept %+v", n)
	}
}

// TestHostSizeFromNodes: the runtime's size is the cluster's largest node
// as the API server has it, and through the lifecycle server a create
// larger than it, or asking for a GPU no node has, is refused.
func TestHostSizeFromNodes(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("size-"+randomSuffix()))
	ctx := context.Background()
	var got sandbox.HostSize
	waitFor(t, podStarts, "the node informer to sync", func() bool {
		var err error
		got, err = rt.HostSize(ctx)
		return err == nil
	})
	list, err := env.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want sandbox.HostSize
	for i := range list.Items {
		a := list.Items[i].Status.Capacity
		want.CPUMillis = max(want.CPUMillis, a.Cpu().MilliValue())
		want.MemoryBytes = max(want.MemoryBytes, a.Memory().Value())
		if q, ok := a[resourceGPU]; ok {
			want.GPUs = max(want.GPUs, q.Value())
		}
	}
	if got.CPUMillis != want.CPUMillis || got.MemoryBytes != want.MemoryBytes || got.GPUs != want.GPUs || !got.GPUsKnown {
		t.Fatalf("HostSize = %+v; the nodes say %+v", got, want)
	}
	t.Logf("largest node: %+v", got)

	srv, err := lifecycle.New(lifecycle.NewManager(rt, lifecycle.ManagerConfig{}), lifecycle.Config{APIKey: "k", RuntimeName: "KUBERNETES"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	create := func(limits string) (int, string) {
		body := `{"image":{"uri":"` + testImage + `"},"entrypoint":["sleep","1000"],"resourceLimits":{` + limits + `}}`
		req, _ := http.NewRequest("POST", ts.URL+"/v1/sandboxes", strings.NewReader(body))
		req.Header.Set(api.HeaderAPIKey, "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := create(`"cpu":"1000"`); code != 400 || !strings.Contains(body, "1000 CPUs") {
		t.Errorf("cpu 1000: %d %s", code, body)
	}
	if code, body := create(`"memory":"10Ti"`); code != 400 || !strings.Contains(body, "memory") {
		t.Errorf("memory 10Ti: %d %s", code, body)
	}
	if want.GPUs == 0 {
		if code, body := create(`"gpu":"1"`); code != 400 || !strings.Contains(body, "no GPU") {
			t.Errorf("gpu 1 on a cluster without GPUs: %d %s", code, body)
		}
	}
	if code, body := create(`"cpu":"100m","memory":"64Mi"`); code != 202 {
		t.Errorf("a create that fits: %d %s", code, body)
	}
}

// TestHostSizeWithoutNodeAccess: with only the deployment's Role, which
// reaches no node, the runtime says it does not know its size, and the
// lifecycle server does not refuse creates for it.
func TestHostSizeWithoutNodeAccess(t *testing.T) {
	env := newTestEnv(t)
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join(moduleRoot(), "deploy", "kubernetes", "base", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.Role
	if err := yaml.Unmarshal(data, &role); err != nil {
		t.Fatal(err)
	}
	role.Namespace = env.ns
	if _, err := env.cs.RbacV1().Roles(env.ns).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	user := "osb-test-" + randomSuffix()
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: env.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	if _, err := env.cs.RbacV1().RoleBindings(env.ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rest, err := clientcmd.BuildConfigFromFlags("", env.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rest.Impersonate.UserName = user
	cs, err := kubernetes.NewForConfig(rest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
		t.Fatal("the deployment's Role reads nodes; this test wants a server that cannot")
	}
	cfg := env.config("nonodes-" + randomSuffix())
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rt, err := newRuntime(cfg, cs, env.ns, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.HostSize(ctx); !errors.Is(err, errNodesUnknown) {
		t.Fatalf("HostSize without node access: %v, want errNodesUnknown", err)
	}
}
