package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/runtime/warmpool"
	"github.com/opensandbox/opensandbox/sandbox"
)

// quiet is how long the pool suite watches a pool to see that something
// does not happen (a refill, a replacement). A runtime that breaks the
// rule shows it at once: a start is counted as soon as it is asked for.
const quiet = 2 * time.Second

// pools runs the pool suite when the runtime has warm pools
// (sandbox.Pooler), holding it to docs/api.md#pools.
func (s *suite) pools(t *testing.T) {
	if _, ok := s.new(t).(sandbox.Pooler); !ok {
		t.Skip("runtime has no warm pools")
	}
	if s.opts.Hooks.WarmLeft == nil {
		t.Fatal("a runtime with warm pools must give the suite Hooks.WarmLeft")
	}
	// Each sub-test has a runtime of its own: they run side by side, as
	// many at once as -test.parallel allows.
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Fill", s.poolFill},
		{"PoolMin", s.poolMin},
		{"RefillPastOnePass", s.poolRefillPastOnePass},
		{"Oldest", s.poolOldest},
		{"ClaimsOnce", s.poolClaimsOnce},
		{"TemplateChange", s.poolTemplateChange},
		{"FailingTemplate", s.poolFailingTemplate},
		{"FailedHandOver", s.poolFailedHandOver},
		{"Delete", s.poolDelete},
		{"Restart", s.poolRestart},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

// poolCase is one pool of a fresh runtime under test.
type poolCase struct {
	s    *suite
	t    *testing.T
	rt   sandbox.Runtime
	pl   sandbox.Pooler
	name string
	pace time.Duration
	// cap is the pool's capacity as last set, for the checks every
	// status read makes.
	cap sandbox.Capacity
	// seen lists the distinct statuses read, for what a failed wait
	// prints.
	seen []string
}

// template is what the suite's pools start: the suite's image and
// entrypoint, and a variable of their own.
func (s *suite) template() sandbox.Spec {
	return sandbox.Spec{Image: s.opts.Image, Entrypoint: slices.Clone(s.opts.Entrypoint), Env: map[string]string{"POOL_TEMPLATE": "1"}}
}

// newPool makes a runtime and a pool of it named name; the pool is
// deleted when the test ends, before the runtime goes.
func (s *suite) newPool(t *testing.T, name string, c sandbox.Capacity, tmpl sandbox.Spec) *poolCase {
	t.Helper()
	rt := s.new(t)
	p := &poolCase{s: s, t: t, rt: rt, pl: rt.(sandbox.Pooler), name: name, pace: s.pace(t), cap: c}
	info, err := p.pl.CreatePool(context.Background(), sandbox.Pool{Name: name, Template: tmpl, Capacity: c})
	if err != nil {
		t.Fatalf("CreatePool %s: %v", name, err)
	}
	if info.Name != name || info.Template.Image != tmpl.Image || info.Capacity != c || info.CreatedAt.IsZero() {
		t.Fatalf("CreatePool returned %+v", info)
	}
	t.Cleanup(func() { p.pl.DeletePool(context.Background(), name) })
	return p
}

// info reads the pool and checks what holds at any moment: the total is
// the sum of its parts and never beyond poolMax.
func (p *poolCase) info() *sandbox.PoolInfo {
	p.t.Helper()
	info, err := p.pl.GetPool(context.Background(), p.name)
	if err != nil {
		p.t.Fatalf("GetPool %s: %v", p.name, err)
	}
	st := info.Status
	if line := fmt.Sprintf("%+v", st); len(p.seen) == 0 || p.seen[len(p.seen)-1] != line {
		p.seen = append(p.seen, line)
	}
	if st.Total != st.Allocated+st.Available+st.Starting {
		p.t.Fatalf("pool %s: total %d is not allocated+available+starting: %+v", p.name, st.Total, st)
	}
	if st.Total > p.cap.PoolMax {
		p.t.Fatalf("pool %s holds %d sandboxes, beyond poolMax %d: %+v\n%s", p.name, st.Total, p.cap.PoolMax, st, p.report())
	}
	return info
}

func (p *poolCase) status() sandbox.PoolStatus { p.t.Helper(); return p.info().Status }

// report describes the pool and the runtime's sandboxes, for a failure.
func (p *poolCase) report() string {
	var b strings.Builder
	if info, err := p.pl.GetPool(context.Background(), p.name); err == nil {
		fmt.Fprintf(&b, "pool %s now: %+v, revision %d\n", p.name, info.Status, info.Revision)
	} else {
		fmt.Fprintf(&b, "pool %s: %v\n", p.name, err)
	}
	if n := len(p.seen); n > 0 {
		fmt.Fprintf(&b, "statuses read, oldest first (%d):\n  %s\n", n, strings.Join(p.seen[max(0, n-20):], "\n  "))
	}
	fmt.Fprintf(&b, "warm sandboxes left: %v\n", p.s.opts.Hooks.WarmLeft(p.t, p.rt, p.name))
	if list, err := p.rt.List(context.Background()); err == nil {
		for _, sb := range list {
			fmt.Fprintf(&b, "sandbox %s: %s %s %s\n", sb.ID, sb.Status.State, sb.Status.Reason, sb.Status.Message)
		}
	}
	return b.String()
}

// waitFor polls the pool until cond holds and returns the status that
// met it. It gives up when the pool's status has not changed for rounds
// times the pace, or after three times that in all: a machine that grew
// slower since the pace was measured still gets there, a pool that is
// stuck does not.
func (p *poolCase) waitFor(what string, rounds int, cond func(sandbox.PoolStatus) bool) sandbox.PoolStatus {
	p.t.Helper()
	limit := time.Duration(rounds) * p.pace
	start := time.Now()
	changed, last := start, ""
	for {
		st := p.status()
		if cond(st) {
			return st
		}
		if line := fmt.Sprintf("%+v", st); line != last {
			changed, last = time.Now(), line
		}
		if time.Since(changed) > limit || time.Since(start) > 3*limit {
			p.t.Fatalf("pool %s: after %v (unchanged for %v), not yet %s\n%s", p.name,
				time.Since(start).Round(time.Millisecond), time.Since(changed).Round(time.Millisecond), what, p.report())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// steady checks that cond holds at every read for the quiet period.
func (p *poolCase) steady(what string, cond func(sandbox.PoolStatus) bool) {
	p.t.Helper()
	end := time.Now().Add(quiet)
	for time.Now().Before(end) {
		if st := p.status(); !cond(st) {
			p.t.Fatalf("pool %s: no longer %s: %+v\n%s", p.name, what, st, p.report())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// full waits until the pool holds n ready sandboxes and starts none.
func (p *poolCase) full(n int) sandbox.PoolStatus {
	p.t.Helper()
	return p.waitFor(fmt.Sprintf("%d ready and none starting", n), max(1, (n+3)/4), func(st sandbox.PoolStatus) bool {
		return st.Available == n && st.Starting == 0
	})
}

// resize changes the pool's capacity, keeping its template.
func (p *poolCase) resize(c sandbox.Capacity) {
	p.t.Helper()
	info := p.info()
	info.Pool.Capacity = c
	if _, err := p.pl.UpdatePool(context.Background(), info.Pool); err != nil {
		p.t.Fatalf("UpdatePool %s to %+v: %v", p.name, c, err)
	}
	p.cap = c
}

func (p *poolCase) warm() []sandbox.ID {
	p.t.Helper()
	return p.s.opts.Hooks.WarmLeft(p.t, p.rt, p.name)
}

// claim claims from the pool with metadata naming n.
func (p *poolCase) claim(n int, spec sandbox.Spec) (*sandbox.Sandbox, error) {
	spec.Metadata = map[string]string{"claim": fmt.Sprint(n)}
	return p.pl.Claim(context.Background(), p.name, spec)
}

func (p *poolCase) mustClaim(n int, spec sandbox.Spec) *sandbox.Sandbox {
	p.t.Helper()
	sb, err := p.claim(n, spec)
	if err != nil {
		p.t.Fatalf("claim %d from pool %s: %v\n%s", n, p.name, err, p.report())
	}
	p.checkClaimed(sb, n)
	return sb
}

// checkClaimed checks a sandbox handed out by claim n: Running at once,
// visible, with the claim's metadata, and its execd reachable with its
// new token.
func (p *poolCase) checkClaimed(sb *sandbox.Sandbox, n int) {
	p.t.Helper()
	if sb.Status.State != sandbox.StateRunning || sb.Metadata["claim"] != fmt.Sprint(n) {
		p.t.Fatalf("claim %d returned %+v, want Running with its metadata", n, sb)
	}
	got, err := p.rt.Get(context.Background(), sb.ID)
	if err != nil || got.Status.State != sandbox.StateRunning {
		p.t.Fatalf("Get of claimed sandbox %s: %+v, %v", sb.ID, got, err)
	}
	if p.s.opts.Reach != nil {
		ep, err := p.rt.Endpoint(context.Background(), sb.ID, api.ExecdPort)
		if err != nil {
			p.t.Fatalf("Endpoint of claimed sandbox %s: %v", sb.ID, err)
		}
		p.s.opts.Reach(p.t, ep)
	}
}

// exec runs a command in a claimed sandbox, when the runtime's sandboxes
// run commands (Options.Reach is set); ok is false when they do not.
func (p *poolCase) exec(id sandbox.ID, cmd string) (out string, ok bool) {
	p.t.Helper()
	if p.s.opts.Reach == nil {
		return "", false
	}
	ep, err := p.rt.Endpoint(context.Background(), id, api.ExecdPort)
	if err != nil {
		p.t.Fatal(err)
	}
	return runCommand(p.t, ep, cmd), true
}

func sameIDs(a, b []sandbox.ID) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func overlap(a, b []sandbox.ID) []sandbox.ID {
	var out []sandbox.ID
	for _, id := range a {
		if slices.Contains(b, id) {
			out = append(out, id)
		}
	}
	return out
}

// poolFill: ready sandboxes are filled to bufferMax, refilled to
// bufferMax only once they fall below bufferMin, and the pool, handed-out
// sandboxes included, never holds more than poolMax; a handed-out
// sandbox deleted makes room again.
func (s *suite) poolFill(t *testing.T) {
	c := sandbox.Capacity{BufferMin: 2, BufferMax: 3, PoolMax: 5}
	p := s.newPool(t, "fill", c, s.template())
	p.waitFor("filled to bufferMax 3 without going past it", 1, func(st sandbox.PoolStatus) bool {
		if st.Available+st.Starting > c.BufferMax {
			t.Fatalf("filling started more than bufferMax %d: %+v", c.BufferMax, st)
		}
		return st.Available == 3 && st.Starting == 0
	})
	if st := p.status(); st.Total != 3 || st.Allocated != 0 || st.Claims != 0 || st.Misses != 0 || st.Error != "" {
		t.Fatalf("a full pool that handed out nothing: %+v", st)
	}
	// Down to bufferMin: not below it, so no refill.
	first := p.mustClaim(1, sandbox.Spec{})
	p.steady("at bufferMin 2 without a refill", func(st sandbox.PoolStatus) bool {
		return st.Available == 2 && st.Starting == 0 && st.Allocated == 1
	})
	// Below bufferMin: refilled to bufferMax, handed-out ones aside.
	p.mustClaim(2, sandbox.Spec{})
	p.waitFor("refilled to bufferMax 3 after falling below bufferMin", 1, func(st sandbox.PoolStatus) bool {
		return st.Available == 3 && st.Starting == 0 && st.Allocated == 2
	})
	// Two more claims: below bufferMin again, but 4 handed out and one
	// ready is poolMax.
	p.mustClaim(3, sandbox.Spec{})
	p.mustClaim(4, sandbox.Spec{})
	p.steady("at poolMax 5 (4 handed out, 1 ready) without a start", func(st sandbox.PoolStatus) bool {
		return st.Available == 1 && st.Starting == 0 && st.Allocated == 4 && st.Total == 5
	})
	// A handed-out sandbox deleted makes room for one more.
	if err := p.rt.Delete(context.Background(), first.ID); err != nil {
		t.Fatal(err)
	}
	p.waitFor("one started in the room a deleted sandbox left", 1, func(st sandbox.PoolStatus) bool {
		return st.Available == 2 && st.Starting == 0 && st.Allocated == 3
	})
	p.steady("at poolMax 5 again", func(st sandbox.PoolStatus) bool { return st.Total == 5 && st.Starting == 0 })
	if st := p.status(); st.Claims != 4 || st.Misses != 0 {
		t.Errorf("claims and misses counted: %+v, want 4 and 0", st)
	}
}

// poolMin: the pool keeps at least poolMin sandboxes, handed-out ones
// included, though that is more ready ones than bufferMax: they are kept
// ready, not started and removed over and over.
func (s *suite) poolMin(t *testing.T) {
	c := sandbox.Capacity{BufferMin: 1, BufferMax: 1, PoolMin: 3, PoolMax: 4}
	p := s.newPool(t, "min", c, s.template())
	p.full(3)
	ids := p.warm()
	p.steady("3 ready (poolMin), the same ones", func(st sandbox.PoolStatus) bool {
		return st.Available == 3 && st.Starting == 0 && sameIDs(p.warm(), ids)
	})
	// Handed-out sandboxes count towards poolMin.
	p.mustClaim(1, sandbox.Spec{})
	p.steady("poolMin met by 2 ready and 1 handed out", func(st sandbox.PoolStatus) bool {
		return st.Available == 2 && st.Starting == 0 && st.Allocated == 1
	})
}

// poolRefillPastOnePass: a refill that needs more starts than the
// shared policy allows at once (warmpool.MaxStarting) goes on until
// bufferMax, though the first starts already lift the pool above
// bufferMin.
func (s *suite) poolRefillPastOnePass(t *testing.T) {
	n := warmpool.MaxStarting + 2
	p := s.newPool(t, "wide", sandbox.Capacity{BufferMin: 1, BufferMax: n, PoolMax: n}, s.template())
	p.full(n)
}

// poolOldest: a claim takes the oldest ready sandbox. Three are made one
// after another, each in a later second than the one before (runtimes
// may keep creation times in whole seconds); claims take them in that
// order.
func (s *suite) poolOldest(t *testing.T) {
	p := s.newPool(t, "oldest", sandbox.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 3}, s.template())
	var order []sandbox.ID
	for n := 1; n <= 3; n++ {
		if n > 1 {
			p.resize(sandbox.Capacity{BufferMin: n, BufferMax: n, PoolMax: 3})
		}
		p.full(n)
		ready := time.Now()
		for _, id := range p.warm() {
			if !slices.Contains(order, id) {
				order = append(order, id)
			}
		}
		if len(order) != n {
			t.Fatalf("%d ready sandboxes, made one at a time, but warm sandboxes %v", n, p.warm())
		}
		for time.Now().Before(ready.Truncate(time.Second).Add(time.Second)) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	var got []sandbox.ID
	for n := range order {
		got = append(got, p.mustClaim(n, sandbox.Spec{}).ID)
	}
	if !slices.Equal(got, order) {
		t.Errorf("claims took %v; want the oldest first: %v", got, order)
	}
}

// poolClaimsOnce: 30 claims at once on a pool of 5 ready sandboxes hand
// out exactly 5, each once, each with the claim's settings; the other 25
// find the pool empty and go cold. Claims never give up while a ready
// sandbox is left.
func (s *suite) poolClaimsOnce(t *testing.T) {
	const ready, claims = 5, 30
	p := s.newPool(t, "once", sandbox.Capacity{BufferMin: ready, BufferMax: ready, PoolMax: ready}, s.template())
	p.full(ready)
	warm := p.warm()
	if len(warm) != ready {
		t.Fatalf("%d ready sandboxes, but warm sandboxes %v", ready, warm)
	}
	var (
		mu     sync.Mutex
		got    = map[sandbox.ID][]int{}
		byID   = map[sandbox.ID]*sandbox.Sandbox{}
		empty  int
		others []error
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	for i := range claims {
		wg.Go(func() {
			<-start
			sb, err := p.claim(i, sandbox.Spec{Env: map[string]string{"CLAIM": fmt.Sprint(i)}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				got[sb.ID] = append(got[sb.ID], i)
				byID[sb.ID] = sb
			case errors.Is(err, sandbox.ErrPoolEmpty):
				empty++
			default:
				others = append(others, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(others) > 0 {
		t.Errorf("claims failed other than with ErrPoolEmpty: %v", others)
	}
	handed := slices.Collect(maps.Keys(got))
	if len(handed) != ready || empty != claims-ready {
		t.Fatalf("%d concurrent claims on %d ready sandboxes: %d handed out, %d found the pool empty; want %d and %d\n%s",
			claims, ready, len(handed), empty, ready, claims-ready, p.report())
	}
	for id, ns := range got {
		if len(ns) != 1 {
			t.Errorf("sandbox %s handed out %d times (claims %v)", id, len(ns), ns)
		}
		if !slices.Contains(warm, id) {
			t.Errorf("handed out %s, which was not one of the ready sandboxes %v", id, warm)
		}
		n := ns[0]
		p.checkClaimed(byID[id], n)
		if out, ok := p.exec(id, "echo $CLAIM $POOL_TEMPLATE"); ok && out != fmt.Sprintf("%d 1", n) {
			t.Errorf("claim %d: the sandbox's environment has %q, want the claim's and the template's variables", n, out)
		}
	}
	st := p.status()
	if st.Allocated != ready || st.Available != 0 || st.Claims != ready || st.Misses != claims-ready {
		t.Errorf("after the claims: %+v, want %d allocated, none ready, %d claims and %d misses", st, ready, ready, claims-ready)
	}
	if left := p.warm(); len(left) != 0 {
		t.Errorf("warm sandboxes left though poolMax is handed out: %v", left)
	}
	list, err := p.rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var listed []sandbox.ID
	for _, sb := range list {
		listed = append(listed, sb.ID)
	}
	if !sameIDs(listed, handed) {
		t.Errorf("List has %v, want exactly the handed-out sandboxes %v", listed, handed)
	}
}

// poolTemplateChange: a new entrypoint keeps the ready sandboxes (it
// only starts at a claim) and the revision; a new environment replaces
// them with a new revision, and leaves the handed-out ones alone; a
// lower bufferMax removes the surplus and starts nothing.
func (s *suite) poolTemplateChange(t *testing.T) {
	ctx := context.Background()
	p := s.newPool(t, "change", sandbox.Capacity{BufferMin: 2, BufferMax: 3, PoolMax: 6}, s.template())
	p.full(3)
	before := p.info()
	warm := p.warm()

	next := before.Pool
	next.Template = s.template()
	next.Template.Entrypoint = s.printing("claimed-entrypoint")
	info, err := p.pl.UpdatePool(ctx, next)
	if err != nil {
		t.Fatalf("UpdatePool with a new entrypoint: %v", err)
	}
	if info.Revision != before.Revision || !slices.Equal(info.Template.Entrypoint, next.Template.Entrypoint) {
		t.Fatalf("a new entrypoint: revision %d (was %d), entrypoint %v; want the same revision and the new entrypoint",
			info.Revision, before.Revision, info.Template.Entrypoint)
	}
	p.steady("the same ready sandboxes after an entrypoint change", func(st sandbox.PoolStatus) bool {
		return st.Available == 3 && st.Starting == 0 && sameIDs(p.warm(), warm)
	})
	kept := p.mustClaim(1, sandbox.Spec{})
	if !slices.Equal(kept.Entrypoint, next.Template.Entrypoint) {
		t.Errorf("a claim without an entrypoint runs %v, want the template's new one %v", kept.Entrypoint, next.Template.Entrypoint)
	}
	s.waitOutput(t, p.rt, kept.ID, "claimed-entrypoint")

	next.Template.Env = map[string]string{"POOL_TEMPLATE": "2"}
	info, err = p.pl.UpdatePool(ctx, next)
	if err != nil {
		t.Fatalf("UpdatePool with a new environment: %v", err)
	}
	if info.Revision == before.Revision {
		t.Fatalf("a new environment kept revision %d", info.Revision)
	}
	p.waitFor("the ready sandboxes replaced after an environment change", 1, func(st sandbox.PoolStatus) bool {
		return st.Available == 3 && st.Starting == 0 && len(overlap(p.warm(), warm)) == 0
	})
	if sb, err := p.rt.Get(ctx, kept.ID); err != nil || sb.Status.State != sandbox.StateRunning {
		t.Errorf("a sandbox handed out before the change: %+v, %v; want it kept, Running", sb, err)
	}
	fresh := p.mustClaim(2, sandbox.Spec{})
	if out, ok := p.exec(fresh.ID, "echo $POOL_TEMPLATE"); ok && out != "2" {
		t.Errorf("a claim after the change got POOL_TEMPLATE=%q, want 2", out)
	}
	p.steady("at bufferMin 2 without a refill", func(st sandbox.PoolStatus) bool { return st.Available == 2 && st.Starting == 0 })

	// Shrink: the surplus goes, nothing new starts.
	warm = p.warm()
	p.resize(sandbox.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 6})
	p.waitFor("shrunk to bufferMax 1", 1, func(st sandbox.PoolStatus) bool { return st.Available == 1 && st.Starting == 0 })
	p.steady("one ready sandbox, one of those before the shrink", func(st sandbox.PoolStatus) bool {
		left := p.warm()
		return st.Available == 1 && st.Starting == 0 && len(left) == 1 && slices.Contains(warm, left[0])
	})
}

// printing is an entrypoint that prints word (Hooks.Output), or, for a
// runtime whose logs are not real output, the suite's entrypoint.
func (s *suite) printing(word string) []string {
	if s.opts.Hooks.Output != nil {
		return s.opts.Hooks.Output(word)
	}
	return append(slices.Clone(s.opts.Entrypoint), word)
}

// waitOutput waits until the sandbox's log has word, when the runtime
// says how to print (Hooks.Output) and reads logs (sandbox.Diagnoser).
func (s *suite) waitOutput(t *testing.T, rt sandbox.Runtime, id sandbox.ID, word string) {
	t.Helper()
	d, ok := rt.(sandbox.Diagnoser)
	if !ok || s.opts.Hooks.Output == nil {
		return
	}
	limit := s.startLimit(t)
	deadline := time.Now().Add(limit)
	for {
		logs, err := d.Logs(context.Background(), id, 0, time.Time{})
		if err != nil {
			t.Fatalf("Logs(%s): %v", id, err)
		}
		if strings.Contains(logs, word) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s has not printed %q after %v; its log:\n%s", id, word, limit, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// poolFailingTemplate: a pool whose sandboxes cannot start says why,
// tries one at a time with growing pauses instead of starting sandboxes
// in a loop, answers claims at once with ErrPoolEmpty, and fills once its
// template is fixed.
func (s *suite) poolFailingTemplate(t *testing.T) {
	broken := s.template()
	broken.Image = s.opts.MissingImage
	c := sandbox.Capacity{BufferMin: 3, BufferMax: 3, PoolMax: 6}
	p := s.newPool(t, "failing", c, broken)
	st := p.waitFor("reporting an error", 1, func(st sandbox.PoolStatus) bool { return st.Error != "" })
	t.Logf("the pool's error: %s", st.Error)
	// The sandboxes started before the first failure was known may still
	// be failing; from then on, one attempt at a time.
	p.waitFor("down to one start at a time", 1, func(st sandbox.PoolStatus) bool { return st.Starting <= 1 })
	// Watch it retry twice after the error was known, never two at once,
	// and not in a loop.
	before := p.warm()
	attempts := map[sandbox.ID]bool{}
	began := time.Now()
	for len(attempts) < 2 && time.Since(began) < 2*p.pace {
		st := p.status()
		if st.Starting > 1 || st.Available != 0 || st.Error == "" {
			t.Fatalf("a failing pool: %+v; want at most one starting, none ready, and its error\n%s", st, p.report())
		}
		for _, id := range p.warm() {
			if !slices.Contains(before, id) {
				attempts[id] = true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(began)
	t.Logf("the failing pool tried %d sandboxes in %v", len(attempts), took.Round(time.Millisecond))
	switch {
	case len(attempts) == 0:
		t.Errorf("a failing pool tried no sandbox in %v; want it to keep trying, backing off", took)
	case len(attempts) == 2 && took < time.Second:
		t.Errorf("a failing pool tried 2 sandboxes in %v; want it to back off from 1 s", took)
	}
	asked := time.Now()
	if _, err := p.claim(1, sandbox.Spec{}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("claim from a failing pool: %v, want ErrPoolEmpty", err)
	}
	if d := time.Since(asked); d > p.pace {
		t.Errorf("claim from a failing pool took %v", d)
	}
	info := p.info()
	info.Pool.Template = s.template()
	if _, err := p.pl.UpdatePool(context.Background(), info.Pool); err != nil {
		t.Fatalf("UpdatePool with a working image: %v", err)
	}
	p.waitFor("filled, its error cleared, once the template works", 2, func(st sandbox.PoolStatus) bool {
		return st.Available == 3 && st.Starting == 0 && st.Error == ""
	})
	p.mustClaim(2, sandbox.Spec{})
}

// poolFailedHandOver: a claim the sandbox refuses as bad (execd's 400)
// fails with ErrInvalid and leaves the sandbox ready; a claim whose
// hand-overs break tries two sandboxes, then goes cold (ErrPoolEmpty)
// with the pool's error set; the pool then recovers.
func (s *suite) poolFailedHandOver(t *testing.T) {
	p := s.newPool(t, "handover", sandbox.Capacity{BufferMin: 3, BufferMax: 3, PoolMax: 6}, s.template())
	p.full(3)
	warm := p.warm()

	// execd refuses to take its own token's variable from a claim.
	_, err := p.claim(1, sandbox.Spec{Env: map[string]string{"EXECD_ACCESS_TOKEN": "x"}})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("a claim the sandbox refuses: %v, want ErrInvalid", err)
	}
	if left := p.warm(); len(overlap(left, warm)) != len(warm) {
		t.Fatalf("after a refused claim the warm sandboxes are %v, want %v among them", left, warm)
	}
	if st := p.status(); st.Allocated != 0 || st.Error != "" || st.Claims != 0 {
		t.Fatalf("after a refused claim: %+v, want nothing handed out and no error", st)
	}
	// A refill the claim set off meanwhile is trimmed back to bufferMax.
	p.waitFor("back to 3 ready", 1, func(st sandbox.PoolStatus) bool {
		warm = p.warm()
		return st.Available == 3 && st.Starting == 0 && len(warm) == 3
	})

	if s.opts.Hooks.BreakWarm == nil {
		t.Skip("no BreakWarm hook")
	}
	for _, id := range warm {
		s.opts.Hooks.BreakWarm(t, p.rt, id)
	}
	before := p.status()
	if _, err := p.claim(2, sandbox.Spec{}); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Fatalf("a claim whose hand-overs break: %v, want ErrPoolEmpty\n%s", err, p.report())
	}
	if untried := overlap(p.warm(), warm); len(untried) != 1 {
		t.Errorf("a claim whose hand-overs break left %d of 3 broken sandboxes, want 1: it tries two, then goes cold\n%s",
			len(untried), p.report())
	}
	st := p.status()
	if st.Error == "" || st.Claims != before.Claims || st.Misses != before.Misses+1 {
		t.Errorf("after failed hand-overs: %+v, want the pool's error set and one more miss", st)
	}
	t.Logf("the pool's error: %s", st.Error)

	// Recovery: the pool refills; the broken sandboxes are never handed
	// out, new ones are. Each claim that fails removes broken ones.
	p.waitFor("refilled after failed hand-overs", 1, func(st sandbox.PoolStatus) bool { return st.Available == 3 && st.Starting == 0 })
	for n := 3; ; n++ {
		sb, err := p.claim(n, sandbox.Spec{})
		if err == nil {
			if slices.Contains(warm, sb.ID) {
				t.Fatalf("handed out %s, whose hand-over was broken", sb.ID)
			}
			p.checkClaimed(sb, n)
			break
		}
		if !errors.Is(err, sandbox.ErrPoolEmpty) || n == 3+len(warm) {
			t.Fatalf("claim %d after failed hand-overs: %v\n%s", n, err, p.report())
		}
	}
	p.waitFor("recovered: ready again, its error cleared", 1, func(st sandbox.PoolStatus) bool {
		return st.Available == 3 && st.Starting == 0 && st.Error == ""
	})
	if left := overlap(p.warm(), warm); len(left) != 0 {
		t.Errorf("broken sandboxes still warm after the recovery: %v", left)
	}
}

// poolDelete: deleting a pool removes its warm sandboxes and keeps those
// it handed out; a pool deleted while it fills leaves nothing behind; a
// new pool of the same name starts afresh, not counting what the old
// one handed out.
func (s *suite) poolDelete(t *testing.T) {
	ctx := context.Background()
	c := sandbox.Capacity{BufferMin: 2, BufferMax: 2, PoolMax: 2}
	p := s.newPool(t, "gone", c, s.template())
	p.full(2)
	handed := p.mustClaim(1, sandbox.Spec{})
	p.steady("one handed out, one ready, at poolMax", func(st sandbox.PoolStatus) bool {
		return st.Available == 1 && st.Allocated == 1 && st.Starting == 0
	})
	old := p.info()
	if err := p.pl.DeletePool(ctx, p.name); err != nil {
		t.Fatalf("DeletePool: %v", err)
	}
	if _, err := p.pl.GetPool(ctx, p.name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("GetPool of a deleted pool: %v, want ErrNotFound", err)
	}
	if err := p.pl.DeletePool(ctx, p.name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("second DeletePool: %v, want ErrNotFound", err)
	}
	if _, err := p.pl.Claim(ctx, p.name, sandbox.Spec{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("claim from a deleted pool: %v, want ErrNotFound", err)
	}
	if list, err := p.pl.ListPools(ctx); err != nil || len(list) != 0 {
		t.Errorf("ListPools after the delete: %d pools, %v", len(list), err)
	}
	s.waitNoWarm(t, p.rt, p.name, p.pace)
	p.checkClaimed(handed, 1)

	// Deleted while filling, three times over.
	for range 3 {
		if _, err := p.pl.CreatePool(ctx, sandbox.Pool{Name: "flash", Template: s.template(), Capacity: sandbox.Capacity{BufferMin: 4, BufferMax: 4, PoolMax: 4}}); err != nil {
			t.Fatal(err)
		}
		if err := p.pl.DeletePool(ctx, "flash"); err != nil {
			t.Fatalf("DeletePool of a pool filling: %v", err)
		}
	}
	s.waitNoWarm(t, p.rt, "flash", 2*p.pace)
	end := time.Now().Add(quiet)
	for time.Now().Before(end) {
		if left := s.opts.Hooks.WarmLeft(t, p.rt, "flash"); len(left) != 0 {
			t.Fatalf("warm sandboxes of a deleted pool came back: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The name again: a new pool, whose revision is new, and to which the
	// sandbox the old one handed out does not count.
	info, err := p.pl.CreatePool(ctx, sandbox.Pool{Name: p.name, Template: s.template(), Capacity: c})
	if err != nil {
		t.Fatalf("CreatePool with the name of a deleted pool: %v", err)
	}
	if info.Revision == old.Revision {
		t.Errorf("a new pool of the same name has the old one's revision %d", info.Revision)
	}
	if st := p.status(); st.Allocated != 0 || st.Claims != 0 {
		t.Fatalf("a new pool of the same name counts what the old one handed out: %+v", st)
	}
	p.full(2)
	if st := p.status(); st.Allocated != 0 || st.Total != 2 || st.Claims != 0 {
		t.Errorf("a new pool of the same name: %+v, want only its 2 ready sandboxes", st)
	}
	if sb, err := p.rt.Get(ctx, handed.ID); err != nil || sb.Status.State != sandbox.StateRunning {
		t.Errorf("the sandbox the old pool handed out: %+v, %v", sb, err)
	}
}

// waitNoWarm waits until no warm sandbox of pool is left, giving up when
// none has gone for limit, or after three times that in all.
func (s *suite) waitNoWarm(t *testing.T, rt sandbox.Runtime, pool string, limit time.Duration) {
	t.Helper()
	start := time.Now()
	changed, last := start, -1
	for {
		left := s.opts.Hooks.WarmLeft(t, rt, pool)
		if len(left) == 0 {
			return
		}
		if len(left) != last {
			changed, last = time.Now(), len(left)
		}
		if time.Since(changed) > limit || time.Since(start) > 3*limit {
			t.Fatalf("warm sandboxes of deleted pool %s left after %v: %v", pool, time.Since(start).Round(time.Millisecond), left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// poolRestart: a runtime reopened on the same state has the pool, its
// ready sandboxes (the same ones) and what it handed out, and claims
// work.
func (s *suite) poolRestart(t *testing.T) {
	if s.opts.Hooks.Reopen == nil {
		t.Skip("no Reopen hook")
	}
	ctx := context.Background()
	p := s.newPool(t, "kept", sandbox.Capacity{BufferMin: 2, BufferMax: 2, PoolMax: 4}, s.template())
	p.full(2)
	handed := p.mustClaim(1, sandbox.Spec{})
	p.full(2)
	before := p.info()
	warm := p.warm()

	p.rt = s.opts.Hooks.Reopen(t, p.rt)
	var ok bool
	if p.pl, ok = p.rt.(sandbox.Pooler); !ok {
		t.Fatal("the reopened runtime has no pools")
	}
	info := p.info()
	if info.Revision != before.Revision || info.Template.Image != before.Template.Image || info.Capacity != before.Capacity ||
		!maps.Equal(info.Template.Env, before.Template.Env) {
		t.Fatalf("the pool after a restart: %+v, was %+v", info.Pool, before.Pool)
	}
	p.waitFor("the ready and handed-out sandboxes found again", 1, func(st sandbox.PoolStatus) bool {
		return st.Available == 2 && st.Allocated == 1 && st.Starting == 0
	})
	if left := p.warm(); !sameIDs(left, warm) {
		t.Errorf("warm sandboxes after a restart: %v, want the same %v", left, warm)
	}
	sb, err := p.rt.Get(ctx, handed.ID)
	if err != nil || sb.Status.State != sandbox.StateRunning || sb.Metadata["claim"] != "1" {
		t.Fatalf("the handed-out sandbox after a restart: %+v, %v", sb, err)
	}
	p.checkClaimed(sb, 1)
	again := p.mustClaim(2, sandbox.Spec{})
	if !slices.Contains(warm, again.ID) {
		t.Errorf("the claim after a restart took %s, not one of the ready sandboxes %v", again.ID, warm)
	}
	p.full(2)
}
