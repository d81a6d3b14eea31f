package lifecycle

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/hostpath"
	"github.com/opensandbox/opensandbox/internal/httpx"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestCheckImageRef(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	good := []string{
		"python", "python:3.11", "python:3.11-slim", "library/python:3.11", "a.b-c__d/e_f:v1.0",
		"registry.local:5000/team/app:1.0", "localhost/app", "localhost:5000/app", "Registry.Example.COM/app",
		"[::1]:5000/app:tag", "app@" + digest, "app:tag@" + digest, "a/b/c/d:" + strings.Repeat("t", 128),
	}
	bad := []string{
		"", " ", "Python", "python:", ":tag", "python:3.11 ", " python", "app@sha256:abc", "app:" + strings.Repeat("t", 129),
		"a//b", "a/", "/a", "-a", "a-", "http://x/y", "app tag", "app:-tag", strings.Repeat("ab", 32),
		strings.Repeat("a/", 128) + "a", "a\x00b", "app@@" + digest, "ex ample.com/app",
	}
	for _, ref := range good {
		if err := checkImageRef(ref); err != nil {
			t.Errorf("checkImageRef(%q) = %v, want ok", ref, err)
		}
	}
	for _, ref := range bad {
		if err := checkImageRef(ref); err == nil {
			t.Errorf("checkImageRef(%q) = ok, want an error", ref)
		}
	}
}

func TestLabelRules(t *testing.T) {
	tests := []struct {
		key, value string
		ok         bool
	}{
		{"team", "ml", true},
		{"team", "", true},
		{"a", "b", true},
		{"A_b-c.D", "v.1_2-3", true},
		{"example.com/team", "x", true},
		{"a.b-c.d/name", "x", true},
		{strings.Repeat("k", 63), strings.Repeat("v", 63), true},
		{strings.Repeat("p", 253) + "/k", "v", true},
		{"", "v", false},
		{"/k", "v", false},
		{"example.com/", "v", false},
		{strings.Repeat("k", 64), "v", false},
		{"k", strings.Repeat("v", 64), false},
		{strings.Repeat("p", 254) + "/k", "v", false},
		{"Example.com/k", "v", false},
		{"a/b/c", "v", false},
		{"-k", "v", false},
		{"k-", "v", false},
		{"k y", "v", false},
		{"k", "Data Processing Sandbox", false},
		{"k", "-v", false},
		{"k", "v_", false},
		{"opensandbox.io/id", "v", false},
		{"opensandbox.io/", "v", false},
		{"x.opensandbox.io/k", "v", true},
	}
	for _, tt := range tests {
		if err := checkLabel(tt.key, tt.value); (err == nil) != tt.ok {
			t.Errorf("checkLabel(%q, %q) = %v, want ok=%v", tt.key, tt.value, err, tt.ok)
		}
	}
}

func TestParseResources(t *testing.T) {
	tests := []struct {
		in   map[string]string
		want sandbox.Resources
		ok   bool
	}{
		{map[string]string{}, sandbox.Resources{}, true},
		{map[string]string{"cpu": "500m"}, sandbox.Resources{CPUMillis: 500}, true},
		{map[string]string{"cpu": "2"}, sandbox.Resources{CPUMillis: 2000}, true},
		{map[string]string{"cpu": "0.5"}, sandbox.Resources{CPUMillis: 500}, true},
		{map[string]string{"cpu": "1.25"}, sandbox.Resources{CPUMillis: 1250}, true},
		{map[string]string{"cpu": " 1 "}, sandbox.Resources{CPUMillis: 1000}, true},
		{map[string]string{"memory": "512Mi"}, sandbox.Resources{MemoryBytes: 512 << 20}, true},
		{map[string]string{"memory": "2Gi"}, sandbox.Resources{MemoryBytes: 2 << 30}, true},
		{map[string]string{"memory": "1G"}, sandbox.Resources{MemoryBytes: 1e9}, true},
		{map[string]string{"memory": "1.5Gi"}, sandbox.Resources{MemoryBytes: 3 << 29}, true},
		{map[string]string{"memory": "1000000"}, sandbox.Resources{MemoryBytes: 1e6}, true},
		{map[string]string{"memory": "128k"}, sandbox.Resources{MemoryBytes: 128e3}, true},
		{map[string]string{"memory": "7Ei"}, sandbox.Resources{MemoryBytes: 7 << 60}, true},
		{map[string]string{"gpu": "1"}, sandbox.Resources{GPUs: "1"}, true},
		{map[string]string{"gpu": "02"}, sandbox.Resources{GPUs: "2"}, true},
		{map[string]string{"gpu": "0"}, sandbox.Resources{}, true},
		{map[string]string{"gpu": "ALL"}, sandbox.Resources{GPUs: "all"}, true},
		{map[string]string{"cpu": "1", "memory": "1Gi", "gpu": "all"}, sandbox.Resources{CPUMillis: 1000, MemoryBytes: 1 << 30, GPUs: "all"}, true},
		{map[string]string{"cpu": "0"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "0m"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "1.5m"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "0.0001"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "-1"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "1e3"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "two"}, sandbox.Resources{}, false},
		{map[string]string{"cpu": ""}, sandbox.Resources{}, false},
		{map[string]string{"cpu": "999999999999999"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "8Ei"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "99999999999999999999"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "512MB"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "512m"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "0"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "0.5"}, sandbox.Resources{}, false},
		{map[string]string{"memory": "Gi"}, sandbox.Resources{}, false},
		{map[string]string{"gpu": "some"}, sandbox.Resources{}, false},
		{map[string]string{"gpu": "-1"}, sandbox.Resources{}, false},
		{map[string]string{"gpu": "1.5"}, sandbox.Resources{}, false},
		{map[string]string{"ephemeral-storage": "1Gi"}, sandbox.Resources{StorageBytes: 1 << 30}, true},
		{map[string]string{"ephemeral-storage": "64Mi"}, sandbox.Resources{StorageBytes: 64 << 20}, true},
		{map[string]string{"ephemeral-storage": "5G"}, sandbox.Resources{StorageBytes: 5e9}, true},
		{map[string]string{"memory": "1Gi", "ephemeral-storage": "2Gi"}, sandbox.Resources{MemoryBytes: 1 << 30, StorageBytes: 2 << 30}, true},
		{map[string]string{"ephemeral-storage": "0"}, sandbox.Resources{}, false},
		{map[string]string{"ephemeral-storage": "10GB"}, sandbox.Resources{}, false},
		{map[string]string{"ephemeral-storage": "-1Gi"}, sandbox.Resources{}, false},
		{map[string]string{"ephemeral-storage": "512m"}, sandbox.Resources{}, false},
		{map[string]string{"ephemeral-storage": "8Ei"}, sandbox.Resources{}, false},
		{map[string]string{"storage": "1Gi"}, sandbox.Resources{}, false},
		{map[string]string{"CPU": "1"}, sandbox.Resources{}, false},
	}
	for _, tt := range tests {
		got, err := parseResources(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("parseResources(%v) = %+v, %v; want %+v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
	if _, err := parseResources(map[string]string{"disk": "1"}); err == nil || !strings.Contains(err.Error(), `"disk"`) {
		t.Errorf("unknown key: %v, want it named", err)
	}
	if _, err := parseResources(map[string]string{"ephemeral-storage": "lots"}); err == nil || !strings.Contains(err.Error(), "ephemeral-storage") {
		t.Errorf("bad ephemeral-storage: %v, want the key named", err)
	}
}

// TestResourcesRoundTrip: a pool's resourceLimits are answered back as
// they were given, ephemeral-storage included.
func TestResourcesRoundTrip(t *testing.T) {
	in := map[string]string{"cpu": "1500m", "memory": "2Gi", "gpu": "1", "ephemeral-storage": "64Mi"}
	res, err := parseResources(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := formatResources(res); !maps.Equal(got, in) {
		t.Errorf("formatResources(parseResources(%v)) = %v", in, got)
	}
}

// hostPathServer returns a server that allows host volumes under allow.
func hostPathServer(t testing.TB, allow ...string) *Server {
	t.Helper()
	srv, err := New(NewManager(fake.New(), ManagerConfig{}), Config{APIKey: "k", HostPathAllowlist: allow, MaxTimeout: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func TestHostPaths(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	allowed := filepath.Join(tmp, "allowed")
	outside := filepath.Join(tmp, "outside")
	for _, d := range []string{filepath.Join(allowed, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		filepath.Join(allowed, "escape"):   outside,
		filepath.Join(allowed, "inside"):   filepath.Join(allowed, "sub"),
		filepath.Join(allowed, "dangling"): filepath.Join(tmp, "nowhere"),
		filepath.Join(tmp, "via-link"):     allowed,
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	srv := hostPathServer(t, allowed+"/")
	viaLink := hostPathServer(t, filepath.Join(tmp, "via-link"))
	root := hostPathServer(t, "/")
	none := hostPathServer(t)
	tests := []struct {
		name      string
		srv       *Server
		path, sub string
		code      string // "" = allowed
	}{
		{"the allowed directory", srv, allowed, "", ""},
		{"a subdirectory", srv, allowed + "/sub", "", ""},
		{"untidy but inside", srv, allowed + "//sub/./", "", ""},
		{"not yet existing", srv, allowed + "/new/deeper", "", ""},
		{"symlink that stays inside", srv, allowed + "/inside", "", ""},
		{"sub path", srv, allowed, "sub", ""},
		{"dot-dot out", srv, allowed + "/../outside", "", codeVolumeNotAllowed},
		{"sibling with the same prefix", srv, allowed + "-other", "", codeVolumeNotAllowed},
		{"outside", srv, outside, "", codeVolumeNotAllowed},
		{"symlink out", srv, allowed + "/escape", "", codeVolumeNotAllowed},
		{"symlink out below", srv, allowed + "/escape/x", "", codeVolumeNotAllowed},
		{"sub path through a symlink out", srv, allowed, "escape", codeVolumeNotAllowed},
		{"dangling symlink", srv, allowed + "/dangling/x", "", codeVolumeHostPath},
		{"relative", srv, "allowed", "", codeVolumeHostPath},
		{"windows", srv, `C:\data`, "", codeVolumeHostPath},
		{"empty", srv, "", "", codeVolumeHostPath},
		{"allowed entry is a symlink", viaLink, filepath.Join(tmp, "via-link", "sub"), "", ""},
		{"same directory, not through the allowed link", viaLink, allowed + "/sub", "", codeVolumeNotAllowed},
		{"no allowlist", none, allowed, "", codeVolumeNotAllowed},
		{"docker socket", root, "/var/run/docker.sock", "", codeVolumeNotAllowed},
		{"containerd's socket directory", root, "/run/docker/containerd", "", codeVolumeNotAllowed},
		{"containerd's own directory", root, "/run/containerd", "", codeVolumeNotAllowed},
		{"the engine's store", root, "/var/lib/docker/volumes", "", codeVolumeNotAllowed},
		{"the engine's configuration", root, "/etc/docker", "", codeVolumeNotAllowed},
		{"the kubelet's directory by sub path", root, "/var/lib", "kubelet/pods", codeVolumeNotAllowed},
		{"above the engine's configuration", root, "/etc", "", codeVolumeNotAllowed},
		{"docker socket, other path", root, "/run/docker.sock", "", codeVolumeNotAllowed},
		{"directory of the socket", root, "/run", "", codeVolumeNotAllowed},
		{"directory of the socket, untidy", root, "/var/./run/", "", codeVolumeNotAllowed},
		{"parent of the socket", root, "/var", "", codeVolumeNotAllowed},
		{"root", root, "/", "", codeVolumeNotAllowed},
		{"socket by sub path", root, "/var", "run/docker.sock", codeVolumeNotAllowed},
		{"elsewhere under root", root, tmp, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.srv.checkHostPath("host.path", tt.path, tt.sub)
			if tt.code == "" {
				want, _ := hostpath.Resolve(filepath.Join(filepath.Clean(tt.path), tt.sub))
				if err != nil || got != want {
					t.Fatalf("checkHostPath(%q, %q) = %q, %v; want allowed, resolved to %q", tt.path, tt.sub, got, err, want)
				}
				return
			}
			var he *httpx.Error
			if !errors.As(err, &he) || he.Code != tt.code || he.Status != http.StatusBadRequest {
				t.Fatalf("checkHostPath(%q, %q) = %q, %v; want 400 %s", tt.path, tt.sub, got, err, tt.code)
			}
		})
	}
}

// TestHostAllowlist: entries are resolved once, at start, and may not
// lie inside one another, as written or resolved.
func TestHostAllowlist(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a/inner", "b", "c", "outside"} {
		os.MkdirAll(filepath.Join(tmp, d), 0o755)
	}
	os.Symlink(filepath.Join(tmp, "a", "inner"), filepath.Join(tmp, "into-a"))
	os.Symlink(filepath.Join(tmp, "c"), filepath.Join(tmp, "to-c"))
	p := func(rel string) string { return filepath.Join(tmp, rel) }
	for _, bad := range [][]string{
		{p("a"), p("a/inner")}, // nested as written
		{p("a/inner"), p("a")}, // in either order
		{p("a"), p("into-a")},  // nested once resolved: a's sandboxes could swap a/inner
		{"/", p("b")},          // everything holds everything
		{"relative/path"},      // not absolute
	} {
		if _, _, err := hostAllowlist(bad); err == nil {
			t.Errorf("hostAllowlist(%q) accepted", bad)
		}
	}
	allow, resolved, err := hostAllowlist([]string{p("a"), p("b") + "/", p("a"), p("to-c"), p("c")})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{p("a"), p("b"), p("to-c"), p("c")}; !slices.Equal(allow, want) {
		t.Errorf("allow %q, want %q", allow, want)
	}
	if want := []string{p("a"), p("b"), p("c"), p("c")}; !slices.Equal(resolved, want) {
		t.Errorf("resolved %q, want %q", resolved, want)
	}

	// A link in one entry into a sibling entry: both paths are allowed,
	// but not the one through the other.
	os.MkdirAll(p("b/tenant2"), 0o755)
	os.Symlink(p("b/tenant2"), p("a/task7"))
	siblings := hostPathServer(t, p("a"), p("b"))
	if got, err := siblings.checkHostPath("p", p("a/task7"), ""); err == nil {
		t.Fatalf("a link from one entry into another was allowed, resolved to %s", got)
	}
	if _, err := siblings.checkHostPath("p", p("a"), "task7/x"); err == nil {
		t.Fatal("a sub path through a link into another entry was allowed")
	}
	if _, err := siblings.checkHostPath("p", p("b/tenant2"), ""); err != nil {
		t.Fatalf("the other entry itself: %v", err)
	}

	// A link among the entries retargeted after start widens nothing.
	srv := hostPathServer(t, p("to-c"))
	if _, err := srv.checkHostPath("p", p("to-c"), ""); err != nil {
		t.Fatalf("the entry itself: %v", err)
	}
	os.Remove(p("to-c"))
	os.Symlink(p("outside"), p("to-c"))
	if got, err := srv.checkHostPath("p", p("to-c"), ""); err == nil {
		t.Fatalf("the retargeted entry was allowed, resolved to %s", got)
	}
}

// FuzzCreateRequest decodes and validates arbitrary create bodies: it
// never panics, every refusal is a 400 envelope, and every accepted
// request yields a spec that keeps the promises of specFromRequest.
func FuzzCreateRequest(f *testing.F) {
	allowed := f.TempDir()
	for _, seed := range []string{
		validCreate,
		`{"snapshotId":"s","resourceLimits":{}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{"cpu":"1.5","memory":"1Gi","gpu":"all"},"timeout":null}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"timeout":60,"env":{"A":null,"B":"1"}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"metadata":{"example.com/k":"v"},"platform":{"os":"LINUX","arch":"arm64"}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"networkPolicy":{"egress":[{"action":"allow","target":"x"}]}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"extensions":{"access.renew.extend.seconds":"300","poolRef":""}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"volumes":[{"name":"v","mountPath":"/m","subPath":"s","host":{"path":"` + allowed + `"}}]}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"volumes":[{"name":"v","mountPath":"/m","pvc":{"claimName":"c","storage":"1Gi"}}]}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"timeout":1e18}`,
		`{"extensions":{"poolRef":"p"}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"extensions":{"docker.privileged":"true"}}`,
		`{"image":{"uri":"127.0.0.1:5000/a"},"entrypoint":["x"],"resourceLimits":{}}`,
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{},"volumes":[{"name":"v","mountPath":"/opt","pvc":{"claimName":"c"}}]}`,
	} {
		f.Add([]byte(seed))
	}
	srv := hostPathServer(f, allowed)
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.CreateSandboxRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		now := time.Now()
		spec, err := srv.specFromRequest(&req, now)
		if err != nil {
			var he *httpx.Error
			if !errors.As(err, &he) || he.Status != http.StatusBadRequest || he.Code == "" || he.Message == "" {
				t.Fatalf("refusal %#v is not a 400 with code and message", err)
			}
			return
		}
		checkSpec(t, srv, &req, &spec, now)
	})
}

// checkSpec fails unless spec, accepted for req at now, keeps every
// promise of validation.
func checkSpec(t *testing.T, srv *Server, req *api.CreateSandboxRequest, spec *sandbox.Spec, now time.Time) {
	t.Helper()
	if (spec.Image == "") == (spec.SnapshotID == "") {
		t.Fatalf("image %q and snapshot %q: want exactly one", spec.Image, spec.SnapshotID)
	}
	if spec.Image != "" && checkImageRef(spec.Image) != nil {
		t.Fatalf("accepted image %q", spec.Image)
	}
	if checkEntrypoint(spec.Entrypoint) != nil {
		t.Fatalf("accepted entrypoint %q", spec.Entrypoint)
	}
	if (req.Timeout == nil) != (spec.ExpiresAt == nil) {
		t.Fatalf("timeout %v gave expiry %v", req.Timeout, spec.ExpiresAt)
	}
	if at := spec.ExpiresAt; at != nil {
		if at.Before(now.Add(srv.cfg.MinTimeout)) || at.After(now.Add(srv.cfg.MaxTimeout)) {
			t.Fatalf("expiry %v outside [now+%v, now+%v]", at, srv.cfg.MinTimeout, srv.cfg.MaxTimeout)
		}
	}
	if req.ResourceLimits == nil {
		t.Fatal("accepted without resourceLimits")
	}
	r := spec.Resources
	if r.CPUMillis < 0 || r.MemoryBytes < 0 || (req.ResourceLimits["cpu"] != "" && r.CPUMillis == 0) || (req.ResourceLimits["memory"] != "" && r.MemoryBytes == 0) {
		t.Fatalf("resources %+v from %v", r, req.ResourceLimits)
	}
	for k := range req.ResourceLimits {
		if k != "cpu" && k != "memory" && k != "gpu" {
			t.Fatalf("accepted resource %q", k)
		}
	}
	for k, v := range spec.Metadata {
		if checkLabel(k, v) != nil || strings.HasPrefix(k, reservedLabelPrefix) {
			t.Fatalf("accepted metadata %q=%q", k, v)
		}
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			t.Fatalf("accepted env %q=%q", k, v)
		}
	}
	for k, v := range req.Env {
		if _, ok := spec.Env[k]; ok != (v != nil) {
			t.Fatalf("env %q: null values must be dropped, the rest kept", k)
		}
	}
	if p := spec.Platform; p != nil && ((p.OS != "linux" && p.OS != "windows") || (p.Arch != "amd64" && p.Arch != "arm64")) {
		t.Fatalf("accepted platform %+v", p)
	}
	if spec.NetworkPolicy != nil {
		t.Fatal("accepted a network policy")
	}
	if strings.TrimSpace(spec.Extensions[extPoolRef]) != "" {
		t.Fatal("accepted a pool ref")
	}
	if err := srv.checkExtensionKeys(spec.Extensions); err != nil {
		t.Fatalf("accepted extensions %v: %v", spec.Extensions, err)
	}
	if spec.Image != "" && localRegistry(spec.Image) != "" {
		t.Fatalf("accepted image %q from a local registry", spec.Image)
	}
	if err := checkExecSize(spec.Env, spec.Entrypoint); err != nil {
		t.Fatalf("accepted env and entrypoint the kernel refuses: %v", err)
	}
	if v, ok := spec.Extensions[extRenewExtend]; ok {
		if _, err := renewExtendOf(v); err != nil {
			t.Fatalf("accepted %s=%q", extRenewExtend, v)
		}
	}
	names, mounts := map[string]bool{}, map[string]bool{}
	for _, v := range spec.Volumes {
		if !dnsLabelRE.MatchString(v.Name) || len(v.Name) > 63 || names[v.Name] {
			t.Fatalf("accepted volume name %q", v.Name)
		}
		names[v.Name] = true
		if !strings.HasPrefix(v.MountPath, "/") || mounts[v.MountPath] || reservedMount(v.MountPath) != "" {
			t.Fatalf("accepted mount path %q", v.MountPath)
		}
		mounts[v.MountPath] = true
		if strings.HasPrefix(v.SubPath, "/") || strings.Contains("/"+v.SubPath+"/", "/../") {
			t.Fatalf("accepted sub path %q", v.SubPath)
		}
		if (v.HostPath == "") == (v.Claim == nil) {
			t.Fatalf("volume %+v: want exactly one backend", v)
		}
		if v.HostPath != "" {
			if _, err := srv.checkHostPath("p", v.HostPath, v.SubPath); err != nil {
				t.Fatalf("accepted host path %q (%q): %v", v.HostPath, v.SubPath, err)
			}
		}
	}
}

// FuzzLabelRules compares the label checker with a plain reading of the
// rules, character by character.
func FuzzLabelRules(f *testing.F) {
	for _, s := range [][2]string{{"team", "ml"}, {"example.com/k", ""}, {"opensandbox.io/x", "v"}, {"a/b/c", "-"}, {"k", "Data Processing"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		err := checkLabel(key, value)
		if want := plainLabelOK(key, value); (err == nil) != want {
			t.Fatalf("checkLabel(%q, %q) = %v, want ok=%v", key, value, err, want)
		}
	})
}

func plainLabelOK(key, value string) bool {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	name := func(s string, allowEmpty bool) bool {
		if s == "" {
			return allowEmpty
		}
		if len(s) > 63 || !alnum(s[0]) || !alnum(s[len(s)-1]) {
			return false
		}
		for i := 0; i < len(s); i++ {
			if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
				return false
			}
		}
		return true
	}
	dnsLabel := func(s string) bool {
		lower := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
		if s == "" || !lower(s[0]) || !lower(s[len(s)-1]) {
			return false
		}
		for i := 0; i < len(s); i++ {
			if !lower(s[i]) && s[i] != '-' {
				return false
			}
		}
		return true
	}
	if strings.HasPrefix(key, "opensandbox.io/") {
		return false
	}
	n := key
	if i := strings.IndexByte(key, '/'); i >= 0 {
		prefix := key[:i]
		if len(prefix) > 253 {
			return false
		}
		for l := range strings.SplitSeq(prefix, ".") {
			if !dnsLabel(l) {
				return false
			}
		}
		n = key[i+1:]
	}
	return name(n, false) && name(value, true)
}
