package docker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

// testPool is a busybox pool definition.
func testPool(name string, bufferMin, bufferMax, poolMax int) sandbox.Pool {
	return sandbox.Pool{
		Name: name,
		Template: sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000000"},
			Env: map[string]string{"FROM_TEMPLATE": "yes"}, Resources: sandbox.Resources{CPUMillis: 500, MemoryBytes: 128 << 20}},
		Capacity: sandbox.Capacity{BufferMin: bufferMin, BufferMax: bufferMax, PoolMax: poolMax},
	}
}

// createPool defines a pool, deleted when the test ends (before the
// runtime's own cleanup), and waits until want sandboxes are available.
func createPool(t *testing.T, rt *Runtime, p sandbox.Pool, want int) {
	t.Helper()
	if _, err := rt.CreatePool(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.DeletePool(context.Background(), p.Name) })
	waitPool(t, rt, p.Name, func(st sandbox.PoolStatus) bool { return st.Available == want && st.Starting == 0 })
}

// waitPool polls the pool's status until cond holds, as long as
// starting the largest pool these tests fill (20 sandboxes) may take on
// this machine, and says what the pool held when it gives up.
func waitPool(t *testing.T, rt *Runtime, name string, cond func(sandbox.PoolStatus) bool) sandbox.PoolStatus {
	t.Helper()
	var st sandbox.PoolStatus
	testwait.Wait{What: "pool " + name, Starts: 20, Every: 50 * time.Millisecond,
		Describe: func() string { return fmt.Sprintf("pool %s: %+v", name, st) },
	}.Until(t, func() bool {
		info, err := rt.GetPool(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		st = info.Status
		return cond(st)
	})
	return st
}

// pingWith reports the status execd at the sandbox's endpoint answers a
// token with.
func pingWith(t *testing.T, rt *Runtime, id sandbox.ID, token string) int {
	t.Helper()
	ep, err := rt.Endpoint(context.Background(), id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+ep.Address+"/ping", nil)
	req.Header.Set(sandbox.HeaderExecdToken, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestPoolClaimsUnderConcurrency: 200 concurrent claims against a pool of
// 20 ready sandboxes hand out exactly 20, each once, each with its own
// fresh token, environment and entrypoint; the rest find the pool empty.
func TestPoolClaimsUnderConcurrency(t *testing.T) {
	rt := newTestRuntime(t, nil)
	createPool(t, rt, testPool("conc", 20, 20, 20), 20)
	// The pool tokens, to check they die with the claim.
	oldTokens := map[sandbox.ID]string{}
	rt.mu.Lock()
	for id, e := range rt.byID {
		if e.pool == "conc" {
			oldTokens[id] = e.token
		}
	}
	rt.mu.Unlock()
	if len(oldTokens) != 20 {
		t.Fatalf("%d warm sandboxes", len(oldTokens))
	}

	var (
		mu    sync.Mutex
		got   = map[sandbox.ID]int{}
		empty int
		wg    sync.WaitGroup
	)
	for i := range 200 {
		wg.Go(func() {
			sb, err := rt.Claim(context.Background(), "conc", sandbox.Spec{
				Entrypoint: []string{"sh", "-c", "echo $WHO > /tmp/who; sleep 1000000"},
				Env:        map[string]string{"WHO": strings.Repeat("x", i%7+1)},
				Metadata:   map[string]string{"n": strings.Repeat("y", i%5+1)},
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, sandbox.ErrPoolEmpty):
				empty++
			case err != nil:
				t.Errorf("claim: %v", err)
			default:
				got[sb.ID]++
			}
		})
	}
	wg.Wait()
	if len(got) != 20 || empty != 180 {
		t.Fatalf("%d sandboxes handed out, %d empty answers; want 20 and 180", len(got), empty)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("sandbox %s handed out %d times", id, n)
		}
		if _, ok := oldTokens[id]; !ok {
			t.Errorf("handed out %s, which was not a warm sandbox", id)
		}
	}
	// Each claimed sandbox: visible, Running, reachable with its new token
	// only, running its user's entrypoint with the user's and the
	// template's environment.
	checked := 0
	for id := range got {
		sb, err := rt.Get(context.Background(), id)
		if err != nil || sb.Status.State != sandbox.StateRunning || sb.Metadata["n"] == "" {
			t.Fatalf("claimed sandbox: %+v, %v", sb, err)
		}
		if pingWith(t, rt, id, oldTokens[id]) != http.StatusUnauthorized {
			t.Errorf("%s still takes the pool's token", id)
		}
		if checked < 3 {
			waitFor(t, "the entrypoint's file", func() bool { out, _ := run(t, rt, id, "cat /tmp/who"); return out != "" })
			if out := mustRun(t, rt, id, "echo $FROM_TEMPLATE $WHO"); !strings.HasPrefix(out, "yes x") {
				t.Errorf("environment: %q", out)
			}
			checked++
		}
	}
	info, _ := rt.GetPool(context.Background(), "conc")
	if st := info.Status; st.Allocated != 20 || st.Claims != 20 || st.Misses != 180 || st.Total != 20 {
		t.Errorf("status after the claims: %+v", st)
	}
	// A list shows the claimed sandboxes, never a warm one.
	list, _ := rt.List(context.Background())
	if len(list) != 20 {
		t.Errorf("list has %d sandboxes", len(list))
	}
	// A deleted sandbox is destroyed, not reused: the pool refills with
	// new ones (poolMax counts the handed-out ones).
	for id := range got {
		if err := rt.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if _, err := rt.eng.inspect(context.Background(), containerName(id)); err == nil {
			t.Errorf("the container of deleted %s is still there", id)
		}
		break
	}
	st := waitPool(t, rt, "conc", func(st sandbox.PoolStatus) bool { return st.Available == 1 })
	if st.Allocated != 19 {
		t.Errorf("after one delete: %+v", st)
	}
}

// TestPoolSurvivesRestart: a new runtime on the same data finds the pool,
// its warm sandboxes and the sandboxes it handed out.
func TestPoolSurvivesRestart(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir, scope := t.TempDir(), testScope()
	mod := func(c *Config) { c.DataDir, c.LabelScope = dir, scope }
	rt1 := newTestRuntimeNoCleanup(t, mod)
	if _, err := rt1.CreatePool(context.Background(), testPool("keep", 2, 2, 5)); err != nil {
		t.Fatal(err)
	}
	waitPool(t, rt1, "keep", func(st sandbox.PoolStatus) bool { return st.Available == 2 })
	claimed, err := rt1.Claim(context.Background(), "keep", sandbox.Spec{Metadata: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	waitPool(t, rt1, "keep", func(st sandbox.PoolStatus) bool { return st.Available == 2 && st.Starting == 0 })
	rt1.Close()

	rt2 := newTestRuntime(t, mod)
	defer rt2.DeletePool(context.Background(), "keep")
	info, err := rt2.GetPool(context.Background(), "keep")
	if err != nil {
		t.Fatal(err)
	}
	if st := info.Status; st.Available != 2 || st.Allocated != 1 || info.Template.Image != testImage {
		t.Fatalf("pool after restart: %+v", info)
	}
	sb, err := rt2.Get(context.Background(), claimed.ID)
	if err != nil || sb.Metadata["a"] != "b" || sb.Status.State != sandbox.StateRunning {
		t.Fatalf("claimed sandbox after restart: %+v, %v", sb, err)
	}
	mustRun(t, rt2, claimed.ID, "true")
	again, err := rt2.Claim(context.Background(), "keep", sandbox.Spec{})
	if err != nil || again.ID == claimed.ID {
		t.Fatalf("claim after restart: %+v, %v", again, err)
	}
	mustRun(t, rt2, again.ID, "true")
}

// TestBrokenPoolImage: a pool whose image cannot start says why, and
// backs off instead of starting containers in a loop.
func TestBrokenPoolImage(t *testing.T) {
	rt := newTestRuntime(t, func(c *Config) { c.PullPolicy = "never" })
	p := testPool("broken", 2, 2, 4)
	p.Template.Image = "opensandbox/no-such-image:latest"
	if _, err := rt.CreatePool(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	defer rt.DeletePool(context.Background(), "broken")
	st := waitPool(t, rt, "broken", func(st sandbox.PoolStatus) bool { return st.Error != "" })
	if !strings.Contains(st.Error, "IMAGE_NOT_FOUND") {
		t.Errorf("error %q", st.Error)
	}
	// Over the next seconds, at most a few more attempts.
	created := func() int {
		n := 0
		rt.events.flush()
		recs, _ := rt.st.records()
		for _, rec := range recs {
			if rec.Pool == "broken" {
				n++
			}
		}
		return n
	}
	time.Sleep(4 * time.Second)
	if _, err := rt.Claim(context.Background(), "broken", sandbox.Spec{}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("claim from a broken pool: %v", err)
	}
	info, _ := rt.GetPool(context.Background(), "broken")
	if info.Status.Available != 0 || info.Status.Error == "" {
		t.Errorf("status %+v", info.Status)
	}
	if n := created(); n > 3 {
		t.Errorf("%d warm sandbox records of a broken pool are left", n)
	}
}

// TestPoolShrinkAndTemplateChange: lowering bufferMax removes ready
// sandboxes; a new template replaces those of the old one.
func TestPoolShrinkAndTemplateChange(t *testing.T) {
	rt := newTestRuntime(t, nil)
	p := testPool("shrink", 4, 4, 10)
	createPool(t, rt, p, 4)
	p.Capacity = sandbox.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 10}
	if _, err := rt.UpdatePool(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	waitPool(t, rt, "shrink", func(st sandbox.PoolStatus) bool { return st.Available == 1 && st.Total == 1 })
	waitFor(t, "removed containers", func() bool {
		cs, _ := rt.eng.list(context.Background(), labelPool+"=shrink")
		return len(cs) == 1
	})

	before, _ := rt.GetPool(context.Background(), "shrink")
	// The entrypoint alone starts at a claim: no new revision for it.
	p.Template.Entrypoint = []string{"sleep", "999999"}
	if info, err := rt.UpdatePool(context.Background(), p); err != nil || info.Revision != before.Revision {
		t.Fatalf("entrypoint update: %+v, %v", info, err)
	}
	p.Template.Env = map[string]string{"FROM_TEMPLATE": "v2"}
	info, err := rt.UpdatePool(context.Background(), p)
	if err != nil || info.Revision != before.Revision+1 {
		t.Fatalf("update: %+v, %v", info, err)
	}
	waitPool(t, rt, "shrink", func(st sandbox.PoolStatus) bool { return st.Available == 1 && st.Total == 1 })
	sb, err := rt.Claim(context.Background(), "shrink", sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, rt, sb.ID, "echo $FROM_TEMPLATE"); out != "v2" {
		t.Errorf("claimed a sandbox of the old template: %q", out)
	}
}

// TestPoolMatchesPlainCreates: a claim without a pool name takes from a
// pool whose image and resources match, and from no other.
func TestPoolMatchesPlainCreates(t *testing.T) {
	rt := newTestRuntime(t, nil)
	withEnv := testPool("with-env", 1, 1, 3)
	createPool(t, rt, withEnv, 1)
	p := testPool("match", 1, 1, 3)
	p.Template.Env = nil
	p.Template.Resources.MemoryBytes = 96 << 20
	createPool(t, rt, p, 1)
	// A template with variables of its own serves only creates naming it.
	if _, err := rt.Claim(context.Background(), "", sandbox.Spec{Image: testImage, Resources: withEnv.Template.Resources}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("a plain create took a pool with its own env: %v", err)
	}
	// A create naming a pool but asking for what a warm sandbox cannot be
	// is made cold.
	for _, spec := range []sandbox.Spec{
		{SecureAccess: true},
		{Extensions: map[string]string{extRuntime: "runsc"}},
		{Image: "opensandbox/python:3.11"},
		{Resources: sandbox.Resources{MemoryBytes: 1 << 30}},
		{Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v", HostPath: "/tmp"}}},
	} {
		if _, err := rt.Claim(context.Background(), "with-env", spec); !errors.Is(err, sandbox.ErrPoolEmpty) {
			t.Errorf("named claim for %+v: %v", spec, err)
		}
	}
	if _, err := rt.Claim(context.Background(), "", sandbox.Spec{Image: testImage}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("other resources matched: %v", err)
	}
	if _, err := rt.Claim(context.Background(), "", sandbox.Spec{Image: testImage, Resources: p.Template.Resources,
		Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v", HostPath: "/tmp"}}}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("a create with volumes matched: %v", err)
	}
	sb, err := rt.Claim(context.Background(), "", sandbox.Spec{Image: testImage, Resources: p.Template.Resources, Entrypoint: []string{"sleep", "5000"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Entrypoint[1] != "5000" {
		t.Errorf("entrypoint %v", sb.Entrypoint)
	}
	if _, err := rt.Claim(context.Background(), "nope", sandbox.Spec{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("unknown pool: %v", err)
	}
}

// TestDeletePoolWhileFilling: a pool deleted while its sandboxes start
// leaves none behind, and a new pool of the same name never gets them.
func TestDeletePoolWhileFilling(t *testing.T) {
	rt := newTestRuntime(t, nil)
	for range 3 {
		if _, err := rt.CreatePool(context.Background(), testPool("flash", 6, 6, 6)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Millisecond)
		if err := rt.DeletePool(context.Background(), "flash"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "no container of the deleted pool", func() bool {
		cs, _ := rt.eng.list(context.Background(), labelPool+"=flash")
		rt.mu.Lock()
		defer rt.mu.Unlock()
		for _, e := range rt.byID {
			if e.from == "flash" && !e.deleting {
				return false
			}
		}
		return len(cs) == 0
	})
}

// TestPoolRefillsPastOnePass: a refill that needs more starts than one
// pass makes (warmpool.MaxStarting) goes on until BufferMax, though the
// sandboxes started by the first pass already lift the pool above
// BufferMin.
func TestPoolRefillsPastOnePass(t *testing.T) {
	rt := newTestRuntime(t, nil)
	n := warmpool.MaxStarting + 4
	p := testPool("wide", 1, n, n)
	if _, err := rt.CreatePool(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	waitPool(t, rt, "wide", func(st sandbox.PoolStatus) bool { return st.Available == n })
}

// breakWarm sets the execd token the runtime keeps for warm sandboxes
// of pool to a wrong one, for n of them (oldest first), so that their
// execd refuses the hand-over; it returns their ids.
func breakWarm(t *testing.T, rt *Runtime, pool string, n int) []sandbox.ID {
	t.Helper()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var warm []*entry
	for _, e := range rt.byID {
		if e.pool == pool && !e.deleting {
			warm = append(warm, e)
		}
	}
	slices.SortFunc(warm, func(a, b *entry) int { return a.sb.CreatedAt.Compare(b.sb.CreatedAt) })
	if len(warm) < n {
		t.Fatalf("%d warm sandboxes, want %d", len(warm), n)
	}
	var ids []sandbox.ID
	for _, e := range warm[:n] {
		e.token = "not-the-pool-token"
		ids = append(ids, e.sb.ID)
	}
	return ids
}

// TestPoolFailedHandOver: a warm sandbox whose execd refuses the
// hand-over is removed and the claim takes the next; after two such
// failures the create goes cold (ErrPoolEmpty), the pool reports why,
// and the sandboxes not tried stay warm.
func TestPoolFailedHandOver(t *testing.T) {
	rt := newTestRuntime(t, nil)
	createPool(t, rt, testPool("handover", 3, 3, 6), 3)
	broken := breakWarm(t, rt, "handover", 1)
	sb, err := rt.Claim(context.Background(), "handover", sandbox.Spec{})
	if err != nil {
		t.Fatalf("claim after one failed hand-over: %v", err)
	}
	if sb.ID == broken[0] {
		t.Fatalf("handed out the sandbox whose hand-over failed")
	}
	mustRun(t, rt, sb.ID, "true")
	waitPool(t, rt, "handover", func(st sandbox.PoolStatus) bool { return st.Available == 3 && st.Starting == 0 })

	broken = breakWarm(t, rt, "handover", 2)
	if _, err := rt.Claim(context.Background(), "handover", sandbox.Spec{}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Fatalf("claim after two failed hand-overs: %v, want ErrPoolEmpty", err)
	}
	info, _ := rt.GetPool(context.Background(), "handover")
	if !strings.Contains(info.Status.Error, "hand-over failed") {
		t.Errorf("pool error %q", info.Status.Error)
	}
	rt.mu.Lock()
	for _, id := range broken {
		if e := rt.byID[id]; e != nil && !e.deleting {
			t.Errorf("%s, whose hand-over failed, is still in the pool", id)
		}
	}
	warm := 0
	for _, e := range rt.byID {
		if e.pool == "handover" && !e.deleting {
			warm++
		}
	}
	rt.mu.Unlock()
	if warm == 0 {
		t.Error("the sandbox not tried was removed too")
	}
	// The next claim succeeds, and clears the error.
	if _, err := rt.Claim(context.Background(), "handover", sandbox.Spec{}); err != nil {
		t.Fatal(err)
	}
	if info, _ := rt.GetPool(context.Background(), "handover"); info.Status.Error != "" {
		t.Errorf("pool error after a claim: %q", info.Status.Error)
	}
}

// TestPoolBadClaimStaysWarm: a claim execd refuses as bad (an invalid
// variable name) is answered with ErrInvalid, and the sandbox stays warm
// for the next claim.
func TestPoolBadClaimStaysWarm(t *testing.T) {
	rt := newTestRuntime(t, nil)
	createPool(t, rt, testPool("bad", 1, 1, 1), 1)
	_, err := rt.Claim(context.Background(), "bad", sandbox.Spec{Env: map[string]string{"": "x"}})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("claim with a bad variable: %v, want ErrInvalid", err)
	}
	info, _ := rt.GetPool(context.Background(), "bad")
	if st := info.Status; st.Available != 1 || st.Allocated != 0 {
		t.Fatalf("status after the refused claim: %+v", st)
	}
	sb, err := rt.Claim(context.Background(), "bad", sandbox.Spec{Env: map[string]string{"OK": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, rt, sb.ID, "echo $OK"); out != "1" {
		t.Errorf("environment: %q", out)
	}
}
