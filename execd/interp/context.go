// Package interp runs the code contexts of execd's /code routes: one
// long-lived interpreter process per context, running a small driver
// program written in the context's language and embedded in execd. The
// driver executes the code it is sent in one namespace that lives as long
// as the context, and reports results, rich output and errors on a private
// pipe; execd turns them into the stream events the clients expect.
//
// No Jupyter server or kernel is involved: a context costs one interpreter
// process and starts in tens of milliseconds.
package interp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
)

// Defaults of Options.
const (
	// DefaultStartTimeout bounds the wait for a new driver's ready message.
	// An interpreter that loads in a fraction of a second alone can take
	// ten or more while a sandbox's CPU is shared with other contexts.
	DefaultStartTimeout = 30 * time.Second
	// KillGrace is how long a run that timed out has to stop after its
	// interrupt before the context's processes are killed.
	KillGrace = 2 * time.Second
)

// Error names of the error events a run ends with when the context itself
// fails, beside the language's own exceptions.
const (
	// ENameContextDied: the interpreter exited during the run; the context
	// is gone.
	ENameContextDied = "ContextDied"
	// ENameTimeout: the run passed its timeout and was interrupted.
	ENameTimeout = "TimeoutError"
)

// Options says how to start a context.
type Options struct {
	// Language is one of Languages().
	Language string
	// Dir is the working directory of the interpreter; it must exist.
	Dir string
	// Env is the interpreter's environment; the language's own variables
	// (MPLBACKEND for python) are added.
	Env []string
	// Supervisor starts and reaps the interpreter.
	Supervisor *process.Supervisor
	// DriverDir is a private directory where driver sources are written.
	DriverDir string
	// StartTimeout bounds the wait for the driver to be ready. Default
	// DefaultStartTimeout, or longer for a language that starts slowly.
	StartTimeout time.Duration
}

// StartError reports a driver that did not become ready, with what it
// wrote to stderr meanwhile.
type StartError struct {
	Language string
	Reason   string
	Stderr   string
}

func (e *StartError) Error() string {
	msg := "start " + e.Language + " interpreter: " + e.Reason
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

// Context is one running interpreter with its state.
type Context struct {
	lang *language
	proc *process.Process

	requests   *os.File // fd 3 of the driver, our write end
	interrupts *os.File // fd 5 of the driver, our write end (byPipe only)
	stdout     *process.Reader
	stderr     *process.Reader
	replies    chan reply // closed at EOF of fd 4
	version    string

	queue fifo // one run at a time, in arrival order

	// outMu is held while output goes to the current run, and while the
	// run's sink is set or cleared: once Run has cleared it, no output of
	// the driver reaches the finished run. It guards emit, partial and
	// startErr.
	outMu    sync.Mutex
	emit     func(...api.Event) // the current run's sink; nil between runs
	partial  [2][]byte          // stdout, stderr: an incomplete UTF-8 sequence held back
	startErr bytes.Buffer

	mu       sync.Mutex
	starting bool // before ready: stderr goes to startErr
	running  bool // a run has been sent and its done not received
	// started is set when the driver said the run began; an interrupt
	// asked for before that waits in pendingInterrupt.
	started          bool
	pendingInterrupt bool
	closed           bool

	nextRun uint64
	runID   string // the run in progress; guarded by mu
}

// currentRun returns the id of the run in progress, "" between runs.
func (c *Context) currentRun() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return ""
	}
	return c.runID
}

// maxStartStderr bounds the stderr kept to explain a failed start.
const maxStartStderr = 4 << 10

// Start starts a context's interpreter and waits until its driver is ready.
func Start(ctx context.Context, opts Options) (_ *Context, retErr error) {
	lang, ok := lookupLanguage(opts.Language)
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownLanguage, opts.Language)
	}
	env, path := lang.environ(opts.Env)
	interpreter, err := lang.findInterpreter(path)
	if err != nil {
		return nil, err
	}
	driver, err := lang.driverPath(opts.DriverDir)
	if err != nil {
		return nil, err
	}
	if lang.prepare != nil {
		if driver, err = lang.prepare(ctx, opts.Supervisor, interpreter, driver, env); err != nil {
			return nil, &StartError{Language: lang.name, Reason: err.Error()}
		}
	}

	var closers []*os.File
	defer func() {
		for _, f := range closers {
			f.Close()
		}
	}()
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			closers = append(closers, r, w)
		}
		return r, w, err
	}
	var fds [5][2]*os.File // stdout, stderr, requests, replies, interrupts
	n := 4
	if lang.interrupt == byPipe {
		n = 5
	}
	for i := range n {
		if fds[i][0], fds[i][1], err = pipe(); err != nil {
			return nil, fmt.Errorf("create driver pipes: %w", err)
		}
	}
	path, args := interpreter, lang.args(driver)
	if lang.native {
		path, args = driver, lang.args(interpreter)
	}
	spec := process.Spec{
		Path:   path,
		Args:   append([]string{path}, args...),
		Dir:    opts.Dir,
		Env:    env,
		Stdout: fds[0][1],
		Stderr: fds[1][1],
		// The child's ends: requests are read, replies written,
		// interrupts read.
		ExtraFiles: []*os.File{fds[2][0], fds[3][1], fds[4][0]},
	}
	proc, err := opts.Supervisor.Start(spec)
	if err != nil {
		return nil, fmt.Errorf("start %s interpreter: %w", lang.name, err)
	}
	// The child has its own copies of its ends; ours must go now, or the
	// replies pipe would never see EOF if the driver died.
	for _, f := range []*os.File{fds[0][1], fds[1][1], fds[2][0], fds[3][1], fds[4][0]} {
		if f != nil {
			f.Close()
		}
	}
	closers = nil
	c := &Context{
		lang:       lang,
		proc:       proc,
		requests:   fds[2][1],
		interrupts: fds[4][1],
		// One parsed reply may be megabytes: while the run hands the last
		// one to a slow client, the next waits in the pipe, not here.
		replies:  make(chan reply, 1),
		starting: true,
	}
	c.stdout = process.NewReader(fds[0][0], func(b []byte) { c.output(api.EventStdout, b) }, 0, nil)
	c.stderr = process.NewReader(fds[1][0], func(b []byte) { c.output(api.EventStderr, b) }, 0, nil)
	go c.stdout.Run()
	go c.stderr.Run()
	go c.readReplies(fds[3][0])
	go func() {
		// The context is gone with its driver: what the code left running
		// in its process group goes too (and with it any copy of the
		// replies pipe a forked child held). Its output pipes may still be
		// held by processes that left the group; nothing more is waited
		// for.
		<-proc.Done()
		proc.Signal(syscall.SIGKILL)
		c.stdout.Finish()
		c.stderr.Finish()
	}()
	defer func() {
		if retErr != nil {
			c.kill()
		}
	}()

	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = max(DefaultStartTimeout, lang.startTimeout)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case m, ok := <-c.replies:
		switch {
		case !ok:
			return nil, c.startError("the interpreter exited before it was ready")
		case m.Type != replyReady:
			return nil, c.startError("the driver sent " + strconv.Quote(m.Type) + " before ready")
		}
		c.version = m.Version
	case <-timer.C:
		return nil, c.startError("no ready message within " + timeout.String())
	case <-ctx.Done():
		return nil, fmt.Errorf("start %s interpreter: %w", lang.name, ctx.Err())
	}
	c.mu.Lock()
	c.starting = false
	c.mu.Unlock()
	c.outMu.Lock()
	c.startErr = bytes.Buffer{}
	c.outMu.Unlock()
	return c, nil
}

// startError describes a failed start: the reason, how the process ended
// if it did, and what it wrote to stderr.
func (c *Context) startError(reason string) error {
	select {
	case <-c.proc.Done():
		reason += " (" + c.proc.State().String() + ")"
	case <-time.After(100 * time.Millisecond):
	}
	c.stderr.Sync()
	c.outMu.Lock()
	defer c.outMu.Unlock()
	return &StartError{Language: c.lang.name, Reason: reason, Stderr: string(bytes.TrimSpace(c.startErr.Bytes()))}
}

// Version returns the interpreter's version, as its driver reported it.
func (c *Context) Version() string { return c.version }

// Done is closed when the interpreter has exited.
func (c *Context) Done() <-chan struct{} { return c.proc.Done() }

// output takes a chunk of the driver's stdout or stderr: it goes to the
// current run as it is (chunks are not cut into lines, as from a Jupyter
// kernel), except that a UTF-8 sequence cut by the end of the chunk waits
// for the rest; before ready, stderr is kept to explain a failed start;
// between runs it is dropped (a thread the code left running has no
// reader).
func (c *Context) output(typ string, b []byte) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	if c.emit == nil {
		c.mu.Lock()
		starting := c.starting
		c.mu.Unlock()
		if starting && typ == api.EventStderr && c.startErr.Len() < maxStartStderr {
			c.startErr.Write(b[:min(len(b), maxStartStderr-c.startErr.Len())])
		}
		return
	}
	i := 0
	if typ == api.EventStderr {
		i = 1
	}
	if len(c.partial[i]) > 0 {
		b = append(c.partial[i], b...)
		c.partial[i] = nil
	}
	if n := incompleteTail(b); n > 0 {
		c.partial[i] = append([]byte(nil), b[len(b)-n:]...)
		b = b[:len(b)-n]
	}
	if len(b) > 0 {
		c.emit(api.Event{Type: typ, Text: string(b), Timestamp: nowMilli()})
	}
}

// flushPartial sends the bytes held back at the end of a run, whatever
// they are. c.outMu must be held.
func (c *Context) flushPartialLocked() {
	for i, typ := range []string{api.EventStdout, api.EventStderr} {
		if len(c.partial[i]) > 0 && c.emit != nil {
			c.emit(api.Event{Type: typ, Text: string(c.partial[i]), Timestamp: nowMilli()})
		}
		c.partial[i] = nil
	}
}

// incompleteTail returns the length of a UTF-8 sequence begun but not
// finished at the end of b (0 to 3 bytes).
func incompleteTail(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c&0xC0 == 0x80 {
			continue // a continuation byte: look further back
		}
		var need int
		switch {
		case c&0xE0 == 0xC0:
			need = 2
		case c&0xF0 == 0xE0:
			need = 3
		case c&0xF8 == 0xF0:
			need = 4
		default:
			return 0 // ASCII or invalid: nothing to wait for
		}
		if need > n {
			return n
		}
		return 0
	}
	return 0
}

// readReplies reads the driver's replies until EOF. A line that is not a
// valid reply is dropped: the driver is execd's own, so it is a bug, but
// never a reason to stall a run.
func (c *Context) readReplies(f *os.File) {
	defer close(c.replies)
	defer f.Close()
	var split lineSplitter
	split.max = maxReplyLine
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		split.write(buf[:n], func(line []byte) {
			if m, err := parseReply(line); err == nil {
				c.replies <- m
			}
		}, func(error) {
			// The id is in the line that was dropped: the run in progress
			// is the one it belonged to.
			if id := c.currentRun(); id != "" {
				c.replies <- reply{Type: replyOverflow, ID: id}
			}
		})
		if err != nil {
			return
		}
	}
}

// Run executes code in the context and hands its events to emit as they
// come: stdout and stderr chunks, execution_count and result, and on
// failure status and error. It returns when the run is over; the caller
// sends the terminal execution_complete. A timeout > 0 interrupts the run
// at its deadline, and kills the context if the run has not ended
// KillGrace later.
//
// Runs of one context happen one at a time, in the order they were asked
// for. A run still waiting for its turn when ctx ends is dropped and Run
// returns ctx's error; once started, a run goes on even if ctx ends (the
// code may change state that later runs rely on; Interrupt stops it).
func (c *Context) Run(ctx context.Context, code string, timeout time.Duration, emit func(...api.Event)) error {
	if err := c.queue.lock(ctx); err != nil {
		return err
	}
	defer c.queue.unlock()

	c.mu.Lock()
	if c.closed || c.proc.Exited() {
		c.mu.Unlock()
		emit(c.deathEvents()...)
		return nil
	}
	c.nextRun++
	// The code runs in the driver's process and could write on its reply
	// pipe; an id it cannot guess keeps a stray line from ending a run.
	id := strconv.FormatUint(c.nextRun, 10) + "-" + randomHex()
	c.runID = id
	c.running, c.started, c.pendingInterrupt = true, false, false
	c.mu.Unlock()
	c.outMu.Lock()
	c.emit = emit
	c.outMu.Unlock()
	defer func() {
		// The last output is in; from now on none reaches this run.
		c.syncOutput()
		c.outMu.Lock()
		c.flushPartialLocked()
		c.emit = nil
		c.outMu.Unlock()
		c.mu.Lock()
		c.running, c.started, c.pendingInterrupt = false, false, false
		c.mu.Unlock()
	}()

	req, err := json.Marshal(struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		Code string `json:"code"`
	}{"execute", id, code})
	if err == nil {
		_, err = c.requests.Write(append(req, '\n'))
	}
	if err != nil {
		// The driver no longer reads its requests: it is dying.
		c.kill()
		c.syncOutput()
		emit(c.deathEvents()...)
		return nil
	}

	var deadline, kill, died <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	exited := c.proc.Done()
	timedOut := false
	for {
		select {
		case m, ok := <-c.replies:
			if !ok {
				// The driver is gone; what it wrote before is in the pipes.
				<-c.proc.Done()
				c.syncOutput()
				emit(c.deathEvents()...)
				return nil
			}
			if m.ID != id {
				continue // a stale reply: never another run's
			}
			switch m.Type {
			case replyStarted:
				c.mu.Lock()
				c.started = true
				pending := c.pendingInterrupt
				c.pendingInterrupt = false
				c.mu.Unlock()
				if pending {
					c.interrupt()
				}
				continue
			case replyOverflow:
				now := nowMilli()
				emit(api.Event{Type: api.EventStderr, Timestamp: now,
					Text: fmt.Sprintf("[execd: a result of more than %d MiB was dropped]\n", maxReplyLine>>20)})
				continue
			}
			// Output written before the reply goes out before it.
			c.syncOutput()
			if m.Type == replyDone {
				return nil
			}
			if timedOut && m.Type == replyError {
				m = reply{Type: replyError, ID: id, EName: ENameTimeout,
					EValue:    fmt.Sprintf("the run did not finish within %v and was interrupted", timeout),
					Traceback: m.Traceback}
			}
			emit(m.events(nowMilli())...)
		case <-exited:
			// The driver exited. Its replies end when the last copy of the
			// pipe closes: at once, unless a process it forked holds one;
			// the watcher in Start kills the group, so give that a moment.
			exited = nil
			died = time.After(time.Second)
		case <-died:
			c.syncOutput()
			emit(c.deathEvents()...)
			return nil
		case <-deadline:
			timedOut = true
			c.requestInterrupt()
			kill = time.After(KillGrace)
		case <-kill:
			c.kill()
			<-c.proc.Done()
			c.syncOutput()
			now := nowMilli()
			emit(api.Event{Type: api.EventStatus, Text: "error", Timestamp: now},
				api.Event{Type: api.EventError, Timestamp: now, Error: &api.ExecutionError{
					EName: ENameTimeout,
					EValue: fmt.Sprintf("the run did not finish within %v and did not stop when interrupted; the %s interpreter was killed and the context's state is lost",
						timeout, c.lang.name),
					Traceback: []string{},
				}})
			return nil
		}
	}
}

// syncOutput waits until everything the driver wrote so far to stdout and
// stderr has been handed to the run.
func (c *Context) syncOutput() {
	c.stdout.Sync()
	c.stderr.Sync()
}

// deathEvents are the events of a run in a context whose interpreter has
// exited.
func (c *Context) deathEvents() []api.Event {
	now := nowMilli()
	return []api.Event{
		{Type: api.EventStatus, Text: "error", Timestamp: now},
		{Type: api.EventError, Timestamp: now, Error: &api.ExecutionError{
			EName:     ENameContextDied,
			EValue:    c.DeathReason(),
			Traceback: []string{},
		}},
	}
}

// DeathReason says how the interpreter ended: "the python interpreter
// exited with status 1", "... was killed by signal: killed". It is only
// meaningful once Done is closed.
func (c *Context) DeathReason() string {
	st := c.proc.State()
	if st.Code == -1 && st.Signal != 0 {
		return fmt.Sprintf("the %s interpreter was killed (%s); the context is gone", c.lang.name, st)
	}
	return fmt.Sprintf("the %s interpreter exited (%s); the context is gone", c.lang.name, st)
}

// Interrupt stops the code running in the context, if any: the run ends
// with the language's interrupt error and the context keeps its state.
// It reports whether a run was in progress.
func (c *Context) Interrupt() bool {
	return c.requestInterrupt()
}

// requestInterrupt interrupts the run in progress, or, when the driver has
// not yet said it started, as soon as it does. It reports whether a run
// was in progress.
func (c *Context) requestInterrupt() bool {
	c.mu.Lock()
	running, started := c.running, c.started
	if running && !started {
		c.pendingInterrupt = true
	}
	c.mu.Unlock()
	if running && started {
		c.interrupt()
	}
	return running
}

func (c *Context) interrupt() {
	switch c.lang.interrupt {
	case byPipe:
		c.interrupts.Write([]byte{'\n'})
	default:
		// To the interpreter's main thread, as a Jupyter kernel is
		// interrupted: a signal sent to the process may be taken by any
		// of its threads, and then the main thread's blocking call
		// (time.sleep, a read) is not broken off until it returns.
		// Children the code waits for are stopped by the code's own
		// unwinding (subprocess.run kills its child on KeyboardInterrupt).
		pid := c.proc.Pid()
		if err := syscall.Tgkill(pid, pid, syscall.SIGINT); err != nil {
			c.proc.Signal(syscall.SIGINT)
		}
	}
}

// Close ends the context: its driver is asked to exit, and it and
// everything the code started are killed if it has not after a short
// grace. A run in progress ends as if the context had died. Close returns
// when the interpreter has exited.
func (c *Context) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.proc.Done()
		return
	}
	c.closed = true
	running := c.running
	c.mu.Unlock()
	if running {
		c.kill()
		return
	}
	c.requests.Close()
	select {
	case <-c.proc.Done():
		c.proc.Signal(syscall.SIGKILL) // what the code left behind
	case <-time.After(500 * time.Millisecond):
		c.kill()
	}
	if c.interrupts != nil {
		c.interrupts.Close()
	}
}

// kill kills the interpreter's process group and waits for it to exit.
func (c *Context) kill() {
	c.proc.Signal(syscall.SIGKILL)
	<-c.proc.Done()
	c.requests.Close()
	if c.interrupts != nil {
		c.interrupts.Close()
	}
}

// randomHex returns 16 random hex digits.
func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fifo is a lock granted in the order it was asked for.
type fifo struct {
	mu      sync.Mutex
	held    bool
	waiters []chan struct{}
}

// lock takes the lock, or gives up when ctx ends first.
func (q *fifo) lock(ctx context.Context) error {
	q.mu.Lock()
	if !q.held {
		q.held = true
		q.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	q.waiters = append(q.waiters, ch)
	q.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		q.mu.Lock()
		for i, w := range q.waiters {
			if w == ch {
				q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
				q.mu.Unlock()
				return ctx.Err()
			}
		}
		q.mu.Unlock()
		// Granted while giving up: pass it on.
		q.unlock()
		return ctx.Err()
	}
}

// unlock hands the lock to the longest waiter, or frees it.
func (q *fifo) unlock() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) == 0 {
		q.held = false
		return
	}
	ch := q.waiters[0]
	q.waiters = q.waiters[1:]
	close(ch)
}
