package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// ExtensionPoolRef is the create request's extension that claims a
// sandbox from a warm pool; CreateOptions.Pool sets it.
const ExtensionPoolRef = "poolRef"

// Pools manages a server's warm pools: sandboxes started ahead of time
// that a create with CreateOptions.Pool takes in milliseconds. A server
// whose runtime has no pools answers every call with ErrNotSupported.
// Obtain it with Client.Pools; it is safe for concurrent use.
//
// Stability: the routes are the reference's /pools; the status fields
// beyond total, allocated, available and revision are this server's.
type Pools struct {
	c *Client
}

// Pools returns the handle on the server's warm pools.
func (c *Client) Pools() *Pools { return &Pools{c: c} }

// PoolTemplate is what a pool's sandboxes are made from.
type PoolTemplate struct {
	// Image is the container image, local to the server's engine or in a
	// registry that needs no credentials (a pool keeps none).
	Image string
	// Entrypoint runs when a sandbox is claimed, unless the create gives
	// its own; empty leaves it to the create, or the server's default.
	Entrypoint []string
	// Env is given to every sandbox of the pool; a create adds its own
	// over it.
	Env map[string]string
	// Resources limits each sandbox ("cpu", "memory", ...), as
	// CreateOptions.Resources; empty takes the server's defaults.
	Resources map[string]string
	// NetworkPolicy, when set, is enforced on every sandbox of the pool
	// from its start, as CreateOptions.NetworkPolicy.
	NetworkPolicy *api.NetworkPolicy
	// Extensions are given to each sandbox the pool hands out, under the
	// create's own: api.ExtensionIngressPublic ("true": the ingress
	// gateway serves it without a token) and api.ExtensionRenewExtend
	// (renew-on-access). The server refuses any other key, and bad values,
	// with ErrInvalid.
	//
	// Stability: an extension of this server; the reference's pool
	// template has none.
	Extensions map[string]string
}

func (t *PoolTemplate) wire() *api.PoolTemplate {
	out := &api.PoolTemplate{Entrypoint: t.Entrypoint, Env: t.Env, ResourceLimits: t.Resources, Extensions: t.Extensions}
	if t.Image != "" {
		out.Image = &api.ImageSpec{URI: t.Image}
	}
	if t.NetworkPolicy != nil {
		out.NetworkPolicy, _ = json.Marshal(t.NetworkPolicy)
	}
	return out
}

// Capacity bounds a pool: ready sandboxes are refilled up to BufferMax
// whenever they fall below BufferMin; the pool's sandboxes, handed-out
// ones included, number from PoolMin to PoolMax.
type Capacity = api.CapacitySpec

// Create creates the pool name and returns it at once; its sandboxes
// start in the background (see Wait). A pool of that name already
// existing is ErrConflict.
func (p *Pools) Create(ctx context.Context, name string, tmpl PoolTemplate, capacity Capacity) (*api.Pool, error) {
	body := api.PoolRequest{Name: name, Template: tmpl.wire(), CapacitySpec: &capacity}
	r, err := p.c.server.jsonReq("create pool "+name, http.MethodPost, "/pools", nil, body)
	if err != nil {
		return nil, err
	}
	var out api.Pool
	if err := p.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Get returns a pool with its status.
func (p *Pools) Get(ctx context.Context, name string) (*api.Pool, error) {
	r := p.c.server.req("get pool "+name, http.MethodGet, "/pools/"+url.PathEscape(name), nil)
	r.idempotent = true
	var out api.Pool
	if err := p.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// List returns every pool of the server, by name.
func (p *Pools) List(ctx context.Context) ([]api.Pool, error) {
	r := p.c.server.req("list pools", http.MethodGet, "/pools", nil)
	r.idempotent = true
	var out api.ListPoolsResponse
	if err := p.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// PoolUpdate changes a pool; what it leaves nil is kept.
type PoolUpdate struct {
	// Template replaces the whole template. When it changes what makes a
	// sandbox (image, env, resources), the pool's status gets a new
	// revision and its ready sandboxes are replaced.
	Template *PoolTemplate
	// Capacity replaces the bounds; ready sandboxes beyond the new
	// BufferMax are removed.
	Capacity *Capacity
}

// Update changes a pool and returns it as it is afterwards.
func (p *Pools) Update(ctx context.Context, name string, u PoolUpdate) (*api.Pool, error) {
	body := api.PoolRequest{Name: name, CapacitySpec: u.Capacity}
	if u.Template != nil {
		body.Template = u.Template.wire()
	}
	r, err := p.c.server.jsonReq("update pool "+name, http.MethodPut, "/pools/"+url.PathEscape(name), nil, body)
	if err != nil {
		return nil, err
	}
	r.idempotent = true // putting the same definition twice is harmless
	var out api.Pool
	if err := p.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete deletes a pool and its ready sandboxes; those it handed out
// live on.
func (p *Pools) Delete(ctx context.Context, name string) error {
	r := p.c.server.req("delete pool "+name, http.MethodDelete, "/pools/"+url.PathEscape(name), nil)
	r.idempotent = true
	return p.c.t.call(ctx, r, nil)
}

// Wait polls a pool every interval (default 100 ms) until at least n of
// its sandboxes are ready, and returns it then. When ctx ends first, the
// error says how far the pool got and why its last sandbox failed to
// start, if it did.
func (p *Pools) Wait(ctx context.Context, name string, n int, interval time.Duration) (*api.Pool, error) {
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	var st *api.PoolStatus
	for {
		pool, err := p.Get(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				// The wait ran out during a request: say how far the pool
				// had got when last seen.
				return nil, &PoolWaitError{Name: name, Want: n, Status: st, Err: ctx.Err()}
			}
			return nil, err
		}
		st = pool.Status
		if st != nil && st.Available >= n {
			return pool, nil
		}
		if err := sleep(ctx, interval); err != nil {
			return nil, &PoolWaitError{Name: name, Want: n, Status: st, Err: err}
		}
	}
}

// PoolWaitError says a pool did not have the ready sandboxes a Wait asked
// for in time.
type PoolWaitError struct {
	Name   string
	Want   int
	Status *api.PoolStatus // as last seen; nil if the server gave none
	Err    error           // why the wait ended
}

func (e *PoolWaitError) Error() string {
	st := e.Status
	if st == nil {
		return fmt.Sprintf("wait for %d ready sandboxes in pool %s (no status): %v", e.Want, e.Name, e.Err)
	}
	msg := fmt.Sprintf("wait for %d ready sandboxes in pool %s (%d ready, %d starting, %d handed out)", e.Want, e.Name, st.Available, st.Starting, st.Allocated)
	if st.Error != "" {
		msg += ", last start failed: " + st.Error
	}
	return msg + ": " + e.Err.Error()
}

func (e *PoolWaitError) Unwrap() error { return e.Err }

// EnvNames is the sorted names of a template's environment, for showing a
// pool without its values.
func EnvNames(t *api.PoolTemplate) []string {
	if t == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(t.Env))
}
