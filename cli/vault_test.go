package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
)

// Secrets of the tests: no output may contain them.
const (
	envSecret  = "env-s3cret-value"
	fileSecret = "file-s3cret-value"
)

// wire stands in for the lifecycle server and, behind the endpoint of
// port 18080, the egress API of sandbox sb-1. The egress API answers
// each request with the next scripted answer and records what it got.
type wire struct {
	srv *httptest.Server

	mu      sync.Mutex
	answers []wireAnswer
	seen    []wireRequest
}

type wireAnswer struct {
	status int
	body   string
}

type wireRequest struct {
	method, path, auth, body string
}

func newWire(t *testing.T) *wire {
	t.Helper()
	w := &wire{}
	mux := http.NewServeMux()
	w.srv = httptest.NewServer(mux)
	t.Cleanup(w.srv.Close)
	host := strings.TrimPrefix(w.srv.URL, "http://")
	mux.HandleFunc("GET /v1/sandboxes/sb-1/endpoints/18080", func(rw http.ResponseWriter, r *http.Request) {
		json.NewEncoder(rw).Encode(api.Endpoint{Endpoint: host + "/egress", Headers: map[string]string{api.HeaderEgressAuth: "tok"}})
	})
	record := func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.seen = append(w.seen, wireRequest{r.Method, r.URL.EscapedPath(), r.Header.Get(api.HeaderEgressAuth), string(body)})
		a := wireAnswer{http.StatusInternalServerError, "no answer scripted"}
		if len(w.answers) > 0 {
			a, w.answers = w.answers[0], w.answers[1:]
		}
		w.mu.Unlock()
		if a.status >= 400 {
			http.Error(rw, a.body, a.status)
			return
		}
		rw.WriteHeader(a.status)
		io.WriteString(rw, a.body)
	}
	mux.HandleFunc("/egress/", record)
	mux.HandleFunc("POST /v1/sandboxes", record)
	return w
}

func (w *wire) script(answers ...wireAnswer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answers, w.seen = answers, nil
}

func (w *wire) requests() []wireRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]wireRequest(nil), w.seen...)
}

// run runs osb against the wire with env, stdin in, and returns the exit
// code, stdout and stderr.
func (w *wire) run(t *testing.T, env map[string]string, in string, args ...string) (int, string, string) {
	t.Helper()
	vars := map[string]string{"OPEN_SANDBOX_DOMAIN": w.srv.URL, "OPEN_SANDBOX_API_KEY": "k", "NO_COLOR": "1"}
	for k, v := range env {
		vars[k] = v
	}
	var out, errb bytes.Buffer
	args = append([]string{"--config", filepath.Join(t.TempDir(), "none.toml")}, args...)
	code := Run(t.Context(), args, Streams{In: strings.NewReader(in), Out: &out, Err: &errb, Getenv: func(k string) string { return vars[k] }})
	for _, s := range []string{out.String(), errb.String()} {
		if strings.Contains(s, envSecret) || strings.Contains(s, fileSecret) {
			t.Errorf("osb %q printed a secret:\n%s", args, s)
		}
	}
	return code, out.String(), errb.String()
}

const cliStateJSON = `{"revision":1,"credentials":[{"name":"gh","sourceType":"inline","revision":1},{"name":"npm","sourceType":"inline","revision":1}],` +
	`"bindings":[{"name":"github","revision":1,"match":{"hosts":["api.github.test"],"schemes":["https"],"ports":[443],` +
	`"methods":["GET","POST"],"paths":["/*"]},"auth":{"type":"apiKey","name":"X-Api-Key"}}]}`

func TestVaultCommands(t *testing.T) {
	w := newWire(t)
	dir := t.TempDir()
	bindings := filepath.Join(dir, "bindings.json")
	os.WriteFile(bindings, []byte(`{"bindings":[{"name":"github","match":{"hosts":["api.github.test"]},"auth":{"type":"apiKey","name":"X-Api-Key","credential":"gh"}}]}`), 0o600)
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(fileSecret+"\n"), 0o600)
	env := map[string]string{"GH_TOKEN": envSecret}
	wantBinding := `"bindings":[{"name":"github","match":{"hosts":["api.github.test"]},"auth":{"type":"apiKey","credential":"gh","name":"X-Api-Key"}}]`

	for _, tc := range []struct {
		name   string
		args   []string
		stdin  string
		answer wireAnswer
		method string
		path   string
		body   string
		out    []string // stdout says each
	}{
		{name: "create from file and flags",
			args:   []string{"credential-vault", "create", "sb-1", "-f", bindings, "--credential", "gh=env:GH_TOKEN", "--credential", "npm=file:" + tokenFile},
			answer: wireAnswer{201, cliStateJSON}, method: "POST", path: "/egress/credential-vault",
			body: `{"credentials":[{"name":"gh","source":{"type":"inline","value":"` + envSecret + `"}},{"name":"npm","source":{"type":"inline","value":"` + fileSecret + `"}}],` + wantBinding + `}`,
			out:  []string{"Credential Vault Created", "revision:", "gh ", "npm ", "github", "api.github.test", "apiKey (X-Api-Key)", "GET,POST"}},
		{name: "create from stdin, alias",
			args: []string{"vault", "create", "sb-1", "-f", "-"}, stdin: `{"credentials":[],` + wantBinding + `}`,
			answer: wireAnswer{201, cliStateJSON}, method: "POST", path: "/egress/credential-vault",
			body: `{"credentials":[],` + wantBinding + `}`, out: []string{"Credential Vault Created"}},
		{name: "create with flags only",
			args:   []string{"vault", "create", "sb-1", "--credential", "gh=env:GH_TOKEN"},
			answer: wireAnswer{201, cliStateJSON}, method: "POST", path: "/egress/credential-vault",
			body: `{"credentials":[{"name":"gh","source":{"type":"inline","value":"` + envSecret + `"}}],"bindings":[]}`},
		{name: "patch",
			args: []string{"vault", "patch", "sb-1", "--replace-credential", "gh=env:GH_TOKEN", "--credential", "npm=file:" + tokenFile,
				"--delete-binding", "old", "--delete-credential", "old-token", "--expected-revision", "3"},
			answer: wireAnswer{200, cliStateJSON}, method: "PATCH", path: "/egress/credential-vault",
			body: `{"expectedRevision":3,"credentials":{"add":[{"name":"npm","source":{"type":"inline","value":"` + fileSecret + `"}}],` +
				`"replace":[{"name":"gh","source":{"type":"inline","value":"` + envSecret + `"}}],"delete":["old-token"]},"bindings":{"delete":["old"]}}`,
			out: []string{"Credential Vault Patched"}},
		{name: "patch from file",
			args: []string{"vault", "patch", "sb-1", "-f", "-"}, stdin: `{"bindings":{"delete":["github"]}}`,
			answer: wireAnswer{200, cliStateJSON}, method: "PATCH", path: "/egress/credential-vault",
			body: `{"bindings":{"delete":["github"]}}`},
		{name: "get json", args: []string{"vault", "get", "sb-1", "-o", "json"},
			answer: wireAnswer{200, cliStateJSON}, method: "GET", path: "/egress/credential-vault",
			out: []string{`"sandbox_id": "sb-1"`, `"source_type": "inline"`, `"header": "X-Api-Key"`, `"ports": [`}},
		{name: "delete", args: []string{"vault", "delete", "sb-1"},
			answer: wireAnswer{204, ""}, method: "DELETE", path: "/egress/credential-vault",
			out: []string{"deleted the credential vault of sandbox sb-1"}},
		{name: "credentials", args: []string{"vault", "credentials", "sb-1"},
			answer: wireAnswer{200, `{"revision":2,"credentials":[{"name":"gh","sourceType":"inline","revision":2}]}`},
			method: "GET", path: "/egress/credential-vault/credentials", out: []string{"NAME", "gh", "inline"}},
		{name: "credential", args: []string{"vault", "credentials", "sb-1", "gh token"},
			answer: wireAnswer{200, `{"name":"gh token","sourceType":"inline","revision":2}`},
			method: "GET", path: "/egress/credential-vault/credentials/gh%20token", out: []string{"name:", "gh token"}},
		{name: "bindings yaml", args: []string{"vault", "bindings", "sb-1", "-o", "yaml"},
			answer: wireAnswer{200, `{"revision":2,"bindings":[{"name":"github","revision":2,"match":{"hosts":["api.github.test"]},"auth":{"type":"bearer"}}]}`},
			method: "GET", path: "/egress/credential-vault/bindings", out: []string{"sandbox_id: sb-1", "- api.github.test", "type: bearer"}},
		{name: "binding", args: []string{"vault", "bindings", "sb-1", "github"},
			answer: wireAnswer{200, `{"name":"github","revision":2,"match":{"hosts":["api.github.test"],"ports":[443]},"auth":{"type":"bearer"}}`},
			method: "GET", path: "/egress/credential-vault/bindings/github", out: []string{"hosts:", "api.github.test", "443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.script(tc.answer)
			code, out, errOut := w.run(t, env, tc.stdin, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d\n%s%s", code, out, errOut)
			}
			reqs := w.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests: %+v", len(reqs), reqs)
			}
			r := reqs[0]
			if r.method != tc.method || r.path != tc.path || r.auth != "tok" || r.body != tc.body {
				t.Errorf("sent %s %s (token %q)\n%s\nwant %s %s\n%s", r.method, r.path, r.auth, r.body, tc.method, tc.path, tc.body)
			}
			for _, s := range tc.out {
				if !strings.Contains(out, s) {
					t.Errorf("output does not say %q:\n%s", s, out)
				}
			}
		})
	}
}

func TestVaultCommandErrors(t *testing.T) {
	w := newWire(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		answer *wireAnswer
		code   int
		errs   []string // stderr says each
	}{
		{name: "literal value", args: []string{"vault", "create", "sb-1", "--credential", "gh=" + envSecret},
			code: 2, errs: []string{"want NAME=env:VAR or NAME=file:PATH", "shell history"}},
		{name: "literal value with a colon", args: []string{"vault", "create", "sb-1", "--credential", "gh=x:" + envSecret},
			code: 2, errs: []string{`credential "gh"`}},
		{name: "no name", args: []string{"vault", "patch", "sb-1", "--replace-credential", envSecret},
			code: 2, errs: []string{"invalid --replace-credential"}},
		{name: "unset env", args: []string{"vault", "create", "sb-1", "--credential", "gh=env:NOPE"},
			code: 1, errs: []string{"environment variable NOPE is empty or unset"}},
		{name: "empty file", args: []string{"vault", "create", "sb-1", "--credential", "gh=file:" + empty},
			code: 1, errs: []string{"is empty"}},
		{name: "twice", args: []string{"vault", "create", "sb-1", "--credential", "gh=env:A", "--credential", "gh=env:A"},
			env: map[string]string{"A": envSecret}, code: 1, errs: []string{`credential "gh" is given twice`}},
		{name: "nothing to create", args: []string{"vault", "create", "sb-1"}, code: 2, errs: []string{"-f FILE"}},
		{name: "nothing to patch", args: []string{"vault", "patch", "sb-1"}, code: 2, errs: []string{"-f FILE"}},
		{name: "bad revision", args: []string{"vault", "patch", "sb-1", "--delete-binding", "x", "--expected-revision", "0"}, code: 2, errs: []string{"--expected-revision"}},
		{name: "no id", args: []string{"vault", "get"}, code: 2},
		{name: "no proxy", args: []string{"vault", "create", "sb-1", "--credential", "gh=env:A"}, env: map[string]string{"A": envSecret},
			answer: &wireAnswer{412, "the credential proxy is not enabled for this sandbox"}, code: 1,
			errs: []string{"the credential proxy is not enabled for this sandbox", "--credential-proxy", "HTTP 412"}},
		{name: "exists", args: []string{"vault", "create", "sb-1", "--credential", "gh=env:A"}, env: map[string]string{"A": envSecret},
			answer: &wireAnswer{409, "credential vault already exists"}, code: 1, errs: []string{"already has a credential vault", "osb credential-vault patch"}},
		{name: "revision", args: []string{"vault", "patch", "sb-1", "--delete-binding", "x", "--expected-revision", "2"},
			answer: &wireAnswer{409, "revision mismatch"}, code: 1, errs: []string{"changed since the expected revision", "osb credential-vault get"}},
		{name: "no vault", args: []string{"vault", "get", "sb-1"}, answer: &wireAnswer{404, "credential vault not found"}, code: 1,
			errs: []string{"has no credential vault", "osb credential-vault create"}},
		{name: "plain http", args: []string{"vault", "delete", "sb-1"}, answer: &wireAnswer{426, "TLS required"}, code: 1, errs: []string{"--protocol https"}},
		{name: "invalid", args: []string{"vault", "create", "sb-1", "--credential", "gh=env:A"}, env: map[string]string{"A": envSecret},
			answer: &wireAnswer{400, `bindings[0].match.hosts[0]: "10.0.0.1" is an address, want a name`}, code: 1, errs: []string{"is an address", "HTTP 400"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.answer != nil {
				w.script(*tc.answer)
			} else {
				w.script()
			}
			code, out, errOut := w.run(t, tc.env, "", tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
			}
			for _, s := range tc.errs {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr does not say %q:\n%s", s, errOut)
				}
			}
			if n := len(w.requests()); (tc.answer == nil) != (n == 0) {
				t.Errorf("%d requests reached the egress API", n)
			}
		})
	}
}

// TestCreateCredentialProxyFlag: osb sandbox create --credential-proxy
// sends credentialProxy with the policy, needs the policy, and shows the
// server's refusal.
func TestCreateCredentialProxyFlag(t *testing.T) {
	w := newWire(t)
	policy := filepath.Join(t.TempDir(), "policy.json")
	os.WriteFile(policy, []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"api.github.test"}]}`), 0o600)

	code, _, errOut := w.run(t, nil, "", "sandbox", "create", "-i", "img", "--credential-proxy")
	if code != 2 || !strings.Contains(errOut, "--credential-proxy requires --network-policy-file") {
		t.Errorf("without a policy: exit %d\n%s", code, errOut)
	}

	const refusal = "credentialProxy: the credential vault is not available on this server yet"
	w.script(wireAnswer{400, `{"code":"INVALID_PARAMETER","message":"` + refusal + `"}`})
	code, _, errOut = w.run(t, nil, "", "sandbox", "create", "-i", "img", "--credential-proxy", "--network-policy-file", policy, "--skip-health-check")
	if code != 1 || !strings.Contains(errOut, refusal) || !strings.Contains(errOut, "HTTP 400") {
		t.Errorf("refused: exit %d\n%s", code, errOut)
	}
	reqs := w.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	var sent api.CreateSandboxRequest
	if err := json.Unmarshal([]byte(reqs[0].body), &sent); err != nil || sent.CredentialProxy == nil || !sent.CredentialProxy.Enabled || len(sent.NetworkPolicy) == 0 {
		t.Errorf("sent %s (%v)", reqs[0].body, err)
	}
}

// TestMCPVaultCredentials: osb mcp reads --vault-credential values from
// the environment and files, hands them to the MCP server, and never
// prints them.
func TestMCPVaultCredentials(t *testing.T) {
	w := newWire(t)
	tokenFile := filepath.Join(t.TempDir(), "npm")
	os.WriteFile(tokenFile, []byte(fileSecret+"\r\n"), 0o600)
	env := map[string]string{"GH_TOKEN": envSecret}
	serve := func(args ...string) (MCPOptions, int, string) {
		t.Helper()
		var got MCPOptions
		vars := map[string]string{"OPEN_SANDBOX_DOMAIN": w.srv.URL, "NO_COLOR": "1"}
		for k, v := range env {
			vars[k] = v
		}
		var out, errb bytes.Buffer
		code := Run(t.Context(), append([]string{"--config", filepath.Join(t.TempDir(), "none.toml"), "mcp"}, args...), Streams{
			In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(k string) string { return vars[k] },
			ServeMCP: func(_ context.Context, o MCPOptions) error { got = o; return nil },
		})
		if s := out.String() + errb.String(); strings.Contains(s, envSecret) || strings.Contains(s, fileSecret) {
			t.Errorf("osb mcp printed a secret: %s", s)
		}
		return got, code, errb.String()
	}

	o, code, errOut := serve("--vault-credential", "github=env:GH_TOKEN", "--vault-credential", "npm=file:"+tokenFile,
		"--vault-credential-hosts", "github=API.github.test, *.github.test")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if len(o.VaultCredentials) != 2 || o.VaultCredentials["github"] != envSecret || o.VaultCredentials["npm"] != fileSecret {
		t.Errorf("credentials: %d of them, github %v, npm %v", len(o.VaultCredentials), o.VaultCredentials["github"] == envSecret, o.VaultCredentials["npm"] == fileSecret)
	}
	if h := o.VaultHosts["github"]; len(h) != 2 || h[0] != "api.github.test" || h[1] != "*.github.test" || o.VaultHosts["npm"] != nil {
		t.Errorf("hosts %q", o.VaultHosts)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--vault-credential", "github=" + envSecret}, 2, "shell history"},
		{[]string{"--vault-credential", "github=env:UNSET"}, 1, "UNSET is empty or unset"},
		{[]string{"--vault-credential", "a=env:GH_TOKEN", "--vault-credential", "a=env:GH_TOKEN"}, 2, "given twice"},
		{[]string{"--vault-credential", "a=env:GH_TOKEN", "--vault-credential-hosts", "b=x.test"}, 2, "no --vault-credential b"},
		{[]string{"--vault-credential", "a=env:GH_TOKEN", "--vault-credential-hosts", "a="}, 2, "want NAME=HOST"},
	} {
		if _, code, errOut := serve(tc.args...); code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("osb mcp %q: exit %d, %s; want %d, %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// FuzzParseCredentialFlag: a --credential value never panics the parser,
// and a refused one is not repeated in the error (it may be a secret
// pasted by mistake), beyond the name before "=".
func FuzzParseCredentialFlag(f *testing.F) {
	for _, s := range []string{"gh=env:GH", "gh=file:/x", "gh=s3cret", "s3cret", "=env:X", "gh=env:", "a=b=c", "gh=x:y:z"} {
		f.Add(s)
	}
	cmd := &cobra.Command{Use: "x"}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := parseCredentialFlag(cmd, "--credential", s)
		if err == nil {
			if c.name == "" || (c.kind != "env" && c.kind != "file") || c.ref == "" {
				t.Fatalf("accepted %q as %+v", s, c)
			}
			return
		}
		name, rest, ok := strings.Cut(s, "=")
		if !ok {
			name, rest = "", s // the whole value may be the secret
		}
		if len(rest) >= 6 && !strings.Contains(name, rest) && strings.Contains(err.Error(), rest) {
			t.Fatalf("error %q repeats %q", err, rest)
		}
	})
}
