package cli

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// TestSandboxEndpointExpires runs osb sandbox endpoint against a
// lifecycle stub that answers as a server with an ingress gateway does:
// --expires asks for a signed endpoint and prints its URL alone on
// stdout; a header-mode link gets a warning that a browser cannot open
// it.
func TestSandboxEndpointExpires(t *testing.T) {
	var mu sync.Mutex
	var mode string
	var gotExpires []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb-1/endpoints/8080" || r.Header.Get(api.HeaderAPIKey) != "k" {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "no " + r.URL.Path})
			return
		}
		mu.Lock()
		defer mu.Unlock()
		exp := r.URL.Query().Get("expires")
		gotExpires = append(gotExpires, exp)
		switch {
		case exp == "":
			json.NewEncoder(w).Encode(api.Endpoint{Endpoint: "gw.test:8081", Headers: map[string]string{api.HeaderIngressTo: "sb-1-8080", api.HeaderSecureAccess: "tok"}})
		case mode == "uri":
			json.NewEncoder(w).Encode(api.Endpoint{Endpoint: "gw.test:8081/sb-1/8080/" + exp + "/sig"})
		default:
			json.NewEncoder(w).Encode(api.Endpoint{Endpoint: "gw.test:8081", Headers: map[string]string{api.HeaderIngressTo: "sb-1-8080-" + exp + "-sig"}})
		}
	}))
	t.Cleanup(srv.Close)
	run := func(args ...string) (int, string, string) {
		vars := map[string]string{"OPEN_SANDBOX_DOMAIN": srv.URL, "OPEN_SANDBOX_API_KEY": "k", "NO_COLOR": "1"}
		var out, errb bytes.Buffer
		args = append([]string{"--config", filepath.Join(t.TempDir(), "none.toml"), "sandbox", "endpoint"}, args...)
		code := Run(t.Context(), args, Streams{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(k string) string { return vars[k] }})
		return code, out.String(), errb.String()
	}
	lastExpires := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		n, _ := strconv.ParseInt(gotExpires[len(gotExpires)-1], 10, 64)
		return n
	}

	mode = "uri"
	before := time.Now()
	code, out, errOut := run("sb-1", "8080", "--expires", "1h")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	exp := lastExpires()
	if d := time.Unix(exp, 0).Sub(before); d < time.Hour-2*time.Second || d > time.Hour+2*time.Second {
		t.Errorf("expires=%d is %v from now, want 1h", exp, d)
	}
	if want := "http://gw.test:8081/sb-1/8080/" + strconv.FormatInt(exp, 10) + "/sig/\n"; out != want {
		t.Errorf("stdout %q, want the URL alone: %q", out, want)
	}
	if !strings.Contains(errOut, "valid until") || strings.Contains(errOut, "browser") {
		t.Errorf("stderr %q", errOut)
	}

	// JSON: the whole document, the expiry included.
	code, out, _ = run("sb-1", "--port", "8080", "--expires", "30m", "-o", "json")
	var doc endpointDoc
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.ExpiresAt == nil || !strings.HasPrefix(doc.URL, "http://gw.test:8081/sb-1/8080/") {
		t.Fatalf("json: exit %d %q", code, out)
	}
	if d := time.Until(*doc.ExpiresAt); d < 29*time.Minute || d > 31*time.Minute {
		t.Errorf("expires_at %v", doc.ExpiresAt)
	}

	mode = "header"
	code, out, errOut = run("sb-1", "8080", "--expires", "1h")
	if code != 0 || out != "http://gw.test:8081/\n" || !strings.Contains(errOut, "a browser cannot open") || !strings.Contains(errOut, api.HeaderIngressTo+": sb-1-8080-") {
		t.Errorf("header mode: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// Without --expires: the table, with the URL and the headers.
	code, out, _ = run("sb-1", "8080")
	if code != 0 || !strings.Contains(out, "http://gw.test:8081/") || !strings.Contains(out, api.HeaderSecureAccess) || lastExpires() != 0 {
		t.Errorf("plain: exit %d %q", code, out)
	}

	for _, args := range [][]string{
		{"sb-1", "8080", "--expires", "0s"},
		{"sb-1", "8080", "--expires", "soon"},
		{"sb-1", "http"},
		{"sb-1", "8080", "--port", "9090"},
		{"sb-1"},
		{"sb-1", "70000"},
	} {
		if code, _, errOut := run(args...); code != 2 || errOut == "" {
			t.Errorf("osb sandbox endpoint %q: exit %d (%s), want 2", args, code, errOut)
		}
	}
}
