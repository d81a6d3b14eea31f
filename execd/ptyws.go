package execd

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// The PTY WebSocket (GET /pty/{id}/ws). After the upgrade the server sends
// the replay, the connected message and then live output; the client sends
// input, resizes, signals and pings. One client holds a session at a time.

const (
	// ptyMaxPayload is the most bytes of output in one binary frame: the
	// frame, kind byte included, fits in 32 KiB, the default message limit
	// of common WebSocket clients.
	ptyMaxPayload = 32<<10 - 1
	// ptyMaxReplayPayload is the same for replay frames, which also carry
	// an 8-byte offset. A replay longer than that is sent as consecutive
	// replay frames, each with the offset of its first byte.
	ptyMaxReplayPayload = 32<<10 - 9
	// ptyMaxMessage bounds one message from the client.
	ptyMaxMessage = 1 << 20
	// ptyQueueLen is how many output frames may wait for a slow client
	// before the shell's output blocks.
	ptyQueueLen = 64

	// Close codes and reasons.
	closeTakenOver  websocket.StatusCode = 4001
	reasonExited                         = "process exited"
	reasonTakenOver                      = "TAKEN_OVER"
)

// WebSocket error codes, sent as {"type":"error","code":...}.
const (
	wsStartFailed      = "START_FAILED"
	wsStdinWriteFailed = "STDIN_WRITE_FAILED"
	wsInvalidFrame     = "INVALID_FRAME"
	wsAlreadyConnected = "ALREADY_CONNECTED"
	wsSessionGone      = "SESSION_GONE"
	wsTakenOver        = "TAKEN_OVER"
	wsRuntimeError     = "RUNTIME_ERROR"
)

// ptySignals are the signals a client may send.
var ptySignals = map[string]syscall.Signal{
	"SIGINT":  syscall.SIGINT,
	"SIGTERM": syscall.SIGTERM,
	"SIGKILL": syscall.SIGKILL,
	"SIGQUIT": syscall.SIGQUIT,
	"SIGHUP":  syscall.SIGHUP,
}

// attachPTY serves GET /pty/{id}/ws. Failures before the upgrade are plain
// JSON errors: 404 for an unknown session, 409 when another client holds
// it and takeover=1 is not given. Query: pty=0 for pipe mode (only
// meaningful on the attach that starts the shell), since=<offset> for the
// replay start (default 0), takeover=1.
func (s *Server) attachPTY(w http.ResponseWriter, r *http.Request) error {
	sess, err := s.ptys.get(r.PathValue("id"))
	if err != nil {
		return err
	}
	q := r.URL.Query()
	var since int64
	if v := q.Get("since"); v != "" {
		if since, err = strconv.ParseInt(v, 10, 64); err != nil {
			return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "since %q is not a byte offset", v)
		}
	}
	pipe := q.Get("pty") == "0" || q.Get("pty") == "false"
	takeover := q.Get("takeover") == "1"
	if !takeover && !sess.freeWithin(detachGrace) {
		return httpx.Errorf(http.StatusConflict, api.CodeAlreadyConnected, "pty session %s already has a client; use takeover=1", sess.id)
	}

	c := &ptyClient{
		sess: sess,
		t:    s.ptys.currentTimings(),
		out:  make(chan ptyItem, ptyQueueLen),
		kick: make(chan struct{}),
		gone: make(chan struct{}),
	}
	// The server's own timeouts must not end a long-lived connection; the
	// keep-alive below takes their place.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// With a token, the token is the gate: clients reach execd through
		// proxies under other names, so the origin proves nothing. Without
		// one, a page in a browser must not open a shell.
		InsecureSkipVerify: s.cfg.AccessToken != "",
		OnPongReceived:     func(context.Context, []byte) { c.touch() },
	})
	if err != nil {
		// Accept has answered the request.
		s.log.Debug("pty websocket upgrade", "session", sess.id, "err", err)
		return nil
	}
	c.conn = conn
	c.serve(s, since, pipe, takeover)
	return nil
}

// ptyClient is one WebSocket connection attached (or attaching) to a
// session.
type ptyClient struct {
	sess *ptySession
	t    ptyTimings
	conn *websocket.Conn
	ctx  context.Context // ends when serve returns

	// out carries output frames, then the exit, from the session to the
	// connection's writer, in order.
	out chan ptyItem
	// kick is closed to ask the client to give way to a takeover.
	kick     chan struct{}
	kickOnce sync.Once
	// gone is closed once the client is detached from the session; sends
	// to out give up then.
	gone     chan struct{}
	goneOnce sync.Once

	// deadline ends the connection when the client has been silent for
	// readTimeout.
	deadline *time.Timer
}

// ptyItem is an output frame, or the exit when frame is nil.
type ptyItem struct {
	frame []byte
	exit  int
}

// send queues p as output frames of the given kind. It blocks while the
// queue is full and returns early when the client is detached.
func (c *ptyClient) send(kind byte, p []byte) {
	for len(p) > 0 {
		n := min(len(p), ptyMaxPayload)
		frame := make([]byte, 1+n)
		frame[0] = kind
		copy(frame[1:], p[:n])
		p = p[n:]
		select {
		case c.out <- ptyItem{frame: frame}:
		case <-c.gone:
			return
		}
	}
}

// sendExit queues the exit, after all output queued so far.
func (c *ptyClient) sendExit(code int) {
	select {
	case c.out <- ptyItem{exit: code}:
	case <-c.gone:
	}
}

// giveWay asks the client to detach for a takeover.
func (c *ptyClient) giveWay() { c.kickOnce.Do(func() { close(c.kick) }) }

// detached reports whether the client no longer holds its session.
func (c *ptyClient) detached() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// touch pushes the read deadline back: the client has just sent a frame
// or a pong.
func (c *ptyClient) touch() {
	if c.deadline != nil {
		c.deadline.Reset(c.t.readTimeout)
	}
}

// detach releases the session held by c, if it still holds it, and wakes
// everything waiting on c.
func (sess *ptySession) detach(c *ptyClient) {
	sess.mu.Lock()
	if sess.client == c {
		sess.client = nil
		sess.idleSince = time.Now()
	}
	sess.mu.Unlock()
	c.goneOnce.Do(func() { close(c.gone) })
}

// ptyAttachError is a failure after the upgrade, reported as an error
// message followed by a close.
type ptyAttachError struct {
	code   string
	msg    string
	status websocket.StatusCode
	reason string
}

func (e *ptyAttachError) Error() string { return e.msg }

// ptyAttachment is what a client receives first.
type ptyAttachment struct {
	mode        string
	replay      []byte
	replayStart int64
	exited      bool
	exitCode    int
}

// attach makes c the session's client, starting the shell if this is the
// first attach and evicting the current client on a takeover. It takes
// the replay from since under the same lock that registers c, so the
// replay and the live output that follows meet exactly. A client of a
// session whose shell has exited is not registered: it gets the replay and
// the exit only.
func (c *ptyClient) attach(s *Server, since int64, pipe, takeover bool) (ptyAttachment, error) {
	sess := c.sess
	deadline := time.Now().Add(c.t.takeoverWait)
	for {
		sess.mu.Lock()
		if sess.removed {
			sess.mu.Unlock()
			return ptyAttachment{}, &ptyAttachError{wsSessionGone, "the session was deleted", websocket.StatusNormalClosure, "session gone"}
		}
		old := sess.client
		if old == nil {
			if !sess.started {
				if err := s.startPTYLocked(sess, pipe); err != nil {
					sess.mu.Unlock()
					s.log.Warn("start pty shell", "session", sess.id, "err", err)
					return ptyAttachment{}, &ptyAttachError{wsStartFailed, err.Error(), websocket.StatusInternalError, "start failed"}
				}
			}
			att := ptyAttachment{mode: "pty", exited: sess.exited, exitCode: sess.exitCode}
			if sess.pipe {
				att.mode = "pipe"
			}
			att.replay, att.replayStart = sess.ring.Since(since)
			if !sess.exited {
				sess.client = c
			}
			sess.mu.Unlock()
			return att, nil
		}
		sess.mu.Unlock()
		if !takeover {
			if sess.freeWithin(detachGrace) {
				continue
			}
			return ptyAttachment{}, &ptyAttachError{wsAlreadyConnected, "another client is attached; use takeover=1", websocket.StatusPolicyViolation, "already connected"}
		}
		old.giveWay()
		t := time.NewTimer(max(time.Until(deadline), 0))
		select {
		case <-old.gone:
		case <-t.C:
			// It did not let go in time (its writer may be stuck on a
			// peer that reads nothing): cut it off.
			sess.detach(old)
			if old.conn != nil {
				old.conn.CloseNow()
			}
		}
		t.Stop()
	}
}

// serve runs the connection: attach, replay, connected, then live output
// until the shell exits, the client leaves or is taken over.
func (c *ptyClient) serve(s *Server, since int64, pipe, takeover bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.ctx = ctx
	c.conn.SetReadLimit(ptyMaxMessage)
	log := s.log.With("session", c.sess.id)

	att, err := c.attach(s, since, pipe, takeover)
	var ae *ptyAttachError
	if errors.As(err, &ae) {
		c.writeMessage(api.PTYMessage{Type: "error", Error: ae.msg, Code: ae.code})
		c.conn.Close(ae.status, ae.reason)
		return
	}

	var pings, reader sync.WaitGroup
	readDone := make(chan struct{})
	defer func() {
		c.sess.detach(c)
		c.conn.CloseNow()
		reader.Wait()
		pings.Wait()
	}()

	for p := att.replay; len(p) > 0; {
		n := min(len(p), ptyMaxReplayPayload)
		frame := make([]byte, 9+n)
		frame[0] = api.PTYFrameReplay
		binary.BigEndian.PutUint64(frame[1:9], uint64(att.replayStart))
		copy(frame[9:], p[:n])
		if err := c.write(websocket.MessageBinary, frame); err != nil {
			return
		}
		p, att.replayStart = p[n:], att.replayStart+int64(n)
	}
	if err := c.writeMessage(api.PTYMessage{Type: "connected", SessionID: c.sess.id, Mode: att.mode}); err != nil {
		return
	}
	if att.exited {
		c.writeMessage(api.PTYMessage{Type: "exit", ExitCode: &att.exitCode})
		c.conn.Close(websocket.StatusNormalClosure, reasonExited)
		return
	}

	readCtx, cancelRead := context.WithCancel(ctx)
	defer cancelRead()
	c.deadline = time.AfterFunc(c.t.readTimeout, cancelRead) // reading with a cancelled context closes the connection
	defer c.deadline.Stop()
	reader.Go(func() {
		defer close(readDone)
		c.readLoop(readCtx, log)
	})

	ping := time.NewTicker(c.t.pingInterval)
	defer ping.Stop()
	for {
		select {
		case it := <-c.out:
			if it.frame == nil {
				c.writeMessage(api.PTYMessage{Type: "exit", ExitCode: &it.exit})
				c.sess.detach(c)
				c.conn.Close(websocket.StatusNormalClosure, reasonExited)
				return
			}
			if err := c.write(websocket.MessageBinary, it.frame); err != nil {
				log.Debug("write pty output", "err", err)
				return
			}
		case <-c.kick:
			c.sess.detach(c) // first, so the new client need not wait for the close handshake
			c.writeMessage(api.PTYMessage{Type: "error", Error: "another client took over the session", Code: wsTakenOver})
			c.conn.Close(closeTakenOver, reasonTakenOver)
			return
		case <-c.gone: // cut off by a takeover
			return
		case <-readDone:
			return
		case <-ping.C:
			pings.Go(func() {
				pctx, cancel := context.WithTimeout(ctx, c.t.pingInterval)
				defer cancel()
				c.conn.Ping(pctx) // the answer, if any, pushes the read deadline back
			})
		}
	}
}

// readLoop handles the client's frames until the connection fails or the
// read deadline passes. Bad frames are answered with INVALID_FRAME and do
// not end the connection.
func (c *ptyClient) readLoop(ctx context.Context, log *slog.Logger) {
	for {
		typ, data, err := c.conn.Read(ctx)
		if err != nil {
			log.Debug("pty websocket read", "err", err)
			return
		}
		c.touch()
		if c.detached() {
			continue // taken over: the session is no longer this client's
		}
		cmd, err := parsePTYFrame(typ, data)
		if err != nil {
			c.writeMessage(api.PTYMessage{Type: "error", Error: err.Error(), Code: wsInvalidFrame})
			continue
		}
		switch cmd.op {
		case ptyOpStdin:
			if err := c.sess.writeStdin(cmd.data, c.t.stdinTimeout); err != nil {
				c.writeMessage(api.PTYMessage{Type: "error", Error: err.Error(), Code: wsStdinWriteFailed})
			}
		case ptyOpResize:
			if err := c.sess.resize(cmd.cols, cmd.rows); err != nil {
				c.writeMessage(api.PTYMessage{Type: "error", Error: err.Error(), Code: wsRuntimeError})
			}
		case ptyOpSignal:
			if err := c.sess.signal(cmd.signal); err != nil {
				c.writeMessage(api.PTYMessage{Type: "error", Error: err.Error(), Code: wsRuntimeError})
			}
		case ptyOpPing:
			c.writeMessage(api.PTYMessage{Type: "pong"})
		}
	}
}

// write sends one message, giving up (and closing the connection) after
// readTimeout.
func (c *ptyClient) write(typ websocket.MessageType, p []byte) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.t.readTimeout)
	defer cancel()
	return c.conn.Write(ctx, typ, p)
}

// writeMessage sends a JSON text message.
func (c *ptyClient) writeMessage(m api.PTYMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return c.write(websocket.MessageText, b)
}

// ptyOp is what a client frame asks for.
type ptyOp int

const (
	ptyOpStdin ptyOp = iota + 1
	ptyOpResize
	ptyOpSignal
	ptyOpPing
)

// ptyCommand is a parsed client frame.
type ptyCommand struct {
	op         ptyOp
	data       []byte // ptyOpStdin
	cols, rows int    // ptyOpResize: both in 1..65535
	signal     syscall.Signal
}

// parsePTYFrame parses a client frame: binary 0x00 + input bytes, or a
// JSON text message of type stdin, resize, signal or ping. Anything else
// is an error whose text is fit for the client.
func parsePTYFrame(typ websocket.MessageType, data []byte) (ptyCommand, error) {
	if typ == websocket.MessageBinary {
		if len(data) == 0 {
			return ptyCommand{}, errors.New("empty binary frame")
		}
		if data[0] != api.PTYFrameStdin {
			return ptyCommand{}, fmt.Errorf("unknown binary frame kind 0x%02x", data[0])
		}
		return ptyCommand{op: ptyOpStdin, data: data[1:]}, nil
	}
	var m api.PTYMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return ptyCommand{}, fmt.Errorf("invalid JSON message: %v", err)
	}
	switch m.Type {
	case "stdin":
		return ptyCommand{op: ptyOpStdin, data: []byte(m.Data)}, nil
	case "resize":
		if m.Cols <= 0 || m.Rows <= 0 || m.Cols > 0xffff || m.Rows > 0xffff {
			return ptyCommand{}, fmt.Errorf("resize needs cols and rows in 1..65535, got %dx%d", m.Cols, m.Rows)
		}
		return ptyCommand{op: ptyOpResize, cols: m.Cols, rows: m.Rows}, nil
	case "signal":
		sig, ok := ptySignals[m.Signal]
		if !ok {
			return ptyCommand{}, fmt.Errorf("unsupported signal %q (want SIGINT, SIGTERM, SIGKILL, SIGQUIT or SIGHUP)", m.Signal)
		}
		return ptyCommand{op: ptyOpSignal, signal: sig}, nil
	case "ping":
		return ptyCommand{op: ptyOpPing}, nil
	default:
		return ptyCommand{}, fmt.Errorf("unknown message type %q", m.Type)
	}
}
