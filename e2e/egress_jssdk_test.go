package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// The published JavaScript SDK of OpenSandbox (@alibaba-group/opensandbox
// on npm), unchanged, against this server's egress support: the version
// and its dependencies are pinned by testdata/jssdk/package-lock.json and
// installed with npm ci into .cache/jssdk at the repository's root.

// jssdkTestdata is the committed package.json, package-lock.json and the
// script the test runs.
const jssdkTestdata = "testdata/jssdk"

var (
	jssdkOnce sync.Once
	jssdkDir  string
	jssdkErr  error
)

// jssdk returns the directory where the pinned SDK is installed, installing
// it the first time a test of this process asks, unless an earlier run
// installed the same package-lock.json.
func jssdk(t *testing.T) string {
	t.Helper()
	testenv.MustHaveCommand(t, "node")
	testenv.MustHaveCommand(t, "npm")
	jssdkOnce.Do(func() { jssdkDir, jssdkErr = installJSSDK() })
	if jssdkErr != nil {
		t.Fatalf("install the JavaScript SDK: %v", jssdkErr)
	}
	return jssdkDir
}

func installJSSDK() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	dir := filepath.Join(root, ".cache", "jssdk")
	var want [2][]byte
	for i, name := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(jssdkTestdata, name))
		if err != nil {
			return "", err
		}
		want[i] = b
	}
	if jssdkInstalled(dir, want) {
		return dir, nil
	}
	// Install beside the cache and move into place, so that a run killed
	// mid-install or another test process never sees half an install.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "jssdk.tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	for i, name := range []string{"package.json", "package-lock.json"} {
		if err := os.WriteFile(filepath.Join(tmp, name), want[i], 0o644); err != nil {
			return "", err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--prefix", tmp, "--ignore-scripts", "--no-audit", "--no-fund")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci: %w\n%s", err, out)
	}
	if jssdkInstalled(dir, want) { // another process got there first
		return dir, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("move the install into place: %w", err)
	}
	return dir, nil
}

// jssdkInstalled reports whether dir holds an install of the committed
// package.json and package-lock.json.
func jssdkInstalled(dir string, want [2][]byte) bool {
	for i, name := range []string{"package.json", "package-lock.json"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(b, want[i]) {
			return false
		}
	}
	_, err := os.Stat(filepath.Join(dir, "node_modules", "@alibaba-group", "opensandbox", "package.json"))
	return err == nil
}

// jssdkSummary is what testdata/jssdk/egress.mjs prints.
type jssdkSummary struct {
	ID              string
	State           string
	Endpoint        string
	EndpointHeaders []string
	Before          api.NetworkPolicy
	AfterPatch      api.NetworkPolicy
	AfterDelete     api.NetworkPolicy
	Status          struct{ Mode, EnforcementMode string }
	Killed          bool
	KillError       string
	Error           string
	ErrorStatus     int
	ErrorDetail     any
}

// TestJSSDKEgress creates a sandbox with a network policy through the
// published JavaScript SDK, reads, patches and deletes its egress rules
// through the SDK's calls, and kills it. Only the API is exercised: the
// sandbox's DNS upstream is a loopback address of its own namespace,
// never asked.
func TestJSSDKEgress(t *testing.T) {
	dir := jssdk(t)
	testenv.MustHaveImage(t, egressImage)
	s := startServer(t, serverOptions{extra: "[egress]\ndns_upstreams = [\"127.0.0.1\"]"})

	line := runJSScript(t, dir, s, "egress.mjs")
	var sum jssdkSummary
	if err := json.Unmarshal([]byte(line), &sum); err != nil {
		t.Fatalf("summary: %v in %s", err, line)
	}
	if sum.Error != "" {
		t.Fatalf("the SDK failed (HTTP %d, %v):\n%s", sum.ErrorStatus, sum.ErrorDetail, sum.Error)
	}

	if sum.State != "Running" {
		t.Errorf("state after Sandbox.create: %q, want Running", sum.State)
	}
	if !strings.HasSuffix(sum.Endpoint, "/proxy/18080") || strings.Contains(sum.Endpoint, "://") ||
		!slices.Contains(sum.EndpointHeaders, api.HeaderEgressAuth) {
		t.Errorf("egress endpoint %q with headers %v; want host:port/proxy/18080 with %s", sum.Endpoint, sum.EndpointHeaders, api.HeaderEgressAuth)
	}
	wantJSPolicy(t, "before the patch", sum.Before, rules("allow", "allowed.test"))
	wantJSPolicy(t, "after the patch", sum.AfterPatch, rules("allow", "files.allowed.test", "deny", "allowed.test"))
	wantJSPolicy(t, "after the delete", sum.AfterDelete, rules("deny", "allowed.test"))
	if sum.Status.Mode != "enforcing" || sum.Status.EnforcementMode != "strict" {
		t.Errorf("status %+v; want mode enforcing, enforcementMode strict", sum.Status)
	}
	if !sum.Killed {
		t.Fatalf("kill: %s", sum.KillError)
	}
	s.waitGone(sum.ID)
}

func wantJSPolicy(t *testing.T, when string, got api.NetworkPolicy, want []api.NetworkRule) {
	t.Helper()
	if got.DefaultAction != "deny" || !slices.Equal(got.Egress, want) {
		t.Errorf("policy %s: %+v; want default deny, rules %v", when, got, want)
	}
}

// runJSScript runs testdata/jssdk/NAME with node against server s and
// returns the last line it printed (its summary). env adds variables.
func runJSScript(t *testing.T, dir string, s *server, name string, env ...string) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join(jssdkTestdata, name))
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox and osb-egress beside it are two starts; the SDK waits
	// for both, the test for the SDK and its other calls.
	ready := testwait.TimeoutN(2)
	ctx, cancel := context.WithTimeout(t.Context(), 2*ready+2*time.Minute)
	defer cancel()
	// Node resolves the SDK from the script's directory upwards, or from
	// NODE_PATH for a script elsewhere; an ES module ignores NODE_PATH, so
	// the script runs from a copy inside the install.
	runDir := t.TempDir()
	if err := os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(runDir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	// Every script goes along, for those that import a shared module.
	scripts, err := filepath.Glob(filepath.Join(filepath.Dir(script), "*.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range scripts {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(runDir, filepath.Base(src)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(runDir, name))
	cmd.Dir = runDir
	cmd.Env = append(append(os.Environ(),
		"OSB_DOMAIN="+s.listen, "OSB_API_KEY="+s.key, "OSB_IMAGE="+busyboxImage,
		"OSB_READY_SECONDS="+strconv.Itoa(int(ready/time.Second)),
		"OPEN_SANDBOX_DOMAIN=", "OPEN_SANDBOX_API_KEY="), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\nstdout:\n%s\nstderr:\n%s", name, err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("summary: %s", lines[len(lines)-1])
	return lines[len(lines)-1]
}

// TestJSSDKVault: the published JavaScript SDK's credential vault calls,
// unchanged, against a sandbox created through it with credentialProxy:
// create, the 409 of a second create, get, the credential and binding
// lists and items (404 for a missing one), a stale revision (409), an
// invalid binding (400), a patch at the current revision, delete (then
// 404). The credential's value never comes back.
func TestJSSDKVault(t *testing.T) {
	dir := jssdk(t)
	testenv.MustHaveImage(t, egressImage)
	s := startServer(t, serverOptions{extra: "[egress]\ndns_upstreams = [\"127.0.0.1\"]"})
	secret := "sk-jssdk-" + randomHex(12)
	line := runJSScript(t, dir, s, "vault.mjs", "OSB_SECRET="+secret)
	if strings.Contains(line, secret) {
		t.Fatal("the credential's value came back through the SDK")
	}
	var sum struct {
		ID                                                 string
		Created, Got, Patched                              api.CredentialVaultState
		Credentials                                        []api.CredentialMetadata
		Credential                                         api.CredentialMetadata
		Bindings                                           []api.CredentialBindingMetadata
		Binding                                            api.CredentialBindingMetadata
		SecondCreate, Missing, Stale, Invalid, AfterDelete int
		Error                                              string
		ErrorStatus                                        int
	}
	if err := json.Unmarshal([]byte(line), &sum); err != nil {
		t.Fatalf("summary: %v in %s", err, line)
	}
	if sum.Error != "" {
		t.Fatalf("the SDK failed (HTTP %d): %s", sum.ErrorStatus, sum.Error)
	}
	if sum.Created.Revision != 1 || len(sum.Created.Bindings) != 1 || sum.Created.Bindings[0].Auth.Type != "bearer" ||
		!slices.Equal(sum.Created.Bindings[0].Match.Ports, []int{443}) {
		t.Errorf("create answered %+v", sum.Created)
	}
	if len(sum.Credentials) != 1 || sum.Credential.Name != "key" || sum.Credential.SourceType != "inline" ||
		len(sum.Bindings) != 1 || sum.Binding.Name != "models" {
		t.Errorf("lists %+v %+v, items %+v %+v", sum.Credentials, sum.Bindings, sum.Credential, sum.Binding)
	}
	if sum.Patched.Revision != 2 || len(sum.Patched.Bindings) != 2 {
		t.Errorf("patch answered %+v", sum.Patched)
	}
	for name, got := range map[string][2]int{"second create": {sum.SecondCreate, 409}, "missing binding": {sum.Missing, 404},
		"stale revision": {sum.Stale, 409}, "invalid binding": {sum.Invalid, 400}, "get after delete": {sum.AfterDelete, 404}} {
		if got[0] != got[1] {
			t.Errorf("%s: HTTP %d, want %d", name, got[0], got[1])
		}
	}
	s.waitGone(sum.ID)
}
