package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// RunOptions adjusts a command. The zero value runs it in execd's working
// directory and environment, with no time limit, as the sandbox's user.
type RunOptions struct {
	// Cwd is the working directory; it must exist.
	Cwd string
	// Env adds to the sandbox's environment.
	Env map[string]string
	// Timeout kills the command (and its process group) after this long;
	// zero means no limit. Whole milliseconds are sent.
	Timeout time.Duration
	// UID and GID run the command as another user; HOME and USER follow.
	UID, GID *uint32

	// Stdout and Stderr receive the output as it arrives, each line with
	// its newline. When nil, output is collected in Execution.Stdout and
	// Execution.Stderr instead.
	Stdout, Stderr io.Writer
	// OnEvent, when set, sees every event (pings excepted) as it arrives.
	OnEvent func(api.Event)
}

// Execution is the outcome of a command, a session run or a code run.
type Execution struct {
	// ID is the execution's id: a command's id (for Interrupt and the
	// background routes), a session's or a code context's id.
	ID string
	// ExitCode is 0 on success and the process's exit status after a
	// non-zero exit. It is -1 when the process was killed by a signal
	// (Signal says which, when known) or could not start, and for a code
	// run that raised an error.
	ExitCode int
	// Error describes a failure: ename CommandExecError with the exit
	// code or start error for commands, the exception for code.
	Error *api.ExecutionError
	// Stdout and Stderr hold the output when RunOptions gave no writers.
	Stdout, Stderr string
	// Results are the values of a code run's result events, by MIME type
	// ("text" for text/plain, "image/png" base64, ...).
	Results []map[string]any
	// ExecutionCount is the interpreter's cell counter after a code run.
	ExecutionCount int
	// Elapsed is the execution time the sandbox reported, or the time
	// from start to end as seen by the client.
	Elapsed time.Duration
}

// OK reports whether the execution succeeded.
func (e *Execution) OK() bool { return e.Error == nil }

// Signal is the name of the signal that killed the process ("killed",
// "terminated", "segmentation fault", ...) when the sandbox said so; ""
// otherwise.
func (e *Execution) Signal() string {
	if e.Error == nil || e.ExitCode != -1 {
		return ""
	}
	for _, line := range e.Error.Traceback {
		_, rest, ok := strings.Cut(line, "signal: ")
		if !ok {
			continue
		}
		if i := strings.IndexAny(rest, ");"); i >= 0 {
			rest = rest[:i]
		}
		return strings.TrimSuffix(strings.TrimSpace(rest), " (core dumped")
	}
	return ""
}

// Stream is the live output of an execution. Next returns its events;
// the Execution is complete once Next has returned io.EOF. Close ends it
// early (the process keeps running; see Sandbox.Interrupt).
type Stream struct {
	body    io.ReadCloser
	dec     *api.EventDecoder
	res     Execution
	lines   bool // output events are lines without their newline
	code    bool // a code run: an error may be followed by the completion
	start   time.Time
	first   *api.Event // the init event, read ahead
	done    bool
	err     error
	stdout  bytes.Buffer
	stderr  bytes.Buffer
	collect bool
}

// openStream posts r and reads up to the init event, so that the
// execution's id is known before Next is first called.
func (s *Sandbox) openStream(ctx context.Context, r *request, lines, code bool) (*Stream, error) {
	r.streaming = true
	if r.header == nil {
		r.header = http.Header{}
	}
	r.header.Set("Accept", "text/event-stream")
	resp, err := s.c.t.do(ctx, r)
	if err != nil {
		return nil, err
	}
	st := &Stream{body: resp.Body, dec: api.NewEventDecoder(resp.Body), lines: lines, code: code, start: time.Now()}
	ev, err := st.read()
	if err != nil {
		st.Close()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%s: %w", r.op, err)
	}
	st.first = &ev
	return st, nil
}

// read returns the next event that is not a ping, turning a bare error
// line into an error event.
func (st *Stream) read() (api.Event, error) {
	for {
		ev, err := st.dec.Next()
		var se *api.StreamError
		if errors.As(err, &se) {
			return api.Event{Type: api.EventError, Error: &api.ExecutionError{EName: se.Code, EValue: se.Message, Traceback: []string{se.Message}}}, nil
		}
		if err != nil {
			return ev, err
		}
		if ev.Type == api.EventPing {
			continue
		}
		if ev.Type == api.EventInit && st.res.ID == "" {
			st.res.ID = ev.Text
		}
		return ev, nil
	}
}

// ID is the execution's id, known as soon as the stream is open.
func (st *Stream) ID() string { return st.res.ID }

// Next returns the next event, pings left out, and io.EOF after the
// execution's last event. Output and results are accounted in the
// Execution as they pass.
func (st *Stream) Next() (api.Event, error) {
	if st.err != nil {
		return api.Event{}, st.err
	}
	if st.done {
		return api.Event{}, io.EOF
	}
	var ev api.Event
	var err error
	if st.first != nil {
		ev, st.first = *st.first, nil
	} else {
		ev, err = st.read()
	}
	if err == io.EOF {
		st.finish()
		return api.Event{}, io.EOF
	}
	if err != nil {
		st.err = err
		st.body.Close()
		return api.Event{}, err
	}
	st.account(ev)
	return ev, nil
}

// account folds an event into the Execution and ends the stream at the
// terminal event.
func (st *Stream) account(ev api.Event) {
	switch ev.Type {
	case api.EventStdout:
		if st.collect {
			st.stdout.WriteString(st.text(ev))
		}
	case api.EventStderr:
		if st.collect {
			st.stderr.WriteString(st.text(ev))
		}
	case api.EventExecutionCount:
		st.res.ExecutionCount = ev.ExecutionCount
	case api.EventResult:
		st.res.Results = append(st.res.Results, ev.Results)
	case api.EventError:
		st.res.Error = ev.Error
		st.res.ExitCode = -1
		if ev.Error != nil && ev.Error.EName == api.ErrorNameCommand {
			if code, err := strconv.Atoi(ev.Error.EValue); err == nil {
				st.res.ExitCode = code
			}
		}
		if !st.code {
			st.done = true
		}
	case api.EventComplete:
		st.res.Elapsed = time.Duration(ev.ExecutionTime) * time.Millisecond
		st.done = true
	}
	if st.done {
		st.finish()
	}
}

// text is an output event's text as bytes of output: a line event gets
// its newline back.
func (st *Stream) text(ev api.Event) string {
	if !st.lines || ev.Text == "\n" || strings.HasSuffix(ev.Text, "\n") {
		return ev.Text
	}
	return ev.Text + "\n"
}

func (st *Stream) finish() {
	st.done = true
	if st.res.Elapsed == 0 {
		st.res.Elapsed = time.Since(st.start)
	}
	st.body.Close()
}

// Result is the Execution; complete once Next has returned io.EOF.
func (st *Stream) Result() *Execution {
	res := st.res
	if st.collect {
		res.Stdout, res.Stderr = st.stdout.String(), st.stderr.String()
	}
	return &res
}

// Close ends the stream. The execution goes on in the sandbox.
func (st *Stream) Close() error {
	st.done = true
	return st.body.Close()
}

// drain reads the stream to its end, sending output to the writers of
// opts (or collecting it) and events to opts.OnEvent.
func (st *Stream) drain(stdout, stderr io.Writer, onEvent func(api.Event)) (*Execution, error) {
	st.collect = stdout == nil && stderr == nil
	for {
		ev, err := st.Next()
		if err == io.EOF {
			return st.Result(), nil
		}
		if err != nil {
			return st.Result(), err
		}
		if onEvent != nil {
			onEvent(ev)
		}
		var w io.Writer
		switch ev.Type {
		case api.EventStdout:
			w = stdout
		case api.EventStderr:
			w = stderr
		}
		if w != nil {
			if _, err := io.WriteString(w, st.text(ev)); err != nil {
				st.Close()
				return st.Result(), fmt.Errorf("write output: %w", err)
			}
		}
	}
}

func (o *RunOptions) request(command string, background bool) api.RunCommandRequest {
	req := api.RunCommandRequest{Command: command, Background: background}
	if o != nil {
		req.Cwd, req.Envs, req.UID, req.GID = o.Cwd, o.Env, o.UID, o.GID
		req.Timeout = o.Timeout.Milliseconds()
	}
	return req
}

// Stream starts a command and returns its live output. The command runs
// through the sandbox's shell (sh -c), so it may use pipes and
// redirections; quote arguments with ShellQuote.
func (s *Sandbox) Stream(ctx context.Context, command string, opts *RunOptions) (*Stream, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r, err := tg.jsonReq("run command in sandbox "+s.ID, http.MethodPost, "/command", nil, opts.request(command, false))
	if err != nil {
		return nil, err
	}
	st, err := s.openStream(ctx, r, true, false)
	if err != nil {
		return nil, err
	}
	st.collect = opts == nil || (opts.Stdout == nil && opts.Stderr == nil)
	return st, nil
}

// Run runs a command to its end. A command that fails is not an error:
// see Execution.ExitCode and Execution.Error. The error is for a command
// that could not be run or followed (sandbox gone, connection lost, ctx
// done). Output goes to opts.Stdout and opts.Stderr, or is collected.
func (s *Sandbox) Run(ctx context.Context, command string, opts *RunOptions) (*Execution, error) {
	st, err := s.Stream(ctx, command, opts)
	if err != nil {
		return nil, err
	}
	var stdout, stderr io.Writer
	var onEvent func(api.Event)
	if opts != nil {
		stdout, stderr, onEvent = opts.Stdout, opts.Stderr, opts.OnEvent
	}
	return st.drain(stdout, stderr, onEvent)
}

// RunBackground starts a command detached from the request and returns
// its id at once; follow it with CommandStatus, CommandLogs or
// FollowLogs, stop it with Interrupt. Output writers in opts are unused.
func (s *Sandbox) RunBackground(ctx context.Context, command string, opts *RunOptions) (string, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return "", err
	}
	r, err := tg.jsonReq("start command in sandbox "+s.ID, http.MethodPost, "/command", nil, opts.request(command, true))
	if err != nil {
		return "", err
	}
	st, err := s.openStream(ctx, r, true, false)
	if err != nil {
		return "", err
	}
	defer st.Close()
	if st.ID() == "" {
		return "", fmt.Errorf("start command in sandbox %s: the stream named no command id", s.ID)
	}
	// A start failure arrives as the event after init.
	if ev, err := st.Next(); err == nil && ev.Type == api.EventInit {
		if ev, err := st.Next(); err == nil && ev.Type == api.EventError && ev.Error != nil {
			return st.ID(), fmt.Errorf("start command in sandbox %s: %s", s.ID, ev.Error.EValue)
		}
	}
	return st.ID(), nil
}

// CommandStatus returns the state of a command by id.
func (s *Sandbox) CommandStatus(ctx context.Context, id string) (*api.CommandStatus, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("get status of command "+id, http.MethodGet, "/command/status/"+url.PathEscape(id), nil)
	r.idempotent = true
	var out api.CommandStatus
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CommandLogs returns a background command's output (stdout and stderr
// as they were interleaved) from byte offset cursor, and the cursor to
// ask from next time.
func (s *Sandbox) CommandLogs(ctx context.Context, id string, cursor int64) ([]byte, int64, error) {
	var buf bytes.Buffer
	next, err := s.CommandLogsTo(ctx, id, cursor, &buf)
	if err != nil {
		return nil, cursor, err
	}
	return buf.Bytes(), next, nil
}

// CommandLogsTo is CommandLogs writing the output to w as it arrives,
// so that a log of any size never has to fit in memory.
func (s *Sandbox) CommandLogsTo(ctx context.Context, id string, cursor int64, w io.Writer) (int64, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return cursor, err
	}
	q := url.Values{"cursor": {strconv.FormatInt(cursor, 10)}}
	r := tg.req("get logs of command "+id, http.MethodGet, "/command/"+url.PathEscape(id)+"/logs", q)
	r.idempotent = true
	resp, err := s.c.t.do(ctx, r)
	if err != nil {
		return cursor, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return cursor, fmt.Errorf("get logs of command %s: %w", id, err)
	}
	next := cursor + n
	if h := resp.Header.Get(api.HeaderTailCursor); h != "" {
		if n, err := strconv.ParseInt(h, 10, 64); err == nil {
			next = n
		}
	}
	return next, nil
}

// FollowLogs writes a background command's output to w as it is
// produced, polling every interval (default 200 ms), until the command
// has ended and all its output is written; it returns the final status.
func (s *Sandbox) FollowLogs(ctx context.Context, id string, w io.Writer, interval time.Duration) (*api.CommandStatus, error) {
	if interval <= 0 {
		interval = 200 * time.Millisecond
	}
	var cursor int64
	for {
		// Status first: output written before the command ended is then
		// certain to be in the logs read after it.
		st, err := s.CommandStatus(ctx, id)
		if err != nil {
			return nil, err
		}
		data, next, err := s.CommandLogs(ctx, id, cursor)
		if err != nil {
			return nil, err
		}
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return nil, fmt.Errorf("write logs: %w", err)
			}
		}
		cursor = next
		if !st.Running {
			return st, nil
		}
		if len(data) == 0 {
			if err := sleep(ctx, interval); err != nil {
				return nil, err
			}
		}
	}
}

// Interrupt stops a running command (or code execution) by id: SIGTERM
// to its process group, SIGKILL if it lingers. Its stream ends with an
// error whose exit code is -1.
func (s *Sandbox) Interrupt(ctx context.Context, id string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("interrupt "+id, http.MethodDelete, "/command", url.Values{"id": {id}})
	return s.c.t.call(ctx, r, nil)
}

// ShellQuote quotes words for the sandbox's shell so that each stays one
// argument, exactly as written: safe words stay bare, others are put in
// single quotes.
func ShellQuote(words ...string) string {
	var b strings.Builder
	for i, w := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quoteWord(w))
	}
	return b.String()
}

func quoteWord(w string) string {
	if w == "" {
		return "''"
	}
	safe := true
	for _, c := range w {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_@%+=:,./-", c)) {
			safe = false
			break
		}
	}
	if safe {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'"'"'`) + "'"
}
