package execd

import (
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// EntrypointID is the command id under which the entrypoint's status is
// served: GET /command/status/entrypoint.
const EntrypointID = api.EntrypointCommandID

// Entrypoint is the sandbox's main process, started by execd as init.
type Entrypoint struct {
	cmd *command
}

// StartEntrypoint starts argv (executed directly, no shell) with execd's
// environment and working directory, its output going to execd's own
// stdout and stderr, that is to the container's log. Its status stays
// visible at /command/status/entrypoint after it exits, and execd keeps
// serving either way. A failure to start is recorded there too, and the
// Entrypoint is returned with the error.
func (s *Server) StartEntrypoint(argv []string) (*Entrypoint, error) {
	c := &command{id: EntrypointID, content: joinArgs(argv), pinned: true, startedAt: time.Now()}
	p := &prepared{spec: process.Spec{
		Dir: s.env.cwd, Env: s.env.build(nil, nil), Args: argv,
		Stdout: os.Stdout, Stderr: os.Stderr,
	}}
	p.spec.Path, p.err = lookPath(argv[0], p.spec.Env)
	e := &Entrypoint{cmd: c}
	s.entry.Store(e)
	if err := s.start(c, p); err != nil {
		s.entryFailed.Store(true)
		return e, err
	}
	go func() {
		st := c.proc.State()
		c.finish(st.Code, stateError(st))
		s.log.Info("entrypoint exited", "status", st.String())
	}()
	return e, nil
}

// ready answers GET and HEAD /ready without the access token: 200 while
// execd serves, 503 with code ENTRYPOINT_FAILED once the entrypoint could
// not start. An entrypoint that started and exited since leaves it 200:
// the sandbox still serves, as the lifecycle API reports it Running. It
// says nothing else (not the entrypoint, not its error), since anyone
// who reaches the port may ask; the details are at
// /command/status/entrypoint, behind the token.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if s.entryFailed.Load() {
		httpx.WriteError(w, httpx.Errorf(http.StatusServiceUnavailable, api.CodeEntrypointFailed, "the entrypoint could not start"))
		return
	}
	w.WriteHeader(http.StatusOK)
}

// Entrypoint returns the entrypoint, nil until one has been started (at
// start, or by a claim).
func (s *Server) Entrypoint() *Entrypoint { return s.entry.Load() }

// Running reports whether the entrypoint is still running.
func (e *Entrypoint) Running() bool { return e.cmd.proc != nil && !e.cmd.proc.Exited() }

// Signal sends sig to the entrypoint's process group.
func (e *Entrypoint) Signal(sig syscall.Signal) error {
	if e.cmd.proc == nil {
		return nil
	}
	return e.cmd.proc.Signal(sig)
}

// ExitCode returns the exit code a container would report for the
// entrypoint: its status, 128+N after signal N, or 255 if it never
// started. It waits for the entrypoint to exit.
func (e *Entrypoint) ExitCode() int {
	if e.cmd.proc == nil {
		return exitCodeStartFailure
	}
	st := e.cmd.proc.State()
	if st.Signal != 0 {
		return 128 + int(st.Signal)
	}
	return st.Code
}

func joinArgs(argv []string) string {
	out := ""
	for i, a := range argv {
		if i > 0 {
			out += " "
		}
		out += shellQuoteIfNeeded(a)
	}
	return out
}

func shellQuoteIfNeeded(s string) string {
	for _, c := range s {
		if !(c == '-' || c == '_' || c == '.' || c == '/' || c == '=' || c == ':' || c == ',' ||
			'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return shellQuote(s)
		}
	}
	if s == "" {
		return "''"
	}
	return s
}
