package sdk_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// poolWait bounds the wait for a pool's sandboxes: each is a container
// start, which a loaded 2-core machine can stretch to many seconds.
const poolWait = 3 * time.Minute

// newPool creates the pool name for one test and deletes it afterwards.
func newPool(t *testing.T, c *sdk.Client, name string, tmpl sdk.PoolTemplate, capacity sdk.Capacity) string {
	t.Helper()
	if _, err := c.Pools().Create(t.Context(), name, tmpl, capacity); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := contextWithTimeout(time.Minute)
		defer cancel()
		if err := c.Pools().Delete(ctx, name); err != nil && !errors.Is(err, sdk.ErrNotFound) {
			t.Errorf("delete pool %s: %v", name, err)
		}
	})
	return name
}

// waitPool waits for n ready sandboxes in the pool.
func waitPool(t *testing.T, c *sdk.Client, name string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), poolWait)
	defer cancel()
	if _, err := c.Pools().Wait(ctx, name, n, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
}

func TestPools(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	pools := c.Pools()
	tmpl := sdk.PoolTemplate{Image: busyboxImage, Entrypoint: []string{"sleep", "infinity"},
		Env: map[string]string{"FROM_POOL": "yes", "TOKEN": "secret"}, Resources: map[string]string{"cpu": "500m", "memory": "128Mi"}}
	name := newPool(t, c, "t-pools", tmpl, sdk.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 3})

	got, err := pools.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != name || got.Template == nil || got.Template.Image.URI != busyboxImage ||
		got.Template.ResourceLimits["memory"] != "128Mi" || got.CapacitySpec.PoolMax != 3 || got.Status == nil || got.CreatedAt == nil {
		t.Errorf("get: %+v", got)
	}
	if names := sdk.EnvNames(got.Template); !slices.Equal(names, []string{"FROM_POOL", "TOKEN"}) {
		t.Errorf("EnvNames = %v", names)
	}
	list, err := pools.List(ctx)
	if err != nil || !slices.ContainsFunc(list, func(p api.Pool) bool { return p.Name == name }) {
		t.Errorf("list: %+v %v", list, err)
	}
	waitPool(t, c, name, 1)

	// A create from the pool runs at once with the template's env and
	// its own over it, and counts a claim.
	sb := newSandbox(t, c, sdk.CreateOptions{Pool: name, Env: map[string]string{"TOKEN": "mine"}, Metadata: map[string]string{"from": "pool"}})
	res, err := sb.Run(ctx, "echo $FROM_POOL $TOKEN", nil)
	if err != nil || res.Stdout != "yes mine\n" {
		t.Errorf("pooled sandbox env: %+v %v", res, err)
	}
	info, err := sb.Info(ctx)
	if err != nil || info.Metadata["from"] != "pool" || info.Status.State != sdk.StateRunning {
		t.Errorf("pooled sandbox: %+v %v", info, err)
	}
	got, err = pools.Get(ctx, name)
	if err != nil || got.Status.Claims != 1 || got.Status.Allocated != 1 {
		t.Errorf("after the claim: %+v %v", got.Status, err)
	}

	// A capacity update keeps the template; a template update changes the
	// revision and keeps the capacity.
	rev := got.Status.Revision
	got, err = pools.Update(ctx, name, sdk.PoolUpdate{Capacity: &sdk.Capacity{BufferMin: 2, BufferMax: 2, PoolMax: 4}})
	if err != nil || got.CapacitySpec.BufferMax != 2 || got.Template.Image.URI != busyboxImage || got.Status.Revision != rev {
		t.Errorf("capacity update: %+v %v", got, err)
	}
	tmpl.Env = map[string]string{"FROM_POOL": "again"}
	got, err = pools.Update(ctx, name, sdk.PoolUpdate{Template: &tmpl})
	if err != nil || got.CapacitySpec.BufferMax != 2 || got.Template.Env["FROM_POOL"] != "again" || got.Status.Revision == rev {
		t.Errorf("template update: %+v %v (revision was %s)", got, err, rev)
	}
	waitPool(t, c, name, 2)
	sb2 := newSandbox(t, c, sdk.CreateOptions{Pool: name})
	if res, err := sb2.Run(ctx, "echo $FROM_POOL", nil); err != nil || res.Stdout != "again\n" {
		t.Errorf("sandbox of the new template: %+v %v", res, err)
	}

	// Deleting the pool leaves what it handed out.
	if err := pools.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Get(ctx, name); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("get after delete: %v, want ErrNotFound", err)
	}
	if res, err := sb.Run(ctx, "true", nil); err != nil || !res.OK() {
		t.Errorf("a handed-out sandbox after its pool's deletion: %+v %v", res, err)
	}
}

func TestPoolErrors(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	pools := c.Pools()
	tmpl := sdk.PoolTemplate{Image: busyboxImage}
	name := newPool(t, c, "t-pool-errors", tmpl, sdk.Capacity{PoolMax: 1})

	var apiErr *sdk.APIError
	_, err := pools.Create(ctx, name, tmpl, sdk.Capacity{PoolMax: 1})
	if !errors.Is(err, sdk.ErrConflict) || !errors.As(err, &apiErr) || apiErr.Code != api.CodePoolAlreadyExists {
		t.Errorf("second create: %v, want ErrConflict %s", err, api.CodePoolAlreadyExists)
	}
	for _, tc := range []struct {
		what string
		call func() error
		kind error
	}{
		{"get unknown", func() error { _, err := pools.Get(ctx, "no-such-pool"); return err }, sdk.ErrNotFound},
		{"update unknown", func() error {
			_, err := pools.Update(ctx, "no-such-pool", sdk.PoolUpdate{Capacity: &sdk.Capacity{PoolMax: 1}})
			return err
		}, sdk.ErrNotFound},
		{"delete unknown", func() error { return pools.Delete(ctx, "no-such-pool") }, sdk.ErrNotFound},
		{"create from unknown", func() error {
			_, err := c.Create(ctx, sdk.CreateOptions{Pool: "no-such-pool", SkipHealthCheck: true})
			return err
		}, sdk.ErrNotFound},
		{"bad name", func() error { _, err := pools.Create(ctx, "Bad_Name", tmpl, sdk.Capacity{PoolMax: 1}); return err }, sdk.ErrInvalid},
		{"no image", func() error {
			_, err := pools.Create(ctx, "no-image", sdk.PoolTemplate{}, sdk.Capacity{PoolMax: 1})
			return err
		}, sdk.ErrInvalid},
		{"bufferMax over poolMax", func() error {
			_, err := pools.Update(ctx, name, sdk.PoolUpdate{Capacity: &sdk.Capacity{BufferMin: 1, BufferMax: 2, PoolMax: 1}})
			return err
		}, sdk.ErrInvalid},
	} {
		if err := tc.call(); !errors.Is(err, tc.kind) {
			t.Errorf("%s: %v, want %v", tc.what, err, tc.kind)
		}
	}
	if _, err := c.Create(ctx, sdk.CreateOptions{Pool: name, SnapshotID: "x"}); err == nil || !strings.Contains(err.Error(), "snapshot") {
		t.Errorf("pool with a snapshot: %v", err)
	}

	// A wait that runs out says how far the pool got.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = pools.Wait(short, name, 5, 20*time.Millisecond)
	var waitErr *sdk.PoolWaitError
	if !errors.As(err, &waitErr) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "5 ready sandboxes in pool "+name) {
		t.Errorf("wait: %v", err)
	}
}

// TestPoolExtensions: a template's extensions reach the server and come
// back with the pool; keys a pool's template does not take, and bad
// values, are ErrInvalid with the server's message. The pool holds no
// sandboxes (bufferMax 0), so no container starts.
func TestPoolExtensions(t *testing.T) {
	c := newClient(t)
	ctx := t.Context()
	pools := c.Pools()
	ext := map[string]string{api.ExtensionIngressPublic: "true", api.ExtensionRenewExtend: "600"}
	name := newPool(t, c, "t-pool-ext", sdk.PoolTemplate{Image: busyboxImage, Extensions: ext}, sdk.Capacity{PoolMax: 1})
	got, err := pools.Get(ctx, name)
	if err != nil || got.Template == nil || !maps.Equal(got.Template.Extensions, ext) {
		t.Fatalf("get: %+v %v, want extensions %v", got.Template, err, ext)
	}
	// An update's template replaces the whole template, extensions too.
	got, err = pools.Update(ctx, name, sdk.PoolUpdate{Template: &sdk.PoolTemplate{Image: busyboxImage, Extensions: map[string]string{api.ExtensionRenewExtend: "900"}}})
	if err != nil || !maps.Equal(got.Template.Extensions, map[string]string{api.ExtensionRenewExtend: "900"}) {
		t.Errorf("update: %+v %v", got.Template, err)
	}

	for _, tc := range []struct {
		ext  map[string]string
		want string // in the server's message
	}{
		{map[string]string{api.ExtensionRenewExtend: "5"}, "from 300 to 86400"},
		{map[string]string{api.ExtensionIngressPublic: "yes"}, `want "true" or "false"`},
		{map[string]string{sdk.ExtensionPoolRef: "other"}, "takes ingress.public and access.renew.extend.seconds only"},
	} {
		_, err := pools.Create(ctx, "t-pool-ext-bad", sdk.PoolTemplate{Image: busyboxImage, Extensions: tc.ext}, sdk.Capacity{PoolMax: 1})
		var apiErr *sdk.APIError
		if !errors.Is(err, sdk.ErrInvalid) || !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest ||
			apiErr.Code != api.CodeSandboxInvalidParameter || !strings.Contains(apiErr.Message, tc.want) {
			t.Errorf("create with extensions %v: %v, want a 400 %s saying %q", tc.ext, err, api.CodeSandboxInvalidParameter, tc.want)
		}
	}
	if _, err := pools.Get(ctx, "t-pool-ext-bad"); !errors.Is(err, sdk.ErrNotFound) {
		t.Errorf("a refused pool exists: %v", err)
	}
}
