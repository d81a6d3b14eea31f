package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sdk"
)

// TestOSBVault: the clients of the credential vault against the real
// enforcer — `osb credential-vault` (values from the environment, never
// printed), the Go SDK's Vault (its errors), and the MCP tools with an
// operator's credential the agent attaches by name. Only the API is
// exercised; TestAttackVault checks what bindings do to traffic.
func TestOSBVault(t *testing.T) {
	testenv.MustHaveImage(t, egressImage)
	s := startServer(t, serverOptions{extra: egressClientsConfig})
	secret := "sk-osb-" + randomHex(12)
	t.Setenv("OSB_E2E_VAULT_KEY", secret)

	var created struct{ ID string }
	policy := writeFile(t, `{"defaultAction":"deny","egress":[{"action":"allow","target":"api.provider.test"},{"action":"allow","target":"*.git.test"}]}`)
	s.osb("sandbox", "create", "-i", busyboxImage, "-t", "30m", "--network-policy-file", policy, "--credential-proxy", "-o", "json").json(t, &created)
	id := created.ID
	bindings := writeFile(t, `{"credentials":[],"bindings":[{"name":"models","match":{"hosts":["api.provider.test"],"paths":["/v1/*"]},"auth":{"type":"bearer","credential":"key"}}]}`)

	out := s.osb("credential-vault", "create", id, "-f", bindings, "--credential", "key=env:OSB_E2E_VAULT_KEY", "-o", "json").ok(t)
	var doc struct {
		Revision    int64
		Credentials []struct{ Name string }
		Bindings    []struct{ Name string }
	}
	s.osb("vault", "get", id, "-o", "json").json(t, &doc)
	if doc.Revision != 1 || len(doc.Credentials) != 1 || doc.Credentials[0].Name != "key" || len(doc.Bindings) != 1 {
		t.Fatalf("vault after create: %+v", doc)
	}
	table := s.osb("vault", "bindings", id).ok(t)
	if !strings.Contains(table, "models") || !strings.Contains(table, "api.provider.test") {
		t.Errorf("bindings table:\n%s", table)
	}
	s.osb("vault", "create", id, "-f", bindings, "--credential", "key=env:OSB_E2E_VAULT_KEY").fails(t, 1, "409")
	s.osb("vault", "patch", id, "--delete-binding", "models", "--expected-revision", "9").fails(t, 1, "409")
	s.osb("vault", "create", id, "-f", bindings, "--credential", "key="+secret).fails(t, 2, "")
	all := out + table + s.osb("vault", "credentials", id, "-o", "json").ok(t)
	if strings.Contains(all, secret) {
		t.Fatal("osb printed the credential's value")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c := s.sdkClient()
	sb, err := c.Connect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	v := sb.Vault()
	st, err := v.Patch(ctx, api.CredentialVaultMutationRequest{
		Bindings: &api.BindingMutation{Add: []api.CredentialBinding{{Name: "git", Match: api.CredentialMatch{Hosts: []string{"*.git.test"}},
			Auth: api.CredentialAuth{Type: "apiKey", Name: "X-Token", Credential: "key"}}}},
	})
	if err != nil || st.Revision != 2 || len(st.Bindings) != 2 {
		t.Fatalf("SDK patch: %+v, %v", st, err)
	}
	if b, err := v.Binding(ctx, "git"); err != nil || b.Auth.Name != "X-Token" || b.Match.Ports[0] != 443 {
		t.Fatalf("SDK binding: %+v, %v", b, err)
	}
	stale := int64(1)
	_, err = v.Patch(ctx, api.CredentialVaultMutationRequest{ExpectedRevision: &stale, Bindings: &api.BindingMutation{Delete: []string{"git"}}})
	if !errors.Is(err, sdk.ErrRevisionConflict) {
		t.Fatalf("stale revision: %v", err)
	}
	s.osb("vault", "delete", id).ok(t)
	if _, err := v.Get(ctx); !errors.Is(err, sdk.ErrNoVault) {
		t.Fatalf("after delete: %v", err)
	}

	// MCP: the operator's credential, attached by name by an agent that
	// never sees it.
	home := t.TempDir()
	writeConfig(t, home, "[defaults]\nimage = \""+busyboxImage+"\"\ntimeout = \"30m\"\n")
	cmd := s.osbCmd(home, "mcp", "--vault-credential", "provider=env:OSB_E2E_VAULT_KEY")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to osb mcp: %v\nstderr: %s", err, stderr.String())
	}
	defer cs.Close()
	var got struct {
		Exists      bool
		Revision    int64
		Credentials []string
		Available   []string `json:"available_credentials"`
	}
	text := mcpOK(t, ctx, cs, "vault_attach", map[string]any{"sandbox_id": id, "credential": "provider", "hosts": []string{"api.provider.test"}, "auth_type": "bearer"}, nil)
	text += mcpOK(t, ctx, cs, "vault_get", map[string]any{"sandbox_id": id}, &got)
	if !got.Exists || len(got.Credentials) != 1 || got.Credentials[0] != "provider" {
		t.Fatalf("vault_get after vault_attach: %+v\n%s", got, text)
	}
	mcpFails(t, ctx, cs, "vault_attach", map[string]any{"sandbox_id": id, "credential": "other", "hosts": []string{"api.provider.test"}, "auth_type": "bearer"}, "provider")
	text += mcpOK(t, ctx, cs, "vault_detach", map[string]any{"sandbox_id": id, "binding": "provider"}, nil)
	if strings.Contains(text+stderr.String(), secret) {
		t.Fatal("an MCP answer or osb mcp's log holds the credential's value")
	}
	if st, err := v.Get(ctx); err != nil || len(st.Bindings) != 0 || len(st.Credentials) != 0 {
		t.Fatalf("after vault_detach: %+v, %v", st, err)
	}
}
