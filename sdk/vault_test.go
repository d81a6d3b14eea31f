package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// egressToken is the token the stand-in's endpoint hands out.
const egressToken = "egress-token"

// vaultWire is a stand-in of the wire a vault call crosses: the lifecycle
// server's endpoint route for port 18080 (sandbox sb-1 has an egress API
// under a proxy prefix, sb-free has none: its port proxy answers 502 in
// plain text as execd's does), and behind it scripted answers of the
// egress API. It records every request that reaches the egress API.
type vaultWire struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	answers []answer // consumed in order; the last one repeats
	seen    []seenRequest
}

type answer struct {
	status int
	body   string
}

type seenRequest struct {
	method, path, auth, contentType, body string
}

func newVaultWire(t *testing.T) *vaultWire {
	w := &vaultWire{t: t}
	mux := http.NewServeMux()
	w.srv = httptest.NewServer(mux)
	t.Cleanup(w.srv.Close)
	host := strings.TrimPrefix(w.srv.URL, "http://")
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/18080", func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("OPEN-SANDBOX-API-KEY") != "k" {
			http.Error(rw, `{"code":"UNAUTHORIZED","message":"no key"}`, http.StatusUnauthorized)
			return
		}
		var ep api.Endpoint
		switch r.PathValue("id") {
		case "sb-1":
			ep = api.Endpoint{Endpoint: host + "/proxy/18080", Headers: map[string]string{api.HeaderEgressAuth: egressToken}}
		case "sb-free":
			ep = api.Endpoint{Endpoint: host + "/free/proxy/18080"}
		default:
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusNotFound)
			json.NewEncoder(rw).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "sandbox not found"})
			return
		}
		json.NewEncoder(rw).Encode(ep)
	})
	mux.HandleFunc("/free/proxy/18080/", func(rw http.ResponseWriter, r *http.Request) {
		http.Error(rw, "Bad Gateway", http.StatusBadGateway)
	})
	mux.HandleFunc("/proxy/18080/", func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.seen = append(w.seen, seenRequest{
			method: r.Method, path: strings.TrimPrefix(r.URL.EscapedPath(), "/proxy/18080"),
			auth: r.Header.Get(api.HeaderEgressAuth), contentType: r.Header.Get("Content-Type"), body: string(body),
		})
		a := answer{status: http.StatusInternalServerError, body: "no answer scripted"}
		if len(w.answers) > 0 {
			a = w.answers[0]
			if len(w.answers) > 1 {
				w.answers = w.answers[1:]
			}
		}
		w.mu.Unlock()
		if a.status >= 400 {
			// The egress API's errors are text/plain, as http.Error writes.
			http.Error(rw, a.body, a.status)
			return
		}
		if a.body != "" {
			rw.Header().Set("Content-Type", "application/json")
		}
		rw.WriteHeader(a.status)
		io.WriteString(rw, a.body)
	})
	return w
}

// script sets the answers of the next requests and forgets those seen.
func (w *vaultWire) script(answers ...answer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answers, w.seen = answers, nil
}

func (w *vaultWire) requests() []seenRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seenRequest(nil), w.seen...)
}

func (w *vaultWire) client(t *testing.T) *sdk.Client {
	c, err := sdk.NewClient(sdk.Config{Domain: w.srv.URL, APIKey: "k", RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

const stateJSON = `{"revision":2,"credentials":[{"name":"gh-token","sourceType":"inline","revision":2}],` +
	`"bindings":[{"name":"github","revision":2,"match":{"hosts":["api.github.test"],"schemes":["https"],"ports":[443],` +
	`"methods":["GET","POST","PUT","PATCH","DELETE"],"paths":["/*"]},"auth":{"type":"bearer"}}]}`

func wantState(t *testing.T, got api.CredentialVaultState) {
	t.Helper()
	if got.Revision != 2 || len(got.Credentials) != 1 || got.Credentials[0] != (api.CredentialMetadata{Name: "gh-token", SourceType: "inline", Revision: 2}) ||
		len(got.Bindings) != 1 || got.Bindings[0].Name != "github" || got.Bindings[0].Auth.Type != "bearer" || got.Bindings[0].Match.Ports[0] != 443 {
		t.Errorf("state %+v", got)
	}
}

// TestVaultRequests checks what each vault call sends and how it reads
// the answer.
func TestVaultRequests(t *testing.T) {
	w := newVaultWire(t)
	v := w.client(t).Sandbox("sb-1").Vault()
	rev := int64(1)
	create := api.CredentialVaultCreateRequest{
		Credentials: []api.Credential{{Name: "gh-token", Source: api.CredentialSource{Type: "inline", Value: "s3cret"}}},
		Bindings: []api.CredentialBinding{{Name: "github", Match: api.CredentialMatch{Hosts: []string{"api.github.test"}},
			Auth: api.CredentialAuth{Type: "bearer", Credential: "gh-token"}}},
	}
	patch := api.CredentialVaultMutationRequest{
		ExpectedRevision: &rev,
		Credentials:      &api.CredentialMutation{Replace: []api.Credential{{Name: "gh-token", Source: api.CredentialSource{Value: "n3w"}}}},
		Bindings:         &api.BindingMutation{Delete: []string{"old"}},
	}
	for _, tc := range []struct {
		name     string
		call     func(ctx context.Context) (any, error)
		answer   answer
		method   string
		path     string
		body     string // exact JSON sent; "" for none
		check    func(t *testing.T, got any)
		wantNone bool // the call returns nothing
	}{
		{name: "create", call: func(ctx context.Context) (any, error) { return v.Create(ctx, create) },
			answer: answer{http.StatusCreated, stateJSON}, method: "POST", path: "/credential-vault",
			body: `{"credentials":[{"name":"gh-token","source":{"type":"inline","value":"s3cret"}}],` +
				`"bindings":[{"name":"github","match":{"hosts":["api.github.test"]},"auth":{"type":"bearer","credential":"gh-token"}}]}`,
			check: func(t *testing.T, got any) { wantState(t, got.(api.CredentialVaultState)) }},
		{name: "get", call: func(ctx context.Context) (any, error) { return v.Get(ctx) },
			answer: answer{http.StatusOK, stateJSON}, method: "GET", path: "/credential-vault",
			check: func(t *testing.T, got any) { wantState(t, got.(api.CredentialVaultState)) }},
		{name: "patch", call: func(ctx context.Context) (any, error) { return v.Patch(ctx, patch) },
			answer: answer{http.StatusOK, stateJSON}, method: "PATCH", path: "/credential-vault",
			body:  `{"expectedRevision":1,"credentials":{"replace":[{"name":"gh-token","source":{"value":"n3w"}}]},"bindings":{"delete":["old"]}}`,
			check: func(t *testing.T, got any) { wantState(t, got.(api.CredentialVaultState)) }},
		{name: "delete", call: func(ctx context.Context) (any, error) { return nil, v.Delete(ctx) },
			answer: answer{http.StatusNoContent, ""}, method: "DELETE", path: "/credential-vault", wantNone: true},
		{name: "credentials", call: func(ctx context.Context) (any, error) { return v.Credentials(ctx) },
			answer: answer{http.StatusOK, `{"revision":3,"credentials":[{"name":"a","sourceType":"inline","revision":1},{"name":"b","sourceType":"inline","revision":3}]}`},
			method: "GET", path: "/credential-vault/credentials",
			check: func(t *testing.T, got any) {
				l := got.(api.CredentialListResponse)
				if l.Revision != 3 || len(l.Credentials) != 2 || l.Credentials[1].Name != "b" || l.Credentials[1].Revision != 3 {
					t.Errorf("list %+v", l)
				}
			}},
		{name: "credential", call: func(ctx context.Context) (any, error) { return v.Credential(ctx, "gh token/1") },
			answer: answer{http.StatusOK, `{"name":"gh token/1","sourceType":"inline","revision":4}`},
			method: "GET", path: "/credential-vault/credentials/gh%20token%2F1",
			check: func(t *testing.T, got any) {
				if m := got.(api.CredentialMetadata); m != (api.CredentialMetadata{Name: "gh token/1", SourceType: "inline", Revision: 4}) {
					t.Errorf("metadata %+v", m)
				}
			}},
		{name: "bindings", call: func(ctx context.Context) (any, error) { return v.Bindings(ctx) },
			answer: answer{http.StatusOK, `{"revision":2,"bindings":[{"name":"k","revision":2,"match":{"hosts":["*.api.test"]},"auth":{"type":"apiKey","name":"X-Api-Key"}}]}`},
			method: "GET", path: "/credential-vault/bindings",
			check: func(t *testing.T, got any) {
				l := got.(api.CredentialBindingListResponse)
				if l.Revision != 2 || len(l.Bindings) != 1 || l.Bindings[0].Auth != (api.CredentialAuthMetadata{Type: "apiKey", Name: "X-Api-Key"}) || l.Bindings[0].Match.Hosts[0] != "*.api.test" {
					t.Errorf("list %+v", l)
				}
			}},
		{name: "binding", call: func(ctx context.Context) (any, error) { return v.Binding(ctx, "github") },
			answer: answer{http.StatusOK, `{"name":"github","revision":2,"match":{"hosts":["api.github.test"]},"auth":{"type":"basic"}}`},
			method: "GET", path: "/credential-vault/bindings/github",
			check: func(t *testing.T, got any) {
				if b := got.(api.CredentialBindingMetadata); b.Name != "github" || b.Auth.Type != "basic" {
					t.Errorf("binding %+v", b)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.script(tc.answer)
			got, err := tc.call(t.Context())
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			reqs := w.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests reached the egress API, want 1: %+v", len(reqs), reqs)
			}
			r := reqs[0]
			if r.method != tc.method || r.path != tc.path || r.auth != egressToken {
				t.Errorf("sent %s %s with token %q; want %s %s with %q", r.method, r.path, r.auth, tc.method, tc.path, egressToken)
			}
			if r.body != tc.body {
				t.Errorf("body %s\nwant %s", r.body, tc.body)
			}
			if tc.body != "" && r.contentType != "application/json" {
				t.Errorf("content type %q", r.contentType)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

// TestVaultErrors checks that each status the vault answers becomes an
// error of the right kinds, with the server's message and no value.
func TestVaultErrors(t *testing.T) {
	w := newVaultWire(t)
	c := w.client(t)
	v := c.Sandbox("sb-1").Vault()
	create := func(ctx context.Context) error {
		_, err := v.Create(ctx, api.CredentialVaultCreateRequest{Credentials: []api.Credential{{Name: "a", Source: api.CredentialSource{Value: "s3cret-value"}}}})
		return err
	}
	patch := func(ctx context.Context) error {
		_, err := v.Patch(ctx, api.CredentialVaultMutationRequest{Credentials: &api.CredentialMutation{Add: []api.Credential{{Name: "b", Source: api.CredentialSource{Value: "s3cret-value"}}}}})
		return err
	}
	get := func(ctx context.Context) error { _, err := v.Get(ctx); return err }
	credential := func(ctx context.Context) error { _, err := v.Credential(ctx, "a"); return err }
	binding := func(ctx context.Context) error { _, err := v.Binding(ctx, "a"); return err }
	del := func(ctx context.Context) error { return v.Delete(ctx) }

	vaultKinds := []error{sdk.ErrNoVault, sdk.ErrNoVaultEntry, sdk.ErrVaultExists, sdk.ErrRevisionConflict, sdk.ErrNoCredentialProxy, sdk.ErrVaultNeedsTLS, sdk.ErrNoEgress}
	for _, tc := range []struct {
		name   string
		call   func(context.Context) error
		status int
		msg    string
		want   []error
	}{
		{"create exists", create, 409, "credential vault already exists", []error{sdk.ErrVaultExists, sdk.ErrConflict}},
		{"patch revision", patch, 409, "expectedRevision 3 does not match revision 4", []error{sdk.ErrRevisionConflict, sdk.ErrConflict}},
		{"get none", get, 404, "credential vault not found", []error{sdk.ErrNoVault, sdk.ErrNotFound}},
		{"patch none", patch, 404, "credential vault not found", []error{sdk.ErrNoVault, sdk.ErrNotFound}},
		{"delete none", del, 404, "credential vault not found", []error{sdk.ErrNoVault, sdk.ErrNotFound}},
		{"credential none", credential, 404, "credential \"a\" not found", []error{sdk.ErrNoVaultEntry, sdk.ErrNotFound}},
		{"binding none", binding, 404, "binding \"a\" not found", []error{sdk.ErrNoVaultEntry, sdk.ErrNotFound}},
		{"create no proxy", create, 412, "the credential proxy is not enabled for this sandbox", []error{sdk.ErrNoCredentialProxy, sdk.ErrInvalid}},
		{"delete no proxy", del, 412, "the credential proxy is not enabled for this sandbox", []error{sdk.ErrNoCredentialProxy, sdk.ErrInvalid}},
		{"patch plain http", patch, 426, "credential vault writes need TLS", []error{sdk.ErrVaultNeedsTLS, sdk.ErrInvalid}},
		{"create invalid", create, 400, "bindings[0].match.hosts[0]: \"10.0.0.1\" is an address, want a name", []error{sdk.ErrInvalid}},
		{"get unauthorized", get, 401, "unauthorized", []error{sdk.ErrUnauthorized}},
		{"create too big", create, 413, "request body too large", []error{sdk.ErrInvalid}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.script(answer{tc.status, tc.msg})
			err := tc.call(t.Context())
			if err == nil {
				t.Fatal("no error")
			}
			for _, k := range vaultKinds {
				want := false
				for _, wk := range tc.want {
					want = want || wk == k
				}
				if errors.Is(err, k) != want {
					t.Errorf("errors.Is(%v, %q) = %v, want %v", err, k, !want, want)
				}
			}
			for _, k := range tc.want {
				if !errors.Is(err, k) {
					t.Errorf("errors.Is(%v, %q) = false", err, k)
				}
			}
			var ae *sdk.APIError
			if !errors.As(err, &ae) || ae.StatusCode != tc.status || ae.Message != tc.msg {
				t.Errorf("APIError %+v", ae)
			}
			if s := err.Error(); !strings.Contains(s, tc.msg) || !strings.Contains(s, "sandbox sb-1") || strings.Contains(s, "s3cret") {
				t.Errorf("message %q", s)
			}
		})
	}

	t.Run("no egress API", func(t *testing.T) {
		_, err := c.Sandbox("sb-free").Vault().Get(t.Context())
		if !errors.Is(err, sdk.ErrNoEgress) || errors.Is(err, sdk.ErrNoVault) {
			t.Errorf("err = %v, want ErrNoEgress only", err)
		}
	})
	t.Run("no sandbox", func(t *testing.T) {
		_, err := c.Sandbox("sb-gone").Vault().Get(t.Context())
		if !errors.Is(err, sdk.ErrNotFound) || errors.Is(err, sdk.ErrNoVault) {
			t.Errorf("err = %v, want ErrNotFound without ErrNoVault", err)
		}
	})
	t.Run("empty name", func(t *testing.T) {
		w.script(answer{200, `{}`})
		_, err := v.Binding(t.Context(), " ")
		if !errors.Is(err, sdk.ErrInvalid) || len(w.requests()) != 0 {
			t.Errorf("err = %v after %d requests", err, len(w.requests()))
		}
	})
	t.Run("policy calls keep their kinds", func(t *testing.T) {
		// A 412 of the policy routes is not about the credential proxy.
		w.script(answer{412, "precondition"})
		_, err := c.Sandbox("sb-1").EgressPolicy(t.Context())
		if !errors.Is(err, sdk.ErrInvalid) || errors.Is(err, sdk.ErrNoCredentialProxy) {
			t.Errorf("err = %v", err)
		}
	})
}

// TestVaultRetries: reads are retried after a transient failure, writes
// never, since a write that did land would then fail as a conflict.
func TestVaultRetries(t *testing.T) {
	w := newVaultWire(t)
	v := w.client(t).Sandbox("sb-1").Vault()

	w.script(answer{http.StatusServiceUnavailable, "starting"}, answer{http.StatusOK, stateJSON})
	st, err := v.Get(t.Context())
	if err != nil || len(w.requests()) != 2 {
		t.Fatalf("get: %v after %d requests, want success after 2", err, len(w.requests()))
	}
	wantState(t, st)

	writes := map[string]func(context.Context) error{
		"create": func(ctx context.Context) error {
			_, err := v.Create(ctx, api.CredentialVaultCreateRequest{})
			return err
		},
		"patch": func(ctx context.Context) error {
			_, err := v.Patch(ctx, api.CredentialVaultMutationRequest{})
			return err
		},
		"delete": func(ctx context.Context) error { return v.Delete(ctx) },
	}
	for name, write := range writes {
		w.script(answer{http.StatusServiceUnavailable, "starting"}, answer{http.StatusOK, stateJSON})
		if err := write(t.Context()); !errors.Is(err, sdk.ErrUnavailable) || len(w.requests()) != 1 {
			t.Errorf("%s: %v after %d requests, want ErrUnavailable after 1", name, err, len(w.requests()))
		}
	}
}

// TestCreateCredentialProxy checks the create request of a sandbox with
// the credential proxy, and that it needs a network policy.
func TestCreateCredentialProxy(t *testing.T) {
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes" {
			http.NotFound(w, r)
			return
		}
		body, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"id":"sb-9"}`)
	}))
	defer srv.Close()
	c, err := sdk.NewClient(sdk.Config{Domain: srv.URL, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pol := &api.NetworkPolicy{DefaultAction: "deny", Egress: []api.NetworkRule{{Action: "allow", Target: "api.github.test"}}}
	sb, err := c.Create(t.Context(), sdk.CreateOptions{Image: "img", NetworkPolicy: pol, CredentialProxy: true, SkipHealthCheck: true})
	if err != nil || sb.ID != "sb-9" {
		t.Fatalf("create: %v", err)
	}
	var sent struct {
		CredentialProxy *api.CredentialProxy `json:"credentialProxy"`
		NetworkPolicy   *api.NetworkPolicy   `json:"networkPolicy"`
	}
	if err := json.Unmarshal(body, &sent); err != nil || sent.CredentialProxy == nil || !sent.CredentialProxy.Enabled || sent.NetworkPolicy == nil {
		t.Errorf("sent %s (%v)", body, err)
	}
	body = nil
	if _, err := c.Create(t.Context(), sdk.CreateOptions{Image: "img", CredentialProxy: true, SkipHealthCheck: true}); err == nil || !strings.Contains(err.Error(), "network policy") || body != nil {
		t.Errorf("credential proxy without a policy: %v (sent %s)", err, body)
	}
}
