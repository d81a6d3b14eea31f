package e2e

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/opensandbox/opensandbox/api"
)

// TestOSBPool drives every `osb pool` command and `osb sandbox create
// --pool` through the real binary against a real server, in each output
// format.
func TestOSBPool(t *testing.T) {
	s := startServer(t, serverOptions{})

	type poolDoc struct {
		Name     string
		Template struct {
			Image          string
			Entrypoint     []string
			EnvNames       []string          `json:"env_names"`
			ResourceLimits map[string]string `json:"resource_limits"`
		}
		Capacity struct {
			BufferMin int `json:"buffer_min"`
			BufferMax int `json:"buffer_max"`
			PoolMin   int `json:"pool_min"`
			PoolMax   int `json:"pool_max"`
		}
		Status *struct {
			Available int
			Allocated int
			Claims    int
			Revision  string
			Error     *string
		}
	}
	// --wait returns once bufferMin sandboxes are ready; the template's
	// environment is shown by names, never by values.
	const secret = "osb-pool-secret-5e1d"
	var p poolDoc
	r := s.osb("pool", "create", "py", "-i", busyboxImage, "--entrypoint", "sleep", "--entrypoint", "1000000",
		"-e", "TOKEN="+secret, "-e", "MODE=pool", "--resource", "cpu=500m", "--resource", "memory=128Mi",
		"--buffer-min", "1", "--buffer-max", "1", "--pool-max", "3", "--wait", "-o", "json")
	r.json(t, &p)
	if p.Name != "py" || p.Template.Image != busyboxImage || strings.Join(p.Template.Entrypoint, " ") != "sleep 1000000" ||
		strings.Join(p.Template.EnvNames, ",") != "MODE,TOKEN" || p.Template.ResourceLimits["memory"] != "128Mi" ||
		p.Capacity.PoolMax != 3 || p.Status == nil || p.Status.Available != 1 {
		t.Fatalf("create: %+v", p)
	}
	if strings.Contains(r.out, secret) {
		t.Errorf("create printed an environment value:\n%s", r.out)
	}

	// Table and YAML.
	out := s.osb("pool", "get", "py").ok(t)
	for _, want := range []string{"Pool Info", "py", busyboxImage, "MODE TOKEN", "cpu=500m memory=128Mi", "1-1 ready", "0-3 sandboxes"} {
		if !strings.Contains(out, want) {
			t.Errorf("get (table) lacks %q:\n%s", want, out)
		}
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("pool", "get", "py", "-o", "yaml").ok(t)), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["name"] != "py" || doc["capacity"].(map[string]any)["pool_max"] != 3 {
		t.Errorf("get (yaml): %v", doc)
	}
	out = s.osb("pool", "list").ok(t)
	if !strings.Contains(out, "py") || !strings.Contains(out, "1/1") || strings.Contains(out, secret) {
		t.Errorf("list (table):\n%s", out)
	}
	var list struct{ Items []poolDoc }
	s.osb("pool", "ls", "-o", "json").json(t, &list)
	if len(list.Items) != 1 || list.Items[0].Name != "py" {
		t.Errorf("list (json): %+v", list)
	}

	// A sandbox from the pool gets the template's env with its own over
	// it, and the pool counts the claim.
	var created struct{ ID, Status, Image, Pool string }
	s.osb("sandbox", "create", "--pool", "py", "-e", "MODE=mine", "-o", "json").json(t, &created)
	if created.ID == "" || created.Status != "running" || created.Pool != "py" || created.Image != busyboxImage {
		t.Fatalf("create --pool: %+v", created)
	}
	if out := s.osb("exec", created.ID, "--", "sh", "-c", "echo $MODE $TOKEN").ok(t); out != "mine "+secret+"\n" {
		t.Errorf("the pooled sandbox's environment: %q", out)
	}
	s.osb("pool", "get", "py", "-o", "json").json(t, &p)
	if p.Status.Claims != 1 || p.Status.Allocated != 1 {
		t.Errorf("after the claim: %+v", *p.Status)
	}

	// Update: capacity alone keeps the template and its revision; an env
	// change makes a new revision and keeps the other variables.
	rev := p.Status.Revision
	s.osb("pool", "update", "py", "--buffer-max", "2", "--buffer-min", "2", "-o", "json").json(t, &p)
	if p.Capacity.BufferMax != 2 || p.Capacity.PoolMax != 3 || p.Template.Image != busyboxImage || p.Status.Revision != rev {
		t.Errorf("capacity update: %+v", p)
	}
	s.osb("pool", "update", "py", "--unset-env", "MODE", "-e", "EXTRA=1", "--wait", "-o", "json").json(t, &p)
	if strings.Join(p.Template.EnvNames, ",") != "EXTRA,TOKEN" || p.Status.Revision == rev || p.Status.Available < 2 {
		t.Errorf("template update: %+v %+v", p, p.Status)
	}
	var again struct{ ID string }
	s.osb("sandbox", "create", "--pool", "py", "-o", "json").json(t, &again)
	if out := s.osb("exec", again.ID, "--", "sh", "-c", `echo "${MODE:-none} $EXTRA $TOKEN"`).ok(t); out != "none 1 "+secret+"\n" {
		t.Errorf("a sandbox of the new revision: %q", out)
	}

	// Mistakes.
	s.osb("pool", "update", "py").fails(t, 2, "nothing to change")
	s.osb("pool", "update", "py", "--unset-env", "NOPE").fails(t, 1, "no such variable")
	s.osb("pool", "create", "x", "--pool-max", "1").fails(t, 2, "--image is required")
	s.osb("pool", "create", "x", "-i", busyboxImage).fails(t, 2, "--pool-max is required")
	s.osb("pool", "create", "py", "-i", busyboxImage, "--pool-max", "1").fails(t, 1, api.CodePoolAlreadyExists)
	s.osb("pool", "create", "x", "-i", busyboxImage, "--buffer-max", "5", "--pool-max", "1").fails(t, 1, "bufferMax (5) must not exceed poolMax (1)")
	s.osb("pool", "get", "nope").fails(t, 1, api.CodePoolNotFound)
	s.osb("sandbox", "create", "--pool", "nope").fails(t, 1, api.CodePoolNotFound)
	s.osb("sandbox", "create", "--pool", "py", "--snapshot-id", "s").fails(t, 2, "--snapshot-id and --pool")

	// Delete leaves what the pool handed out.
	if out := s.osb("pool", "delete", "py").ok(t); !strings.Contains(out, "Pool deleted: py") {
		t.Errorf("delete: %q", out)
	}
	s.osb("pool", "get", "py").fails(t, 1, api.CodePoolNotFound)
	if out := s.osb("pool", "list").ok(t); !strings.Contains(out, "No pools found.") {
		t.Errorf("empty list: %q", out)
	}
	if out := s.osb("exec", created.ID, "--", "echo", "alive").ok(t); out != "alive\n" {
		t.Errorf("a handed-out sandbox after its pool's deletion: %q", out)
	}
}

// TestOSBPoolExtensions gives a pool's template extensions with
// --extension, as `osb sandbox create` does: they show in every format,
// an update adds to them and keeps them, and the server's refusal of a
// key or value reaches the user with its message. The pools hold no
// sandboxes (no --buffer-max), so no container starts.
func TestOSBPoolExtensions(t *testing.T) {
	s := startServer(t, serverOptions{})
	type poolDoc struct {
		Template struct {
			EnvNames   []string          `json:"env_names"`
			Extensions map[string]string `json:"extensions"`
		}
	}
	// osbPool runs osb and decodes the pool it prints into a new
	// document (decoding into an old one would keep its map entries).
	osbPool := func(args ...string) (p poolDoc) {
		t.Helper()
		s.osb(append(args, "-o", "json")...).json(t, &p)
		return p
	}
	p := osbPool("pool", "create", "web", "-i", busyboxImage, "--extension", api.ExtensionIngressPublic+"=true",
		"--extension", api.ExtensionRenewExtend+"=600", "--pool-max", "1")
	if want := map[string]string{api.ExtensionIngressPublic: "true", api.ExtensionRenewExtend: "600"}; !maps.Equal(p.Template.Extensions, want) {
		t.Fatalf("create: extensions %v, want %v", p.Template.Extensions, want)
	}
	if out := s.osb("pool", "get", "web").ok(t); !strings.Contains(out, "access.renew.extend.seconds=600 ingress.public=true") {
		t.Errorf("get (table) lacks the extensions:\n%s", out)
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("pool", "get", "web", "-o", "yaml").ok(t)), &doc); err != nil {
		t.Fatal(err)
	}
	if ext, _ := doc["template"].(map[string]any)["extensions"].(map[string]any); ext[api.ExtensionIngressPublic] != "true" {
		t.Errorf("get (yaml): %v", doc)
	}

	// An update replaces one extension and keeps the other; a change of
	// another part of the template keeps them all.
	p = osbPool("pool", "update", "web", "--extension", api.ExtensionRenewExtend+"=900")
	if want := map[string]string{api.ExtensionIngressPublic: "true", api.ExtensionRenewExtend: "900"}; !maps.Equal(p.Template.Extensions, want) {
		t.Errorf("update --extension: extensions %v, want %v", p.Template.Extensions, want)
	}
	p = osbPool("pool", "update", "web", "-e", "MODE=x")
	if p.Template.Extensions[api.ExtensionRenewExtend] != "900" || p.Template.Extensions[api.ExtensionIngressPublic] != "true" ||
		strings.Join(p.Template.EnvNames, ",") != "MODE" {
		t.Errorf("update -e lost the extensions: %+v", p.Template)
	}

	// A template change keeps a network policy osb has no flag for: the
	// template sent replaces the whole one.
	s.call("POST", "/pools", api.PoolRequest{Name: "np", CapacitySpec: &api.CapacitySpec{PoolMax: 1},
		Template: &api.PoolTemplate{Image: &api.ImageSpec{URI: busyboxImage},
			NetworkPolicy: json.RawMessage(`{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}`)}}, 201, nil)
	s.osb("pool", "update", "np", "-e", "MODE=x", "--extension", api.ExtensionIngressPublic+"=true").ok(t)
	var np api.Pool
	s.call("GET", "/pools/np", nil, 200, &np)
	if np.Template == nil || !strings.Contains(string(np.Template.NetworkPolicy), "allowed.test") || np.Template.Env["MODE"] != "x" ||
		np.Template.Extensions[api.ExtensionIngressPublic] != "true" {
		t.Errorf("update of a pool with a network policy: %+v (policy %s)", np.Template, np.Template.NetworkPolicy)
	}

	// Mistakes: the server's 400 and its message, or osb's usage error.
	s.osb("pool", "create", "bad", "-i", busyboxImage, "--pool-max", "1", "--extension", api.ExtensionRenewExtend+"=5").
		fails(t, 1, `template.extensions["access.renew.extend.seconds"] "5": want a whole number of seconds from 300 to 86400`)
	s.osb("pool", "create", "bad", "-i", busyboxImage, "--pool-max", "1", "--extension", api.ExtensionIngressPublic+"=yes").
		fails(t, 1, api.CodeSandboxInvalidParameter)
	s.osb("pool", "create", "bad", "-i", busyboxImage, "--pool-max", "1", "--extension", "poolRef=web").
		fails(t, 1, "a pool's template takes ingress.public and access.renew.extend.seconds only")
	s.osb("pool", "update", "web", "--extension", api.ExtensionRenewExtend+"=1").fails(t, 1, "from 300 to 86400")
	s.osb("pool", "create", "bad", "-i", busyboxImage, "--pool-max", "1", "--extension", "ingress.public").fails(t, 2, "want KEY=VALUE")
	s.osb("pool", "get", "bad").fails(t, 1, api.CodePoolNotFound)
}
