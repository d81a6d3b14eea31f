package mcp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// egressStandIn serves what the egress tools reach: the lifecycle
// server's endpoint of port 18080, which for sb-egress leads to the real
// egress API handler (rule cap 4) and for sb-free to a port proxy where
// nothing listens, as execd's answers; any other sandbox is not found.
func egressStandIn(t *testing.T) string {
	t.Helper()
	const token = "egress-token"
	m, err := egress.NewMatcher(egress.Overlay{}, egress.Policy{DefaultAction: egress.ActionDeny,
		Egress: []egress.Rule{{Action: egress.ActionAllow, Target: "pypi.test"}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := egress.DefaultHandlerConfig()
	cfg.Token, cfg.MaxRules = token, 4
	h, err := egress.NewHandler(cfg, egress.NewLive(m))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/18080", func(w http.ResponseWriter, r *http.Request) {
		var ep api.Endpoint
		switch r.PathValue("id") {
		case "sb-egress":
			ep = api.Endpoint{Endpoint: host + egress.ProxyPrefix, Headers: map[string]string{api.HeaderEgressAuth: token}}
		case "sb-free":
			ep = api.Endpoint{Endpoint: host + "/free/proxy/18080", Headers: map[string]string{"X-EXECD-ACCESS-TOKEN": "t"}}
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "sandbox not found"})
			return
		}
		json.NewEncoder(w).Encode(ep)
	})
	mux.Handle(egress.ProxyPrefix+"/", h)
	mux.HandleFunc("/free/proxy/18080/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Bad Gateway", http.StatusBadGateway)
	})
	return host
}

// TestEgressTools reads and changes a policy through the tools, against
// the egress API's own handler.
func TestEgressTools(t *testing.T) {
	cs := connect(t, newTestServer(t, egressStandIn(t), Config{}))
	sb := map[string]any{"sandbox_id": "sb-egress"}
	with := func(targets ...string) map[string]any {
		return map[string]any{"sandbox_id": "sb-egress", "targets": targets}
	}
	wantRules := func(got EgressOutput, want ...string) {
		t.Helper()
		var flat []string
		for _, r := range got.Rules {
			flat = append(flat, r.Action+" "+r.Target)
		}
		if !slices.Equal(flat, want) || got.SandboxID != "sb-egress" || got.EnforcementMode != "strict" || got.DefaultAction != "deny" {
			t.Fatalf("policy %+v; want rules %q", got, want)
		}
	}

	var out EgressOutput
	text := ok(t, cs, "egress_get", sb, &out)
	wantRules(out, "allow pypi.test")
	if out.Mode != "enforcing" || !strings.Contains(text, "1. allow pypi.test") || !strings.Contains(text, "any other host: denied") {
		t.Errorf("egress_get: %+v\n%s", out, text)
	}

	ok(t, cs, "egress_allow", with(" files.pypi.test ", "*.pythonhosted.test"), &out)
	wantRules(out, "allow files.pypi.test", "allow *.pythonhosted.test", "allow pypi.test")
	ok(t, cs, "egress_deny", with("pypi.test"), &out)
	wantRules(out, "deny pypi.test", "allow files.pypi.test", "allow *.pythonhosted.test")
	ok(t, cs, "egress_remove", with("PYPI.test", "*.pythonhosted.test"), &out)
	wantRules(out, "allow files.pypi.test")
	text = ok(t, cs, "egress_remove", with("absent.test"), &out)
	if out.Note != "no matching targets found" || !strings.Contains(text, "note: no matching targets found") {
		t.Errorf("removing a target without a rule: %+v\n%s", out, text)
	}
	ok(t, cs, "egress_remove", with("files.pypi.test"), &out)
	if out.Mode != "deny_all" || len(out.Rules) != 0 {
		t.Errorf("after removing every rule: %+v", out)
	}

	// The egress API's plain-text refusals reach the model as they are.
	wantToolError(t, cs, "egress_allow", with("bad..name"), "bad..name", "fix the arguments", "HTTP 400")
	wantToolError(t, cs, "egress_allow", with("a.test", "b.test", "c.test", "d.test", "e.test"), "too many rules: 5, the limit is 4", "HTTP 413")
	// Mistakes caught before any call.
	wantToolError(t, cs, "egress_allow", with(), "targets is null")
	wantToolError(t, cs, "egress_allow", map[string]any{"sandbox_id": "sb-egress", "targets": []string{}}, "targets is empty")
	wantToolError(t, cs, "egress_deny", with("https://pypi.test/simple"), "no scheme")
	wantToolError(t, cs, "egress_get", map[string]any{"sandbox_id": "a/b"}, "not a sandbox id")
	// A sandbox without a policy, and one that does not exist.
	free := map[string]any{"sandbox_id": "sb-free"}
	wantToolError(t, cs, "egress_get", free, "sandbox sb-free has no egress policy", "sandbox_create and allowed_hosts", "HTTP 502")
	free["targets"] = []string{"a.test"}
	for _, tool := range []string{"egress_allow", "egress_deny", "egress_remove"} {
		wantToolError(t, cs, tool, free, "sandbox sb-free has no egress policy", "sandbox_create and allowed_hosts", "HTTP 502")
	}
	wantToolError(t, cs, "egress_get", map[string]any{"sandbox_id": "sb-gone"}, "sandbox sb-gone not found", "sandbox_list")
}

// TestCreateAllowedHosts checks allowed_hosts before any call.
func TestCreateAllowedHosts(t *testing.T) {
	cs := connect(t, newTestServer(t, "127.0.0.1:1", Config{DefaultImage: "busybox"}))
	wantToolError(t, cs, "sandbox_create", map[string]any{"allowed_hosts": []string{}}, "allowed_hosts is empty")
	wantToolError(t, cs, "sandbox_create", map[string]any{"allowed_hosts": []string{"pypi.org", " "}}, "is not a host name")
}
