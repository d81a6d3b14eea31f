package warmpool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// pool is an in-memory runtime's warm sandboxes for claim tests: HandOver
// takes a member with a check-and-set, as the runtimes' stores do, and
// answers what fail says for a member.
type pool struct {
	mu        sync.Mutex
	members   map[sandbox.ID]*Member
	discarded []sandbox.ID
	// fail, when set, is the hand-over's answer for a member it took.
	fail func(id sandbox.ID) error
	// interfere, when set, runs before each take: another claimer's
	// chance to get there first.
	interfere func(id sandbox.ID)
	// notTaken, when set and true for a member, makes the take fail
	// without taking it, as when its token cannot be read just now.
	notTaken func(id sandbox.ID) bool
}

func newPool(n int) *pool {
	p := &pool{members: map[sandbox.ID]*Member{}}
	for i := range n {
		m := member(fmt.Sprint("w", i), 1, sandbox.StateRunning, time.Duration(n-i)*time.Minute)
		p.members[m.ID] = &m
	}
	return p
}

func (p *pool) Members(def *sandbox.Pool) []Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Member, 0, len(p.members))
	for _, m := range p.members {
		out = append(out, *m)
	}
	return out
}

func (p *pool) HandOver(ctx context.Context, def *sandbox.Pool, m Member, spec *sandbox.Spec) (*sandbox.Sandbox, error) {
	if p.interfere != nil {
		p.interfere(m.ID)
	}
	if p.notTaken != nil && p.notTaken(m.ID) {
		return nil, fmt.Errorf("sandbox %s: token unknown: %w", m.ID, ErrLost)
	}
	p.mu.Lock()
	cur := p.members[m.ID]
	if cur == nil || cur.HandedOut {
		p.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: %w", m.ID, ErrLost)
	}
	cur.HandedOut = true
	p.mu.Unlock()
	if p.fail != nil {
		if err := p.fail(m.ID); err != nil {
			if errors.Is(err, sandbox.ErrInvalid) {
				p.mu.Lock()
				cur.HandedOut = false
				p.mu.Unlock()
			}
			return nil, err
		}
	}
	return &sandbox.Sandbox{ID: m.ID, Metadata: spec.Metadata}, nil
}

func (p *pool) Discard(ctx context.Context, id sandbox.ID, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.members, id)
	p.discarded = append(p.discarded, id)
}

// observer counts what Claim reports.
type observer struct {
	sandbox.NopObserver
	mu           sync.Mutex
	hits, misses int
}

func (o *observer) PoolClaim(pool string, hit bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if hit {
		o.hits++
	} else {
		o.misses++
	}
}

func candidates(trs ...*Tracker) []Candidate {
	return []Candidate{{Pool: testDef(1, sandbox.Capacity{}), Tracker: trs[0]}}
}

// TestClaimConcurrent: 30 claims at once on 5 warm sandboxes, with some
// takes losing to another claimer (as to claims on other replicas), hand
// out every sandbox the outsider did not get, each once; only the other
// claims find the pool empty.
func TestClaimConcurrent(t *testing.T) {
	for round := range 20 {
		p := newPool(5)
		// An outside claimer takes a sandbox now and then, between the
		// pick and the take: the claim must go on to the next.
		var outside sync.Map
		n := 0
		var nmu sync.Mutex
		p.interfere = func(id sandbox.ID) {
			nmu.Lock()
			n++
			steal := round%2 == 1 && n%7 == 3
			nmu.Unlock()
			if steal {
				p.mu.Lock()
				if m := p.members[id]; m != nil && !m.HandedOut {
					m.HandedOut = true
					outside.Store(id, true)
				}
				p.mu.Unlock()
			}
		}
		tr, obs := NewTracker(), &observer{}
		var (
			mu    sync.Mutex
			got   = map[sandbox.ID]int{}
			empty int
			wg    sync.WaitGroup
		)
		for range 30 {
			wg.Go(func() {
				sb, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, obs)
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
		stolen := 0
		outside.Range(func(k, v any) bool { stolen++; return true })
		if len(got)+stolen != 5 || empty != 30-len(got) {
			t.Fatalf("round %d: %d handed out, %d taken outside, %d empty; want 5 in all, the other claims empty", round, len(got), stolen, empty)
		}
		for id, c := range got {
			if c != 1 {
				t.Errorf("%s handed out %d times", id, c)
			}
			if _, ok := outside.Load(id); ok {
				t.Errorf("%s handed out though taken outside", id)
			}
		}
		st := tr.Status(testDef(1, sandbox.Capacity{}), nil)
		if int(st.Claims) != len(got) || int(st.Misses) != empty || obs.hits != len(got) || obs.misses != empty {
			t.Errorf("counts: status %+v, observer %d hits %d misses", st, obs.hits, obs.misses)
		}
	}
}

// TestClaimWaitsForClaimsUnderWay: a take that fails without anyone
// winning the sandbox (its token not readable at that moment) while every
// other sandbox is being taken by other claims: the claims that found
// them all taken wait, and one of them gets it; none is left warm.
func TestClaimWaitsForClaimsUnderWay(t *testing.T) {
	for range 20 {
		p := newPool(5)
		var once sync.Once
		p.notTaken = func(id sandbox.ID) bool {
			refused := false
			if id == "w0" {
				once.Do(func() {
					time.Sleep(20 * time.Millisecond) // the other claims pick meanwhile
					refused = true
				})
			}
			return refused
		}
		tr := NewTracker()
		var (
			mu    sync.Mutex
			got   = map[sandbox.ID]int{}
			empty int
			wg    sync.WaitGroup
		)
		for range 30 {
			wg.Go(func() {
				sb, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, sandbox.NopObserver{})
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
		if len(got) != 5 || empty != 25 || got["w0"] != 1 {
			t.Fatalf("%d handed out (w0 %d times), %d empty; want 5 and 25", len(got), got["w0"], empty)
		}
	}
}

func TestClaimTakesOldest(t *testing.T) {
	p := newPool(3) // w0 is the oldest
	tr := NewTracker()
	for _, want := range []sandbox.ID{"w0", "w1", "w2"} {
		sb, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, sandbox.NopObserver{})
		if err != nil || sb.ID != want {
			t.Fatalf("claim = %v, %v; want %s", sb, err, want)
		}
	}
}

func TestClaimHandOverFailures(t *testing.T) {
	t.Run("one failure: the next is handed out", func(t *testing.T) {
		p := newPool(3)
		p.fail = func(id sandbox.ID) error {
			if id == "w0" {
				return errors.New("execd unreachable")
			}
			return nil
		}
		tr := NewTracker()
		sb, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, sandbox.NopObserver{})
		if err != nil || sb.ID != "w1" {
			t.Fatalf("claim = %v, %v; want w1", sb, err)
		}
		if len(p.discarded) != 1 || p.discarded[0] != "w0" {
			t.Errorf("discarded %v", p.discarded)
		}
		if e := tr.StartError(1); e != "" {
			t.Errorf("error after a successful claim: %q", e)
		}
	})
	t.Run("two failures: the create goes cold", func(t *testing.T) {
		p := newPool(4)
		p.fail = func(sandbox.ID) error { return errors.New("token refused") }
		tr, obs := NewTracker(), &observer{}
		_, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, obs)
		if !errors.Is(err, sandbox.ErrPoolEmpty) {
			t.Fatalf("claim: %v, want ErrPoolEmpty", err)
		}
		if len(p.discarded) != MaxHandOverFailures || len(p.members) != 4-MaxHandOverFailures {
			t.Errorf("discarded %v, %d left", p.discarded, len(p.members))
		}
		if e := tr.StartError(1); e != "hand-over failed: token refused" {
			t.Errorf("pool error %q", e)
		}
		if obs.misses != 1 {
			t.Errorf("%d misses", obs.misses)
		}
	})
	t.Run("a bad request: error, the sandbox stays warm", func(t *testing.T) {
		p := newPool(2)
		bad := sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, "bad entrypoint")
		p.fail = func(sandbox.ID) error { return bad }
		tr, obs := NewTracker(), &observer{}
		_, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, obs)
		if !errors.Is(err, sandbox.ErrInvalid) {
			t.Fatalf("claim: %v, want ErrInvalid", err)
		}
		if len(p.discarded) != 0 || p.members["w0"].HandedOut {
			t.Errorf("discarded %v, w0 %+v", p.discarded, p.members["w0"])
		}
		if obs.misses != 0 || obs.hits != 0 {
			t.Errorf("observer %+v", obs)
		}
		p.fail = nil
		if sb, err := Claim(context.Background(), p, candidates(tr), "p", &sandbox.Spec{}, obs); err != nil || sb.ID != "w0" {
			t.Errorf("next claim = %v, %v; want w0", sb, err)
		}
	})
}

func TestClaimChoosesPools(t *testing.T) {
	withEnv := &sandbox.Pool{Name: "a-env", Revision: 1, Template: sandbox.Spec{Image: "img", Env: map[string]string{"A": "1"}}}
	plain := &sandbox.Pool{Name: "b-plain", Revision: 1, Template: sandbox.Spec{Image: "img"}}
	trEnv, trPlain := NewTracker(), NewTracker()
	pools := []Candidate{{withEnv, trEnv}, {plain, trPlain}}
	p := newPool(1)
	obs := &observer{}
	if _, err := Claim(context.Background(), p, pools, "nope", &sandbox.Spec{}, obs); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("unknown pool: %v", err)
	}
	// Named, but asking for what a warm sandbox cannot be: a miss.
	if _, err := Claim(context.Background(), p, pools, "a-env", &sandbox.Spec{SecureAccess: true}, obs); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("unsatisfiable claim: %v", err)
	}
	if st := trEnv.Status(withEnv, nil); st.Misses != 1 {
		t.Errorf("status %+v", st)
	}
	// Unnamed: a pool with env of its own never serves it; the plain one does.
	sb, err := Claim(context.Background(), p, pools, "", &sandbox.Spec{Image: "img"}, obs)
	if err != nil || sb.ID != "w0" {
		t.Fatalf("plain claim = %v, %v", sb, err)
	}
	if trPlain.Status(plain, nil).Claims != 1 || trEnv.Status(withEnv, nil).Claims != 0 {
		t.Error("the claim was counted on the wrong pool")
	}
	// No pool matches: empty, no miss counted anywhere.
	if _, err := Claim(context.Background(), p, pools, "", &sandbox.Spec{Image: "other"}, obs); !errors.Is(err, sandbox.ErrPoolEmpty) {
		t.Errorf("no match: %v", err)
	}
	if obs.misses != 1 {
		t.Errorf("%d misses", obs.misses)
	}
}

func TestClaimExecd(t *testing.T) {
	var got api.ClaimRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/claim" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get(sandbox.HeaderExecdToken) != "pool-token" {
			http.Error(w, "bad token", http.StatusUnauthorized)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if len(got.Entrypoint) > 0 && got.Entrypoint[0] == "" {
			http.Error(w, "empty program", http.StatusBadRequest)
			return
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	claim := api.ClaimRequest{Token: "new-token-0123456789", Env: map[string]string{"A": "b"}, Entrypoint: []string{"sleep", "1"}}
	if err := ClaimExecd(ctx, srv.Client(), srv.URL, "pool-token", claim); err != nil {
		t.Fatal(err)
	}
	if got.Token != claim.Token || got.Env["A"] != "b" || got.Entrypoint[1] != "1" {
		t.Errorf("execd got %+v", got)
	}
	err := ClaimExecd(ctx, srv.Client(), srv.URL, "pool-token", api.ClaimRequest{Token: "x", Entrypoint: []string{""}})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("refused request: %v, want ErrInvalid", err)
	}
	err = ClaimExecd(ctx, srv.Client(), srv.URL, "other", claim)
	if err == nil || errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("refused token: %v, want a failed hand-over", err)
	}
	// A context that has ended does not cut the call short.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := ClaimExecd(done, srv.Client(), srv.URL, "pool-token", claim); err != nil {
		t.Errorf("with an ended context: %v", err)
	}
	srv.Close()
	if err := ClaimExecd(ctx, srv.Client(), srv.URL, "pool-token", claim); err == nil || errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("execd unreachable: %v", err)
	}
}

func TestClaimExecdClaimedAlready(t *testing.T) {
	for _, tc := range []struct {
		message string
		claimed bool
	}{
		{"this sandbox has been claimed already", true},
		{"this sandbox already has an entrypoint", true},
		{"execd runs without a token (--insecure): it cannot be claimed", false},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeInvalidRequestBody, Message: tc.message})
		}))
		err := ClaimExecd(context.Background(), srv.Client(), srv.URL, "token", api.ClaimRequest{Token: "new-token-0123456789"})
		srv.Close()
		if err == nil || errors.Is(err, ErrClaimed) != tc.claimed || errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("409 %q: %v, want ErrClaimed %v", tc.message, err, tc.claimed)
		}
	}
}
