package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// Well-known ports inside every sandbox.
const (
	PortExecd  = api.ExecdPort // execd: commands, files, terminals, metrics
	PortEgress = 18080         // the egress policy API
)

// Sandbox is a handle on one sandbox: its lifecycle through the server,
// and commands, files, terminals and the egress policy through the
// sandbox's own endpoints, which it resolves once and keeps. It is safe
// for concurrent use.
type Sandbox struct {
	// ID is the sandbox's id.
	ID string

	c      *Client
	mu     sync.Mutex
	execdT *target
	egress *target
}

// Client is the client the sandbox was obtained from.
func (s *Sandbox) Client() *Client { return s.c }

// Info returns the sandbox's current description.
func (s *Sandbox) Info(ctx context.Context) (*api.Sandbox, error) { return s.c.Get(ctx, s.ID) }

// Kill deletes the sandbox.
func (s *Sandbox) Kill(ctx context.Context) error { return s.c.Kill(ctx, s.ID) }

// Pause freezes the sandbox; see Client.Pause.
func (s *Sandbox) Pause(ctx context.Context) error { return s.c.Pause(ctx, s.ID) }

// Resume thaws the sandbox and waits until its execd answers again.
func (s *Sandbox) Resume(ctx context.Context) error {
	if err := s.c.Resume(ctx, s.ID); err != nil {
		return err
	}
	return s.WaitReady(ctx, DefaultReadyTimeout)
}

// Renew sets the sandbox's expiry to now plus d.
func (s *Sandbox) Renew(ctx context.Context, d time.Duration) (time.Time, error) {
	return s.c.Renew(ctx, s.ID, d)
}

// Endpoint returns where port of the sandbox is reached; WithExpiry asks
// for a signed endpoint, whose URL (api.Endpoint.URL) needs no header.
func (s *Sandbox) Endpoint(ctx context.Context, port int, opts ...EndpointOption) (*api.Endpoint, error) {
	return s.c.Endpoint(ctx, s.ID, port, opts...)
}

// execd returns the target of the sandbox's execd, resolving it once.
func (s *Sandbox) execd(ctx context.Context) (*target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.execdT != nil {
		return s.execdT, nil
	}
	ep, err := s.c.Endpoint(ctx, s.ID, PortExecd)
	if err != nil {
		return nil, err
	}
	s.execdT = s.c.endpointTarget(ep)
	return s.execdT, nil
}

// egressAPI returns the target of the sandbox's egress API.
func (s *Sandbox) egressAPI(ctx context.Context) (*target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.egress != nil {
		return s.egress, nil
	}
	ep, err := s.c.Endpoint(ctx, s.ID, PortEgress)
	if err != nil {
		return nil, err
	}
	s.egress = s.c.endpointTarget(ep)
	return s.egress, nil
}

// forget drops the resolved endpoints, so the next call asks the server
// again (after a resume or a server restart they may have moved).
func (s *Sandbox) forget() {
	s.mu.Lock()
	s.execdT, s.egress = nil, nil
	s.mu.Unlock()
}

// Ping asks the sandbox's execd whether it is up.
func (s *Sandbox) Ping(ctx context.Context) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("ping sandbox "+s.ID, http.MethodGet, "/ping", nil)
	return s.c.t.call(ctx, r, nil)
}

// WaitReady waits up to timeout (0: until ctx ends) for the sandbox to be
// Running with its execd answering. It fails at once if the sandbox
// fails or is terminated, with the reason the server gives.
func (s *Sandbox) WaitReady(ctx context.Context, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var last string
	for delay := 10 * time.Millisecond; ; delay = min(delay*2, 250*time.Millisecond) {
		info, err := s.c.Get(ctx, s.ID)
		if err != nil {
			return s.notReady(ctx, last, err)
		}
		last = info.Status.State
		switch last {
		case StateFailed, StateTerminated:
			return &StateError{ID: s.ID, Want: StateRunning, Status: info.Status}
		case StateRunning:
			if err := s.pingOnce(ctx); err == nil {
				return nil
			}
		}
		if err := sleep(ctx, delay); err != nil {
			return s.notReady(ctx, last, err)
		}
	}
}

// pingOnce pings without retries, re-resolving the endpoint on failure.
func (s *Sandbox) pingOnce(ctx context.Context) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("ping sandbox "+s.ID, http.MethodGet, "/ping", nil)
	resp, err := s.c.t.once(ctx, r)
	if err != nil {
		s.forget()
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ping: HTTP %d", resp.StatusCode)
	}
	return nil
}

func (s *Sandbox) notReady(ctx context.Context, state string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		if state == "" {
			state = "unknown"
		}
		return fmt.Errorf("sandbox %s not ready in time (state %s): %w", s.ID, state, err)
	}
	return err
}

func jsonRaw(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return b, nil
}
