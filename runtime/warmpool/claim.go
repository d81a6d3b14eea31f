package warmpool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// ErrLost is what Claimer.HandOver returns, wrapped, when it did not take
// the warm sandbox and left it as it was: another claim (of this process
// or another) took it first, it is no longer warm, or it could not be
// taken just now. The claim tries the next one.
var ErrLost = errors.New("the warm sandbox was not taken")

// Claimer is what a claim needs of its runtime.
type Claimer interface {
	// Members returns the pool's sandboxes as the runtime sees them now.
	Members(def *sandbox.Pool) []Member
	// HandOver takes the warm sandbox m for the claim, so that no other
	// claim anywhere can have it, and hands it over through execd
	// (ClaimExecd) with spec's entrypoint (else the template's),
	// environment, metadata and expiry. Its errors: ErrLost (wrapped) when
	// it did not take m; sandbox.ErrInvalid when execd refused the request
	// as bad, after which m is warm again for other claims; any other
	// error is a failed hand-over of a sandbox taken, which the claim then
	// discards.
	HandOver(ctx context.Context, def *sandbox.Pool, m Member, spec *sandbox.Spec) (*sandbox.Sandbox, error)
	// Discard removes a sandbox whose hand-over failed; it logs its own
	// failure.
	Discard(ctx context.Context, id sandbox.ID, why string)
}

// Candidate is a pool a claim may take from, with its tracker.
type Candidate struct {
	Pool    *sandbox.Pool
	Tracker *Tracker
}

// Claim hands out a warm sandbox for a create. With name set it takes
// from that pool (NotFound when it is not among pools), or from none when
// spec asks for what its warm sandboxes cannot be (a miss: the create is
// made cold); with name empty, from the first pool by name whose template
// matches spec (createExts are the runtime's creation-time extensions,
// see sandbox.Pool.Satisfies). pools must be sorted by name.
//
// A claim takes the oldest ready warm sandbox. One another claim took
// first is skipped, as many times as it takes, and while the ready ones
// are all being taken by other claims of this process, a claim waits for
// those to end: it answers sandbox.ErrPoolEmpty only when no warm
// sandbox it can see is left. A
// failed hand-over discards that sandbox and tries the next, at most
// MaxHandOverFailures times, then answers ErrPoolEmpty. A request execd
// refuses as bad is answered with that error, the sandbox staying warm.
func Claim(ctx context.Context, c Claimer, pools []Candidate, name string, spec *sandbox.Spec, obs sandbox.Observer, createExts ...string) (*sandbox.Sandbox, error) {
	start := time.Now()
	var candidates []Candidate
	if name != "" {
		for _, p := range pools {
			if p.Pool.Name == name {
				candidates = append(candidates, p)
			}
		}
		if len(candidates) == 0 {
			return nil, NotFound(name)
		}
		if !candidates[0].Pool.Satisfies(spec, createExts...) {
			miss(candidates[0], obs)
			return nil, sandbox.ErrPoolEmpty
		}
		// Only a create that names the pool gets its template's
		// extensions (ingress.public...), under its own.
		spec.Extensions = sandbox.WithTemplateExtensions(spec.Extensions, &candidates[0].Pool.Template)
	} else {
		for _, p := range pools {
			if p.Pool.Matches(spec, createExts...) {
				candidates = append(candidates, p)
			}
		}
		if len(candidates) == 0 {
			return nil, sandbox.ErrPoolEmpty
		}
	}

	skip := map[sandbox.ID]bool{} // lost, or failed to hand over
	failures := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var (
			m       Member
			taken   *Candidate
			pending <-chan struct{}
		)
		for i := range candidates {
			mm, ok, wait := candidates[i].Tracker.reserve(candidates[i].Pool, c.Members(candidates[i].Pool), skip)
			if ok {
				m, taken = mm, &candidates[i]
				break
			}
			if pending == nil {
				pending = wait
			}
		}
		if taken == nil && pending != nil {
			// Every ready sandbox is being taken by other claims of this
			// process; one of them may yet come back (its take did not
			// happen, or execd refused that claim's request). Look again
			// once one of those claims ends.
			select {
			case <-pending:
			case <-ctx.Done():
			}
			continue
		}
		if taken == nil {
			miss(candidates[0], obs)
			return nil, sandbox.ErrPoolEmpty
		}
		sb, err := c.HandOver(ctx, taken.Pool, m, spec)
		t := taken.Tracker
		t.release(m.ID)
		switch {
		case err == nil:
			t.mu.Lock()
			t.claims++
			t.handOverErr = ""
			t.mu.Unlock()
			obs.PoolClaim(taken.Pool.Name, true)
			obs.SandboxReady(sandbox.CreatePooled, time.Since(start))
			return sb, nil
		case errors.Is(err, ErrLost):
			skip[m.ID] = true
			continue
		case errors.Is(err, sandbox.ErrInvalid):
			return nil, err
		}
		skip[m.ID] = true
		failures++
		c.Discard(context.WithoutCancel(ctx), m.ID, "its hand-over failed: "+err.Error())
		t.mu.Lock()
		t.handOverErr = "hand-over failed: " + err.Error()
		t.mu.Unlock()
		if failures == MaxHandOverFailures {
			miss(*taken, obs)
			return nil, sandbox.ErrPoolEmpty
		}
	}
}

func miss(p Candidate, obs sandbox.Observer) {
	p.Tracker.mu.Lock()
	p.Tracker.misses++
	p.Tracker.mu.Unlock()
	obs.PoolClaim(p.Pool.Name, false)
}

// reserve picks the oldest ready warm sandbox of def no claim of this
// process is taking, and marks it taken by the caller until release.
// When there is none but other claims of this process are taking some,
// it returns a channel closed when one of them ends.
func (t *Tracker) reserve(def *sandbox.Pool, members []Member, skip map[sandbox.ID]bool) (Member, bool, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := pick(def, members, func(id sandbox.ID) bool { return skip[id] || t.claiming[id] })
	if ok {
		t.claiming[m.ID] = true
		return m, true, nil
	}
	if len(t.claiming) > 0 {
		return Member{}, false, t.released
	}
	return Member{}, false, nil
}

// release ends the caller's reservation of id, and wakes the claims
// waiting for one to end.
func (t *Tracker) release(id sandbox.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.claiming, id)
	close(t.released)
	t.released = make(chan struct{})
}

// ErrClaimed is ClaimExecd's error when execd has been claimed already in
// its present life, or runs an entrypoint already: whatever the call was
// to hand over is in place, and was not handed over twice.
var ErrClaimed = errors.New("execd has been claimed already")

// claimedAlready reports whether execd's 409 to a claim says that it took
// one already, or runs an entrypoint already.
func claimedAlready(body []byte) bool {
	var e api.ErrorResponse
	if json.Unmarshal(body, &e) != nil {
		return false
	}
	return strings.Contains(e.Message, "claimed already") || strings.Contains(e.Message, "already has an entrypoint")
}

// claimTimeout bounds the call to execd's /claim.
const claimTimeout = 10 * time.Second

// ClaimExecd hands a warm sandbox over to its user through execd at
// baseURL ("http://host:port"), authenticated with the pool's token: in
// one call execd takes the new token, the environment and the entrypoint.
// The Docker runtime starts a held entrypoint the same way, with the
// sandbox's own token. A claim execd took already is ErrClaimed.
// The call is not cut short by ctx's end (a claim execd took must be
// known), only by claimTimeout. A request execd refuses as bad (400) is
// sandbox.ErrInvalid, and execd has taken none of it.
func ClaimExecd(ctx context.Context, client *http.Client, baseURL, poolToken string, claim api.ClaimRequest) error {
	body, err := json.Marshal(claim)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/claim", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set(sandbox.HeaderExecdToken, poolToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("claim through execd: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch {
	case resp.StatusCode == http.StatusBadRequest:
		return sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, "the sandbox refused the request: "+strings.TrimSpace(string(msg)))
	case resp.StatusCode == http.StatusConflict && claimedAlready(msg):
		return fmt.Errorf("%w: %s", ErrClaimed, bytes.TrimSpace(msg))
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("claim through execd: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
