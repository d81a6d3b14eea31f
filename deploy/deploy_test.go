// Package deploy checks the deployment files: the Helm chart lints and
// renders, and what it renders agrees with the kustomize base on what
// matters (RBAC, replicas, security contexts, probes, the server's
// configuration), so that the two ways to install never drift apart.
package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"sigs.k8s.io/yaml"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// release is the release name under which the chart's objects are named
// as the base's: opensandbox-server, opensandbox-ingress.
const release = "opensandbox"

// object is one Kubernetes object, as decoded YAML.
type object map[string]any

func (o object) kind() string { return str(o, "kind") }
func (o object) name() string { return str(o, "metadata", "name") }
func (o object) key() string  { return o.kind() + "/" + o.name() }

// get walks a path of map keys (and list indexes, as ints).
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				if o, isObj := v.(object); isObj {
					m, ok = map[string]any(o), true
				}
			}
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any, path ...any) string {
	s, _ := get(v, path...).(string)
	return s
}

func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// decode splits a multi-document YAML stream into objects.
func decode(t *testing.T, what string, data []byte) []object {
	t.Helper()
	var out []object
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s, document %d: %v\n%s", what, i, err, doc)
		}
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			b.Write(line)
		}
	}
	return b.Bytes()
}

// kustomizeBase reads the objects of deploy/kubernetes/base as its
// kustomization lists them, and its config.toml.
func kustomizeBase(t *testing.T) (map[string]object, map[string]any) {
	t.Helper()
	dir := filepath.Join(root(), "deploy", "kubernetes", "base")
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources          []string `json:"resources"`
		ConfigMapGenerator []struct {
			Name  string   `json:"name"`
			Files []string `json:"files"`
		} `json:"configMapGenerator"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	objs := map[string]object{}
	for _, r := range k.Resources {
		data, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decode(t, r, data) {
			objs[o.key()] = o
		}
	}
	if len(k.ConfigMapGenerator) != 1 || !slices.Equal(k.ConfigMapGenerator[0].Files, []string{"config.toml"}) {
		t.Fatalf("the base generates %+v, want one ConfigMap of config.toml", k.ConfigMapGenerator)
	}
	var config map[string]any
	if _, err := toml.DecodeFile(filepath.Join(dir, "config.toml"), &config); err != nil {
		t.Fatal(err)
	}
	return objs, config
}

// helmBin returns helm as scripts/k8s/helm.sh builds it.
func helmBin(t *testing.T) string {
	t.Helper()
	p := filepath.Join(root(), ".k8s", "bin", "helm")
	if _, err := os.Stat(p); err != nil {
		testenv.Missing(t, "no helm at %s (%v); scripts/k8s/helm.sh builds it (make k8s-up runs it)", p, err)
	}
	return p
}

func chartDir() string { return filepath.Join(root(), "deploy", "helm", "opensandbox") }

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	// Nothing of the user's helm configuration, and no cluster.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home, "KUBECONFIG=/dev/null")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), fmt.Errorf("helm %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// render runs helm template with set values, and returns the objects by
// kind/name and the server's config.toml.
func render(t *testing.T, set ...string) (map[string]object, map[string]any) {
	t.Helper()
	args := []string{"template", release, chartDir(), "--namespace", "osb"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	objs := map[string]object{}
	for _, o := range decode(t, "helm template", []byte(out)) {
		if _, dup := objs[o.key()]; dup {
			t.Fatalf("helm template renders %s twice", o.key())
		}
		objs[o.key()] = o
	}
	cm, ok := objs["ConfigMap/opensandbox-server-config"]
	if !ok {
		t.Fatalf("no ConfigMap opensandbox-server-config among %v", keys(objs))
	}
	var config map[string]any
	if _, err := toml.Decode(str(cm, "data", "config.toml"), &config); err != nil {
		t.Fatalf("the chart's config.toml: %v\n%s", err, str(cm, "data", "config.toml"))
	}
	return objs, config
}

func keys(m map[string]object) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestHelmLint(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", chartDir()); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Values the chart refuses, with a message naming the value.
	for _, c := range []struct{ set, want string }{
		{"ingress.mode=proxy", "ingress.mode"},
		{"ingress.routeMode=cookie", "ingress.routeMode"},
		{"ingress.mode=gateway", "ingress.address"},
		{"ingress.mode=gateway,ingress.routeMode=wildcard", "ingress.domain"},
	} {
		out, err := helm(t, "template", release, chartDir(), "--set", c.set)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("helm template --set %s: %v, want a refusal naming %s\n%s", c.set, err, c.want, out)
		}
	}
}

// TestHelmMatchesKustomize: with its default values the chart makes the
// objects the kustomize base makes, with the same replicas, RBAC,
// security, probes, resources and configuration.
func TestHelmMatchesKustomize(t *testing.T) {
	base, baseConfig := kustomizeBase(t)
	chart, chartConfig := render(t)

	for key, want := range base {
		got, ok := chart[key]
		if !ok {
			t.Errorf("the base has %s, the chart does not (it has %v)", key, keys(chart))
			continue
		}
		switch want.kind() {
		case "Role":
			if !reflect.DeepEqual(get(got, "rules"), get(want, "rules")) {
				t.Errorf("%s rules:\nchart %v\nbase  %v", key, get(got, "rules"), get(want, "rules"))
			}
		case "ServiceAccount":
			if !reflect.DeepEqual(get(got, "automountServiceAccountToken"), get(want, "automountServiceAccountToken")) {
				t.Errorf("%s automountServiceAccountToken: chart %v, base %v", key, get(got, "automountServiceAccountToken"), get(want, "automountServiceAccountToken"))
			}
		case "RoleBinding":
			for _, f := range [][]any{{"roleRef"}, {"subjects", 0, "kind"}, {"subjects", 0, "name"}} {
				if !reflect.DeepEqual(get(got, f...), get(want, f...)) {
					t.Errorf("%s %v: chart %v, base %v", key, f, get(got, f...), get(want, f...))
				}
			}
		case "Service":
			for _, f := range [][]any{{"spec", "type"}, {"spec", "ports"}, {"spec", "selector"}} {
				if !reflect.DeepEqual(get(got, f...), get(want, f...)) {
					t.Errorf("%s %v: chart %v, base %v", key, f, get(got, f...), get(want, f...))
				}
			}
		case "PodDisruptionBudget":
			for _, f := range [][]any{{"spec", "minAvailable"}, {"spec", "selector"}} {
				if !reflect.DeepEqual(get(got, f...), get(want, f...)) {
					t.Errorf("%s %v: chart %v, base %v", key, f, get(got, f...), get(want, f...))
				}
			}
		case "Deployment":
			compareDeployments(t, key, got, want)
		default:
			t.Errorf("the base has %s, of a kind this test does not compare", key)
		}
	}
	for key := range chart {
		if _, ok := base[key]; !ok && key != "ConfigMap/opensandbox-server-config" {
			t.Errorf("the chart makes %s, the base does not", key)
		}
	}
	if !reflect.DeepEqual(chartConfig, baseConfig) {
		t.Errorf("config.toml:\nchart %v\nbase  %v", chartConfig, baseConfig)
	}
}

// compareDeployments compares what a Deployment promises: replicas, the
// pod's identity, security and volumes, and each container's image,
// arguments, environment, ports, probes, resources and security.
func compareDeployments(t *testing.T, key string, got, want object) {
	t.Helper()
	pod := []any{"spec", "template", "spec"}
	fields := [][]any{
		{"spec", "replicas"}, {"spec", "selector"}, {"spec", "strategy"},
		append(pod[:3:3], "serviceAccountName"), append(pod[:3:3], "automountServiceAccountToken"),
		append(pod[:3:3], "enableServiceLinks"), append(pod[:3:3], "securityContext"),
		append(pod[:3:3], "terminationGracePeriodSeconds"), append(pod[:3:3], "topologySpreadConstraints"),
	}
	for _, f := range fields {
		if !reflect.DeepEqual(get(got, f...), get(want, f...)) {
			t.Errorf("%s %v:\nchart %v\nbase  %v", key, f, get(got, f...), get(want, f...))
		}
	}
	// Volumes by name and source kind, the ConfigMap's name aside (the
	// base's carries a hash).
	vols := func(o object) map[string]string {
		out := map[string]string{}
		l, _ := get(o, append(pod[:3:3], "volumes")...).([]any)
		for _, v := range l {
			m := v.(map[string]any)
			var kinds []string
			for k := range m {
				if k != "name" {
					kinds = append(kinds, k)
				}
			}
			src := fmt.Sprint(kinds)
			if s, ok := m["secret"].(map[string]any); ok {
				src += fmt.Sprintf(" %v optional=%v items=%v", s["secretName"], s["optional"], s["items"])
			}
			if p, ok := m["projected"]; ok {
				src += fmt.Sprint(p)
			}
			out[m["name"].(string)] = src
		}
		return out
	}
	if g, w := vols(got), vols(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s volumes:\nchart %v\nbase  %v", key, g, w)
	}
	gc, _ := get(got, append(pod[:3:3], "containers")...).([]any)
	wc, _ := get(want, append(pod[:3:3], "containers")...).([]any)
	if len(gc) != len(wc) {
		t.Fatalf("%s: chart %d containers, base %d", key, len(gc), len(wc))
	}
	for i := range wc {
		for _, f := range []string{"name", "image", "imagePullPolicy", "ports", "readinessProbe", "livenessProbe", "resources", "securityContext", "volumeMounts", "lifecycle"} {
			if g, w := get(gc[i], f), get(wc[i], f); !reflect.DeepEqual(g, w) {
				t.Errorf("%s container %d %s:\nchart %v\nbase  %v", key, i, f, g, w)
			}
		}
		// The same flags; the base names the namespace through the
		// downward API, the chart directly; the base's server Service is
		// in its own namespace, the chart's fully named.
		norm := func(c any) []string {
			var out []string
			args, _ := get(c, "args").([]any)
			for _, a := range args {
				s := a.(string)
				if name, _, ok := strings.Cut(s, "="); ok && (name == "--namespace" || name == "--server") {
					s = name + "=…"
				}
				out = append(out, s)
			}
			return out
		}
		if g, w := norm(gc[i]), norm(wc[i]); !slices.Equal(g, w) {
			t.Errorf("%s container %d args:\nchart %v\nbase  %v", key, i, g, w)
		}
		envNames := func(c any) map[string]any {
			out := map[string]any{}
			env, _ := get(c, "env").([]any)
			for _, e := range env {
				m := e.(map[string]any)
				if m["name"] == "POD_NAMESPACE" {
					continue // the base's way to the namespace, see above
				}
				out[m["name"].(string)] = fmt.Sprint(m["value"], m["valueFrom"])
			}
			return out
		}
		if g, w := envNames(gc[i]), envNames(wc[i]); !reflect.DeepEqual(g, w) {
			t.Errorf("%s container %d env:\nchart %v\nbase  %v", key, i, g, w)
		}
	}
	// The gateway's namespace is the release's, and its server the
	// release's server.
	if strings.Contains(key, "ingress") {
		args := fmt.Sprint(get(gc[0], "args"))
		for _, want := range []string{"--kubernetes", "--namespace=osb", "--server=http://opensandbox-server.osb:80"} {
			if !strings.Contains(args, want) {
				t.Errorf("%s args %s: no %s", key, args, want)
			}
		}
	}
}

// TestHelmValues: the values the chart offers reach the objects and the
// server's configuration.
func TestHelmValues(t *testing.T) {
	objs, config := render(t,
		"server.replicas=3", "ingress.gateway.replicas=4",
		"runtime.runtime_class_name=gvisor", "runtime.allowed_runtime_classes={gvisor,runc}",
		"apiKey.existingSecret=my-key", "ingress.signingKeys.existingSecret=my-signing-keys",
		"ingress.mode=gateway", "ingress.routeMode=wildcard", "ingress.domain=sandboxes.example.com",
		"egress.mode=strict", "egress.max_rules=500",
		"pools[0].name=python", "pools[0].image=opensandbox/python:3.11", "pools[0].buffer_min=2", "pools[0].pool_max=50",
		"pools[0].entrypoint={tail,-f,/dev/null}", "pools[0].resource_limits.cpu=1", "pools[0].resource_limits.memory=2Gi",
		"ingress.gateway.extraArgs={--metrics-listen=:9090}",
	)
	want := map[string]any{
		"version": int64(1),
		"server":  map[string]any{"listen": "0.0.0.0:8080", "log_format": "json"},
		"runtime": map[string]any{"type": "kubernetes", "kubernetes": map[string]any{
			"kubeconfig": "", "namespace": "", "execd_image": "opensandbox/execd:latest", "image_pull_policy": "IfNotPresent",
			"runtime_class_name": "gvisor", "allowed_runtime_classes": []any{"gvisor", "runc"}}},
		"egress": map[string]any{"mode": "strict", "max_rules": int64(500)},
		"pools": []map[string]any{{"name": "python", "image": "opensandbox/python:3.11", "buffer_min": int64(2), "pool_max": int64(50),
			"entrypoint": []any{"tail", "-f", "/dev/null"}, "resource_limits": map[string]any{"cpu": "1", "memory": "2Gi"}}},
		"ingress": map[string]any{"mode": "gateway", "route_mode": "wildcard", "domain": "sandboxes.example.com",
			"signing_keys_file": "/etc/opensandbox-ingress/keys"},
	}
	if !reflect.DeepEqual(config, want) {
		t.Errorf("config.toml:\ngot  %#v\nwant %#v", config, want)
	}
	server, gw := objs["Deployment/opensandbox-server"], objs["Deployment/opensandbox-ingress"]
	if r := get(server, "spec", "replicas"); r != float64(3) {
		t.Errorf("server replicas %v", r)
	}
	if r := get(gw, "spec", "replicas"); r != float64(4) {
		t.Errorf("gateway replicas %v", r)
	}
	for _, d := range []object{server, gw} {
		ref := str(d, "spec", "template", "spec", "containers", 0, "env", 1, "valueFrom", "secretKeyRef", "name")
		if d.name() == "opensandbox-ingress" {
			ref = str(d, "spec", "template", "spec", "containers", 0, "env", 0, "valueFrom", "secretKeyRef", "name")
		}
		if ref != "my-key" {
			t.Errorf("%s takes the API key from %q", d.name(), ref)
		}
	}
	args := fmt.Sprint(get(gw, "spec", "template", "spec", "containers", 0, "args"))
	for _, a := range []string{"--domain=sandboxes.example.com", "--metrics-listen=:9090"} {
		if !strings.Contains(args, a) {
			t.Errorf("gateway args %s: no %s", args, a)
		}
	}
	if !strings.Contains(fmt.Sprint(get(gw, "spec", "template", "spec", "volumes")), "my-signing-keys") {
		t.Errorf("gateway volumes %v: not the Secret my-signing-keys", get(gw, "spec", "template", "spec", "volumes"))
	}
	// In gateway mode the server needs the keys: no longer optional.
	vols := fmt.Sprint(get(server, "spec", "template", "spec", "volumes"))
	if !strings.Contains(vols, "my-signing-keys") || !strings.Contains(vols, "optional:false") {
		t.Errorf("server volumes %s: want the Secret my-signing-keys, not optional", vols)
	}

	// Without the gateway: the server alone.
	objs, _ = render(t, "ingress.gateway.enabled=false")
	for key := range objs {
		if strings.Contains(key, "ingress") {
			t.Errorf("gateway disabled, yet the chart makes %s", key)
		}
	}
}
