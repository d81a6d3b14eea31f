package warmpool

import (
	"fmt"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

func TestDeficit(t *testing.T) {
	c := sandbox.Capacity{BufferMin: 2, BufferMax: 4, PoolMax: 10}
	cases := []struct {
		name        string
		cap         sandbox.Capacity
		idle, total int
		refilling   bool
		want        int
		wantRefill  bool
	}{
		{"empty pool fills to bufferMax", c, 0, 0, false, 4, true},
		{"at bufferMin: no refill", c, 2, 5, false, 0, false},
		{"below bufferMin: refill to bufferMax", c, 1, 9, false, 1, true},
		{"refill goes on above bufferMin", c, 3, 3, true, 1, true},
		{"refill ends at bufferMax", c, 4, 4, true, 0, false},
		{"poolMin kept", sandbox.Capacity{PoolMin: 3, PoolMax: 10}, 0, 1, false, 2, false},
		{"poolMax bounds", sandbox.Capacity{BufferMin: 2, BufferMax: 4, PoolMax: 4}, 0, 4, false, 0, true},
		{"poolMax bounds part", sandbox.Capacity{BufferMin: 2, BufferMax: 4, PoolMax: 5}, 0, 3, false, 2, true},
		{"wide refill", sandbox.Capacity{BufferMin: 1, BufferMax: 30, PoolMax: 30}, 16, 16, true, 14, true},
		{"over poolMax: none", c, 0, 12, false, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, refill := deficit(tc.cap, tc.idle, tc.total, tc.refilling)
			if got != tc.want || refill != tc.wantRefill {
				t.Errorf("deficit(%+v, idle %d, total %d, %v) = %d, %v; want %d, %v",
					tc.cap, tc.idle, tc.total, tc.refilling, got, refill, tc.want, tc.wantRefill)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, time.Minute, time.Minute}
	for i, w := range want {
		if got := backoff(i + 1); got != w {
			t.Errorf("backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	if got := backoff(1000); got != time.Minute {
		t.Errorf("backoff(1000) = %v", got)
	}
}

func testDef(rev int64, c sandbox.Capacity) *sandbox.Pool {
	return &sandbox.Pool{Name: "p", Template: sandbox.Spec{Image: "img"}, Capacity: c, Revision: rev}
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func member(id string, rev int64, state sandbox.State, age time.Duration) Member {
	return Member{ID: sandbox.ID(id), Revision: rev, Created: t0.Add(-age),
		Status: sandbox.Status{State: state, Reason: "R-" + id, Message: "m"}}
}

func removed(p Plan) map[sandbox.ID]string {
	out := map[sandbox.ID]string{}
	for _, r := range p.Remove {
		out[r.ID] = r.Why
	}
	return out
}

func TestPlanBoundsStarts(t *testing.T) {
	tr := NewTracker()
	def := testDef(1, sandbox.Capacity{BufferMin: 1, BufferMax: 30, PoolMax: 30})
	if p := tr.Plan(def, nil, t0); p.Start != MaxStarting {
		t.Fatalf("empty pool: start %d, want %d", p.Start, MaxStarting)
	}
	var ms []Member
	for i := range 5 {
		ms = append(ms, member(fmt.Sprint("s", i), 1, sandbox.StatePending, 0))
	}
	for i := range 5 {
		ms = append(ms, member(fmt.Sprint("r", i), 1, sandbox.StateRunning, 0))
	}
	// 10 idle, above bufferMin, but the refill goes on: 8 - 5 starting.
	if p := tr.Plan(def, ms, t0); p.Start != MaxStarting-5 || len(p.Remove) != 0 {
		t.Fatalf("plan %+v, want %d starts", p, MaxStarting-5)
	}
}

func TestPlanBacksOffOneProbeAtATime(t *testing.T) {
	tr := NewTracker()
	def := testDef(1, sandbox.Capacity{BufferMin: 4, BufferMax: 4, PoolMax: 10})
	ms := []Member{
		member("a", 1, sandbox.StateFailed, 0),
		member("b", 1, sandbox.StateFailed, 0),
		member("c", 1, sandbox.StatePending, 0),
	}
	p := tr.Plan(def, ms, t0)
	if p.Start != 0 || len(p.Remove) != 2 {
		t.Fatalf("first look: %+v", p)
	}
	if err := tr.StartError(1); err != "R-b: m" {
		t.Errorf("error %q", err)
	}
	// Two failures: retry after 2 s. The failed ones are still listed (their
	// removal takes time): not counted again.
	now := t0.Add(1500 * time.Millisecond)
	if p := tr.Plan(def, ms[:2], now); p.Start != 0 {
		t.Fatalf("before the back-off passed: %+v", p)
	}
	now = t0.Add(2 * time.Second)
	if p := tr.Plan(def, ms[:2], now); p.Start != 1 {
		t.Fatalf("after the back-off: %+v, want one probe", p)
	}
	// The probe starting: no other start, even once the time passed.
	probe := []Member{member("d", 1, sandbox.StatePending, 0)}
	if p := tr.Plan(def, probe, now.Add(time.Hour)); p.Start != 0 {
		t.Fatalf("with a probe starting: %+v", p)
	}
	// The probe fails: third failure, 4 s.
	probe[0].Status.State = sandbox.StateFailed
	tr.Plan(def, probe, now)
	if p := tr.Plan(def, nil, now.Add(3900*time.Millisecond)); p.Start != 0 {
		t.Fatalf("3.9 s after the third failure: %+v", p)
	}
	if p := tr.Plan(def, nil, now.Add(4*time.Second)); p.Start != 1 {
		t.Fatalf("4 s after the third failure: %+v", p)
	}
	// A start the runtime refused counts too.
	tr.StartFailed(1, fmt.Errorf("no such image"), now.Add(4*time.Second))
	if err := tr.StartError(1); err != "no such image" {
		t.Errorf("error %q", err)
	}
	if p := tr.Plan(def, nil, now.Add(4*time.Second+7*time.Second)); p.Start != 0 {
		t.Fatalf("7 s after the fourth failure: %+v", p)
	}
	// A probe that becomes ready ends the failing: a full refill again.
	ok := []Member{member("e", 1, sandbox.StateRunning, 0)}
	if p := tr.Plan(def, ok, now.Add(time.Minute)); p.Start != 3 {
		t.Fatalf("after a success: %+v, want 3", p)
	}
	if err := tr.StartError(1); err != "" {
		t.Errorf("error after a success: %q", err)
	}
}

func TestPlanNewRevisionForgetsFailures(t *testing.T) {
	tr := NewTracker()
	c := sandbox.Capacity{BufferMin: 2, BufferMax: 2, PoolMax: 4}
	tr.Plan(testDef(1, c), []Member{member("a", 1, sandbox.StateFailed, 0)}, t0)
	if tr.StartError(1) == "" {
		t.Fatal("no error after a failure")
	}
	// The revision read changed (another replica updated the pool): its
	// status no longer reports the old failure, and its plan starts at once.
	if err := tr.StartError(2); err != "" {
		t.Errorf("revision 2 reports %q", err)
	}
	st := tr.Status(testDef(2, c), nil)
	if st.Error != "" {
		t.Errorf("status of revision 2: %+v", st)
	}
	p := tr.Plan(testDef(2, c), []Member{member("a", 1, sandbox.StateFailed, 0), member("b", 1, sandbox.StateRunning, 0)}, t0)
	if p.Start != 2 {
		t.Errorf("plan of revision 2: %+v, want 2 starts", p)
	}
	// The old revision's sandboxes go, failed or not; the failure of one of
	// them does not count against the new revision.
	if r := removed(p); len(r) != 2 {
		t.Errorf("removals %v", r)
	}
	if err := tr.StartError(2); err != "" {
		t.Errorf("a failure of revision 1 counted for 2: %q", err)
	}
	// A late start failure of revision 1 neither.
	tr.StartFailed(1, fmt.Errorf("late"), t0)
	if err := tr.StartError(2); err != "" {
		t.Errorf("late failure of revision 1 counted: %q", err)
	}
}

func TestPlanShrinkRemovesNewest(t *testing.T) {
	tr := NewTracker()
	def := testDef(1, sandbox.Capacity{BufferMin: 1, BufferMax: 2, PoolMax: 10})
	ms := []Member{
		member("young", 1, sandbox.StateRunning, time.Minute),
		member("old", 1, sandbox.StateRunning, time.Hour),
		member("newest", 1, sandbox.StateRunning, time.Second),
		member("older", 1, sandbox.StateRunning, 2*time.Hour),
	}
	p := tr.Plan(def, ms, t0)
	r := removed(p)
	if len(r) != 2 || r["newest"] == "" || r["young"] == "" || p.Start != 0 {
		t.Errorf("plan %+v", p)
	}
}

func TestPlanCountsHandedOut(t *testing.T) {
	tr := NewTracker()
	def := testDef(1, sandbox.Capacity{BufferMin: 2, BufferMax: 3, PoolMax: 4})
	ms := []Member{
		{ID: "h1", Revision: 1, HandedOut: true, Status: sandbox.Status{State: sandbox.StateRunning}},
		{ID: "h2", Revision: 0, HandedOut: true, Status: sandbox.Status{State: sandbox.StateRunning}},
		{ID: "h3", Revision: 1, HandedOut: true, Status: sandbox.Status{State: sandbox.StateFailed}},
	}
	// 2 alive handed out, none idle: poolMax leaves 2 starts of 3 wanted.
	if p := tr.Plan(def, ms, t0); p.Start != 2 || len(p.Remove) != 0 {
		t.Errorf("plan %+v", p)
	}
	st := tr.Status(def, append(ms, member("s", 1, sandbox.StatePending, 0), member("r", 1, sandbox.StateRunning, 0),
		member("stale", 0, sandbox.StateRunning, 0)))
	if st.Allocated != 2 || st.Starting != 1 || st.Available != 1 || st.Total != 4 {
		t.Errorf("status %+v", st)
	}
}

func TestPickOldest(t *testing.T) {
	def := testDef(2, sandbox.Capacity{})
	ms := []Member{
		member("new", 2, sandbox.StateRunning, time.Second),
		member("stale", 1, sandbox.StateRunning, time.Hour),
		member("starting", 2, sandbox.StatePending, time.Hour),
		member("mid", 2, sandbox.StateRunning, time.Minute),
		{ID: "taken", Revision: 2, Created: t0.Add(-2 * time.Hour), HandedOut: true, Status: sandbox.Status{State: sandbox.StateRunning}},
		member("oldest", 2, sandbox.StateRunning, 30*time.Minute),
	}
	none := func(sandbox.ID) bool { return false }
	if m, ok := pick(def, ms, none); !ok || m.ID != "oldest" {
		t.Errorf("pick = %v, %v; want oldest", m.ID, ok)
	}
	if m, ok := pick(def, ms, func(id sandbox.ID) bool { return id == "oldest" }); !ok || m.ID != "mid" {
		t.Errorf("pick skipping oldest = %v, %v; want mid", m.ID, ok)
	}
	if _, ok := pick(def, ms[1:3], none); ok {
		t.Error("picked a stale or starting sandbox")
	}
}
