package mcp

import (
	"context"
	"strings"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// PoolInfo is a warm pool as the tools describe it. The template's
// environment is given by names only: its values may be credentials the
// operator gave the pool's sandboxes, and a model's context is no place
// for them.
type PoolInfo struct {
	Name       string            `json:"name"`
	Image      string            `json:"image" jsonschema:"image of the pool's sandboxes"`
	Entrypoint []string          `json:"entrypoint,omitempty" jsonschema:"what a sandbox of the pool runs once handed out, unless sandbox_create gives its own"`
	EnvNames   []string          `json:"env_names,omitempty" jsonschema:"names of the environment variables every sandbox of the pool has (their values are not shown)"`
	Resources  map[string]string `json:"resources,omitempty" jsonschema:"resource limits of each sandbox (cpu, memory...)"`
	Ready      int               `json:"ready" jsonschema:"sandboxes ready to be handed out now"`
	Starting   int               `json:"starting" jsonschema:"sandboxes being started"`
	HandedOut  int               `json:"handed_out" jsonschema:"sandboxes handed out and still alive"`
	BufferMin  int               `json:"buffer_min" jsonschema:"the pool refills when fewer than this are ready"`
	BufferMax  int               `json:"buffer_max" jsonschema:"the pool refills up to this many ready sandboxes"`
	PoolMax    int               `json:"pool_max" jsonschema:"most sandboxes of the pool, handed-out ones included"`
	Error      string            `json:"error,omitempty" jsonschema:"why the pool's last sandbox failed to start, if it did"`
}

func poolInfo(p *api.Pool) PoolInfo {
	c := p.CapacitySpec
	info := PoolInfo{Name: p.Name, BufferMin: c.BufferMin, BufferMax: c.BufferMax, PoolMax: c.PoolMax, EnvNames: sdk.EnvNames(p.Template)}
	if t := p.Template; t != nil {
		info.Entrypoint, info.Resources = t.Entrypoint, t.ResourceLimits
		if t.Image != nil {
			info.Image = t.Image.URI
		}
	}
	if s := p.Status; s != nil {
		info.Ready, info.Starting, info.HandedOut, info.Error = s.Available, s.Starting, s.Allocated, s.Error
	}
	return info
}

type poolArg struct {
	Pool string `json:"pool" jsonschema:"name of the pool, as pool_list gives it"`
}

func (a poolArg) validate() error {
	if strings.TrimSpace(a.Pool) == "" || strings.ContainsAny(a.Pool, "/?#") {
		return argErrorf("pool %q is not a pool name; call pool_list to find it", a.Pool)
	}
	return nil
}

// PoolListOutput is every pool of the server.
type PoolListOutput struct {
	Pools []PoolInfo `json:"pools"`
}

func (s *Server) addPoolTools() {
	add(s, &gomcp.Tool{
		Name: "pool_list",
		Description: `List the server's warm pools: sandboxes of one image started ahead of time.
sandbox_create with "pool" set to a pool's name takes one of its ready sandboxes, which runs at once instead of in a second or more.
Shows each pool's image, resources, the names of its environment variables, and how many sandboxes are ready.`,
		Annotations: &gomcp.ToolAnnotations{Title: "List warm pools", ReadOnlyHint: true},
	}, func(ctx context.Context, _ struct{}) (*gomcp.CallToolResult, PoolListOutput, error) {
		pools, err := s.client.Pools().List(ctx)
		if err != nil {
			return nil, PoolListOutput{}, err
		}
		out := PoolListOutput{Pools: make([]PoolInfo, 0, len(pools))}
		for i := range pools {
			out.Pools = append(out.Pools, poolInfo(&pools[i]))
		}
		return nil, out, nil
	})

	add(s, &gomcp.Tool{
		Name:        "pool_get",
		Description: "Get one warm pool: its image, resources, the names of its environment variables, how many sandboxes are ready, starting and handed out, and why its last sandbox failed to start if one did.",
		Annotations: &gomcp.ToolAnnotations{Title: "Get warm pool", ReadOnlyHint: true},
	}, func(ctx context.Context, in poolArg) (*gomcp.CallToolResult, PoolInfo, error) {
		p, err := s.client.Pools().Get(ctx, in.Pool)
		if err != nil {
			return nil, PoolInfo{}, err
		}
		return nil, poolInfo(p), nil
	})
}
