package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/fake"
	"github.com/opensandbox/opensandbox/sandbox"
)

func TestCreateSandbox(t *testing.T) {
	// custom.key reaches the runtime because the operator allows it.
	e, rt := newEnv(t, func(c *Config) { c.AllowedExtensions = []string{"custom.*"} })
	before := time.Now()
	body := `{"image":{"uri":"registry.local:5000/team/app:1.0","auth":{"username":"u","password":"p"}},
		"entrypoint":["python","-m","http.server","8080"],"timeout":1800,
		"resourceLimits":{"cpu":"500m","memory":"512Mi","gpu":"all"},
		"env":{"LOG_LEVEL":"debug","DROPPED":null},"metadata":{"team":"ml","example.com/purpose":"demo"},
		"platform":{"os":"Linux","arch":"AMD64"},"secureAccess":true,
		"extensions":{"access.renew.extend.seconds":"600","custom.key":"x"}}`
	r := e.call("POST", "/v1/sandboxes", body).wantStatus(t, http.StatusAccepted)
	var raw map[string]json.RawMessage
	r.decode(t, &raw)
	for _, absent := range []string{"image", "snapshotId"} {
		if _, ok := raw[absent]; ok {
			t.Errorf("create response has %q: %s", absent, r.body)
		}
	}
	var out api.CreateSandboxResponse
	r.decode(t, &out)
	if out.Status.State != "Pending" || out.Status.LastTransitionAt == nil || len(out.Entrypoint) != 4 ||
		out.Metadata["team"] != "ml" || out.Platform == nil || out.Platform.OS != "linux" || out.Platform.Arch != "amd64" {
		t.Fatalf("create response %s", r.body)
	}
	if out.ExpiresAt == nil || out.ExpiresAt.Before(before.Add(1800*time.Second)) || out.ExpiresAt.After(time.Now().Add(1800*time.Second)) {
		t.Fatalf("expiresAt %v, want now+1800s", out.ExpiresAt)
	}
	if !strings.Contains(string(raw["expiresAt"]), "Z") || !strings.Contains(string(raw["createdAt"]), "Z") {
		t.Fatalf("timestamps not in UTC: %s", r.body)
	}
	sb, err := rt.Get(context.Background(), sandbox.ID(out.ID))
	if err != nil {
		t.Fatal(err)
	}
	if !sb.SecureAccess || sb.Extensions["custom.key"] != "x" || sb.Extensions["access.renew.extend.seconds"] != "600" {
		t.Fatalf("runtime got %+v", sb)
	}

	// GET shows the image uri, never its credentials.
	g := e.call("GET", "/v1/sandboxes/"+out.ID, "").wantStatus(t, 200)
	if strings.Contains(string(g.body), `"auth"`) || strings.Contains(string(g.body), `"password"`) {
		t.Fatalf("GET leaks registry credentials: %s", g.body)
	}
	var got api.Sandbox
	g.decode(t, &got)
	if got.Image == nil || got.Image.URI != "registry.local:5000/team/app:1.0" || got.SnapshotID != "" {
		t.Fatalf("GET %s", g.body)
	}
	e.waitState(out.ID, sandbox.StateRunning)
	e.call("GET", "/v1/sandboxes/"+out.ID, "").decode(t, &got)
	if got.Status.State != "Running" {
		t.Fatalf("state %q", got.Status.State)
	}
}

// recordingRuntime records the specs it is asked to create.
type recordingRuntime struct {
	*fake.Runtime
	mu    sync.Mutex
	specs []sandbox.Spec
}

func (r *recordingRuntime) Create(ctx context.Context, id sandbox.ID, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	return r.Runtime.Create(ctx, id, spec)
}

func (r *recordingRuntime) last() sandbox.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.specs[len(r.specs)-1]
}

func TestCreateBuildsSpec(t *testing.T) {
	rt := &recordingRuntime{Runtime: fake.New()}
	allowed := t.TempDir()
	e := newEnvWith(t, rt, func(c *Config) { c.HostPathAllowlist = []string{allowed} })
	e.create(`{"image":{"uri":"python:3.11","auth":{"username":"u","password":"p"}},"entrypoint":["sh"],
		"resourceLimits":{"cpu":"0.5","memory":"2Gi","gpu":"1"},"env":{"A":"1","B":null},
		"volumes":[{"name":"data","mountPath":"/data/","subPath":"./x/","host":{"path":"` + allowed + `/"}},
			{"name":"cache","mountPath":"/cache","readOnly":true,"pvc":{"claimName":"my-claim","storage":"1Gi","deleteOnSandboxTermination":true}}]}`)
	spec := rt.last()
	if spec.Image != "python:3.11" || spec.ImageAuth == nil || spec.ImageAuth.Password != "p" || spec.ExpiresAt != nil {
		t.Fatalf("spec %+v", spec)
	}
	if spec.Resources != (sandbox.Resources{CPUMillis: 500, MemoryBytes: 2 << 30, GPUs: "1"}) {
		t.Fatalf("resources %+v", spec.Resources)
	}
	if len(spec.Env) != 1 || spec.Env["A"] != "1" {
		t.Fatalf("env %v", spec.Env)
	}
	if len(spec.Volumes) != 2 {
		t.Fatalf("volumes %+v", spec.Volumes)
	}
	if v := spec.Volumes[0]; v.HostPath != filepath.Join(allowed, "x") || v.MountPath != "/data" || v.SubPath != "" || v.Claim != nil {
		t.Fatalf("host volume %+v", v)
	}
	if v := spec.Volumes[1]; v.Claim == nil || v.Claim.Name != "my-claim" || !v.Claim.CreateIfNotExists || !v.Claim.DeleteOnTermination ||
		v.Claim.Size != "1Gi" || !v.ReadOnly || v.HostPath != "" {
		t.Fatalf("pvc volume %+v %+v", v, v.Claim)
	}
}

func TestCreateFromSnapshot(t *testing.T) {
	e, _ := newEnv(t)
	src := e.create("")
	e.waitState(src, sandbox.StateRunning)
	var snap api.Snapshot
	e.call("POST", "/v1/sandboxes/"+src+"/snapshots", `{"name":"s1"}`).wantStatus(t, 202).decode(t, &snap)

	waitSnapshot(t, e, snap.ID, "Ready")
	var out api.CreateSandboxResponse
	e.call("POST", "/v1/sandboxes", `{"snapshotId":"  `+snap.ID+`  ","timeout":null,"resourceLimits":{"cpu":"1"}}`).wantStatus(t, 202).decode(t, &out)
	if strings.Join(out.Entrypoint, " ") != "tail -f /dev/null" || out.ExpiresAt != nil {
		t.Fatalf("restore %+v", out)
	}
	r := e.call("GET", "/v1/sandboxes/"+out.ID, "")
	var got api.Sandbox
	r.decode(t, &got)
	if got.Image != nil || got.SnapshotID != snap.ID || strings.Contains(string(r.body), "expiresAt") {
		t.Fatalf("restored sandbox %s", r.body)
	}
	e.call("POST", "/v1/sandboxes", `{"snapshotId":"no-such-snapshot","resourceLimits":{}}`).wantError(t, 404, api.CodeSnapshotNotFound)
	e.call("POST", "/v1/sandboxes", `{"snapshotId":"`+snap.ID+`","entrypoint":["sleep","1"],"resourceLimits":{}}`).wantStatus(t, 202)
}

// unreadySnapshots is a runtime whose snapshots never become Ready.
type unreadySnapshots struct{ *fake.Runtime }

func (u unreadySnapshots) SnapshotImage(ctx context.Context, snap sandbox.SnapshotID) (string, error) {
	if _, err := u.GetSnapshot(ctx, snap); err != nil {
		return "", err
	}
	return "", sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotNotReady, "snapshot "+string(snap)+" is Creating")
}

func TestCreateFromUnreadySnapshot(t *testing.T) {
	e := newEnvWith(t, unreadySnapshots{fake.New()})
	src := e.create("")
	e.waitState(src, sandbox.StateRunning)
	var snap api.Snapshot
	e.call("POST", "/v1/sandboxes/"+src+"/snapshots", "").wantStatus(t, 202).decode(t, &snap)
	e.call("POST", "/v1/sandboxes", `{"snapshotId":"`+snap.ID+`","resourceLimits":{}}`).wantError(t, 409, api.CodeSnapshotNotReady)
	e.call("POST", "/v1/sandboxes", `{"snapshotId":"nope","resourceLimits":{}}`).wantError(t, 404, api.CodeSnapshotNotFound)
}

func waitSnapshot(t *testing.T, e *testEnv, id, state string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var s api.Snapshot
		e.call("GET", "/v1/snapshots/"+id, "").wantStatus(t, 200).decode(t, &s)
		if s.Status.State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s is %s, never %s", id, s.Status.State, state)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestCreateValidation(t *testing.T) {
	e, _ := newEnv(t, func(c *Config) { c.MaxTimeout = 24 * time.Hour })
	const rl = `"resourceLimits":{"cpu":"1"}`
	img := func(extra string) string {
		return `{"image":{"uri":"python:3.11"},"entrypoint":["python"],` + rl + extra + `}`
	}
	tests := []struct {
		name, body, code string
	}{
		{"neither image nor snapshot", `{"entrypoint":["x"],` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"blank snapshot only", `{"snapshotId":"  ",` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"both", `{"image":{"uri":"a"},"snapshotId":"s","entrypoint":["x"],` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"blank uri", `{"image":{"uri":"  "},"entrypoint":["x"],` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"missing uri", `{"image":{},"entrypoint":["x"],` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"bad reference", `{"image":{"uri":"Python:3.11"},"entrypoint":["x"],` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"reference with space", `{"image":{"uri":"python :3"},"entrypoint":["x"],` + rl + `}`, api.CodeSandboxInvalidParameter},
		{"no entrypoint", `{"image":{"uri":"a"},` + rl + `}`, api.CodeDockerInvalidEntrypoint},
		{"empty entrypoint", `{"image":{"uri":"a"},"entrypoint":[],` + rl + `}`, api.CodeDockerInvalidEntrypoint},
		{"blank program", `{"image":{"uri":"a"},"entrypoint":[" ","x"],` + rl + `}`, api.CodeDockerInvalidEntrypoint},
		{"NUL in argument", `{"image":{"uri":"a"},"entrypoint":["sh","a\u0000b"],` + rl + `}`, api.CodeDockerInvalidEntrypoint},
		{"timeout below minimum", img(`,"timeout":59`), api.CodeSandboxInvalidParameter},
		{"timeout zero", img(`,"timeout":0`), api.CodeSandboxInvalidParameter},
		{"timeout negative", img(`,"timeout":-5`), api.CodeSandboxInvalidParameter},
		{"timeout above maximum", img(`,"timeout":86401`), api.CodeSandboxInvalidParameter},
		{"timeout absurd", img(`,"timeout":1000000000000000000`), api.CodeSandboxInvalidParameter},
		{"timeout beyond int64", img(`,"timeout":100000000000000000000`), api.CodeSandboxInvalidParameter},
		{"timeout string", img(`,"timeout":"600"`), api.CodeSandboxInvalidParameter},
		{"no resource limits", `{"image":{"uri":"a"},"entrypoint":["x"]}`, api.CodeSandboxInvalidParameter},
		{"null resource limits", `{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":null}`, api.CodeSandboxInvalidParameter},
		{"unknown resource", `{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{"disk":"1Gi"}}`, api.CodeSandboxInvalidParameter},
		{"bad cpu", `{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{"cpu":"lots"}}`, api.CodeSandboxInvalidParameter},
		{"bad memory", `{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{"memory":"512MB"}}`, api.CodeSandboxInvalidParameter},
		{"bad gpu", `{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{"gpu":"some"}}`, api.CodeSandboxInvalidParameter},
		{"env name with =", img(`,"env":{"A=B":"x"}`), api.CodeSandboxInvalidParameter},
		{"env empty name", img(`,"env":{"":"x"}`), api.CodeSandboxInvalidParameter},
		{"metadata bad value", img(`,"metadata":{"purpose":"Data Processing Sandbox"}`), api.CodeSandboxInvalidMetadataLabel},
		{"metadata reserved", img(`,"metadata":{"opensandbox.io/id":"x"}`), api.CodeSandboxInvalidMetadataLabel},
		{"metadata long key", img(`,"metadata":{"` + strings.Repeat("k", 64) + `":"x"}`), api.CodeSandboxInvalidMetadataLabel},
		{"platform os", img(`,"platform":{"os":"plan9","arch":"amd64"}`), api.CodeSandboxInvalidParameter},
		{"platform arch", img(`,"platform":{"os":"linux","arch":"riscv"}`), api.CodeSandboxInvalidParameter},
		{"platform incomplete", img(`,"platform":{"os":"linux"}`), api.CodeSandboxInvalidParameter},
		{"network policy", img(`,"networkPolicy":{"defaultAction":"deny","egress":[{"action":"allow","target":"example.org"}]}`), api.CodeSandboxInvalidParameter},
		{"empty network policy", img(`,"networkPolicy":{}`), api.CodeSandboxInvalidParameter},
		{"malformed network policy", img(`,"networkPolicy":{"defaultAction":"maybe"}`), api.CodeSandboxInvalidParameter},
		{"network policy extra field", img(`,"networkPolicy":{"rules":[]}`), api.CodeSandboxInvalidParameter},
		{"credential proxy without policy", img(`,"credentialProxy":{"enabled":true}`), api.CodeSandboxInvalidParameter},
		{"pool ref", `{"extensions":{"poolRef":"warm"}}`, api.CodeSandboxUnsupportedPoolRef},
		{"renew extend too small", img(`,"extensions":{"access.renew.extend.seconds":"299"}`), api.CodeSandboxInvalidParameter},
		{"renew extend too large", img(`,"extensions":{"access.renew.extend.seconds":"86401"}`), api.CodeSandboxInvalidParameter},
		{"renew extend empty", img(`,"extensions":{"access.renew.extend.seconds":""}`), api.CodeSandboxInvalidParameter},
		{"renew extend not a number", img(`,"extensions":{"access.renew.extend.seconds":"5m"}`), api.CodeSandboxInvalidParameter},
		{"volume bad name", img(`,"volumes":[{"name":"Data","mountPath":"/d","pvc":{"claimName":"c"}}]`), api.CodeVolumeInvalidName},
		{"volume duplicate name", img(`,"volumes":[{"name":"d","mountPath":"/a","pvc":{"claimName":"c"}},{"name":"d","mountPath":"/b","pvc":{"claimName":"c"}}]`), api.CodeVolumeDuplicateName},
		{"volume relative mount", img(`,"volumes":[{"name":"d","mountPath":"d","pvc":{"claimName":"c"}}]`), api.CodeVolumeInvalidMountPath},
		{"volume same mount", img(`,"volumes":[{"name":"a","mountPath":"/d","pvc":{"claimName":"c"}},{"name":"b","mountPath":"/d/","pvc":{"claimName":"c"}}]`), api.CodeVolumeInvalidMountPath},
		{"volume sub path escapes", img(`,"volumes":[{"name":"d","mountPath":"/d","subPath":"a/../../b","pvc":{"claimName":"c"}}]`), api.CodeVolumeInvalidSubPath},
		{"volume absolute sub path", img(`,"volumes":[{"name":"d","mountPath":"/d","subPath":"/etc","pvc":{"claimName":"c"}}]`), api.CodeVolumeInvalidSubPath},
		{"volume no backend", img(`,"volumes":[{"name":"d","mountPath":"/d"}]`), api.CodeVolumeInvalidBackend},
		{"volume two backends", img(`,"volumes":[{"name":"d","mountPath":"/d","host":{"path":"/tmp"},"pvc":{"claimName":"c"}}]`), api.CodeVolumeInvalidBackend},
		{"host volume refused by default", img(`,"volumes":[{"name":"d","mountPath":"/d","host":{"path":"/tmp"}}]`), api.CodeVolumeHostPathNotAllowed},
		{"host volume relative", img(`,"volumes":[{"name":"d","mountPath":"/d","host":{"path":"tmp"}}]`), api.CodeVolumeInvalidHostPath},
		{"pvc bad claim", img(`,"volumes":[{"name":"d","mountPath":"/d","pvc":{"claimName":"My_Claim"}}]`), api.CodeVolumeInvalidPVCName},
		{"pvc bad storage", img(`,"volumes":[{"name":"d","mountPath":"/d","pvc":{"claimName":"c","storage":"1GB"}}]`), api.CodeSandboxInvalidParameter},
		{"pvc bad access mode", img(`,"volumes":[{"name":"d","mountPath":"/d","pvc":{"claimName":"c","accessModes":["Sometimes"]}}]`), api.CodeSandboxInvalidParameter},
		{"ossfs", img(`,"volumes":[{"name":"d","mountPath":"/d","ossfs":{"bucket":"b","endpoint":"e","accessKeyId":"a","accessKeySecret":"s"}}]`), api.CodeVolumeUnsupportedBackend},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.call("POST", "/v1/sandboxes", tt.body).wantError(t, 400, tt.code)
		})
	}
	// And the accepted edges.
	for _, body := range []string{
		img(`,"timeout":60`), img(`,"timeout":86400`), img(`,"timeout":null`),
		img(`,"credentialProxy":{"enabled":false}`), img(`,"networkPolicy":null`),
		img(`,"extensions":{"access.renew.extend.seconds":"300","poolRef":"  "}`),
		img(`,"metadata":{"example.com/a-b":"","k":"v.1_2-3"}`),
		`{"image":{"uri":"a"},"entrypoint":["x"],"resourceLimits":{}}`,
	} {
		e.call("POST", "/v1/sandboxes", body).wantStatus(t, 202)
	}
}

func TestRuntimeNameInCodes(t *testing.T) {
	e, _ := newEnv(t, func(c *Config) { c.RuntimeName = "KUBERNETES" })
	e.call("GET", "/v1/sandboxes/nope", "").wantError(t, 404, api.CodeKubernetesSandboxNotFound)
	e.call("GET", "/v1/sandboxes/nope/endpoints/0", "").wantError(t, 400, api.CodeKubernetesInvalidPort)
	e.call("POST", "/v1/sandboxes", `{"image":{"uri":"a"},"resourceLimits":{}}`).wantError(t, 400, api.CodeKubernetesInvalidEntrypoint)
}

// TestConcurrentCreates creates 50 sandboxes at once through HTTP.
func TestConcurrentCreates(t *testing.T) {
	e, rt := newEnv(t)
	const n = 50
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"metadata":{"i":"%d"}}`, i)
			req, _ := http.NewRequest("POST", e.url+"/v1/sandboxes", strings.NewReader(body))
			req.Header.Set(api.HeaderAPIKey, testKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			var out api.CreateSandboxResponse
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 202 || out.Metadata["i"] != fmt.Sprint(i) {
				errs <- fmt.Errorf("create %d: %d %+v %v", i, resp.StatusCode, out, err)
				return
			}
			ids[i] = out.ID
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if id == "" || seen[id] {
			t.Fatalf("ids %v: want %d distinct", ids, n)
		}
		seen[id] = true
	}
	all, _ := rt.List(context.Background())
	if len(all) != n {
		t.Fatalf("runtime has %d sandboxes, want %d", len(all), n)
	}
	var list api.ListSandboxesResponse
	e.call("GET", "/v1/sandboxes?pageSize=200", "").decode(t, &list)
	if list.Pagination.TotalItems != n || len(list.Items) != n {
		t.Fatalf("list: %+v", list.Pagination)
	}
}

func TestListSandboxes(t *testing.T) {
	e, rt := newEnv(t)
	mk := func(md string) string {
		id := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"metadata":` + md + `}`)
		time.Sleep(2 * time.Millisecond) // distinct creation times
		return id
	}
	a := mk(`{"team":"ml","env":"prod"}`)
	b := mk(`{"team":"ml","env":"dev"}`)
	c := mk(`{"team":"web","note":"a.b"}`)
	for _, id := range []string{a, b, c} {
		e.waitState(id, sandbox.StateRunning)
	}
	if err := rt.Pause(context.Background(), sandbox.ID(b)); err != nil {
		t.Fatal(err)
	}
	list := func(query string) []string {
		t.Helper()
		var out api.ListSandboxesResponse
		e.call("GET", "/v1/sandboxes"+query, "").wantStatus(t, 200).decode(t, &out)
		var ids []string
		for _, it := range out.Items {
			ids = append(ids, it.ID)
		}
		return ids
	}
	md := func(s string) string { return "metadata=" + url.QueryEscape(s) }
	tests := []struct {
		query string
		want  []string
	}{
		{"", []string{c, b, a}}, // newest first
		{"?state=Running", []string{c, a}},
		{"?state=running&state=PAUSED", []string{c, b, a}},
		{"?state=Paused", []string{b}},
		{"?state=Failed", nil},
		{"?" + md("team=ml"), []string{b, a}},
		{"?" + md("team=ml&env=prod"), []string{a}},
		{"?" + md("team=ml") + "&state=Paused", []string{b}},
		{"?" + md("note=a.b"), []string{c}},
		{"?" + md("note=a%2Eb"), []string{c}},       // unescaped twice
		{"?" + md("note=a+b"), nil},                 // "+" is a space
		{"?" + md("team=ml&team=web"), []string{c}}, // last wins
		{"?" + md("team="), nil},
		{"?" + md(""), []string{c, b, a}},
		{"?metadata=team%3Dml%26env%3Ddev", []string{b}}, // as the SDKs encode it
		{"?pageSize=2", []string{c, b}},
		{"?pageSize=2&page=2", []string{a}},
		{"?pageSize=2&page=3", nil},
	}
	for _, tt := range tests {
		if got := list(tt.query); strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("GET /sandboxes%s = %v, want %v", tt.query, got, tt.want)
		}
	}
	if got := list("?" + md("=v")); got != nil {
		t.Errorf("an empty key matches nothing; got %v", got)
	}
	for _, q := range []string{"?" + md("team"), "?" + md("a=1&&b=2"), "?" + md("a=%zz"), "?" + md("a=1&")} {
		e.call("GET", "/v1/sandboxes"+q, "").wantError(t, 400, "INVALID_METADATA_FORMAT")
	}
	for _, q := range []string{"?page=0", "?page=-1", "?page=x", "?pageSize=0", "?pageSize=201", "?pageSize=1.5", "?page=99999999999999999999"} {
		e.call("GET", "/v1/sandboxes"+q, "").wantError(t, 400, api.CodeSandboxInvalidParameter)
	}
	var out api.ListSandboxesResponse
	e.call("GET", "/v1/sandboxes?page=1000000000&pageSize=200", "").wantStatus(t, 200).decode(t, &out)
	if len(out.Items) != 0 || out.Items == nil || out.Pagination != (api.PaginationInfo{Page: 1000000000, PageSize: 200, TotalItems: 3, TotalPages: 1}) {
		t.Fatalf("far page: %+v", out)
	}
	r := e.call("GET", "/v1/sandboxes?state=Failed", "")
	if !strings.Contains(string(r.body), `"items":[]`) {
		t.Fatalf("empty list must be [], not null: %s", r.body)
	}
}

func TestGetAndDeleteSandbox(t *testing.T) {
	e, rt := newEnv(t)
	id := e.create("")
	var got api.Sandbox
	e.call("GET", "/sandboxes/"+id, "").wantStatus(t, 200).decode(t, &got)
	if got.ID != id || len(got.Entrypoint) == 0 {
		t.Fatalf("GET %+v", got)
	}
	r := e.call("DELETE", "/v1/sandboxes/"+id, "").wantStatus(t, 204)
	if len(r.body) != 0 {
		t.Fatalf("204 with body %q", r.body)
	}
	e.call("GET", "/v1/sandboxes/"+id, "").wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("DELETE", "/v1/sandboxes/"+id, "").wantError(t, 404, api.CodeDockerSandboxNotFound)

	id = e.create("")
	// The runtime's own code, whichever it is, reaches the client.
	rt.FailNext("Delete", sandbox.Coded(sandbox.ErrConflict, api.CodeSnapshotInvalidSourceState, "busy"))
	e.call("DELETE", "/v1/sandboxes/"+id, "").wantError(t, 409, api.CodeSnapshotInvalidSourceState)
}

func TestEntrypointNeverNull(t *testing.T) {
	sb := &sandbox.Sandbox{ID: "x", Status: sandbox.Status{State: sandbox.StateRunning}, CreatedAt: time.Now()}
	b, _ := json.Marshal(toAPISandbox(sb))
	if !strings.Contains(string(b), `"entrypoint":[]`) || strings.Contains(string(b), "expiresAt") || strings.Contains(string(b), "lastTransitionAt") {
		t.Fatalf("%s", b)
	}
	b, _ = json.Marshal(toCreateResponse(sb))
	if !strings.Contains(string(b), `"entrypoint":[]`) {
		t.Fatalf("%s", b)
	}
}

func TestPatchMetadata(t *testing.T) {
	e, _ := newEnv(t)
	id := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{},"metadata":{"a":"1","b":"2"}}`)
	patch := func(body string) map[string]string {
		t.Helper()
		var out api.Sandbox
		e.call("PATCH", "/v1/sandboxes/"+id+"/metadata", body).wantStatus(t, 200).decode(t, &out)
		if out.ID != id {
			t.Fatalf("PATCH answered %+v", out)
		}
		return out.Metadata
	}
	if md := patch(`{}`); len(md) != 2 || md["a"] != "1" {
		t.Fatalf("no-op patch: %v", md)
	}
	if md := patch(`{"a":"10","c":"3","b":null,"absent":null}`); len(md) != 2 || md["a"] != "10" || md["c"] != "3" {
		t.Fatalf("patch: %v", md)
	}
	for _, body := range []string{`{"opensandbox.io/id":"x"}`, `{"opensandbox.io/id":null}`, `{"k":"bad value"}`, `{"bad key":"v"}`} {
		e.call("PATCH", "/v1/sandboxes/"+id+"/metadata", body).wantError(t, 400, "INVALID_METADATA_LABEL")
	}
	for _, body := range []string{`null`, `[]`, `{"a":1}`, ``} {
		e.call("PATCH", "/v1/sandboxes/"+id+"/metadata", body).wantError(t, 400, api.CodeSandboxInvalidParameter)
	}
	e.call("PATCH", "/v1/sandboxes/nope/metadata", `{"a":"b"}`).wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("PATCH", "/v1/sandboxes/nope/metadata", `{}`).wantError(t, 404, api.CodeDockerSandboxNotFound)
}

func TestPauseResume(t *testing.T) {
	e, rt := newEnv(t)
	id := e.create("")
	e.call("POST", "/v1/sandboxes/"+id+"/resume", "").wantError(t, 409, api.CodeDockerSandboxNotPaused)
	e.waitState(id, sandbox.StateRunning)
	r := e.call("POST", "/v1/sandboxes/"+id+"/pause", "").wantStatus(t, 202)
	if len(r.body) != 0 {
		t.Fatalf("pause answered a body: %q", r.body)
	}
	if sb, _ := rt.Get(context.Background(), sandbox.ID(id)); sb.Status.State != sandbox.StatePaused {
		t.Fatalf("after pause: %s", sb.Status.State)
	}
	e.call("POST", "/v1/sandboxes/"+id+"/pause", "").wantError(t, 409, api.CodeDockerSandboxNotRunning)
	e.call("POST", "/v1/sandboxes/"+id+"/resume", "").wantStatus(t, 202)
	e.call("POST", "/v1/sandboxes/nope/pause", "").wantError(t, 404, api.CodeDockerSandboxNotFound)

	bare := newEnvWith(t, bareRuntime{fake.New()})
	id = bare.create("")
	bare.call("POST", "/v1/sandboxes/"+id+"/pause", "").wantError(t, 501, api.CodeSandboxAPINotSupported)
	bare.call("POST", "/v1/sandboxes/"+id+"/resume", "").wantError(t, 501, api.CodeSandboxAPINotSupported)
}

func TestRenewExpiration(t *testing.T) {
	e, rt := newEnv(t, func(c *Config) { c.MaxTimeout = 48 * time.Hour })
	id := e.create("")
	renew := func(body string) result { return e.call("POST", "/v1/sandboxes/"+id+"/renew-expiration", body) }

	at := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	var out api.RenewExpirationRequest
	renew(`{"expiresAt":"`+at.In(time.FixedZone("X", 3600)).Format(time.RFC3339)+`"}`).wantStatus(t, 200).decode(t, &out)
	if !out.ExpiresAt.Equal(at) || out.ExpiresAt.Location() != time.UTC {
		t.Fatalf("renew answered %v, want %v in UTC", out.ExpiresAt, at)
	}
	// A timestamp without zone is UTC.
	naive := time.Now().UTC().Add(3 * time.Hour).Truncate(time.Second)
	r := renew(`{"expiresAt":"`+naive.Format("2006-01-02T15:04:05")+`"}`).wantStatus(t, 200)
	r.decode(t, &out)
	if !out.ExpiresAt.Equal(naive) || !strings.Contains(string(r.body), "Z") {
		t.Fatalf("naive renew answered %s, want %v", r.body, naive)
	}
	if sb, _ := rt.Get(context.Background(), sandbox.ID(id)); !sb.ExpiresAt.Equal(naive) {
		t.Fatalf("runtime expiry %v", sb.ExpiresAt)
	}
	renew(`{"expiresAt":"`+naive.Add(time.Hour).Format("2006-01-02 15:04:05.000")+`"}`).wantStatus(t, 200)

	renew(`{"expiresAt":"2001-01-01T00:00:00Z"}`).wantError(t, 400, api.CodeDockerInvalidExpiration)
	renew(`{"expiresAt":"`+time.Now().Add(100*time.Hour).UTC().Format(time.RFC3339)+`"}`).wantError(t, 400, api.CodeSandboxInvalidParameter)
	renew(`{}`).wantError(t, 400, api.CodeSandboxInvalidParameter)
	renew(`{"expiresAt":"tomorrow"}`).wantError(t, 400, api.CodeSandboxInvalidParameter)
	renew(`{"expiresAt":12345}`).wantError(t, 400, api.CodeSandboxInvalidParameter)
	renew(``).wantError(t, 400, api.CodeSandboxInvalidParameter)

	noTTL := e.create(`{"image":{"uri":"img"},"entrypoint":["x"],"resourceLimits":{}}`)
	e.call("POST", "/v1/sandboxes/"+noTTL+"/renew-expiration", `{"expiresAt":"`+at.Format(time.RFC3339)+`"}`).wantError(t, 409, api.CodeDockerInvalidExpiration)
	e.call("POST", "/v1/sandboxes/nope/renew-expiration", `{"expiresAt":"`+at.Format(time.RFC3339)+`"}`).wantError(t, 404, api.CodeDockerSandboxNotFound)
}

func TestEndpoint(t *testing.T) {
	e, rt := newEnv(t, func(c *Config) { c.PublicAddress = "osb.example.test:8080" })
	id := e.create("")
	token := rt.Token(sandbox.ID(id))

	var ep api.Endpoint
	execdPort := strconv.Itoa(api.ExecdPort)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+execdPort, "").wantStatus(t, 200).decode(t, &ep)
	if ep.Endpoint != "fake.invalid:"+execdPort || ep.Headers[sandbox.HeaderExecdToken] != token {
		t.Fatalf("endpoint %+v", ep)
	}
	for _, q := range []string{"?use_server_proxy=true", "?use_server_proxy=True", "?use_server_proxy=1"} {
		e.call("GET", "/v1/sandboxes/"+id+"/endpoints/3000"+q, "").wantStatus(t, 200).decode(t, &ep)
		if ep.Endpoint != "osb.example.test:8080/sandboxes/"+id+"/proxy/3000" || len(ep.Headers) != 1 || ep.Headers[sandbox.HeaderExecdToken] != token {
			t.Fatalf("proxied endpoint %+v", ep)
		}
	}
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/18080?use_server_proxy=false", "").decode(t, &ep)
	if ep.Endpoint != "fake.invalid:18080" {
		t.Fatalf("use_server_proxy=false: %+v", ep)
	}
	for _, p := range []string{"0", "65536", "-1", "abc", "80.5", "1e3", "999999999999"} {
		e.call("GET", "/v1/sandboxes/"+id+"/endpoints/"+p, "").wantError(t, 400, api.CodeDockerInvalidPort)
	}
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/65535", "").wantStatus(t, 200)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/1", "").wantStatus(t, 200)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires=4102444800", "").wantError(t, 400, api.CodeSandboxAPINotSupported)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires=4102444800&use_server_proxy=true", "").wantError(t, 400, api.CodeSandboxInvalidParameter)
	e.call("GET", "/v1/sandboxes/"+id+"/endpoints/8080?use_server_proxy=maybe", "").wantError(t, 400, api.CodeSandboxInvalidParameter)
	e.call("GET", "/v1/sandboxes/nope/endpoints/8080", "").wantError(t, 404, api.CodeDockerSandboxNotFound)
	e.call("GET", "/v1/sandboxes/nope/endpoints/8080?use_server_proxy=true", "").wantError(t, 404, api.CodeDockerSandboxNotFound)

	// Without a configured public address, the request's Host is used.
	plain, prt := newEnv(t)
	id = plain.create("")
	plain.call("GET", "/sandboxes/"+id+"/endpoints/8080?use_server_proxy=true", "").decode(t, &ep)
	host := strings.TrimPrefix(plain.url, "http://")
	if ep.Endpoint != host+"/sandboxes/"+id+"/proxy/8080" || ep.Headers[sandbox.HeaderExecdToken] != prt.Token(sandbox.ID(id)) {
		t.Fatalf("endpoint %+v, want on %s", ep, host)
	}
}

// TestEndpointServerProxyHeaders: the server-proxy endpoint carries the
// headers of the direct endpoint of the same port (the egress token of
// 18080, none for a published app port) and the sandbox's token, which
// the proxy route accepts.
func TestEndpointServerProxyHeaders(t *testing.T) {
	rt := newRouted("sandbox.invalid:1")
	rt.noHeaders[sandbox.PortApp] = true
	rt.noHeaders[sandbox.PortEgress] = true
	rt.headers[sandbox.PortEgress] = map[string]string{api.HeaderEgressAuth: "egress-token"}
	e := newEnvWith(t, rt)
	id := e.create("")
	token := rt.Token(sandbox.ID(id))
	tests := []struct {
		port    int
		headers map[string]string
	}{
		{api.ExecdPort, map[string]string{sandbox.HeaderExecdToken: token}},
		{sandbox.PortApp, map[string]string{sandbox.HeaderExecdToken: token}},
		{sandbox.PortEgress, map[string]string{sandbox.HeaderExecdToken: token, api.HeaderEgressAuth: "egress-token"}},
		{3000, map[string]string{sandbox.HeaderExecdToken: token}},
	}
	for _, tt := range tests {
		var direct, proxied api.Endpoint
		e.call("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d", id, tt.port), "").wantStatus(t, 200).decode(t, &direct)
		e.call("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d?use_server_proxy=true", id, tt.port), "").wantStatus(t, 200).decode(t, &proxied)
		if !maps.Equal(proxied.Headers, tt.headers) {
			t.Errorf("port %d through the server: headers %v, want %v", tt.port, proxied.Headers, tt.headers)
		}
		for k, v := range direct.Headers {
			if proxied.Headers[k] != v {
				t.Errorf("port %d: the direct endpoint's header %s=%q is not in the proxied one's %v", tt.port, k, v, proxied.Headers)
			}
		}
		if !strings.HasSuffix(proxied.Endpoint, fmt.Sprintf("/sandboxes/%s/proxy/%d", id, tt.port)) {
			t.Errorf("port %d through the server: %q", tt.port, proxied.Endpoint)
		}
	}
}

// TestCreateNetworkPolicy: on a server whose runtime enforces policies, a
// create's networkPolicy reaches the runtime normalised; bad rules and
// policies over the cap are 400s; a create without one gets the
// configured default.
func TestCreateNetworkPolicy(t *testing.T) {
	rt := &recordingRuntime{Runtime: fake.New()}
	eg := &sandbox.EgressConfig{MaxRules: 2}
	eg.SetDefaults()
	e := newEnvWith(t, rt, func(c *Config) { c.Egress = eg })
	img := func(extra string) string {
		return `{"image":{"uri":"python:3.11"},"entrypoint":["python"],"resourceLimits":{}` + extra + `}`
	}
	e.create(img(`,"networkPolicy":{"egress":[{"action":"allow","target":" Example.ORG. "},{"action":"deny","target":"10.1.2.3/8"}]}`))
	if got := string(rt.last().NetworkPolicy); got != `{"defaultAction":"deny","egress":[{"action":"allow","target":"example.org"},{"action":"deny","target":"10.0.0.0/8"}]}` {
		t.Fatalf("policy handed to the runtime: %s", got)
	}
	e.create(img(`,"networkPolicy":{}`))
	if got := string(rt.last().NetworkPolicy); got != `{"defaultAction":"deny","egress":[]}` {
		t.Fatalf("empty policy: %s", got)
	}
	for name, body := range map[string]string{
		"bad action":   img(`,"networkPolicy":{"egress":[{"action":"block","target":"a.test"}]}`),
		"bad target":   img(`,"networkPolicy":{"egress":[{"action":"allow","target":"a..test"}]}`),
		"blank target": img(`,"networkPolicy":{"egress":[{"action":"allow","target":" "}]}`),
		"over the cap": img(`,"networkPolicy":{"egress":[{"action":"allow","target":"a.test"},{"action":"allow","target":"b.test"},{"action":"allow","target":"c.test"}]}`),
	} {
		t.Run(name, func(t *testing.T) {
			e.call("POST", "/v1/sandboxes", body).wantError(t, 400, api.CodeSandboxInvalidParameter)
		})
	}
	e.create(img(`,"networkPolicy":{},"credentialProxy":{"enabled":true}`))
	if !rt.last().CredentialProxy {
		t.Fatal("credentialProxy did not reach the runtime")
	}
	eg.Mode = sandbox.EgressDNSNft
	e.call("POST", "/v1/sandboxes", img(`,"networkPolicy":{},"credentialProxy":{"enabled":true}`)).wantError(t, 400, api.CodeSandboxInvalidParameter)
	eg.Mode = sandbox.EgressStrict
	eg.DefaultPolicy = `{"defaultAction":"deny","egress":[]}`
	e.create(img(``))
	if got := string(rt.last().NetworkPolicy); got != eg.DefaultPolicy {
		t.Fatalf("default policy: %q", got)
	}
}
