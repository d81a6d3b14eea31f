package kubernetes

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/lifecycle"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestSandboxNotFoundCode checks that a sandbox that does not exist is
// KUBERNETES::SANDBOX_NOT_FOUND, as the protocol has it, from every
// operation of the runtime and through the lifecycle API.
func TestSandboxNotFoundCode(t *testing.T) {
	env := newTestEnv(t)
	rt := env.runtime(t, env.config("codes"))
	ctx := t.Context()
	id := sandbox.NewID()

	checks := map[string]error{}
	_, checks["Get"] = rt.Get(ctx, id)
	checks["Delete"] = rt.Delete(ctx, id)
	_, checks["Endpoint"] = rt.Endpoint(ctx, id, api.ExecdPort)
	checks["SetExpiry"] = rt.SetExpiry(ctx, id, nil)
	label := "x"
	_, checks["PatchMetadata"] = rt.PatchMetadata(ctx, id, map[string]*string{"a": &label})
	for op, err := range checks {
		var ce *sandbox.CodedError
		if !errors.Is(err, sandbox.ErrNotFound) || !errors.As(err, &ce) || ce.Code != api.CodeKubernetesSandboxNotFound {
			t.Errorf("%s of a sandbox that does not exist: %v, want ErrNotFound coded %s", op, err, api.CodeKubernetesSandboxNotFound)
		}
	}

	srv, err := lifecycle.New(lifecycle.NewManager(rt, lifecycle.ManagerConfig{RuntimeName: "KUBERNETES"}),
		lifecycle.Config{APIKey: "k", RuntimeName: "KUBERNETES"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/" + string(id)},
		{"DELETE", "/v1/sandboxes/" + string(id)},
		{"GET", "/v1/sandboxes/" + string(id) + "/endpoints/" + strconv.Itoa(api.ExecdPort)},
	} {
		req, _ := http.NewRequestWithContext(ctx, c.method, ts.URL+c.path, nil)
		req.Header.Set(api.HeaderAPIKey, "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body api.ErrorResponse
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || derr != nil || body.Code != api.CodeKubernetesSandboxNotFound {
			t.Errorf("%s %s: %d %+v (%v), want 404 %s", c.method, c.path, resp.StatusCode, body, derr, api.CodeKubernetesSandboxNotFound)
		}
	}
}
