package execd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// Terminal sessions (POST /pty and friends). A session is created empty;
// its shell starts on the first WebSocket attach, in the mode that attach
// asks for, and lives until it exits, is deleted, or is evicted. Its output
// goes to a replay ring, and to the attached client when there is one; see
// ptyws.go for the WebSocket side.

const (
	// ptyRingSize is how much output a session keeps for replay.
	ptyRingSize = 1 << 20
	// ptyCols and ptyRows are the size of a new terminal.
	ptyCols, ptyRows = 80, 24
	// ptyDrainGrace is how long output may keep arriving after the shell
	// exited before the session stops reading: leftover background jobs
	// can hold the terminal open for ever, and the kernel may still be
	// moving the shell's last bytes through the line discipline.
	ptyDrainGrace = 200 * time.Millisecond
	// ptyDeleteWait bounds how long DELETE waits for a killed shell to be
	// reaped.
	ptyDeleteWait = 5 * time.Second
)

// ptyTable holds the terminal sessions by id. Lock order: ptyTable.mu
// before ptySession.mu.
type ptyTable struct {
	mu       sync.Mutex
	sessions map[string]*ptySession
	// timings are read under mu when a client attaches; tests shorten them.
	timings ptyTimings
}

// ptyTimings are the WebSocket keep-alive and hand-over durations.
type ptyTimings struct {
	// pingInterval is the period of WebSocket pings to the client.
	pingInterval time.Duration
	// readTimeout ends a connection that has sent nothing, not even a
	// pong, for this long; it also bounds every write to the client.
	readTimeout time.Duration
	// takeoverWait is how long a takeover waits for the current client to
	// let go before it is cut off.
	takeoverWait time.Duration
	// stdinTimeout bounds one write to the shell's input, which blocks
	// while the shell reads nothing and the terminal's buffer is full.
	stdinTimeout time.Duration
}

func newPTYTable() *ptyTable {
	return &ptyTable{
		sessions: make(map[string]*ptySession),
		timings: ptyTimings{
			pingInterval: 30 * time.Second,
			readTimeout:  60 * time.Second,
			takeoverWait: 5 * time.Second,
			stdinTimeout: 10 * time.Second,
		},
	}
}

// currentTimings returns the timings for a new connection.
func (t *ptyTable) currentTimings() ptyTimings {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.timings
}

// get returns the session with id, or a 404 CONTEXT_NOT_FOUND error.
func (t *ptyTable) get(id string) (*ptySession, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if sess := t.sessions[id]; sess != nil {
		return sess, nil
	}
	return nil, httpx.Errorf(http.StatusNotFound, api.CodeContextNotFound, "pty session %s not found", id)
}

// remove takes the session with id out of the table and reports whether it
// was there.
func (t *ptyTable) remove(id string) (*ptySession, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sess := t.sessions[id]
	if sess == nil {
		return nil, false
	}
	delete(t.sessions, id)
	return sess, true
}

// evict kills and removes the sessions that have had no client for idle
// (a session whose shell never started counts from its creation), and
// removes the sessions whose shell has exited and that have had no client
// for exited since the exit. A duration <= 0 disables its rule.
func (t *ptyTable) evict(now time.Time, idle, exited time.Duration) {
	t.mu.Lock()
	var gone []*ptySession
	for id, sess := range t.sessions {
		if sess.expired(now, idle, exited) {
			delete(t.sessions, id)
			gone = append(gone, sess)
		}
	}
	t.mu.Unlock()
	for _, sess := range gone {
		sess.kill()
	}
}

// closeAll kills and removes every session. Attached clients receive the
// exit of their shell as usual.
func (t *ptyTable) closeAll() {
	t.mu.Lock()
	all := t.sessions
	t.sessions = make(map[string]*ptySession)
	t.mu.Unlock()
	for _, sess := range all {
		sess.kill()
	}
}

// ptySession is one terminal: a shell, its output ring, and at most one
// attached client.
type ptySession struct {
	id      string
	dir     string // working directory; empty: execd's
	command string // run with -c when set; empty: an interactive shell

	// stdinMu serializes writes to the shell's input, so that two clients
	// crossing during a takeover cannot interleave their bytes.
	stdinMu sync.Mutex

	mu      sync.Mutex
	started bool // the shell was started; pipe is fixed from then on
	pipe    bool // pipe mode: stdin, stdout and stderr are pipes
	proc    *process.Process
	// stdin is the shell's input: the terminal's master side, or the
	// write end of the stdin pipe. term is the master side in PTY mode,
	// for resizing. Both are closed and cleared once the shell has exited.
	stdin, term *os.File
	ring        *process.Ring // nil until started
	client      *ptyClient    // the attached client, or nil
	idleSince   time.Time     // when the last client left; creation before that
	exited      bool          // the shell exited and its output was read
	exitCode    int
	exitedAt    time.Time
	removed     bool // deleted or evicted: no new client may attach
}

// expired reports whether evict should remove the session now.
func (sess *ptySession) expired(now time.Time, idle, exited time.Duration) bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.client != nil {
		return false
	}
	if sess.exited && exited > 0 {
		since := sess.idleSince
		if sess.exitedAt.After(since) {
			since = sess.exitedAt
		}
		if now.Sub(since) >= exited {
			return true
		}
	}
	return idle > 0 && now.Sub(sess.idleSince) >= idle
}

// kill marks the session removed and sends SIGKILL to every process of the
// shell's session: its own group, the terminal's foreground job, and the
// background jobs, which an interactive shell puts in groups of their own.
// It returns the process, nil when the shell never started.
func (sess *ptySession) kill() *process.Process {
	sess.mu.Lock()
	sess.removed = true
	proc := sess.proc
	var targets []int
	if proc != nil && !proc.Exited() {
		// Once the shell is reaped, its group's number is only safe to
		// use while members hold it, which the session scan below checks
		// process by process.
		targets = sess.signalTargetsLocked()
	}
	sess.mu.Unlock()
	for _, pgid := range targets {
		process.SignalGroup(pgid, syscall.SIGKILL)
	}
	if proc != nil {
		// Background jobs of an interactive shell have groups of their
		// own; the session holds them all.
		process.SignalSession(proc.Pid(), syscall.SIGKILL)
	}
	return proc
}

// signalTargetsLocked returns the process groups a signal for the session
// goes to: the shell's own group and, in PTY mode, the terminal's
// foreground group. An interactive bash puts every job in a group of its
// own, so without the second a SIGINT would never reach the command that
// is running, which is what a user pressing ^C expects to stop.
func (sess *ptySession) signalTargetsLocked() []int {
	targets := []int{sess.proc.Pid()}
	if sess.term != nil {
		if fg, err := unix.IoctlGetInt(int(sess.term.Fd()), unix.TIOCGPGRP); err == nil && fg > 0 && fg != targets[0] {
			targets = append(targets, fg)
		}
	}
	return targets
}

// signal sends sig to the session (see signalTargetsLocked). Once the
// shell has exited it does nothing, as the group may be gone and its
// number reused.
func (sess *ptySession) signal(sig syscall.Signal) error {
	sess.mu.Lock()
	if sess.proc == nil || sess.proc.Exited() {
		sess.mu.Unlock()
		return nil
	}
	targets := sess.signalTargetsLocked()
	sess.mu.Unlock()
	for _, pgid := range targets {
		if err := process.SignalGroup(pgid, sig); err != nil {
			return fmt.Errorf("signal process group %d: %w", pgid, err)
		}
	}
	return nil
}

// status returns the GET /pty/{id} answer.
func (sess *ptySession) status() api.PTYStatus {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	st := api.PTYStatus{SessionID: sess.id, Running: sess.proc != nil && !sess.proc.Exited()}
	if sess.ring != nil {
		st.OutputOffset = sess.ring.Total()
	}
	return st
}

// attached reports whether a client holds the session.
func (sess *ptySession) attached() bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.client != nil
}

// detachGrace is how long an attach without takeover waits for the
// attached client to go: a client that has just closed its connection
// (detached to reattach) still holds the session until its close has been
// read, and its successor must not be refused for that.
const detachGrace = 500 * time.Millisecond

// freeWithin reports whether the session has no client, waiting up to d
// for the attached one to go.
func (sess *ptySession) freeWithin(d time.Duration) bool {
	sess.mu.Lock()
	c := sess.client
	sess.mu.Unlock()
	if c == nil {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.gone:
		return true
	case <-t.C:
		return !sess.attached()
	}
}

// createPTY serves POST /pty: it records a session whose shell starts on
// the first attach.
func (s *Server) createPTY(w http.ResponseWriter, r *http.Request) error {
	var req api.CreatePTYRequest
	if err := httpx.DecodeJSON(w, r, &req, 0, true); err != nil {
		return err
	}
	sess := &ptySession{id: newUUID(), command: req.Command, idleSince: time.Now()}
	if req.Cwd != "" {
		dir, err := s.resolveDir(req.Cwd)
		if err != nil {
			return err
		}
		sess.dir = dir
	}
	s.ptys.mu.Lock()
	s.ptys.sessions[sess.id] = sess
	s.ptys.mu.Unlock()
	httpx.WriteJSON(w, http.StatusCreated, api.PTYSession{SessionID: sess.id})
	return nil
}

// getPTY serves GET /pty/{id}.
func (s *Server) getPTY(w http.ResponseWriter, r *http.Request) error {
	sess, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, sess.status())
	return nil
}

// deletePTY serves DELETE /pty/{id}: it removes the session and SIGKILLs
// its shell, and answers once the shell has been reaped (or after
// ptyDeleteWait). An attached client receives the exit as usual.
func (s *Server) deletePTY(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	sess, ok := s.ptys.remove(id)
	if !ok {
		return httpx.Errorf(http.StatusNotFound, api.CodeContextNotFound, "pty session %s not found", id)
	}
	if proc := sess.kill(); proc != nil {
		t := time.NewTimer(ptyDeleteWait)
		defer t.Stop()
		select {
		case <-proc.Done():
		case <-t.C:
			s.log.Warn("killed pty shell has not exited", "session", id, "pid", proc.Pid())
		}
	}
	return nil
}

// startPTYLocked starts the session's shell in PTY or pipe mode, with
// readers feeding its output to the ring and the client, and a watcher
// that records the exit. The caller holds sess.mu.
func (s *Server) startPTYLocked(sess *ptySession, pipe bool) (retErr error) {
	env := s.env.build(nil, nil)
	if lookupEnv(env, "TERM") == "" {
		env = append(env, "TERM=xterm-256color")
	}
	path, args, err := ptyShell(env, sess.command)
	if err != nil {
		return err
	}
	spec := process.Spec{Path: path, Args: args, Dir: sess.dir, Env: env, Setsid: true}

	// childEnds are closed once the child has them (or on failure);
	// ours are closed on failure only.
	var childEnds, ours []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
		if retErr != nil {
			for _, f := range ours {
				f.Close()
			}
		}
	}()
	var stdin, term *os.File
	var outputs []*os.File // read ends, in frame kind order: stdout, stderr
	if pipe {
		inR, inW, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("create stdin pipe: %w", err)
		}
		childEnds, ours = append(childEnds, inR), append(ours, inW)
		outR, outW, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("create stdout pipe: %w", err)
		}
		childEnds, ours = append(childEnds, outW), append(ours, outR)
		errR, errW, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("create stderr pipe: %w", err)
		}
		childEnds, ours = append(childEnds, errW), append(ours, errR)
		spec.Stdin, spec.Stdout, spec.Stderr = inR, outW, errW
		stdin, outputs = inW, []*os.File{outR, errR}
	} else {
		master, reader, tty, err := openPTY()
		if err != nil {
			return err
		}
		childEnds, ours = append(childEnds, tty), append(ours, master, reader)
		spec.Stdin, spec.Stdout, spec.Stderr, spec.Ctty = tty, tty, tty, true
		stdin, term, outputs = master, master, []*os.File{reader}
	}

	proc, err := s.sup.Start(spec)
	if err != nil {
		return fmt.Errorf("start %s: %w", path, err)
	}
	sess.started, sess.pipe, sess.proc = true, pipe, proc
	sess.stdin, sess.term = stdin, term
	sess.ring = process.NewRing(ptyRingSize)
	readers := make([]*process.Reader, len(outputs))
	for i, f := range outputs {
		kind := api.PTYFrameStdout + byte(i)
		readers[i] = process.NewReader(f, func(p []byte) { sess.output(kind, p) }, 0, nil)
		go func() {
			if err := readers[i].Run(); err != nil {
				s.log.Debug("read pty output", "session", sess.id, "err", err)
			}
		}()
	}
	go sess.watch(readers)
	return nil
}

// openPTY opens a terminal pair sized ptyCols x ptyRows. It returns the
// master side twice, as two descriptors in non-blocking mode: one for
// input and resizing, one that the output reader owns and closes. tty is
// the child's side.
func openPTY() (master, reader, tty *os.File, retErr error) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open pty: %w", err)
	}
	defer ptmx.Close()
	defer func() {
		if retErr != nil {
			tty.Close()
		}
	}()
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: ptyCols, Rows: ptyRows}); err != nil {
		return nil, nil, nil, fmt.Errorf("size pty: %w", err)
	}
	// Fd (called by Setsize) left the descriptor blocking, where reads
	// ignore deadlines. Descriptors made by NewFile from a non-blocking
	// one stay non-blocking even when their Fd is taken.
	fd := ptmx.Fd()
	if err := syscall.SetNonblock(int(fd), true); err != nil {
		return nil, nil, nil, fmt.Errorf("set pty non-blocking: %w", err)
	}
	var dups [2]*os.File
	for i := range dups {
		nfd, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			if i == 1 {
				dups[0].Close()
			}
			return nil, nil, nil, fmt.Errorf("duplicate pty descriptor: %w", err)
		}
		dups[i] = os.NewFile(uintptr(nfd), "/dev/ptmx")
	}
	return dups[0], dups[1], tty, nil
}

// output records a chunk of the shell's output in the ring and hands it to
// the attached client, if any. The ring write and the look at the client
// share the lock an attach holds while it takes its replay and registers,
// so every byte is either in a client's replay or delivered to it live,
// never both and never neither. Delivery blocks while the client's queue
// is full (the terminal's flow control), but never without a client.
func (sess *ptySession) output(kind byte, p []byte) {
	sess.mu.Lock()
	sess.ring.Write(p)
	c := sess.client
	sess.mu.Unlock()
	if c != nil {
		c.send(kind, p)
	}
}

// watch waits for the shell to exit, lets the readers finish, records the
// exit and tells the attached client.
func (sess *ptySession) watch(readers []*process.Reader) {
	<-sess.proc.Done()
	ctx, cancel := context.WithTimeout(context.Background(), ptyDrainGrace)
	for _, r := range readers {
		select {
		case <-r.Done():
		case <-ctx.Done():
		}
	}
	cancel()
	for _, r := range readers {
		r.Finish()
		<-r.Done()
	}
	code := exitCode(sess.proc.State())
	sess.mu.Lock()
	sess.exited, sess.exitCode, sess.exitedAt = true, code, time.Now()
	sess.stdin.Close()
	sess.stdin, sess.term = nil, nil
	c := sess.client
	sess.mu.Unlock()
	if c != nil {
		c.sendExit(code)
	}
}

// exitCode turns an exit state into the exit message's exit_code: the
// status of a process that exited, 128+n for one killed by signal n. That
// is how shells report a signal in $?, and it keeps the code unambiguous
// (ExitState says -1 for every signal).
func exitCode(st process.ExitState) int {
	if st.Signal != 0 {
		return 128 + int(st.Signal)
	}
	return st.Code
}

// ptyShell returns the program and argv of a session's shell:
// bash --norc --noprofile [-c command], or sh [-c command] in an image
// without bash. It looks in the PATH of env, or defaultPath.
func ptyShell(env []string, command string) (path string, args []string, err error) {
	path, posix, err := findShell(env)
	if err != nil {
		return "", nil, err
	}
	args = []string{"bash", "--norc", "--noprofile"}
	if posix {
		args = []string{"sh"}
	}
	if command != "" {
		args = append(args, "-c", command)
	}
	return path, args, nil
}

// errPTYStdinClosed is returned for input to a shell that has exited.
var errPTYStdinClosed = errors.New("the shell has exited")

// writeStdin writes p to the shell's input, giving up after stdinTimeout.
func (sess *ptySession) writeStdin(p []byte, timeout time.Duration) error {
	if len(p) == 0 {
		return nil
	}
	sess.stdinMu.Lock()
	defer sess.stdinMu.Unlock()
	sess.mu.Lock()
	f := sess.stdin
	sess.mu.Unlock()
	if f == nil {
		return errPTYStdinClosed
	}
	f.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := f.Write(p); err != nil {
		return fmt.Errorf("write to shell input: %w", err)
	}
	return nil
}

// resize sets the terminal size. In pipe mode there is no terminal, and
// resizing does nothing.
func (sess *ptySession) resize(cols, rows int) error {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.term == nil {
		return nil
	}
	if err := pty.Setsize(sess.term, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	return nil
}
