package mcp

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// TestPoolTools reads a warm pool through the tools and creates a sandbox
// from it; the pool's environment values never reach the model.
func TestPoolTools(t *testing.T) {
	cs, c := liveServerClient(t)
	const secret = "pool-secret-value-93f1"
	_, err := c.Pools().Create(t.Context(), "agents", sdk.PoolTemplate{Image: busyboxImage,
		Env:       map[string]string{"API_TOKEN": secret, "MODE": "agent"},
		Resources: map[string]string{"cpu": "500m", "memory": "128Mi"}}, sdk.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 2})
	if err != nil {
		t.Fatal(err)
	}
	// Each sandbox is a container start, which a loaded machine can
	// stretch to many seconds.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := c.Pools().Wait(ctx, "agents", 1, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}

	var list PoolListOutput
	text := ok(t, cs, "pool_list", nil, &list)
	if len(list.Pools) != 1 {
		t.Fatalf("pool_list: %+v", list)
	}
	p := list.Pools[0]
	if p.Name != "agents" || p.Image != busyboxImage || !slices.Equal(p.EnvNames, []string{"API_TOKEN", "MODE"}) ||
		p.Resources["memory"] != "128Mi" || p.Ready != 1 || p.BufferMax != 1 || p.PoolMax != 2 {
		t.Errorf("pool_list: %+v", p)
	}
	var got PoolInfo
	text += ok(t, cs, "pool_get", map[string]any{"pool": "agents"}, &got)
	if got.Name != "agents" || !slices.Equal(got.EnvNames, p.EnvNames) {
		t.Errorf("pool_get: %+v", got)
	}
	if strings.Contains(text, secret) || strings.Contains(text, `"agent"`) {
		t.Errorf("the tools show the pool's environment values:\n%s", text)
	}

	var sb SandboxInfo
	ok(t, cs, "sandbox_create", map[string]any{"pool": "agents", "env": map[string]any{"MODE": "mine"}}, &sb)
	if sb.State != sdk.StateRunning || sb.Image != busyboxImage {
		t.Errorf("created from the pool: %+v", sb)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.Kill(ctx, sb.SandboxID)
	})
	var out RunOutput
	ok(t, cs, "command_run", map[string]any{"sandbox_id": sb.SandboxID, "command": `echo "$MODE ${#API_TOKEN}"`}, &out)
	if out.Stdout != "mine 22\n" {
		t.Errorf("the pooled sandbox's environment: %+v", out)
	}
	ok(t, cs, "pool_get", map[string]any{"pool": "agents"}, &got)
	if got.HandedOut != 1 {
		t.Errorf("after the claim: %+v", got)
	}

	wantToolError(t, cs, "pool_get", map[string]any{"pool": "nope"}, "pool_list", api.CodePoolNotFound, "HTTP 404")
	wantToolError(t, cs, "sandbox_create", map[string]any{"pool": "nope"}, "pool_list", api.CodePoolNotFound)
}
