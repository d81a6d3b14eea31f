package execd

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// Timing of command streams.
const (
	// idleFlush is how long a partial line waits for its end before it is
	// sent as it is, so prompts and progress output appear without a
	// newline.
	idleFlush = 100 * time.Millisecond
	// interruptGrace is how long an interrupted command has between
	// SIGTERM and SIGKILL.
	interruptGrace = 3 * time.Second
	// exitCodeStartFailure is the status of a command that never started.
	exitCodeStartFailure = api.ExitCodeStartFailure
)

// command is the record of one command started through POST /command (or
// the entrypoint). Its fields before mu never change after creation.
type command struct {
	id         string
	content    string
	background bool
	pinned     bool // never evicted (the entrypoint)
	startedAt  time.Time
	proc       *process.Process // nil if the command never started
	spool      *process.Spool   // combined output of a background command

	mu         sync.Mutex
	done       bool
	finishedAt time.Time
	exitCode   int
	errText    string
}

// finish records how the command ended.
func (c *command) finish(code int, errText string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done, c.finishedAt, c.exitCode, c.errText = true, time.Now(), code, errText
}

func (c *command) status() api.CommandStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := api.CommandStatus{ID: c.id, Content: c.content, Running: !c.done, StartedAt: c.startedAt}
	if c.done {
		code, fin := c.exitCode, c.finishedAt
		st.ExitCode, st.FinishedAt, st.Error = &code, &fin, c.errText
	}
	return st
}

func (c *command) finishedBefore(t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done && c.finishedAt.Before(t)
}

// commandTable holds command records. Finished records are evicted after
// a while and beyond a count, so a long-lived sandbox does not accumulate
// them without bound.
type commandTable struct {
	ttl time.Duration
	max int

	mu   sync.Mutex
	byID map[string]*command
}

func newCommandTable(ttl time.Duration, max int) *commandTable {
	return &commandTable{ttl: ttl, max: max, byID: make(map[string]*command)}
}

func (t *commandTable) add(c *command) {
	t.mu.Lock()
	t.byID[c.id] = c
	over := len(t.byID) > t.max
	t.mu.Unlock()
	if over {
		t.evict(time.Now())
	}
}

func (t *commandTable) get(id string) *command {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

// evict removes finished records older than the TTL, then the oldest
// finished records beyond the count limit.
func (t *commandTable) evict(now time.Time) {
	t.mu.Lock()
	var finished []*command
	for id, c := range t.byID {
		if c.pinned {
			continue
		}
		if c.finishedBefore(now.Add(-t.ttl)) {
			delete(t.byID, id)
			c.release()
			continue
		}
		c.mu.Lock()
		if c.done {
			finished = append(finished, c)
		}
		c.mu.Unlock()
	}
	if excess := len(t.byID) - t.max; excess > 0 && len(finished) > 0 {
		slices.SortFunc(finished, func(a, b *command) int { return a.finishedAt.Compare(b.finishedAt) })
		for _, c := range finished[:min(excess, len(finished))] {
			delete(t.byID, c.id)
			c.release()
		}
	}
	t.mu.Unlock()
}

func (t *commandTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, c := range t.byID {
		delete(t.byID, id)
		c.release()
	}
}

func (c *command) release() {
	if c.spool != nil {
		c.spool.Close()
	}
}

// prepared is a validated command request, ready to start.
type prepared struct {
	req  api.RunCommandRequest
	spec process.Spec
	// err is a failure to build the command line (no shell, no such
	// program). It is reported as a start failure, in the stream.
	err error
}

// prepareCommand validates a request and resolves everything needed to
// start it. Its errors are 400s, answered before any event.
func (s *Server) prepareCommand(req api.RunCommandRequest) (*prepared, error) {
	switch {
	case req.Command == "":
		return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "command is required")
	case req.Timeout < 0:
		return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "timeout must not be negative")
	case req.GID != nil && req.UID == nil:
		return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "uid is required when gid is provided")
	}
	dir := s.env.cwd
	if req.Cwd != "" {
		var err error
		if dir, err = s.resolveDir(req.Cwd); err != nil {
			return nil, err
		}
	}
	var id *identity
	var cred *syscall.Credential
	if req.UID != nil {
		id = lookupIdentity(*req.UID, req.GID)
		cred = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
	}
	p := &prepared{req: req}
	p.spec = process.Spec{Dir: dir, Env: s.env.build(req.Envs, id), Cred: cred}
	p.spec.Path, p.spec.Args, p.err = commandLine(req.Command, p.spec.Env)
	return p, nil
}

// runCommand serves POST /command.
func (s *Server) runCommand(w http.ResponseWriter, r *http.Request) error {
	var req api.RunCommandRequest
	if err := httpx.DecodeJSON(w, r, &req, 0, false); err != nil {
		return err
	}
	p, err := s.prepareCommand(req)
	if err != nil {
		return err
	}
	if req.Background {
		return s.startBackground(w, p)
	}
	return s.runForeground(w, r, p)
}

// startError is the stream's answer to a command that could not start.
func startError(err error) api.Event {
	return api.Event{Type: api.EventError, Error: &api.ExecutionError{
		EName: api.ErrorNameCommand, EValue: err.Error(), Traceback: []string{err.Error()},
	}}
}

// exitEvent is the terminal event for a command that ran: complete on
// success, else an error whose evalue is the exit code ("-1" for a signal).
func exitEvent(st process.ExitState, elapsed time.Duration) api.Event {
	if st.Success() {
		return api.Event{Type: api.EventComplete, ExecutionTime: elapsed.Milliseconds()}
	}
	return api.Event{Type: api.EventError, Error: &api.ExecutionError{
		EName: api.ErrorNameCommand, EValue: strconv.Itoa(st.Code), Traceback: []string{st.String()},
	}}
}

func stateError(st process.ExitState) string {
	if st.Success() {
		return ""
	}
	return st.String()
}

// newCommand returns the record of a command about to start.
func newCommand(p *prepared, background bool) *command {
	return &command{id: newID(), content: p.req.Command, background: background, startedAt: time.Now()}
}

// start starts c as p says and registers its record. A failure to start is
// recorded too (exit code 255), so status queries agree with the stream.
// A timeout kills the command's whole process group.
func (s *Server) start(c *command, p *prepared) error {
	err := p.err
	if err == nil {
		c.proc, err = s.sup.Start(p.spec)
	}
	if err != nil {
		c.finish(exitCodeStartFailure, err.Error())
	}
	s.commands.add(c)
	if err == nil && p.req.Timeout > 0 {
		t := time.AfterFunc(time.Duration(p.req.Timeout)*time.Millisecond, func() { c.proc.Signal(syscall.SIGKILL) })
		go func() {
			<-c.proc.Done()
			t.Stop()
		}()
	}
	return err
}

// runForeground runs a command and streams its output: init, a ping,
// stdout/stderr events one per line, then error or execution_complete.
// The stream ends as soon as the process has exited and the output it
// wrote is sent, even if a background grandchild still holds its pipes.
//
// If the client goes away, the command keeps running to completion (the
// reference daemon's behaviour, and what a client that lost its connection
// expects to find when it asks /command/status/{id}); its output is drained
// and dropped, so it never blocks on a full pipe. DELETE /command?id=
// stops it.
func (s *Server) runForeground(w http.ResponseWriter, r *http.Request, p *prepared) error {
	c := newCommand(p, false)
	ew := httpx.NewEventWriter(w)
	var pipes [2]*os.File // read ends: stdout, stderr
	if p.err == nil {
		outR, outW, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("create stdout pipe: %w", err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			outR.Close()
			outW.Close()
			return fmt.Errorf("create stderr pipe: %w", err)
		}
		p.spec.Stdout, p.spec.Stderr = outW, errW
		pipes = [2]*os.File{outR, errR}
	}
	err := s.start(c, p)
	if p.spec.Stdout != nil {
		// The child has its own copies of the write ends.
		p.spec.Stdout.Close()
		p.spec.Stderr.Close()
	}
	if err != nil {
		for _, f := range pipes {
			if f != nil {
				f.Close()
			}
		}
		ew.Send(api.Event{Type: api.EventInit, Text: c.id}, startError(err))
		return nil
	}

	st := newOutputStream()
	defer st.detach()
	for i, typ := range []string{api.EventStdout, api.EventStderr} {
		st.readLines(pipes[i], typ, c.proc.Done())
	}
	go func() {
		state := c.proc.State()
		c.finish(state.Code, stateError(state))
		st.readers.Wait()
		st.send(exitEvent(state, time.Since(c.startedAt)))
		st.close()
	}()

	if err := ew.Send(api.Event{Type: api.EventInit, Text: c.id}, pong()); err != nil {
		return nil
	}
	s.pump(r, ew, st)
	return nil
}

// pump copies a stream's events to the client, with keep-alive pings,
// until the stream ends or the client goes. Each round takes everything
// queued and writes it at once; while the client reads slowly the queue
// fills up to its budget and then holds the producers back.
func (s *Server) pump(r *http.Request, ew *httpx.EventWriter, st *outputStream) {
	tick := time.NewTicker(s.cfg.PingInterval)
	defer tick.Stop()
	var batches, spare [][]api.Event
	for {
		select {
		case <-st.ready:
			var ended bool
			batches, ended = st.take(spare)
			if len(batches) > 0 && ew.SendBatches(batches...) != nil {
				return
			}
			spare = batches
			if ended {
				return
			}
		case <-tick.C:
			if ew.Send(pong()) != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

func pong() api.Event { return api.Event{Type: api.EventPing, Text: "pong"} }

// startBackground starts a detached command whose combined output goes to
// a spool, and answers init then execution_complete at once.
func (s *Server) startBackground(w http.ResponseWriter, p *prepared) error {
	c := newCommand(p, true)
	var outR *os.File
	if p.err == nil {
		spool, err := s.spools.New()
		if err != nil {
			return err
		}
		pr, pw, err := os.Pipe()
		if err != nil {
			spool.Close()
			return fmt.Errorf("create output pipe: %w", err)
		}
		p.spec.Stdout, p.spec.Stderr = pw, pw
		c.spool, outR = spool, pr
	}
	ew := httpx.NewEventWriter(w)
	err := s.start(c, p)
	if p.spec.Stdout != nil {
		p.spec.Stdout.Close() // the child has its own copy
	}
	if err != nil {
		if outR != nil {
			outR.Close()
		}
		ew.Send(api.Event{Type: api.EventInit, Text: c.id}, startError(err))
		return nil
	}
	rd := process.NewReader(outR, func(b []byte) { c.spool.Write(b) }, 0, nil)
	// What a job the command left running ("server &") writes after the
	// command has exited still belongs in its log.
	rd.Tail = func(b []byte) { c.spool.Write(b) }
	go rd.Run()
	go func() {
		state := c.proc.State()
		rd.Finish()
		<-rd.Done()
		c.finish(state.Code, stateError(state))
		// What jobs it left write from now on may still be read, but
		// gives way first when the logs' budget is used up.
		c.spool.Done()
	}()
	ew.Send(api.Event{Type: api.EventInit, Text: c.id}, api.Event{Type: api.EventComplete})
	return nil
}

// commandStatusOrLogs serves GET /command/status/{id} and
// GET /command/{id}/logs.
func (s *Server) commandStatusOrLogs(w http.ResponseWriter, r *http.Request) error {
	a, b := r.PathValue("a"), r.PathValue("b")
	switch {
	case a == "status":
		return s.commandStatus(w, b)
	case b == "logs":
		// A log is read from a file: a turn of the file-system requests.
		if !s.takeFileOp(r) {
			return nil
		}
		defer s.releaseFileOp()
		return s.commandLogs(w, r, a)
	}
	http.NotFound(w, r)
	return nil
}

func (s *Server) commandStatus(w http.ResponseWriter, id string) error {
	c := s.commands.get(id)
	if c == nil {
		// The reference daemon answers 404 with this code.
		return httpx.Errorf(http.StatusNotFound, api.CodeInvalidRequestBody, "command not found: %s", id)
	}
	httpx.WriteJSON(w, http.StatusOK, c.status())
	return nil
}

// commandLogs answers a background command's output from the byte offset
// in ?cursor= to the current end, and the next cursor in a header.
func (s *Server) commandLogs(w http.ResponseWriter, r *http.Request, id string) error {
	c := s.commands.get(id)
	if c == nil {
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "command not found: %s", id)
	}
	if !c.background || c.spool == nil {
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "command %s is not running in background", id)
	}
	cursor, err := strconv.ParseInt(r.URL.Query().Get("cursor"), 10, 64)
	if err != nil || cursor < 0 {
		cursor = 0
	}
	// A cursor older than what the log keeps starts at its oldest byte.
	end := c.spool.Size()
	cursor = min(max(cursor, c.spool.Oldest()), end)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set(api.HeaderTailCursor, strconv.FormatInt(end, 10))
	w.Header().Set("Content-Length", strconv.FormatInt(end-cursor, 10))
	w.WriteHeader(http.StatusOK)
	if _, n, err := c.spool.WriteRange(w, cursor, end); err != nil && n < end-cursor {
		// Bytes gave way while being sent (newer output wrapped the
		// log, or the logs' budget took them): cut the connection so the
		// client sees an incomplete answer, never wrong bytes.
		s.log.Debug("command log gave way while being sent", "id", id, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// interrupt serves DELETE /command?id= and DELETE /code?id=: it
// interrupts the run in progress in a code context (which keeps its
// state), stops a running command, or closes a bash session.
func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return httpx.Errorf(http.StatusBadRequest, api.CodeMissingQuery, "missing query parameter id")
	}
	if s.interruptCode(id) {
		return nil
	}
	if c := s.commands.get(id); c != nil {
		if c.proc == nil || !c.status().Running {
			return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "command session %s is not running", id)
		}
		c.proc.Stop(interruptGrace)
		return nil
	}
	if s.sessions.remove(id) {
		return nil
	}
	return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "no such session: %s", id)
}
