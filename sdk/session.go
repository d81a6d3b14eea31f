package sdk

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// Session is a persistent bash in a sandbox: variables, functions,
// aliases and the working directory carry over from one run to the next.
type Session struct {
	ID string
	sb *Sandbox
}

// CreateSession starts a bash session, in cwd when not empty.
func (s *Sandbox) CreateSession(ctx context.Context, cwd string) (*Session, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r, err := tg.jsonReq("create session in sandbox "+s.ID, http.MethodPost, "/session", nil, api.CreateSessionRequest{Cwd: cwd})
	if err != nil {
		return nil, err
	}
	var out api.CreateSessionResponse
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &Session{ID: out.SessionID, sb: s}, nil
}

// Session returns a handle on an existing session by id.
func (s *Sandbox) Session(id string) *Session { return &Session{ID: id, sb: s} }

// SessionRunOptions adjusts a run in a session.
type SessionRunOptions struct {
	// Cwd runs this command in another directory; the session's own
	// directory is unchanged by it.
	Cwd string
	// Timeout bounds the run; zero means the sandbox's limit.
	Timeout time.Duration
	// Stdout receives the output (stdout and stderr merged, as a terminal
	// would show them) as it arrives; when nil it is collected in
	// Execution.Stdout.
	Stdout io.Writer
	// OnEvent, when set, sees every event (pings excepted).
	OnEvent func(api.Event)
}

// Stream runs a command in the session and returns its live output.
func (ss *Session) Stream(ctx context.Context, command string, opts *SessionRunOptions) (*Stream, error) {
	tg, err := ss.sb.execd(ctx)
	if err != nil {
		return nil, err
	}
	body := api.RunInSessionRequest{Command: command}
	if opts != nil {
		body.Cwd, body.Timeout = opts.Cwd, opts.Timeout.Milliseconds()
	}
	r, err := tg.jsonReq("run in session "+ss.ID, http.MethodPost, "/session/"+url.PathEscape(ss.ID)+"/run", nil, body)
	if err != nil {
		return nil, err
	}
	st, err := ss.sb.openStream(ctx, r, true, false)
	if err != nil {
		return nil, err
	}
	st.collect = opts == nil || opts.Stdout == nil
	return st, nil
}

// Run runs a command in the session to its end; as Sandbox.Run, a
// failing command is reported in the Execution, not as an error.
func (ss *Session) Run(ctx context.Context, command string, opts *SessionRunOptions) (*Execution, error) {
	st, err := ss.Stream(ctx, command, opts)
	if err != nil {
		return nil, err
	}
	var stdout io.Writer
	var onEvent func(api.Event)
	if opts != nil {
		stdout, onEvent = opts.Stdout, opts.OnEvent
	}
	return st.drain(stdout, nil, onEvent)
}

// Delete ends the session and whatever runs in it.
func (ss *Session) Delete(ctx context.Context) error {
	tg, err := ss.sb.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("delete session "+ss.ID, http.MethodDelete, "/session/"+url.PathEscape(ss.ID), nil)
	r.idempotent = true
	return ss.sb.c.t.call(ctx, r, nil)
}
