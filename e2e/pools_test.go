package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// poolStatus polls a pool until cond holds.
func (s *server) waitPool(name string, cond func(api.PoolStatus) bool) api.Pool {
	s.t.Helper()
	var p api.Pool
	testwait.Wait{What: "pool " + name, Starts: 2, Describe: func() string {
		return fmt.Sprintf("pool %s: %+v\n%s", name, p.Status, testwait.Containers("label=opensandbox.scope="+s.scope))
	}}.Until(s.t, func() bool {
		s.call("GET", "/v1/pools/"+name, nil, 200, &p)
		return p.Status != nil && cond(*p.Status)
	})
	return p
}

// TestWarmPools drives warm pools through the server: a pool from the
// configuration and one made through /v1/pools, creates that claim from
// them by poolRef and by matching image and resources, concurrent creates
// beyond the pool's size, bad input, and a restart.
func TestWarmPools(t *testing.T) {
	s := startServer(t, serverOptions{docker: `
[[pools]]
name = "cfg"
image = "` + busyboxImage + `"
entrypoint = ["sleep", "1000000"]
env = { FROM_POOL = "cfg" }
resource_limits = { cpu = "500m", memory = "128Mi" }
buffer_min = 2
buffer_max = 3
pool_max = 10

[[pools]]
name = "plain"
image = "` + busyboxImage + `"
resource_limits = { cpu = "250m", memory = "96Mi" }
buffer_min = 1
buffer_max = 1
pool_max = 5
`})
	p := s.waitPool("cfg", func(st api.PoolStatus) bool { return st.Available == 3 })
	if p.Template == nil || p.Template.Image.URI != busyboxImage || p.CapacitySpec.BufferMax != 3 || p.Status.Revision == "" {
		t.Fatalf("pool from the config: %+v", p)
	}

	// poolRef: the template's entrypoint and env, the request's metadata,
	// env and timeout; Running at once.
	timeout := int64(600)
	start := time.Now()
	var created api.CreateSandboxResponse
	s.call("POST", "/v1/sandboxes", api.CreateSandboxRequest{
		Extensions: map[string]string{"poolRef": "cfg"}, Timeout: &timeout,
		Metadata: map[string]string{"team": "blue"}, Env: map[string]*string{"MINE": ptr("x")},
	}, 202, &created)
	if created.Status.State != "Running" {
		t.Fatalf("pooled create answered %+v", created)
	}
	c := s.execd(created.ID)
	if out := c.mustRun("echo $FROM_POOL $MINE"); out != "cfg x" {
		t.Errorf("environment %q", out)
	}
	t.Logf("pooled create to first command: %v", time.Since(start))
	var sb api.Sandbox
	s.call("GET", "/v1/sandboxes/"+created.ID, nil, 200, &sb)
	if sb.Metadata["team"] != "blue" || sb.ExpiresAt == nil || len(sb.Entrypoint) != 2 {
		t.Errorf("pooled sandbox %+v", sb)
	}

	// A plain create with the same image and resources claims too, from a
	// pool without variables of its own; one whose template sets some
	// serves only creates that name it.
	s.waitPool("plain", func(st api.PoolStatus) bool { return st.Available == 1 })
	req := sandboxRequest(busyboxImage, "sleep", "1000")
	req.ResourceLimits = map[string]string{"cpu": "250m", "memory": "96Mi"}
	s.call("POST", "/v1/sandboxes", req, 202, &created)
	if created.Status.State != "Running" {
		t.Errorf("matching create was not served warm: %+v", created)
	}
	s.execd(created.ID).mustRun("true")
	req.ResourceLimits = map[string]string{"cpu": "500m", "memory": "128Mi"}
	s.call("POST", "/v1/sandboxes", req, 202, &created)
	if created.Status.State == "Running" {
		t.Errorf("a plain create was served by a pool with variables of its own")
	}
	s.waitState(created.ID, "Running")
	if out := s.execd(created.ID).mustRun("echo x$FROM_POOL"); out != "x" {
		t.Errorf("a plain create got the pool's variables: %q", out)
	}

	// A pool through the API; concurrent creates beyond its size all work,
	// each sandbox handed out once.
	s.call("POST", "/v1/pools", api.PoolRequest{Name: "api",
		Template:     &api.PoolTemplate{Image: &api.ImageSpec{URI: busyboxImage}, ResourceLimits: map[string]string{"cpu": "250m", "memory": "64Mi"}},
		CapacitySpec: &api.CapacitySpec{BufferMin: 5, BufferMax: 5, PoolMax: 5}}, 201, nil)
	s.wantError("POST", "/v1/pools", api.PoolRequest{Name: "api", Template: &api.PoolTemplate{Image: &api.ImageSpec{URI: busyboxImage}},
		CapacitySpec: &api.CapacitySpec{BufferMax: 1, PoolMax: 1}}, http.StatusConflict, api.CodePoolAlreadyExists)
	s.waitPool("api", func(st api.PoolStatus) bool { return st.Available == 5 })
	const n = 12
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var r api.CreateSandboxResponse
			s.call("POST", "/v1/sandboxes", api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "api"}}, 202, &r)
			ids[i] = r.ID
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("sandbox %s handed out twice", id)
		}
		seen[id] = true
		s.waitState(id, "Running")
	}
	p = s.waitPool("api", func(st api.PoolStatus) bool { return st.Claims == 5 })
	if p.Status.Misses != n-5 || p.Status.Allocated != 5 {
		t.Errorf("after %d creates: %+v", n, p.Status)
	}

	// The server's metrics count the claims and the pooled creates.
	_, metrics := s.do("GET", "/metrics", nil)
	for _, want := range []string{`opensandbox_pool_claims_total{pool="api",result="hit"} 5`,
		`opensandbox_pool_claims_total{pool="api",result="miss"} 7`, `opensandbox_pool_sandboxes{pool="cfg",state="allocated"} 1`,
		`opensandbox_sandbox_create_duration_seconds_count{mode="pooled"} 7`,
		`opensandbox_pool_claims_total{pool="plain",result="hit"} 1`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// Shrink at run time.
	s.call("PUT", "/v1/pools/cfg", api.PoolRequest{CapacitySpec: &api.CapacitySpec{BufferMin: 1, BufferMax: 1, PoolMax: 10}}, 200, &p)
	if p.Template == nil || p.Template.Image.URI != busyboxImage {
		t.Errorf("a capacity-only update lost the template: %+v", p)
	}
	s.waitPool("cfg", func(st api.PoolStatus) bool { return st.Available == 1 && st.Starting == 0 })

	// Bad input.
	s.wantError("POST", "/v1/sandboxes", api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "nope"}}, 404, api.CodePoolNotFound)
	s.wantError("POST", "/v1/pools", api.PoolRequest{Name: "Bad Name"}, 400, api.CodeSandboxInvalidParameter)
	s.wantError("POST", "/v1/pools", api.PoolRequest{Name: "x", Template: &api.PoolTemplate{Image: &api.ImageSpec{URI: busyboxImage}},
		CapacitySpec: &api.CapacitySpec{BufferMin: 3, BufferMax: 2, PoolMax: 5}}, 400, api.CodeSandboxInvalidParameter)
	s.wantError("GET", "/v1/pools/nope", nil, 404, api.CodePoolNotFound)
	s.wantError("POST", "/v1/sandboxes", api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "cfg"}, SnapshotID: "abc"}, 400, api.CodeSandboxInvalidParameter)

	// A restart keeps the pools, their warm sandboxes and what they
	// handed out.
	s.stop(syscall.SIGTERM)
	s.start()
	var list api.ListPoolsResponse
	s.call("GET", "/v1/pools", nil, 200, &list)
	if len(list.Items) != 3 {
		t.Fatalf("pools after restart: %+v", list)
	}
	p = s.waitPool("cfg", func(st api.PoolStatus) bool { return st.Available == 1 })
	if p.Status.Allocated != 1 {
		t.Errorf("cfg after restart: %+v", p.Status)
	}
	s.execd(ids[0]).mustRun("true")
	s.call("POST", "/v1/sandboxes", api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "cfg"}}, 202, &created)
	if created.Status.State != "Running" {
		t.Errorf("claim after restart: %+v", created)
	}

	s.call("DELETE", "/v1/pools/api", nil, 204, nil)
	s.wantError("DELETE", "/v1/pools/api", nil, 404, api.CodePoolNotFound)
	// What the pool handed out stays.
	s.execd(ids[1]).mustRun("true")
}
