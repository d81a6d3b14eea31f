package execd

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// Timing of bash session runs.
const (
	// sessionRunCap bounds a run that asks for no timeout.
	sessionRunCap = 24 * time.Hour
	// sessionKillGrace is how long an interrupted run has to stop after
	// SIGINT before the session's shell is killed with it.
	sessionKillGrace = 2 * time.Second
)

// session is a persistent shell. Every run is sourced by the same shell
// process, so variables (exported or not), functions, aliases, options and
// the working directory carry over from one run to the next.
//
// The shell reads its instructions from a pipe on its stdin; each run's
// script is a private file that the shell sources with stdin from
// /dev/null, so nothing the user runs can read or write the control
// channel. When the run is over the shell writes its status to descriptor
// 3, a pipe of its own that the sourced code does not inherit: no output of
// the user's can be mistaken for the end of a run. All output written
// before the status is in the output pipe by then, so a Sync of the reader
// collects it exactly.
type session struct {
	id  string
	dir string // starting directory of the shell
	// raw sends output as it comes, in chunks with their newlines, as a
	// code context's stream carries it, instead of one event per line.
	raw bool

	// run serializes runs: a run waits for the one before it.
	run chan struct{}

	mu     sync.Mutex // guards sh and closed
	sh     *shell     // nil until started, and after the shell died
	closed bool

	// outMu guards the current run's stream and the partial line. It is
	// held while output is sent, which may wait for a slow client, so it
	// is never taken while holding mu: closing a session never waits for
	// a client.
	outMu sync.Mutex
	out   *outputStream
	lines process.Lines
}

// shell is one running shell process of a session.
type shell struct {
	proc    *process.Process
	posix   bool // plain sh: no bash-only syntax in control lines
	stdin   *os.File
	output  *process.Reader
	status  chan runStatus // run statuses, closed when the shell's fd 3 closes
	scripts string         // directory of run scripts
}

// sessionTable holds the bash sessions.
type sessionTable struct {
	mu   sync.Mutex
	byID map[string]*session
}

func newSessionTable() *sessionTable { return &sessionTable{byID: make(map[string]*session)} }

func (t *sessionTable) get(id string) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// remove closes and forgets a session. It reports whether it existed.
func (t *sessionTable) remove(id string) bool {
	t.mu.Lock()
	ss := t.byID[id]
	delete(t.byID, id)
	t.mu.Unlock()
	if ss != nil {
		ss.close()
	}
	return ss != nil
}

func (t *sessionTable) closeAll() {
	t.mu.Lock()
	all := t.byID
	t.byID = make(map[string]*session)
	t.mu.Unlock()
	for _, ss := range all {
		ss.close()
	}
}

// createSession serves POST /session.
func (s *Server) createSession(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSessionRequest
	if err := httpx.DecodeJSON(w, r, &req, 0, true); err != nil {
		return err
	}
	dir := s.env.cwd
	if req.Cwd != "" {
		var err error
		if dir, err = s.resolvePath(req.Cwd); err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "create cwd: %w", err)
		}
	}
	ss := &session{id: newUUID(), dir: dir, run: make(chan struct{}, 1)}
	ss.mu.Lock()
	err := s.startShell(ss)
	ss.mu.Unlock()
	if err != nil {
		return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "start session shell: %w", err)
	}
	s.sessions.mu.Lock()
	s.sessions.byID[ss.id] = ss
	s.sessions.mu.Unlock()
	httpx.WriteJSON(w, http.StatusOK, api.CreateSessionResponse{SessionID: ss.id})
	return nil
}

// deleteSession serves DELETE /session/{id}.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) error {
	if !s.sessions.remove(r.PathValue("id")) {
		return httpx.Errorf(http.StatusNotFound, api.CodeContextNotFound, "session %s not found", r.PathValue("id"))
	}
	return nil
}

// bashPrelude sets the shell up once: aliases expand as in an interactive
// shell, and SIGINT (an interrupt or a timeout) abandons the sourced run
// instead of going on with its next command or killing the shell.
const bashPrelude = "shopt -s expand_aliases\ntrap '\\builtin return 130 2>/dev/null' INT\n"

// posixPrelude is the same for a plain sh (dash, busybox ash), which
// expands aliases anyway.
const posixPrelude = "trap 'return 130 2>/dev/null' INT\n"

// startShell starts the session's shell. ss.mu must be held.
func (s *Server) startShell(ss *session) (retErr error) {
	env := s.env.build(nil, nil)
	path, posix, err := findShell(env)
	if err != nil {
		return err
	}
	scripts, err := os.MkdirTemp(s.priv, "session-")
	if err != nil {
		return fmt.Errorf("create script directory: %w", err)
	}
	var closers []*os.File
	defer func() {
		for _, f := range closers {
			f.Close()
		}
		if retErr != nil {
			os.RemoveAll(scripts)
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			closers = append(closers, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return err
	}
	outR, outW, err := pipe()
	if err != nil {
		return err
	}
	ctlR, ctlW, err := pipe()
	if err != nil {
		return err
	}
	argv := []string{"bash", "--noprofile", "--norc"}
	if posix {
		argv = []string{"sh"}
	}
	proc, err := s.sup.Start(process.Spec{
		Path: path, Args: argv, Dir: ss.dir, Env: env,
		Stdin: inR, Stdout: outW, Stderr: outW, ExtraFiles: []*os.File{ctlW},
	})
	if err != nil {
		return err
	}
	closers = []*os.File{inR, outW, ctlW} // the child's ends; ours stay open
	sh := &shell{proc: proc, posix: posix, stdin: inW, status: make(chan runStatus, 1), scripts: scripts}
	prelude := bashPrelude
	if posix {
		prelude = posixPrelude
	}
	if _, err := inW.WriteString(prelude); err != nil {
		proc.Stop(0)
		return fmt.Errorf("set up shell: %w", err)
	}
	sh.output = process.NewReader(outR, func(b []byte) { ss.write(b) }, idleFlush, ss.idle)
	go sh.output.Run()
	go readStatuses(ctlR, sh.status)
	go func() {
		<-proc.Done()
		sh.output.Finish()
		inW.Close()
		os.RemoveAll(scripts)
	}()
	ss.sh = sh
	return nil
}

// runStatus is one line of a shell's status pipe: the nonce of the run it
// ends and the run's status.
type runStatus struct {
	nonce string
	code  int
}

// readStatuses turns the status lines a shell writes on fd 3 into values.
func readStatuses(f *os.File, out chan<- runStatus) {
	defer close(out)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		nonce, code, _ := strings.Cut(sc.Text(), " ")
		if n, err := strconv.Atoi(code); err == nil {
			out <- runStatus{nonce, n}
		}
	}
}

// write takes output from the shell: lines go to the current run's
// stream, empty ones dropped as the clients expect; output between runs
// (from background jobs) has no reader and is dropped.
func (ss *session) write(b []byte) {
	ss.outMu.Lock()
	defer ss.outMu.Unlock()
	if ss.raw {
		if ss.out != nil {
			ss.out.send(api.Event{Type: api.EventStdout, Text: string(b), Timestamp: time.Now().UnixMilli()})
		}
		return
	}
	ss.lines.Write(b, ss.emitLocked)
}

func (ss *session) idle() {
	ss.outMu.Lock()
	defer ss.outMu.Unlock()
	ss.lines.Flush(false, ss.emitLocked)
}

func (ss *session) emitLocked(line []byte) {
	if len(line) == 0 || ss.out == nil {
		return
	}
	ss.out.send(api.Event{Type: api.EventStdout, Text: string(line), Timestamp: time.Now().UnixMilli()})
}

// close kills the session's shell and everything it started.
func (ss *session) close() {
	ss.mu.Lock()
	ss.closed = true
	sh := ss.sh
	ss.mu.Unlock()
	if sh != nil {
		sh.proc.Signal(syscall.SIGKILL)
	}
}

// runInSession serves POST /session/{id}/run.
func (s *Server) runInSession(w http.ResponseWriter, r *http.Request) error {
	var req api.RunInSessionRequest
	if err := httpx.DecodeJSON(w, r, &req, 0, false); err != nil {
		return err
	}
	switch {
	case req.Command == "":
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "command is required")
	case req.Timeout < 0:
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "timeout must not be negative")
	}
	ss := s.sessions.get(r.PathValue("id"))
	if ss == nil {
		// The reference daemon answers 500 for an unknown session.
		return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "session %s not found", r.PathValue("id"))
	}
	var dir string
	if req.Cwd != "" {
		var err error
		if dir, err = s.resolveDir(req.Cwd); err != nil {
			return err
		}
	}
	timeout := sessionRunCap
	if req.Timeout > 0 {
		timeout = time.Duration(req.Timeout) * time.Millisecond
	}

	// Wait for the previous run; a client that gives up stops waiting.
	select {
	case ss.run <- struct{}{}:
	case <-r.Context().Done():
		return nil
	}
	st := newOutputStream()
	defer st.detach()
	go func() {
		defer func() { <-ss.run }()
		term, _ := s.sessionRun(ss, st, req.Command, dir, timeout)
		st.send(term)
		st.close()
	}()
	ew := httpx.NewEventWriter(w)
	if err := ew.Send(api.Event{Type: api.EventInit, Text: ss.id}, pong()); err != nil {
		return nil
	}
	s.pump(r, ew, st)
	return nil
}

// sessionRun runs one command in the session's shell, sends its output to
// st and returns its terminal event, and whether the timeout ended the
// run. The caller holds the session's run slot throughout.
func (s *Server) sessionRun(ss *session, st *outputStream, command, dir string, timeout time.Duration) (api.Event, bool) {
	started := time.Now()
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return runFailure("session was closed"), false
	}
	if ss.sh == nil || ss.sh.proc.Exited() {
		// The shell died in an earlier run (exit, set -e, a kill): start a
		// fresh one, whose state is that of a new session.
		if err := s.startShell(ss); err != nil {
			ss.mu.Unlock()
			return runFailure("restart session shell: " + err.Error()), false
		}
	}
	sh := ss.sh
	ss.mu.Unlock()
	ss.outMu.Lock()
	ss.out = st
	ss.outMu.Unlock()

	res := sh.run(command, dir, timeout)

	// Everything the run wrote is in the pipe now; collect it, then end
	// the partial line, if any, so the next run starts clean.
	sh.output.Sync()
	ss.outMu.Lock()
	ss.lines.Flush(true, ss.emitLocked)
	ss.out = nil
	ss.outMu.Unlock()
	ss.mu.Lock()
	if sh.proc.Exited() && ss.sh == sh {
		ss.sh = nil
	}
	ss.mu.Unlock()

	if res.code == 0 && res.note == "" {
		return api.Event{Type: api.EventComplete, ExecutionTime: time.Since(started).Milliseconds()}, false
	}
	note := res.note
	if note == "" {
		note = "command exited with code " + strconv.Itoa(res.code)
	}
	return api.Event{Type: api.EventError, Error: &api.ExecutionError{
		EName: api.ErrorNameCommand, EValue: strconv.Itoa(res.code), Traceback: []string{note},
	}}, res.timedOut
}

// runFailure is the terminal event of a run that could not start.
func runFailure(msg string) api.Event {
	return api.Event{Type: api.EventError, Error: &api.ExecutionError{
		EName: api.ErrorNameCommand, EValue: "-1", Traceback: []string{msg},
	}}
}

// runResult is how a run ended: its status (-1 when a signal or a timeout
// ended it), and a note when it did not end normally.
type runResult struct {
	code     int
	note     string
	timedOut bool
}

// run sources command in the shell and returns its status. On timeout it
// interrupts the run with SIGINT, and kills the shell if the run has not
// stopped within sessionKillGrace.
func (sh *shell) run(command, dir string, timeout time.Duration) runResult {
	script, err := os.CreateTemp(sh.scripts, "run-*.sh")
	if err != nil {
		return runResult{code: -1, note: "write run script: " + err.Error()}
	}
	defer os.Remove(script.Name())
	_, err = script.WriteString(command + "\n")
	if cerr := script.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return runResult{code: -1, note: "write run script: " + err.Error()}
	}
	nonce := newID()
	if _, err := sh.stdin.WriteString(sh.controlLine(script.Name(), dir, nonce)); err != nil {
		return runResult{code: -1, note: "the session's shell is gone: " + err.Error()}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var kill <-chan time.Time
	timedOut := false
	for done := false; !done; {
		select {
		case st, ok := <-sh.status:
			switch {
			case !ok:
				done = true
			case st.nonce != nonce:
				// Not this run's end: something wrote to a copy of the
				// status pipe. Runs end only with their own nonce.
			case timedOut:
				return runResult{-1, fmt.Sprintf("run timed out after %v and was interrupted", timeout), true}
			default:
				return runResult{code: st.code}
			}
		case <-timer.C:
			timedOut = true
			sh.proc.Signal(syscall.SIGINT)
			kill = time.After(sessionKillGrace)
		case <-kill:
			sh.proc.Signal(syscall.SIGKILL)
			<-sh.proc.Done()
			return runResult{-1, fmt.Sprintf("run timed out after %v; the session's shell did not stop on SIGINT and was killed, so its state is lost", timeout), true}
		}
	}
	// The status pipe closed: the shell itself exited during the run
	// ("exit 3", "set -e"), and takes the run's status with it.
	st := sh.proc.State()
	return runResult{code: st.Code, note: fmt.Sprintf("the session's shell exited (%s); the next run starts a fresh shell", st)}
}

// controlLine is what the shell reads to perform one run. Backslashed
// builtins cannot be replaced by the user's aliases, and "builtin" keeps
// the user's functions from shadowing them.
func (sh *shell) controlLine(script, dir, nonce string) string {
	var b strings.Builder
	if sh.posix {
		if dir != "" {
			b.WriteString("cd -- " + shellQuote(dir) + " && ")
		}
		b.WriteString(". " + shellQuote(script) + " </dev/null 3>&-; printf '" + nonce + " %d\\n' \"$?\" >&3\n")
		return b.String()
	}
	if dir != "" {
		b.WriteString("\\builtin cd -- " + shellQuote(dir) + " && ")
	}
	b.WriteString("\\builtin source " + shellQuote(script) + " </dev/null 3>&-; \\builtin printf '" + nonce + " %d\\n' \"$?\" >&3\n")
	return b.String()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
