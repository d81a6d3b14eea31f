// Package warmpool is the warm-pool policy every runtime with pools
// follows: how many sandboxes a pool starts, how it backs off when they
// fail, which warm sandbox a claim takes, what happens when a hand-over
// fails, and the call that hands a sandbox over to its execd. A runtime
// keeps only what is its own: where it stores pools, how it lists, starts,
// labels and removes its sandboxes. Runtimes (runtime/docker,
// runtime/kubernetes, runtime/fake) import it; nothing else does.
package warmpool

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Policy tuning, the same on every runtime.
const (
	// MaxStarting bounds the sandboxes of one pool being started at once,
	// so that a big refill does not swamp the engine or the cluster that
	// cold creates use too.
	MaxStarting = 8
	// MaxHandOverFailures is how many warm sandboxes one claim may fail to
	// hand over (execd unreachable, refusing the pool's token) before the
	// create goes cold: a fault that breaks one hand-over likely breaks
	// the next, and each costs a warm sandbox.
	MaxHandOverFailures = 2
	// firstBackoff and maxBackoff bound the wait after failed starts: 1 s
	// after the first, doubling with each further one, at most a minute.
	firstBackoff = time.Second
	maxBackoff   = time.Minute
)

// Errors about pools, with the codes the API answers.

// NotFound is the error for a pool that does not exist.
func NotFound(name string) error {
	return sandbox.Coded(sandbox.ErrNotFound, api.CodePoolNotFound, fmt.Sprintf("pool %s not found", name))
}

// Exists is the error for creating a pool whose name is taken.
func Exists(name string) error {
	return sandbox.Coded(sandbox.ErrConflict, api.CodePoolAlreadyExists, fmt.Sprintf("pool %s already exists", name))
}

// Invalid is the error for a pool definition the runtime cannot run.
func Invalid(msg string) error {
	return sandbox.Coded(sandbox.ErrInvalid, api.CodePoolInvalidParameter, msg)
}

// Member is one sandbox a pool started, as its runtime sees it now.
type Member struct {
	ID sandbox.ID
	// Revision is the pool template's revision it was started from.
	Revision int64
	// Created orders warm sandboxes: a claim takes the oldest.
	Created time.Time
	// Status is the sandbox's: Pending while it starts, Running when its
	// execd answers (ready to be claimed), Failed, Terminated or Unknown
	// when it will never serve.
	Status sandbox.Status
	// HandedOut is set once a claim took it (or is taking it): it counts
	// toward the pool's size while alive, and the pool never touches it.
	HandedOut bool
}

func (m *Member) dead() bool {
	switch m.Status.State {
	case sandbox.StateFailed, sandbox.StateTerminated, sandbox.StateUnknown:
		return true
	}
	return false
}

// Removal is a warm sandbox the pool no longer wants, and why.
type Removal struct {
	ID  sandbox.ID
	Why string
}

// Plan is what one look at a pool decided: sandboxes to start and warm
// sandboxes to remove.
type Plan struct {
	Start  int
	Remove []Removal
}

// Tracker is the policy's memory of one pool: failures and their
// back-off, whether a refill is under way, the claims under way in this
// process, and the counts a pool reports. Safe for concurrent use; it
// never calls out while holding its lock.
type Tracker struct {
	mu sync.Mutex
	// revision is the template revision the failures below happened
	// under: a new revision starts with none.
	revision int64
	failures int
	retryAt  time.Time
	startErr string
	// counted holds the failed members already counted, so that one
	// that takes several looks to remove is counted once; ready holds
	// the members seen ready at the last look.
	counted map[sandbox.ID]bool
	ready   map[sandbox.ID]bool
	// refilling is set when the pool's idle sandboxes fell below
	// BufferMin and cleared when they are back at BufferMax.
	refilling bool
	// handOverErr is why the last hand-over failed, until one succeeds.
	handOverErr string
	// claiming holds the warm sandboxes this process's claims are
	// taking, so that two claims of one process do not race for one.
	claiming map[sandbox.ID]bool
	// released is closed, and replaced, whenever such a claim ends.
	released       chan struct{}
	claims, misses uint64
}

// NewTracker returns the tracker of a pool with no history.
func NewTracker() *Tracker {
	return &Tracker{counted: map[sandbox.ID]bool{}, ready: map[sandbox.ID]bool{}, claiming: map[sandbox.ID]bool{},
		released: make(chan struct{})}
}

// backoff is the wait after n failed starts in a row.
func backoff(n int) time.Duration {
	return min(firstBackoff<<min(n-1, 10), maxBackoff)
}

// deficit is how many sandboxes a pool must start, given its idle
// (ready and starting) and total (idle and handed out) sandboxes: idle
// ones are refilled to BufferMax once they fell below BufferMin, and
// refilling says whether such a refill is under way (starts are bounded,
// so one takes several looks); the pool holds at least PoolMin and at most
// PoolMax. It returns the refill state to keep.
func deficit(c sandbox.Capacity, idle, total int, refilling bool) (int, bool) {
	switch {
	case idle < c.BufferMin:
		refilling = true
	case idle >= c.BufferMax:
		refilling = false
	}
	want := 0
	if refilling {
		want = c.BufferMax - idle
	}
	if total+want < c.PoolMin {
		want = c.PoolMin - total
	}
	return max(0, min(want, c.PoolMax-total)), refilling
}

// forgetLocked drops failures of a revision other than rev. t.mu must
// be held.
func (t *Tracker) forgetLocked(rev int64) {
	if t.revision != rev {
		t.revision = rev
		t.failures, t.retryAt, t.startErr = 0, time.Time{}, ""
	}
}

// failLocked counts one failed start. t.mu must be held.
func (t *Tracker) failLocked(why string, now time.Time) {
	t.failures++
	t.startErr = why
	t.retryAt = now.Add(backoff(t.failures))
}

// Plan looks at a pool once. Warm sandboxes that failed are removed, each
// counted once as a failure of the revision it was started from when that
// is the pool's; those of another revision, and ready ones beyond
// BufferMax (the newest), are removed. It asks for the deficit's starts:
// at most MaxStarting at once; while the pool is failing, one probe at a
// time once the back-off has passed. A sandbox that becomes ready ends
// the failing.
func (t *Tracker) Plan(def *sandbox.Pool, members []Member, now time.Time) Plan {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(def.Revision)
	var plan Plan
	var available []*Member
	starting, allocated := 0, 0
	recovered := false
	counted, ready := map[sandbox.ID]bool{}, map[sandbox.ID]bool{}
	for i := range members {
		m := &members[i]
		switch {
		case m.HandedOut:
			if !m.dead() {
				allocated++
			}
		case m.dead():
			if m.Revision == def.Revision && !t.counted[m.ID] {
				t.failLocked(cmp.Or(m.Status.Reason+": "+m.Status.Message, m.Status.Reason), now)
			}
			counted[m.ID] = true
			plan.Remove = append(plan.Remove, Removal{m.ID, "it failed: " + m.Status.Reason})
		case m.Revision != def.Revision:
			plan.Remove = append(plan.Remove, Removal{m.ID, "its pool's template changed"})
		case m.Status.State == sandbox.StatePending:
			starting++
		case m.Status.State == sandbox.StateRunning:
			available = append(available, m)
			ready[m.ID] = true
			if !t.ready[m.ID] {
				recovered = true
			}
		}
	}
	t.counted, t.ready = counted, ready
	if recovered && t.failures > 0 {
		// A sandbox of this revision started after the failures: the
		// template works.
		t.failures, t.retryAt, t.startErr = 0, time.Time{}, ""
	}
	c := def.Capacity
	if extra := len(available) - c.BufferMax; extra > 0 {
		// Shrunk: the newest go, the oldest stay ready.
		slices.SortFunc(available, func(a, b *Member) int { return -older(a, b) })
		for _, m := range available[:extra] {
			plan.Remove = append(plan.Remove, Removal{m.ID, "its pool shrank"})
		}
		available = available[extra:]
	}
	idle := len(available) + starting
	want, refilling := deficit(c, idle, idle+allocated, t.refilling)
	t.refilling = refilling
	want = min(want, MaxStarting-starting)
	if t.failures > 0 {
		if now.Before(t.retryAt) || starting > 0 {
			want = 0
		}
		want = min(want, 1)
	}
	plan.Start = max(0, want)
	return plan
}

// StartFailed counts a start of revision that failed before it made a
// sandbox (the runtime refused it), with the error the pool reports.
func (t *Tracker) StartFailed(revision int64, err error, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if revision == t.revision {
		t.failLocked(err.Error(), now)
	}
}

// StartError is why the pool of revision is failing: its last failed
// start, until a sandbox starts again, else its last failed hand-over,
// until a claim succeeds; "" when it is not failing. Failures of another
// revision are not reported.
func (t *Tracker) StartError(revision int64) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.revision == revision && t.startErr != "" {
		return t.startErr
	}
	return t.handOverErr
}

// Status counts a pool's members and adds what the tracker knows:
// claims, misses and the pool's error.
func (t *Tracker) Status(def *sandbox.Pool, members []Member) sandbox.PoolStatus {
	var st sandbox.PoolStatus
	for i := range members {
		m := &members[i]
		switch {
		case m.dead():
			// Gone or going: neither ready nor anyone's.
		case m.HandedOut:
			st.Allocated++
		case m.Revision != def.Revision:
			// Being replaced.
		case m.Status.State == sandbox.StatePending:
			st.Starting++
		case m.Status.State == sandbox.StateRunning:
			st.Available++
		}
	}
	st.Total = st.Allocated + st.Available + st.Starting
	st.Error = t.StartError(def.Revision)
	t.mu.Lock()
	st.Claims, st.Misses = t.claims, t.misses
	t.mu.Unlock()
	return st
}

// older compares members by age, oldest first, ties by id.
func older(a, b *Member) int {
	return cmp.Or(a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
}

// pick returns the oldest ready warm sandbox of def's revision that is
// not in skip, or false.
func pick(def *sandbox.Pool, members []Member, skip func(sandbox.ID) bool) (Member, bool) {
	var best *Member
	for i := range members {
		m := &members[i]
		if m.HandedOut || m.Revision != def.Revision || m.Status.State != sandbox.StateRunning || skip(m.ID) {
			continue
		}
		if best == nil || older(m, best) < 0 {
			best = m
		}
	}
	if best == nil {
		return Member{}, false
	}
	return *best, true
}
