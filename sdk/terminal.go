package sdk

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
)

// TerminalOptions describes a terminal to open.
type TerminalOptions struct {
	// Command runs instead of an interactive bash (bash -c COMMAND).
	Command string
	// Cwd is the working directory.
	Cwd string
	// Cols and Rows set the window size at once; zero keeps 80x24.
	Cols, Rows int
	// Pipe runs the process with plain pipes instead of a pseudo-terminal:
	// stderr is then kept apart (see Terminal.Stderr) and there is no
	// window size.
	Pipe bool
}

// ErrTakenOver is the error a Terminal's Read returns when another
// client attached to its session with takeover.
var ErrTakenOver = errors.New("terminal taken over by another client")

// Terminal is an interactive process in the sandbox on a pseudo-terminal:
// Write types, Read returns what the screen shows, until io.EOF when the
// process has exited (then Wait gives its exit code). Closing it detaches
// and leaves the process running; Kill ends it.
type Terminal struct {
	// ID is the terminal session's id, for AttachTerminal.
	ID string

	sb     *Sandbox
	conn   *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	out    *io.PipeReader
	errOut *io.PipeReader

	done     chan struct{}
	mu       sync.Mutex
	exitCode int
	exited   bool
	err      error
	received int64 // output bytes received, replay included
	start    int64 // output offset of the first byte received
}

// OpenTerminal starts a terminal session and attaches to it.
func (s *Sandbox) OpenTerminal(ctx context.Context, opts TerminalOptions) (*Terminal, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r, err := tg.jsonReq("open terminal in sandbox "+s.ID, http.MethodPost, "/pty", nil, api.CreatePTYRequest{Cwd: opts.Cwd, Command: opts.Command})
	if err != nil {
		return nil, err
	}
	var sess api.PTYSession
	if err := s.c.t.call(ctx, r, &sess); err != nil {
		return nil, err
	}
	t, err := s.attach(ctx, sess.SessionID, 0, false, opts.Pipe)
	if err != nil {
		s.killTerminal(context.WithoutCancel(ctx), sess.SessionID)
		return nil, err
	}
	if opts.Cols > 0 && opts.Rows > 0 && !opts.Pipe {
		if err := t.Resize(opts.Cols, opts.Rows); err != nil {
			t.Kill(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return t, nil
}

// AttachTerminal attaches to an existing terminal session. Output from
// byte offset since on is replayed first (what the session's buffer still
// holds); takeover evicts a client already attached.
func (s *Sandbox) AttachTerminal(ctx context.Context, id string, since int64, takeover bool) (*Terminal, error) {
	return s.attach(ctx, id, since, takeover, false)
}

// TerminalStatus returns whether a terminal session's process runs and
// how many bytes of output it has produced (the since for a reattach
// without repeats).
func (s *Sandbox) TerminalStatus(ctx context.Context, id string) (*api.PTYStatus, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("get terminal "+id, http.MethodGet, "/pty/"+url.PathEscape(id), nil)
	r.idempotent = true
	var out api.PTYStatus
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (s *Sandbox) killTerminal(ctx context.Context, id string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("kill terminal "+id, http.MethodDelete, "/pty/"+url.PathEscape(id), nil)
	r.idempotent = true
	return s.c.t.call(ctx, r, nil)
}

func (s *Sandbox) attach(ctx context.Context, id string, since int64, takeover, pipe bool) (*Terminal, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if since > 0 {
		q.Set("since", strconv.FormatInt(since, 10))
	}
	if takeover {
		q.Set("takeover", "1")
	}
	if pipe {
		q.Set("pty", "0")
	}
	u := tg.url("/pty/"+url.PathEscape(id)+"/ws", q)
	u = "ws" + strings.TrimPrefix(u, "http")
	dialCtx := ctx
	if s.c.t.timeout > 0 {
		var cancel context.CancelFunc
		dialCtx, cancel = context.WithTimeout(ctx, s.c.t.timeout)
		defer cancel()
	}
	header := tg.header.Clone()
	header.Set("User-Agent", s.c.t.userAgent)
	conn, resp, err := websocket.Dial(dialCtx, u, &websocket.DialOptions{HTTPClient: s.c.t.hc, HTTPHeader: header})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			return nil, errorFrom("attach terminal "+id, resp)
		}
		return nil, fmt.Errorf("attach terminal %s: %w", id, err)
	}
	conn.SetReadLimit(8 << 20) // a replay carries up to the session's whole buffer
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	out, outW := io.Pipe()
	errOut, errW := io.Pipe()
	t := &Terminal{ID: id, sb: s, conn: conn, ctx: tctx, cancel: cancel, out: out, errOut: errOut,
		done: make(chan struct{}), exitCode: -1, start: since}
	go t.readLoop(outW, errW)
	return t, nil
}

// readLoop turns frames into output until the connection ends.
func (t *Terminal) readLoop(out, errOut *io.PipeWriter) {
	err := t.readFrames(out, errOut)
	t.mu.Lock()
	if t.err == nil && !t.exited {
		t.err = err
	}
	end := t.err
	t.mu.Unlock()
	if end == nil {
		end = io.EOF
	}
	out.CloseWithError(end)
	errOut.CloseWithError(end)
	close(t.done)
	t.conn.CloseNow()
}

func (t *Terminal) readFrames(out, errOut *io.PipeWriter) error {
	for {
		typ, data, err := t.conn.Read(t.ctx)
		if err != nil {
			if websocket.CloseStatus(err) == 4001 {
				return ErrTakenOver
			}
			t.mu.Lock()
			exited := t.exited
			t.mu.Unlock()
			if exited || websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return nil
			}
			if t.ctx.Err() != nil {
				return io.ErrClosedPipe
			}
			return fmt.Errorf("terminal %s: %w", t.ID, err)
		}
		if typ == websocket.MessageText {
			var m api.PTYMessage
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			switch m.Type {
			case "exit":
				t.mu.Lock()
				t.exited = true
				if m.ExitCode != nil {
					t.exitCode = *m.ExitCode
				}
				t.mu.Unlock()
			case "error":
				if m.Code == "TAKEN_OVER" {
					return ErrTakenOver
				}
				return fmt.Errorf("terminal %s: %s (%s)", t.ID, m.Error, m.Code)
			}
			continue
		}
		if len(data) == 0 {
			continue
		}
		payload := data[1:]
		w := out
		switch data[0] {
		case api.PTYFrameStdout:
		case api.PTYFrameStderr:
			w = errOut
		case api.PTYFrameReplay:
			if len(payload) < 8 {
				continue
			}
			t.mu.Lock()
			t.start = int64(binary.BigEndian.Uint64(payload[:8]))
			t.mu.Unlock()
			payload = payload[8:]
		default:
			continue
		}
		t.mu.Lock()
		t.received += int64(len(payload))
		t.mu.Unlock()
		if _, err := w.Write(payload); err != nil {
			return nil // the reader went away
		}
	}
}

// Read reads output: the screen's bytes, stdout and stderr together on a
// pseudo-terminal. It returns io.EOF once the process has exited and its
// output is read.
func (t *Terminal) Read(p []byte) (int, error) { return t.out.Read(p) }

// Stderr is the process's standard error in pipe mode; empty on a
// pseudo-terminal. Read it concurrently with Read, as each holds up the
// other when not read.
func (t *Terminal) Stderr() io.Reader { return t.errOut }

// Write sends input, as typed keys.
func (t *Terminal) Write(p []byte) (int, error) {
	frame := make([]byte, 1+len(p))
	frame[0] = api.PTYFrameStdin
	copy(frame[1:], p)
	if err := t.conn.Write(t.ctx, websocket.MessageBinary, frame); err != nil {
		return 0, fmt.Errorf("terminal %s: %w", t.ID, err)
	}
	return len(p), nil
}

func (t *Terminal) send(m api.PTYMessage) error {
	b, _ := json.Marshal(m)
	if err := t.conn.Write(t.ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("terminal %s: %w", t.ID, err)
	}
	return nil
}

// Resize sets the window size.
func (t *Terminal) Resize(cols, rows int) error {
	if cols <= 0 || rows <= 0 {
		return fmt.Errorf("terminal %s: size %dx%d: both must be positive", t.ID, cols, rows)
	}
	return t.send(api.PTYMessage{Type: "resize", Cols: cols, Rows: rows})
}

// Signal sends a signal (SIGINT, SIGTERM, SIGKILL, SIGQUIT or SIGHUP) to
// the terminal's process group.
func (t *Terminal) Signal(sig string) error {
	return t.send(api.PTYMessage{Type: "signal", Signal: sig})
}

// Wait waits until the connection ends and returns the process's exit
// code. Output must be read (Read until io.EOF) for Wait to return. The
// error is for a terminal that ended without its process exiting: the
// connection was lost, taken over or closed.
func (t *Terminal) Wait() (int, error) {
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.exited {
		if t.err != nil {
			return -1, t.err
		}
		return -1, fmt.Errorf("terminal %s: closed before its process exited", t.ID)
	}
	return t.exitCode, nil
}

// Done is closed when the terminal's connection has ended: the process
// exited (Wait then returns its code), or the terminal was closed or lost.
func (t *Terminal) Done() <-chan struct{} { return t.done }

// Offset is the output offset just after the last byte received: the
// since to reattach with and miss nothing, repeat nothing.
func (t *Terminal) Offset() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.start + t.received
}

// Close detaches from the terminal; its process keeps running and can be
// attached to again.
func (t *Terminal) Close() error {
	err := t.conn.Close(websocket.StatusNormalClosure, "detach")
	t.cancel()
	t.out.Close()
	t.errOut.Close()
	return err
}

// Kill ends the terminal's process and its session.
func (t *Terminal) Kill(ctx context.Context) error {
	err := t.sb.killTerminal(ctx, t.ID)
	t.Close()
	return err
}
