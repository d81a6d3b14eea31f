package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sdk"
)

// The clients of the egress API against the real enforcer: the SDK's
// calls and `osb egress` on a sandbox whose osb-egress runs in strict
// mode. Only the API is exercised; no packet leaves the sandboxes (their
// DNS upstream is a loopback address of their own namespace, never
// asked), so no test internet is needed. TestAttackEgress checks what the
// policies set here do to traffic.

// egressClientsConfig is the [egress] section of the server: a rule cap
// small enough to go over in a test.
const egressClientsConfig = `[egress]
mode = "strict"
dns_upstreams = ["127.0.0.1:53"]
max_rules = 4`

// sdkClient is an SDK client of s.
func (s *server) sdkClient() *sdk.Client {
	s.t.Helper()
	c, err := sdk.NewClient(sdk.Config{Domain: s.listen, APIKey: s.key, RequestTimeout: time.Minute})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(c.Close)
	return c
}

func rules(pairs ...string) []api.NetworkRule {
	var out []api.NetworkRule
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, api.NetworkRule{Action: pairs[i], Target: pairs[i+1]})
	}
	return out
}

// wantPolicy fails unless the sandbox's policy is def with rules, in
// order.
func wantPolicy(t *testing.T, sb *sdk.Sandbox, mode, def string, want []api.NetworkRule) {
	t.Helper()
	st, err := sb.EgressPolicy(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != mode || st.EnforcementMode != "strict" || st.Policy == nil || st.Policy.DefaultAction != def || !slices.Equal(st.Policy.Egress, want) {
		t.Fatalf("policy %+v (%+v); want mode %s, default %s, rules %v", st, st.Policy, mode, def, want)
	}
}

// wantAPIError fails unless err is the egress API's answer status, a
// plain-text error turned into a one-line SDK error that contains want.
func wantAPIError(t *testing.T, err error, status int, want string) {
	t.Helper()
	var ae *sdk.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T); want an *sdk.APIError", err, err)
	}
	if ae.StatusCode != status || ae.Code != "" || !strings.Contains(ae.Message, want) || !errors.Is(err, sdk.ErrInvalid) {
		t.Fatalf("error %+v; want HTTP %d, no code, a message with %q, matching sdk.ErrInvalid", ae, status, want)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %q spans lines", err)
	}
}

// TestOSBEgressEnforcer drives the SDK's egress calls and `osb egress`
// against a sandbox with a policy enforced by osb-egress, directly and
// through the server's proxy route, and checks that a sandbox without one
// says so. (TestOSBEgress runs the CLI against a stand-in API.)
func TestOSBEgressEnforcer(t *testing.T) {
	testenv.MustHaveImage(t, egressImage)
	s := startServer(t, serverOptions{extra: egressClientsConfig})
	c := s.sdkClient()
	start := rules("allow", "pypi.test", "deny", "*.evil.test")
	sb, err := c.Create(t.Context(), sdk.CreateOptions{Image: busyboxImage, Timeout: 30 * time.Minute,
		NetworkPolicy: &api.NetworkPolicy{DefaultAction: "deny", Egress: start}})
	if err != nil {
		t.Fatal(err)
	}
	free, err := c.Create(t.Context(), sdk.CreateOptions{Image: busyboxImage, Timeout: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("SDK round trips", func(t *testing.T) {
		ctx := t.Context()
		wantPolicy(t, sb, "enforcing", "deny", start)

		st, err := sb.PatchEgress(ctx, rules("allow", "files.pypi.test", "deny", "pypi.test")...)
		if err != nil || st.Mode != "enforcing" || st.EnforcementMode != "strict" {
			t.Fatalf("PatchEgress: %+v, %v", st, err)
		}
		wantPolicy(t, sb, "enforcing", "deny", rules("allow", "files.pypi.test", "deny", "pypi.test", "deny", "*.evil.test"))

		if st, err = sb.DeleteEgressRules(ctx, "FILES.pypi.test", "absent.test"); err != nil || st.Reason != "" {
			t.Fatalf("DeleteEgressRules: %+v, %v", st, err)
		}
		wantPolicy(t, sb, "enforcing", "deny", rules("deny", "pypi.test", "deny", "*.evil.test"))
		if st, err = sb.DeleteEgressRules(ctx, "absent.test"); err != nil || st.Reason != "no matching targets found" {
			t.Fatalf("DeleteEgressRules of a target without a rule: %+v, %v", st, err)
		}

		if st, err = sb.SetEgressPolicy(ctx, api.NetworkPolicy{DefaultAction: "allow", Egress: rules("deny", "10.0.0.0/8")}); err != nil || st.Mode != "enforcing" {
			t.Fatalf("SetEgressPolicy: %+v, %v", st, err)
		}
		wantPolicy(t, sb, "enforcing", "allow", rules("deny", "10.0.0.0/8"))
		if st, err = sb.SetEgressPolicy(ctx, api.NetworkPolicy{DefaultAction: "allow", Egress: []api.NetworkRule{}}); err != nil || st.Mode != "allow_all" {
			t.Fatalf("SetEgressPolicy allow-all: %+v, %v", st, err)
		}
		if _, err = sb.SetEgressPolicy(ctx, api.NetworkPolicy{DefaultAction: "deny", Egress: start}); err != nil {
			t.Fatal(err)
		}
		wantPolicy(t, sb, "enforcing", "deny", start)
	})

	t.Run("SDK errors", func(t *testing.T) {
		ctx := t.Context()
		_, err := sb.PatchEgress(ctx, rules("block", "a.test")...)
		wantAPIError(t, err, 400, `"block"`)
		_, err = sb.PatchEgress(ctx, rules("allow", "bad..name")...)
		wantAPIError(t, err, 400, "bad..name")
		_, err = sb.SetEgressPolicy(ctx, api.NetworkPolicy{DefaultAction: "deny",
			Egress: rules("allow", "a.test", "allow", "b.test", "allow", "c.test", "allow", "d.test", "allow", "e.test")})
		wantAPIError(t, err, 413, "the limit is 4")
		_, err = sb.PatchEgress(ctx, rules("allow", "a.test", "allow", "b.test", "allow", "c.test")...)
		wantAPIError(t, err, 413, "too many rules: 5")
		wantPolicy(t, sb, "enforcing", "deny", start) // nothing refused was applied

		for name, call := range map[string]func() error{
			"EgressPolicy":      func() error { _, err := free.EgressPolicy(ctx); return err },
			"PatchEgress":       func() error { _, err := free.PatchEgress(ctx, rules("allow", "a.test")...); return err },
			"DeleteEgressRules": func() error { _, err := free.DeleteEgressRules(ctx, "a.test"); return err },
		} {
			err := call()
			if !errors.Is(err, sdk.ErrNoEgress) || !strings.Contains(err.Error(), free.ID) {
				t.Errorf("%s on a sandbox without a policy: %v; want sdk.ErrNoEgress naming the sandbox", name, err)
			}
		}
	})

	t.Run("osb egress", func(t *testing.T) {
		var doc struct {
			Mode            string
			EnforcementMode string `json:"enforcement_mode"`
			DefaultAction   string `json:"default_action"`
			Egress          []api.NetworkRule
		}
		s.osb("egress", "get", sb.ID, "-o", "json").json(t, &doc)
		if doc.Mode != "enforcing" || doc.EnforcementMode != "strict" || doc.DefaultAction != "deny" || !slices.Equal(doc.Egress, start) {
			t.Fatalf("get: %+v", doc)
		}
		if proxied := s.osb("--use-server-proxy", "egress", "get", sb.ID, "-o", "json").ok(t); proxied != s.osb("egress", "get", sb.ID, "-o", "json").ok(t) {
			t.Errorf("get through the server's proxy route differs:\n%s", proxied)
		}
		out := s.osb("egress", "get", sb.ID).ok(t)
		for _, want := range []string{"Egress Policy", "strict", "pypi.test", "*.evil.test", "Rules (the first match wins)"} {
			if !strings.Contains(out, want) {
				t.Errorf("get (table) lacks %q:\n%s", want, out)
			}
		}

		var patched struct {
			Mode         string
			PatchedRules []api.NetworkRule `json:"patched_rules"`
		}
		s.osb("egress", "patch", sb.ID, "--rule", "ALLOW=cli.test", "--rule", "deny=203.0.113.7", "-o", "json").json(t, &patched)
		if patched.Mode != "enforcing" || !slices.Equal(patched.PatchedRules, rules("allow", "cli.test", "deny", "203.0.113.7")) {
			t.Errorf("patch: %+v", patched)
		}
		wantPolicy(t, sb, "enforcing", "deny", append(rules("allow", "cli.test", "deny", "203.0.113.7"), start...))

		var deleted struct {
			Targets []string `json:"deleted_targets"`
			Reason  *string
		}
		s.osb("egress", "delete", sb.ID, "cli.test", "203.0.113.7", "-o", "json").json(t, &deleted)
		if len(deleted.Targets) != 2 || deleted.Reason != nil {
			t.Errorf("delete: %+v", deleted)
		}
		wantPolicy(t, sb, "enforcing", "deny", start)

		// What get prints, edited, is what set reads.
		raw := s.osb("egress", "get", sb.ID, "-o", "json").ok(t)
		edited := strings.Replace(raw, `"default_action": "deny"`, `"default_action": "allow"`, 1)
		if edited == raw {
			t.Fatalf("get -o json has no default_action to edit:\n%s", raw)
		}
		s.osbIn(strings.NewReader(edited), "", "egress", "set", sb.ID, "--file", "-").ok(t)
		wantPolicy(t, sb, "enforcing", "allow", start)
		file := filepath.Join(t.TempDir(), "policy.json")
		if err := os.WriteFile(file, []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.test"},{"action":"deny","target":"*.evil.test"}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		s.osb("egress", "set", sb.ID, "-f", file).ok(t)
		wantPolicy(t, sb, "enforcing", "deny", start)

		s.osb("egress", "patch", sb.ID, "--rule", "allow=bad..name").fails(t, 1, "bad..name")
		s.osb("egress", "patch", sb.ID, "--rule", "block=a.test").fails(t, 2, "use allow or deny")
		s.osb("egress", "patch", sb.ID, "--rule", "allow=a.test", "--rule", "allow=b.test", "--rule", "allow=c.test").fails(t, 1, "too many rules: 5, the limit is 4 (HTTP 413")
		s.osb("egress", "get", free.ID).fails(t, 1, "has no egress policy API")
		s.osb("egress", "get", free.ID).fails(t, 1, "--network-policy-file")
		wantPolicy(t, sb, "enforcing", "deny", start)
	})

	t.Run("osb mcp", func(t *testing.T) { egressThroughMCP(t, s, free.ID) })

	t.Run("osb sandbox create --network-policy-file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "policy.json")
		if err := os.WriteFile(file, []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.pypi.test"}]}`), 0o600); err != nil {
			t.Fatal(err)
		}
		var created struct{ ID, Status string }
		s.osb("sandbox", "create", "-i", busyboxImage, "-t", "30m", "--network-policy-file", file, "-o", "json").json(t, &created)
		if created.Status != "running" {
			t.Fatalf("create: %+v", created)
		}
		wantPolicy(t, c.Sandbox(created.ID), "enforcing", "deny", rules("allow", "*.pypi.test"))
		// The sandbox runs beside its own enforcer.
		if out := docker(t, "inspect", "-f", "{{.State.Running}}", "osb-"+created.ID+"-egress"); strings.TrimSpace(out) != "true" {
			t.Errorf("egress container of %s: running=%s", created.ID, out)
		}
		s.osb("sandbox", "create", "-i", busyboxImage, "--network-policy-file", writeFile(t, `{"defaultAction":"deny","egress":[{"action":"block","target":"a.test"}]}`)).
			fails(t, 1, "networkPolicy")
	})
}

// egressThroughMCP runs the egress tools of `osb mcp` (over stdio) on
// the server: a sandbox created with allowed_hosts, its policy read and
// changed, and a sandbox without one.
func egressThroughMCP(t *testing.T, s *server, freeID string) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	home := t.TempDir()
	writeConfig(t, home, "[defaults]\nimage = \""+busyboxImage+"\"\ntimeout = \"30m\"\n")
	cmd := s.osbCmd(home, "mcp")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to osb mcp: %v\nstderr: %s", err, stderr.String())
	}
	defer cs.Close()

	var sb struct {
		SandboxID string `json:"sandbox_id"`
		State     string
	}
	mcpOK(t, ctx, cs, "sandbox_create", map[string]any{"allowed_hosts": []string{"pypi.test", "*.pythonhosted.test"}}, &sb)
	if sb.State != "Running" {
		t.Fatalf("sandbox_create: %+v", sb)
	}
	type rule struct{ Action, Target string }
	var pol struct {
		Mode            string
		EnforcementMode string `json:"enforcement_mode"`
		DefaultAction   string `json:"default_action"`
		Rules           []rule
	}
	args := func(targets ...string) map[string]any {
		return map[string]any{"sandbox_id": sb.SandboxID, "targets": targets}
	}
	text := mcpOK(t, ctx, cs, "egress_get", map[string]any{"sandbox_id": sb.SandboxID}, &pol)
	if pol.EnforcementMode != "strict" || pol.DefaultAction != "deny" || !slices.Equal(pol.Rules, []rule{{"allow", "pypi.test"}, {"allow", "*.pythonhosted.test"}}) ||
		!strings.Contains(text, "any other host: denied") {
		t.Fatalf("egress_get: %+v\n%s", pol, text)
	}
	mcpOK(t, ctx, cs, "egress_deny", args("bad.pythonhosted.test"), &pol)
	mcpOK(t, ctx, cs, "egress_allow", args("files.test"), &pol)
	mcpOK(t, ctx, cs, "egress_remove", args("pypi.test"), &pol)
	if want := []rule{{"allow", "files.test"}, {"deny", "bad.pythonhosted.test"}, {"allow", "*.pythonhosted.test"}}; !slices.Equal(pol.Rules, want) {
		t.Errorf("after deny, allow, remove: %+v, want %v", pol.Rules, want)
	}
	mcpFails(t, ctx, cs, "egress_allow", args("a.test", "b.test"), "too many rules: 5, the limit is 4", "HTTP 413")
	mcpFails(t, ctx, cs, "egress_get", map[string]any{"sandbox_id": freeID}, "has no egress policy", "allowed_hosts")
}

// writeFile writes data to a new file and returns its path.
func writeFile(t *testing.T, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEgressCreateRefusals: a Docker server checks a networkPolicy on
// create before it starts anything: the [egress] section has defaults, so
// a server without one enforces policies in strict mode with the default
// rule cap; on the host's network no policy can be enforced.
func TestEgressCreateRefusals(t *testing.T) {
	s := startServer(t, serverOptions{docker: `network = "host"`})
	withPolicy := func(p string) api.CreateSandboxRequest {
		req := sandboxRequest(busyboxImage, "sleep", "infinity")
		req.NetworkPolicy = json.RawMessage(p)
		return req
	}
	for _, tc := range []struct {
		name, policy, want string
	}{
		{"the host network", `{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.test"}]}`, `Docker network "host"`},
		{"a bad action", `{"egress":[{"action":"block","target":"pypi.test"}]}`, "block"},
		{"a bad target", `{"egress":[{"action":"allow","target":"bad..name"}]}`, "bad..name"},
		{"not a policy", `["allow"]`, "networkPolicy"},
		{"over the default cap of 4096 rules", manyRules(4097), "cap of 4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := s.wantError("POST", "/v1/sandboxes", withPolicy(tc.policy), 400, "")
			if !strings.Contains(e.Message, tc.want) {
				t.Errorf("message %q lacks %q", e.Message, tc.want)
			}
		})
	}
	if n := s.scopeContainers(); n != 0 {
		t.Errorf("%d containers made for refused creates", n)
	}
}

// manyRules is a policy of n deny rules.
func manyRules(n int) string {
	p := api.NetworkPolicy{DefaultAction: "allow"}
	for i := range n {
		p.Egress = append(p.Egress, api.NetworkRule{Action: "deny", Target: "n" + strings.Repeat("x", i%7) + ".many.test"})
	}
	b, _ := json.Marshal(p)
	return string(b)
}
