package mcp

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
)

// The operator's secrets in these tests: no tool result may hold them.
const (
	ghSecret  = "ghp-s3cret-value"
	npmSecret = "npm-s3cret-value"
)

// fakeVault stands in for a sandbox's credential vault as egress.md §5
// describes it: statuses, strict revisions, per collection delete then
// replace then add, a credential in use cannot go, binding hosts must
// be allowed. It records the writes it is sent.
type fakeVault struct {
	mu       sync.Mutex
	allowed  []string // hosts the egress policy allows
	exists   bool
	revision int64
	creds    map[string]string // name -> value
	bindings map[string]api.CredentialBinding
	writes   []string // "METHOD body"
	// bumpOnce, when set, makes the next write see a vault changed by
	// someone else: its revision goes up first.
	bumpOnce bool
}

func (f *fakeVault) reset() {
	f.exists, f.revision, f.creds, f.bindings, f.writes = false, 0, map[string]string{}, map[string]api.CredentialBinding{}, nil
}

func (f *fakeVault) state() api.CredentialVaultState {
	st := api.CredentialVaultState{Revision: f.revision, Credentials: []api.CredentialMetadata{}, Bindings: []api.CredentialBindingMetadata{}}
	for n := range f.creds {
		st.Credentials = append(st.Credentials, api.CredentialMetadata{Name: n, SourceType: "inline", Revision: f.revision})
	}
	for _, b := range f.bindings {
		m := b.Match
		if len(m.Methods) == 0 {
			m.Methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
		}
		if len(m.Paths) == 0 {
			m.Paths = []string{"/*"}
		}
		st.Bindings = append(st.Bindings, api.CredentialBindingMetadata{Name: b.Name, Revision: f.revision, Match: m,
			Auth: api.CredentialAuthMetadata{Type: b.Auth.Type, Name: b.Auth.Name}})
	}
	sort.Slice(st.Credentials, func(i, j int) bool { return st.Credentials[i].Name < st.Credentials[j].Name })
	sort.Slice(st.Bindings, func(i, j int) bool { return st.Bindings[i].Name < st.Bindings[j].Name })
	return st
}

// check is the validation of a vault after a change.
func (f *fakeVault) check(creds map[string]string, bindings map[string]api.CredentialBinding) error {
	for _, b := range bindings {
		if _, ok := creds[b.Auth.Credential]; !ok {
			return fmt.Errorf("binding %s: credential %q does not exist", b.Name, b.Auth.Credential)
		}
		for _, h := range b.Match.Hosts {
			if !slices.Contains(f.allowed, h) {
				return fmt.Errorf("binding %s: host %s is not covered by an explicit allow rule", b.Name, h)
			}
		}
	}
	return nil
}

func (f *fakeVault) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get(api.HeaderEgressAuth) != "vault-token" {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if r.Method != http.MethodGet {
		f.writes = append(f.writes, r.Method+" "+string(body))
		if f.bumpOnce && f.exists {
			f.bumpOnce = false
			f.revision++
		}
	}
	reply := func(status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(v)
	}
	switch r.Method + " " + r.URL.Path {
	case "GET /credential-vault":
		if !f.exists {
			http.Error(w, "credential vault not found", http.StatusNotFound)
			return
		}
		reply(http.StatusOK, f.state())
	case "POST /credential-vault":
		if f.exists {
			http.Error(w, "credential vault already exists", http.StatusConflict)
			return
		}
		var req api.CredentialVaultCreateRequest
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "invalid JSON", http.StatusBadRequest)
			return
		}
		creds, bindings := map[string]string{}, map[string]api.CredentialBinding{}
		for _, c := range req.Credentials {
			creds[c.Name] = c.Source.Value
		}
		for _, b := range req.Bindings {
			bindings[b.Name] = b
		}
		if err := f.check(creds, bindings); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.exists, f.revision, f.creds, f.bindings = true, 1, creds, bindings
		reply(http.StatusCreated, f.state())
	case "PATCH /credential-vault":
		if !f.exists {
			http.Error(w, "credential vault not found", http.StatusNotFound)
			return
		}
		var req api.CredentialVaultMutationRequest
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			http.Error(w, "invalid JSON", http.StatusBadRequest)
			return
		}
		if req.ExpectedRevision != nil && *req.ExpectedRevision != f.revision {
			http.Error(w, fmt.Sprintf("expectedRevision %d, vault at %d", *req.ExpectedRevision, f.revision), http.StatusConflict)
			return
		}
		creds, bindings := maps.Clone(f.creds), maps.Clone(f.bindings)
		if m := req.Credentials; m != nil {
			if err := mutate(creds, m.Delete, m.Replace, m.Add, func(c api.Credential) (string, string) { return c.Name, c.Source.Value }); err != nil {
				http.Error(w, "credentials: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		if m := req.Bindings; m != nil {
			if err := mutate(bindings, m.Delete, m.Replace, m.Add, func(b api.CredentialBinding) (string, api.CredentialBinding) { return b.Name, b }); err != nil {
				http.Error(w, "bindings: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		if err := f.check(creds, bindings); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.revision++
		f.creds, f.bindings = creds, bindings
		reply(http.StatusOK, f.state())
	default:
		http.NotFound(w, r)
	}
}

// mutate applies delete, replace, add to m as the contract says.
func mutate[T, V any](m map[string]V, del []string, replace, add []T, kv func(T) (string, V)) error {
	for _, n := range del {
		if _, ok := m[n]; !ok {
			return fmt.Errorf("delete %q: no such name", n)
		}
		delete(m, n)
	}
	for _, it := range replace {
		n, v := kv(it)
		if _, ok := m[n]; !ok {
			return fmt.Errorf("replace %q: no such name", n)
		}
		m[n] = v
	}
	for _, it := range add {
		n, v := kv(it)
		if _, ok := m[n]; ok {
			return fmt.Errorf("add %q: exists", n)
		}
		m[n] = v
	}
	return nil
}

// vaultStandIn serves the lifecycle server's endpoint of port 18080:
// sb-vault leads to f, sb-noproxy to an egress API without the
// credential proxy (412 on every vault route), sb-free to a port proxy
// where nothing listens.
func vaultStandIn(t *testing.T, f *fakeVault) string {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/18080", func(w http.ResponseWriter, r *http.Request) {
		prefix := map[string]string{"sb-vault": "/vault", "sb-noproxy": "/noproxy", "sb-free": "/free"}[r.PathValue("id")]
		if prefix == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "sandbox not found"})
			return
		}
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: host + prefix, Headers: map[string]string{api.HeaderEgressAuth: "vault-token"}})
	})
	mux.Handle("/vault/", http.StripPrefix("/vault", f))
	mux.HandleFunc("/noproxy/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the credential proxy is not enabled for this sandbox", http.StatusPreconditionFailed)
	})
	mux.HandleFunc("/free/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Bad Gateway", http.StatusBadGateway)
	})
	return host
}

// vaultCall calls a tool and fails the test if any of its text or
// structured content holds a secret.
func vaultCall(t *testing.T, cs *gomcp.ClientSession, tool string, args map[string]any) (*gomcp.CallToolResult, string) {
	t.Helper()
	res, text := call(t, cs, tool, args)
	b, _ := json.Marshal(res)
	for _, s := range []string{ghSecret, npmSecret} {
		if strings.Contains(text, s) || strings.Contains(string(b), s) {
			t.Fatalf("%s returned a secret: %s", tool, b)
		}
	}
	return res, text
}

func vaultOK(t *testing.T, cs *gomcp.ClientSession, tool string, args map[string]any) (VaultOutput, string) {
	t.Helper()
	res, text := vaultCall(t, cs, tool, args)
	if res.IsError {
		t.Fatalf("%s(%v): tool error: %s", tool, args, text)
	}
	var out VaultOutput
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out, text
}

func vaultError(t *testing.T, cs *gomcp.ClientSession, tool string, args map[string]any, wants ...string) {
	t.Helper()
	res, text := vaultCall(t, cs, tool, args)
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded: %s", tool, args, text)
	}
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s(%v) error %q does not say %q", tool, args, text, w)
		}
	}
}

func TestVaultTools(t *testing.T) {
	f := &fakeVault{allowed: []string{"api.github.test", "registry.npm.test", "evil.test"}}
	f.reset()
	cs := connect(t, newTestServer(t, vaultStandIn(t, f), Config{VaultCredentials: map[string]VaultCredential{
		"github": {Value: ghSecret, Hosts: []string{"api.github.test", "*.github.test"}},
		"npm":    {Value: npmSecret},
	}}))
	sb := map[string]any{"sandbox_id": "sb-vault"}
	attach := func(kv ...any) map[string]any {
		m := map[string]any{"sandbox_id": "sb-vault"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	writes := func() []string {
		f.mu.Lock()
		defer f.mu.Unlock()
		w := f.writes
		f.writes = nil
		return w
	}

	out, text := vaultOK(t, cs, "vault_get", sb)
	if out.Exists || !slices.Equal(out.Available, []string{"github", "npm"}) || !strings.Contains(text, "no credential vault yet") {
		t.Errorf("vault_get before any: %+v\n%s", out, text)
	}

	// The first attach creates the vault, with the value on the wire.
	out, text = vaultOK(t, cs, "vault_attach", attach("credential", "github", "hosts", []string{"API.github.test"}, "auth_type", "bearer", "methods", []string{"get"}))
	if w := writes(); len(w) != 1 || w[0] != `POST {"credentials":[{"name":"github","source":{"type":"inline","value":"`+ghSecret+`"}}],`+
		`"bindings":[{"name":"github","match":{"hosts":["api.github.test"],"methods":["GET"]},"auth":{"type":"bearer","credential":"github"}}]}` {
		t.Errorf("writes %q", w)
	}
	if !out.Exists || out.Revision != 1 || !slices.Equal(out.Credentials, []string{"github"}) || len(out.Bindings) != 1 ||
		out.Bindings[0].AuthType != "bearer" || !strings.Contains(text, "requests to api.github.test now carry credential github") {
		t.Errorf("attach: %+v\n%s", out, text)
	}

	// The second patches it at the revision read.
	out, _ = vaultOK(t, cs, "vault_attach", attach("credential", "npm", "binding", "npm-registry", "hosts", []string{"registry.npm.test"}, "auth_type", "apiKey", "header", "X-Npm-Token", "paths", []string{"/private/*"}))
	if w := writes(); len(w) != 1 || w[0] != `PATCH {"expectedRevision":1,"credentials":{"add":[{"name":"npm","source":{"type":"inline","value":"`+npmSecret+`"}}]},`+
		`"bindings":{"add":[{"name":"npm-registry","match":{"hosts":["registry.npm.test"],"paths":["/private/*"]},"auth":{"type":"apiKey","credential":"npm","name":"X-Npm-Token"}}]}}` {
		t.Errorf("writes %q", w)
	}
	if out.Revision != 2 || len(out.Bindings) != 2 || out.Bindings[1].Header != "X-Npm-Token" {
		t.Errorf("second attach: %+v", out)
	}

	// Attaching again replaces, and survives a change made meanwhile.
	f.mu.Lock()
	f.bumpOnce = true
	f.mu.Unlock()
	out, _ = vaultOK(t, cs, "vault_attach", attach("credential", "github", "hosts", []string{"api.github.test"}, "auth_type", "basic"))
	if w := writes(); len(w) != 2 || !strings.Contains(w[1], `"expectedRevision":3`) || !strings.Contains(w[1], `"replace":[{"name":"github"`) {
		t.Errorf("writes %q", w)
	}
	if out.Revision != 4 || out.Bindings[0].AuthType != "basic" {
		t.Errorf("re-attach: %+v", out)
	}

	// A second binding of the github credential keeps it in the vault
	// when the first is detached.
	vaultOK(t, cs, "vault_attach", attach("credential", "github", "binding", "github-2", "hosts", []string{"api.github.test"}, "auth_type", "bearer", "paths", []string{"/other"}))
	writes()
	out, text = vaultOK(t, cs, "vault_detach", map[string]any{"sandbox_id": "sb-vault", "binding": "github"})
	if !slices.Equal(out.Credentials, []string{"github", "npm"}) || !strings.Contains(text, "credential github stays") {
		t.Errorf("detach of a shared credential: %+v\n%s", out, text)
	}
	out, text = vaultOK(t, cs, "vault_detach", map[string]any{"sandbox_id": "sb-vault", "binding": "github-2"})
	if !slices.Equal(out.Credentials, []string{"npm"}) || !strings.Contains(text, "removed binding github-2 and credential github") {
		t.Errorf("detach: %+v\n%s", out, text)
	}
	if w := writes(); len(w) != 3 || !strings.Contains(w[2], `"credentials":{"delete":["github"]}`) {
		t.Errorf("writes %q", w)
	}

	// Mistakes, and refusals.
	vaultError(t, cs, "vault_attach", attach("credential", "aws", "hosts", []string{"api.github.test"}, "auth_type", "bearer"),
		`no credential "aws"`, "github, npm")
	vaultError(t, cs, "vault_attach", attach("credential", "github", "hosts", []string{"evil.test"}, "auth_type", "bearer"),
		"only for api.github.test, *.github.test, not for evil.test")
	vaultError(t, cs, "vault_attach", attach("credential", "npm", "hosts", []string{"unlisted.test"}, "auth_type", "bearer"),
		"not covered by an explicit allow rule", "egress_allow", "HTTP 400")
	vaultError(t, cs, "vault_attach", attach("credential", "npm", "hosts", []string{"https://registry.npm.test/x"}, "auth_type", "bearer"), "no scheme")
	vaultError(t, cs, "vault_attach", attach("credential", "npm", "hosts", []string{"registry.npm.test"}, "auth_type", "apiKey"), "needs header")
	vaultError(t, cs, "vault_attach", attach("credential", "npm", "hosts", []string{"registry.npm.test"}, "auth_type", "token"), "auth_type")
	vaultError(t, cs, "vault_detach", map[string]any{"sandbox_id": "sb-vault", "binding": "nope"}, `no binding "nope"`, "npm-registry")
	vaultError(t, cs, "vault_detach", map[string]any{"sandbox_id": "sb-vault", "binding": "npm-registry", "credential": "other"}, `no credential "other"`)
	vaultError(t, cs, "vault_attach", map[string]any{"sandbox_id": "sb-noproxy", "credential": "npm", "hosts": []string{"registry.npm.test"}, "auth_type": "bearer"},
		"sandbox sb-noproxy has no credential proxy", "credential_proxy: true")
	vaultError(t, cs, "vault_get", map[string]any{"sandbox_id": "sb-free"}, "sandbox sb-free has no egress policy")
	vaultError(t, cs, "vault_get", map[string]any{"sandbox_id": "sb-gone"}, "sandbox sb-gone not found")
	f.mu.Lock()
	f.reset()
	f.mu.Unlock()
	vaultError(t, cs, "vault_detach", map[string]any{"sandbox_id": "sb-vault", "binding": "npm-registry"}, "has no credential vault")
}

// TestVaultToolsWithoutCredentials: without --vault-credential the
// tools say who can give one.
func TestVaultToolsWithoutCredentials(t *testing.T) {
	f := &fakeVault{}
	f.reset()
	cs := connect(t, newTestServer(t, vaultStandIn(t, f), Config{}))
	out, text := vaultOK(t, cs, "vault_get", map[string]any{"sandbox_id": "sb-vault"})
	if len(out.Available) != 0 || !strings.Contains(text, "attach with vault_attach: none") {
		t.Errorf("%+v\n%s", out, text)
	}
	vaultError(t, cs, "vault_attach", map[string]any{"sandbox_id": "sb-vault", "credential": "x", "hosts": []string{"a.test"}, "auth_type": "bearer"},
		"started without credentials", "--vault-credential")
	vaultError(t, cs, "sandbox_create", map[string]any{"credential_proxy": true}, "credential_proxy needs allowed_hosts")
}

// TestVaultCredentialRedacted: a credential formats, logs and marshals
// without its value.
func TestVaultCredentialRedacted(t *testing.T) {
	c := VaultCredential{Value: ghSecret, Hosts: []string{"api.github.test"}}
	cfg := Config{VaultCredentials: map[string]VaultCredential{"github": c}}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "credential", c, "all", cfg.VaultCredentials)
	js, _ := json.Marshal(cfg.VaultCredentials)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v %#v %s", c, c, c), fmt.Sprintf("%v %+v", cfg.VaultCredentials, cfg.VaultCredentials), logged.String(), string(js)} {
		if strings.Contains(s, ghSecret) || !strings.Contains(s, "redacted") {
			t.Errorf("shows the value or hides that it is hidden: %s", s)
		}
	}
}
