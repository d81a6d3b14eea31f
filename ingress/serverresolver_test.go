package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// targetServer serves the lifecycle server's ingress routes over real
// HTTP, as the protocol says (api.IngressTargetsPath, api.IngressRenewPath),
// from a map of targets, requiring an API key.
type targetServer struct {
	*httptest.Server
	key string

	mu      sync.Mutex
	targets map[string]api.IngressTarget // by "id/port"
	renews  []string
	broken  bool
}

func newTargetServer(t *testing.T, key string) *targetServer {
	ts := &targetServer{key: key, targets: map[string]api.IngressTarget{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.IngressTargetsPath+"{id}/{port}", func(w http.ResponseWriter, r *http.Request) {
		if !ts.auth(w, r) {
			return
		}
		ts.mu.Lock()
		t, ok := ts.targets[r.PathValue("id")+"/"+r.PathValue("port")]
		ts.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "Sandbox " + r.PathValue("id") + " not found."})
			return
		}
		json.NewEncoder(w).Encode(t)
	})
	mux.HandleFunc("POST "+api.IngressRenewPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		if !ts.auth(w, r) {
			return
		}
		var req api.IngressRenewRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ts.mu.Lock()
		ts.renews = append(ts.renews, r.PathValue("id"))
		ts.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	ts.Server = httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts
}

func (ts *targetServer) auth(w http.ResponseWriter, r *http.Request) bool {
	ts.mu.Lock()
	broken := ts.broken
	ts.mu.Unlock()
	if broken {
		w.WriteHeader(http.StatusInternalServerError)
		json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeSandboxUnknownError, Message: "boom"})
		return false
	}
	if r.Header.Get(api.HeaderAPIKey) != ts.key {
		w.WriteHeader(http.StatusUnauthorized)
		json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeInvalidAPIKey, Message: "bad key"})
		return false
	}
	return true
}

func TestServerResolver(t *testing.T) {
	ts := newTargetServer(t, "the-key")
	ts.targets["sb-1/8080"] = api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Running", Endpoint: "127.0.0.1:1234/proxy/8080",
		Headers: map[string]string{"X-A": "b"}, RenewExtendSeconds: 600}
	ctx := context.Background()

	r, err := NewServerResolver(ts.URL+"/v1/", "the-key", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Target(ctx, "sb-1", 8080)
	if err != nil || got.Endpoint != "127.0.0.1:1234/proxy/8080" || got.Headers["X-A"] != "b" || got.RenewExtendSeconds != 600 {
		t.Fatalf("Target = %+v, %v", got, err)
	}
	if _, err := r.Target(ctx, "sb-2", 8080); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown sandbox: %v, want ErrNotFound", err)
	}
	if err := r.Renew(ctx, "sb-1", 8080); err != nil {
		t.Fatal(err)
	}
	if len(ts.renews) != 1 || ts.renews[0] != "sb-1" {
		t.Fatalf("renews %v", ts.renews)
	}

	wrong, _ := NewServerResolver(ts.URL, "wrong", nil)
	if _, err := wrong.Target(ctx, "sb-1", 8080); err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wrong key: %v", err)
	}
	// A server without the ingress routes is not "sandbox not found".
	bare := httptest.NewServer(http.NotFoundHandler())
	defer bare.Close()
	old, _ := NewServerResolver(bare.URL, "k", nil)
	if _, err := old.Target(ctx, "sb-1", 8080); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("server without routes: %v", err)
	}
	for _, bad := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://h/?q=1"} {
		if _, err := NewServerResolver(bad, "", nil); err == nil {
			t.Fatalf("NewServerResolver(%q) accepted", bad)
		}
	}
}

// TestGatewayOverServerResolver: the gateway in front of the server's
// ingress routes over HTTP; a server that fails answers 503.
func TestGatewayOverServerResolver(t *testing.T) {
	backend := newBackend(t)
	ts := newTargetServer(t, "k")
	ep := strings.TrimPrefix(backend.URL, "http://")
	ts.targets["sb-1/8080"] = api.IngressTarget{SandboxID: "sb-1", Port: 8080, State: "Running", Endpoint: ep, RenewExtendSeconds: 300}
	r, _ := NewServerResolver(ts.URL, "k", nil)
	keys := testKeys(t, 'a')
	gw, err := New(Config{Keys: func() *Keys { return keys }, Resolver: r, Renewer: r, CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(gw)
	defer s.Close()
	tok, _ := keys.AccessToken("sb-1")
	get := func(path string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, s.URL+path, nil)
		req.Header.Set(api.HeaderSecureAccess, tok)
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if e := readEcho(t, get("/sb-1/8080/x")); e.Path != "/x" {
		t.Fatalf("path %q", e.Path)
	}
	waitFor(t, func() bool { ts.mu.Lock(); defer ts.mu.Unlock(); return len(ts.renews) == 1 })
	wantError(t, get("/sb-1/9999/x"), 404, api.CodeIngressSandboxNotFound)
	ts.mu.Lock()
	ts.broken = true
	ts.mu.Unlock()
	wantError(t, get("/sb-1/8080/x"), 503, api.CodeIngressUnavailable)
	resp, _ := http.Get(s.URL + "/readyz")
	wantError(t, resp, 503, api.CodeIngressUnavailable)
	ts.Close()
	wantError(t, get("/sb-1/8080/x"), 503, api.CodeIngressUnavailable)
}
