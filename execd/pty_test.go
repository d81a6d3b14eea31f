package execd

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/opensandbox/opensandbox/api"
)

// ptyWait bounds every wait for the server in these tests.
const ptyWait = 10 * time.Second

// createPTY creates a session and returns its id.
func createPTY(t *testing.T, tc *testClient, body any) string {
	t.Helper()
	var resp api.PTYSession
	tc.call(http.MethodPost, "/pty", body, http.StatusCreated, &resp)
	return resp.SessionID
}

// ptyStatus returns GET /pty/{id}.
func ptyStatus(t *testing.T, tc *testClient, id string) api.PTYStatus {
	t.Helper()
	var st api.PTYStatus
	tc.call(http.MethodGet, "/pty/"+id, nil, http.StatusOK, &st)
	return st
}

// ptyConn is a test client of the PTY WebSocket. It keeps what it has
// received so far.
type ptyConn struct {
	t    *testing.T
	url  string
	conn *websocket.Conn

	replay     []byte // replay bytes, in order
	replayFrom int64  // offset of the first replay byte; -1 if none came
	stdout     []byte
	stderr     []byte
	stream     []byte // replay, stdout and stderr as they came
	connected  api.PTYMessage
	messages   []api.PTYMessage // text messages other than connected
}

func ptyURL(tc *testClient, id, query string) string {
	return "ws" + strings.TrimPrefix(tc.base, "http") + "/pty/" + id + "/ws" + query
}

// dialPTYRaw opens the WebSocket and returns the connection or the failed
// handshake's response.
func dialPTYRaw(t *testing.T, tc *testClient, id, query string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), ptyWait)
	defer cancel()
	return websocket.Dial(ctx, ptyURL(tc, id, query), &websocket.DialOptions{
		HTTPHeader: http.Header{api.HeaderExecdToken: {tc.token}},
	})
}

// dialPTY attaches to a session and reads up to and including the
// connected message. The connection keeps the client's default 32 KiB
// message limit, so every frame the server sends must fit in it.
func dialPTY(t *testing.T, tc *testClient, id, query string) *ptyConn {
	t.Helper()
	conn, resp, err := dialPTYRaw(t, tc, id, query)
	if err != nil {
		var body []byte
		if resp != nil {
			body, _ = io.ReadAll(resp.Body)
		}
		t.Fatalf("dial %s: %v; body %s", ptyURL(tc, id, query), err, body)
	}
	t.Cleanup(func() { conn.CloseNow() })
	p := &ptyConn{t: t, url: ptyURL(tc, id, query), conn: conn, replayFrom: -1}
	for p.connected.Type == "" {
		typ, data := p.read()
		if typ == websocket.MessageBinary {
			if data[0] != api.PTYFrameReplay {
				t.Fatalf("%s: frame kind 0x%02x before connected", p.url, data[0])
			}
			if len(data) < 9 {
				t.Fatalf("%s: short replay frame %q", p.url, data)
			}
			off := int64(binary.BigEndian.Uint64(data[1:9]))
			if p.replayFrom < 0 {
				p.replayFrom = off
			} else if want := p.replayFrom + int64(len(p.replay)); off != want {
				t.Fatalf("%s: replay frame at offset %d, want %d", p.url, off, want)
			}
			p.replay = append(p.replay, data[9:]...)
			p.stream = append(p.stream, data[9:]...)
			continue
		}
		var m api.PTYMessage
		if err := json.Unmarshal(data, &m); err != nil || m.Type != "connected" {
			t.Fatalf("%s: first message %s, want connected", p.url, data)
		}
		p.connected = m
	}
	if p.connected.SessionID != id {
		t.Fatalf("%s: connected to %q, want %q", p.url, p.connected.SessionID, id)
	}
	return p
}

// read returns the next message.
func (p *ptyConn) read() (websocket.MessageType, []byte) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.t.Context(), ptyWait)
	defer cancel()
	typ, data, err := p.conn.Read(ctx)
	if err != nil {
		p.t.Fatalf("%s: read: %v (stdout so far %q)", p.url, err, p.stdout)
	}
	if typ == websocket.MessageBinary && len(data) == 0 {
		p.t.Fatalf("%s: empty binary frame", p.url)
	}
	return typ, data
}

// next reads messages, recording output, until a text message other than
// output arrives, and returns it.
func (p *ptyConn) next() api.PTYMessage {
	p.t.Helper()
	for {
		typ, data := p.read()
		if typ == websocket.MessageBinary {
			p.output(data)
			continue
		}
		var m api.PTYMessage
		if err := json.Unmarshal(data, &m); err != nil {
			p.t.Fatalf("%s: bad message %q: %v", p.url, data, err)
		}
		p.messages = append(p.messages, m)
		return m
	}
}

func (p *ptyConn) output(frame []byte) {
	p.t.Helper()
	switch frame[0] {
	case api.PTYFrameStdout:
		p.stdout = append(p.stdout, frame[1:]...)
	case api.PTYFrameStderr:
		p.stderr = append(p.stderr, frame[1:]...)
	default:
		p.t.Fatalf("%s: unexpected frame kind 0x%02x after connected", p.url, frame[0])
	}
	p.stream = append(p.stream, frame[1:]...)
}

// until reads until stdout (or stderr, when stderr is set) contains want.
// Text messages on the way fail the test.
func (p *ptyConn) until(want string, stderr bool) {
	p.t.Helper()
	for {
		buf := p.stdout
		if stderr {
			buf = p.stderr
		}
		if strings.Contains(string(buf), want) {
			return
		}
		typ, data := p.read()
		if typ != websocket.MessageBinary {
			p.t.Fatalf("%s: waiting for %q: got message %s (stdout %q)", p.url, want, data, p.stdout)
		}
		p.output(data)
	}
}

// offset returns the stream offset just after the bytes received so far.
func (p *ptyConn) offset() int64 {
	start := p.replayFrom
	if start < 0 {
		start = 0
	}
	return start + int64(len(p.replay)+len(p.stdout)+len(p.stderr))
}

// stdin sends input as a binary frame.
func (p *ptyConn) stdin(s string) {
	p.t.Helper()
	p.write(websocket.MessageBinary, append([]byte{api.PTYFrameStdin}, s...))
}

// send sends a JSON text message.
func (p *ptyConn) send(v any) {
	p.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		p.t.Fatal(err)
	}
	p.write(websocket.MessageText, b)
}

func (p *ptyConn) write(typ websocket.MessageType, b []byte) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.t.Context(), ptyWait)
	defer cancel()
	if err := p.conn.Write(ctx, typ, b); err != nil {
		p.t.Fatalf("%s: write %q: %v", p.url, b, err)
	}
}

// wantExit reads until the exit message, checks its code, and then the
// close 1000 "process exited".
func (p *ptyConn) wantExit(code int) {
	p.t.Helper()
	m := p.next()
	if m.Type != "exit" || m.ExitCode == nil || *m.ExitCode != code {
		p.t.Fatalf("%s: got %+v, want exit %d (stdout %q)", p.url, m, code, p.stdout)
	}
	p.wantClose(websocket.StatusNormalClosure, "process exited")
}

// wantClose reads until the connection closes and checks the close frame.
// Output and messages on the way are recorded.
func (p *ptyConn) wantClose(code websocket.StatusCode, reason string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.t.Context(), ptyWait)
	defer cancel()
	for {
		typ, data, err := p.conn.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != code || ce.Reason != reason {
				p.t.Fatalf("%s: connection ended with %v, want close %d %q", p.url, err, code, reason)
			}
			return
		}
		if typ == websocket.MessageBinary {
			p.output(data)
		} else {
			var m api.PTYMessage
			json.Unmarshal(data, &m)
			p.messages = append(p.messages, m)
		}
	}
}

// shell sends a command line and waits for want in the output.
func (p *ptyConn) shell(line, want string) {
	p.t.Helper()
	p.stdin(line + "\n")
	p.until(want, false)
}

// waitFor polls cond until it holds or ptyWait passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(ptyWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// session returns the server's session with id.
func ptySessionOf(t *testing.T, s *Server, id string) *ptySession {
	t.Helper()
	sess, err := s.ptys.get(id)
	if err != nil {
		t.Fatal(err)
	}
	return sess
}

// waitDetached waits until no client holds the session.
func waitDetached(t *testing.T, s *Server, id string) {
	t.Helper()
	sess := ptySessionOf(t, s, id)
	waitFor(t, "session "+id+" to be detached", func() bool { return !sess.attached() })
}

// pidGone reports whether pid no longer exists (it has been reaped).
func pidGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

// liveMembers returns the processes of group pgid that are not zombies.
// Killed jobs that are not execd's children stay zombies until init gets
// round to them.
func liveMembers(pgid int) []int {
	var pids []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		var state string
		var pid, ppid, pgrp int
		if _, err := fmt.Sscanf(string(b[:i]), "%d", &pid); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(string(b[i+1:]), " %s %d %d", &state, &ppid, &pgrp); err != nil {
			continue
		}
		if pgrp == pgid && state != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

func setTimings(s *Server, f func(*ptyTimings)) {
	s.ptys.mu.Lock()
	defer s.ptys.mu.Unlock()
	f(&s.ptys.timings)
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestPTYCreate(t *testing.T) {
	_, tc := newTestServer(t, nil)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ok := []struct {
		name string
		body any
	}{
		{"no body", nil},
		{"empty object", map[string]any{}},
		{"cwd", api.CreatePTYRequest{Cwd: dir}},
		{"command", api.CreatePTYRequest{Command: "true"}},
	}
	for _, c := range ok {
		t.Run(c.name, func(t *testing.T) {
			id := createPTY(t, tc, c.body)
			if !uuidRE.MatchString(id) {
				t.Fatalf("POST /pty %v: session_id %q is not a UUID", c.body, id)
			}
			if st := ptyStatus(t, tc, id); st != (api.PTYStatus{SessionID: id}) {
				t.Fatalf("GET /pty/%s before attach = %+v, want not running, offset 0", id, st)
			}
		})
	}
	bad := []struct {
		name string
		body any
	}{
		{"missing cwd", api.CreatePTYRequest{Cwd: filepath.Join(dir, "missing")}},
		{"cwd is a file", api.CreatePTYRequest{Cwd: file}},
		{"undefined variable", api.CreatePTYRequest{Cwd: "$EXECD_TEST_UNDEFINED_VARIABLE"}},
		{"bad JSON", "{"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			tc.wantError(http.MethodPost, "/pty", c.body, http.StatusBadRequest, api.CodeInvalidRequestBody)
		})
	}
}

func TestPTYNotFound(t *testing.T) {
	_, tc := newTestServer(t, nil)
	const id = "00000000-0000-4000-8000-000000000000"
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		tc.wantError(method, "/pty/"+id, nil, http.StatusNotFound, api.CodeContextNotFound)
	}
	tc.wantError(http.MethodGet, "/pty/"+id+"/ws", nil, http.StatusNotFound, api.CodeContextNotFound)
	_, resp, err := dialPTYRaw(t, tc, id, "")
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("dial unknown session: err %v, response %+v; want 404", err, resp)
	}
	var e api.ErrorResponse
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Code != api.CodeContextNotFound {
		t.Fatalf("dial unknown session: body %+v (%v), want code %s", e, err, api.CodeContextNotFound)
	}
}

func TestPTYEcho(t *testing.T) {
	s, tc := newTestServer(t, nil)
	dir := t.TempDir()
	id := createPTY(t, tc, api.CreatePTYRequest{Cwd: dir})
	p := dialPTY(t, tc, id, "")
	if p.connected.Mode != "pty" || p.replayFrom != -1 {
		t.Fatalf("first attach: connected %+v, replay from %d; want mode pty and no replay", p.connected, p.replayFrom)
	}
	// Arithmetic keeps the terminal's echo of the line from matching.
	p.shell("echo mark-$((40+2))", "mark-42")
	p.send(api.PTYMessage{Type: "stdin", Data: "echo json-$((1+1))\n"})
	p.until("json-2", false)
	p.shell(`echo "cwd=$(pwd)="`, "cwd="+dir+"=")
	wantTerm := os.Getenv("TERM")
	if wantTerm == "" {
		wantTerm = "xterm-256color"
	}
	p.shell(`echo "term=$TERM="`, "term="+wantTerm+"=")
	p.shell(`[ -t 0 ] && echo "tty-$((7))"`, "tty-7")

	p.send(api.PTYMessage{Type: "ping"})
	if m := p.next(); m.Type != "pong" {
		t.Fatalf("ping: got %+v, want pong", m)
	}
	st := ptyStatus(t, tc, id)
	if !st.Running || st.OutputOffset < p.offset() {
		t.Fatalf("GET /pty/%s = %+v; want running, offset >= %d", id, st, p.offset())
	}
	if s.ptys.timings.pingInterval != 30*time.Second || s.ptys.timings.readTimeout != 60*time.Second {
		t.Fatalf("default timings %+v, want ping 30s, read deadline 60s", s.ptys.timings)
	}
}

func TestPTYResize(t *testing.T) {
	_, tc := newTestServer(t, nil)
	id := createPTY(t, tc, nil)
	p := dialPTY(t, tc, id, "")
	p.shell("stty size", "24 80")
	p.send(api.PTYMessage{Type: "resize", Cols: 120, Rows: 40})
	p.shell("stty size", "40 120")
}

func TestPTYReplay(t *testing.T) {
	s, tc := newTestServer(t, nil)
	id := createPTY(t, tc, nil)
	a := dialPTY(t, tc, id, "")
	a.shell("echo one-$((1))", "one-1")
	// Wait for the prompt after the output, so the stream stands still.
	var total int64
	waitFor(t, "output to settle", func() bool {
		before := ptyStatus(t, tc, id).OutputOffset
		time.Sleep(100 * time.Millisecond)
		total = ptyStatus(t, tc, id).OutputOffset
		return before == total
	})
	a.conn.Close(websocket.StatusNormalClosure, "")
	waitDetached(t, s, id)

	t.Run("since=0", func(t *testing.T) {
		b := dialPTY(t, tc, id, "?since=0")
		if b.replayFrom != 0 || int64(len(b.replay)) != total || !strings.Contains(string(b.replay), "one-1") {
			t.Fatalf("replay from %d, %d bytes %q; want offset 0, %d bytes with one-1", b.replayFrom, len(b.replay), b.replay, total)
		}
		if !strings.HasPrefix(string(b.replay), string(a.stream)) {
			t.Fatalf("replay %q does not start with what the first client saw, %q", b.replay, a.stream)
		}
		b.conn.Close(websocket.StatusNormalClosure, "")
		waitDetached(t, s, id)
	})
	t.Run("negative since is clamped", func(t *testing.T) {
		b := dialPTY(t, tc, id, "?since=-5")
		if b.replayFrom != 0 || int64(len(b.replay)) != total {
			t.Fatalf("replay from %d, %d bytes; want offset 0, %d bytes", b.replayFrom, len(b.replay), total)
		}
		b.conn.Close(websocket.StatusNormalClosure, "")
		waitDetached(t, s, id)
	})
	t.Run("since=output_offset", func(t *testing.T) {
		c := dialPTY(t, tc, id, fmt.Sprintf("?since=%d", total))
		if c.replayFrom != -1 {
			t.Fatalf("replay from %d (%q), want none", c.replayFrom, c.replay)
		}
		c.shell("echo two-$((2))", "two-2")
		if strings.Contains(string(c.stdout), "one-1") {
			t.Fatalf("output after since=%d repeats old output: %q", total, c.stdout)
		}
		c.conn.Close(websocket.StatusNormalClosure, "")
		waitDetached(t, s, id)
	})
	t.Run("bad since", func(t *testing.T) {
		tc.wantError(http.MethodGet, "/pty/"+id+"/ws?since=abc", nil, http.StatusBadRequest, api.CodeInvalidRequestBody)
	})
}

// TestPTYReconnect drops a client in the middle of a stream of numbered
// lines and reattaches from the offset it had reached: together the two
// clients must have seen every byte exactly once.
func TestPTYReconnect(t *testing.T) {
	s, tc := newTestServer(t, nil)
	const n = 300
	id := createPTY(t, tc, api.CreatePTYRequest{
		Command: fmt.Sprintf("for i in $(seq 1 %d); do echo line-$i; sleep 0.005; done", n),
	})
	a := dialPTY(t, tc, id, "")
	a.until("line-40\r\n", false)
	a.conn.CloseNow()
	waitDetached(t, s, id)

	b := dialPTY(t, tc, id, fmt.Sprintf("?since=%d", a.offset()))
	if b.replayFrom != -1 && b.replayFrom != a.offset() {
		t.Fatalf("replay from %d, want %d", b.replayFrom, a.offset())
	}
	b.wantExit(0)

	all := string(a.stream) + string(b.stream)
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "line-%d\r\n", i)
	}
	if all != want.String() {
		t.Fatalf("output across the reconnect:\n%q\nwant\n%q", all, want.String())
	}
	if got := ptyStatus(t, tc, id).OutputOffset; got != int64(len(all)) {
		t.Fatalf("output_offset %d, want %d", got, len(all))
	}
}

func TestPTYTakeover(t *testing.T) {
	_, tc := newTestServer(t, nil)
	id := createPTY(t, tc, nil)
	a := dialPTY(t, tc, id, "")
	a.shell("X=$((6*7)); echo set-$((1))", "set-1")

	// A second client without takeover is refused before the upgrade.
	tc.wantError(http.MethodGet, "/pty/"+id+"/ws", nil, http.StatusConflict, api.CodeAlreadyConnected)
	_, resp, err := dialPTYRaw(t, tc, id, "")
	if err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("second dial: err %v, response %+v; want 409", err, resp)
	}

	b := dialPTY(t, tc, id, fmt.Sprintf("?takeover=1&since=%d", ptyStatus(t, tc, id).OutputOffset))
	a.wantClose(4001, "TAKEN_OVER")
	b.shell(`echo "x=$X"`, "x=42")
}

// TestPTYReattachRightAfterClose: a client that closes its connection and
// at once attaches again (detach, reattach) is not refused because its
// own close has not been read yet.
func TestPTYReattachRightAfterClose(t *testing.T) {
	_, tc := newTestServer(t, nil)
	id := createPTY(t, tc, nil)
	for i := range 20 {
		a := dialPTY(t, tc, id, "")
		a.shell(fmt.Sprintf("echo round-$((%d))", i), fmt.Sprintf("round-%d", i))
		a.conn.Close(websocket.StatusNormalClosure, "")
	}
}

// TestPTYTakeoverStuckClient takes over from a client that never lets go:
// after takeoverWait it is cut off, and the output it held up flows to the
// new client.
func TestPTYTakeoverStuckClient(t *testing.T) {
	s, tc := newTestServer(t, nil)
	setTimings(s, func(tm *ptyTimings) { tm.takeoverWait = 200 * time.Millisecond })
	id := createPTY(t, tc, nil)
	a := dialPTY(t, tc, id, "")
	a.shell("echo a-$((1))", "a-1")
	a.conn.Close(websocket.StatusNormalClosure, "")
	waitDetached(t, s, id)

	// A client that takes nothing from its queue and ignores the request
	// to give way.
	sess := ptySessionOf(t, s, id)
	stuck := &ptyClient{sess: sess, out: make(chan ptyItem), kick: make(chan struct{}), gone: make(chan struct{})}
	sess.mu.Lock()
	sess.client = stuck
	sess.mu.Unlock()
	if err := sess.writeStdin([]byte("echo held-$((2))\n"), time.Second); err != nil {
		t.Fatal(err)
	}
	tc.wantError(http.MethodGet, "/pty/"+id+"/ws", nil, http.StatusConflict, api.CodeAlreadyConnected)

	start := time.Now()
	b := dialPTY(t, tc, id, "?takeover=1")
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Fatalf("takeover of a stuck client after %v, want the 200ms wait", d)
	}
	if !stuck.detached() {
		t.Fatalf("stuck client still attached")
	}
	b.shell("echo b-$((3))", "b-3")
	// The held-up output came in the replay or live, once.
	if n := strings.Count(string(b.stream), "held-2"); n != 1 {
		t.Fatalf("new client saw held-2 %d times in %q", n, b.stream)
	}
}

func TestPTYPipeMode(t *testing.T) {
	_, tc := newTestServer(t, nil)
	t.Run("interactive", func(t *testing.T) {
		id := createPTY(t, tc, nil)
		p := dialPTY(t, tc, id, "?pty=0")
		if p.connected.Mode != "pipe" {
			t.Fatalf("connected %+v, want mode pipe", p.connected)
		}
		p.stdin("echo out-$((1))\n")
		p.until("out-1\n", false)
		p.stdin("echo err-$((2)) >&2\n")
		p.until("err-2\n", true)
		if string(p.stdout) != "out-1\n" || string(p.stderr) != "err-2\n" {
			t.Fatalf("stdout %q, stderr %q; want no echo, no prompt", p.stdout, p.stderr)
		}
		p.send(api.PTYMessage{Type: "resize", Cols: 100, Rows: 30}) // no terminal: ignored
		p.stdin("exit 5\n")
		p.wantExit(5)
	})
	t.Run("command", func(t *testing.T) {
		id := createPTY(t, tc, api.CreatePTYRequest{Command: "echo o; echo e >&2; exit 3"})
		p := dialPTY(t, tc, id, "?pty=0")
		p.wantExit(3)
		if string(p.stdout) != "o\n" || string(p.stderr) != "e\n" {
			t.Fatalf("stdout %q, stderr %q; want o, e", p.stdout, p.stderr)
		}
		// The mode was fixed by the first attach.
		q := dialPTY(t, tc, id, "?pty=1")
		if q.connected.Mode != "pipe" || len(q.replay) != 4 {
			t.Fatalf("reattach: connected %+v, replay %q; want mode pipe and the 4 bytes", q.connected, q.replay)
		}
		q.wantExit(3)
	})
}

func TestPTYCommandExit(t *testing.T) {
	_, tc := newTestServer(t, nil)
	cases := []struct {
		name    string
		command string
		code    int
		output  string
	}{
		{"status", "echo done-$((3)); exit 7", 7, "done-3"},
		{"success", "echo ok-$((4))", 0, "ok-4"},
		{"signal", "echo bye-$((5)); kill -TERM $$", 128 + int(syscall.SIGTERM), "bye-5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := createPTY(t, tc, api.CreatePTYRequest{Command: c.command})
			p := dialPTY(t, tc, id, "")
			p.wantExit(c.code)
			if !strings.Contains(string(p.stdout), c.output) {
				t.Fatalf("command %q: stdout %q, want %q", c.command, p.stdout, c.output)
			}
			st := ptyStatus(t, tc, id)
			if st.Running || st.OutputOffset != int64(len(p.stdout)) {
				t.Fatalf("GET after exit = %+v, want not running, offset %d", st, len(p.stdout))
			}
			// Attaching to an exited session: replay, connected, exit, close.
			q := dialPTY(t, tc, id, "")
			if q.replayFrom != 0 || string(q.replay) != string(p.stdout) {
				t.Fatalf("reattach: replay from %d %q, want %q", q.replayFrom, q.replay, p.stdout)
			}
			q.wantExit(c.code)
		})
	}
}

// TestPTYLeftoverJob runs a command that leaves a background job holding
// the terminal (or the output pipes) open: the exit must still arrive, with
// the output before it.
func TestPTYLeftoverJob(t *testing.T) {
	s, tc := newTestServer(t, nil)
	for _, query := range []string{"", "?pty=0"} {
		t.Run("mode"+query, func(t *testing.T) {
			id := createPTY(t, tc, api.CreatePTYRequest{Command: `(trap "" HUP; exec sleep 100) & echo left-$((8))`})
			p := dialPTY(t, tc, id, query)
			p.wantExit(0)
			if !strings.Contains(string(p.stdout), "left-8") {
				t.Fatalf("stdout %q, want left-8", p.stdout)
			}
			// The job is in the shell's process group; DELETE ends it.
			pgid := ptySessionOf(t, s, id).proc.Pid()
			tc.call(http.MethodDelete, "/pty/"+id, nil, http.StatusOK, nil)
			waitFor(t, "the leftover job to be killed", func() bool { return len(liveMembers(pgid)) == 0 })
		})
	}
}

func TestPTYSignal(t *testing.T) {
	_, tc := newTestServer(t, nil)
	t.Run("SIGINT stops the foreground command", func(t *testing.T) {
		id := createPTY(t, tc, nil)
		p := dialPTY(t, tc, id, "")
		p.shell("echo go-$((5)); sleep 100", "go-5")
		time.Sleep(200 * time.Millisecond) // let sleep start
		p.send(api.PTYMessage{Type: "signal", Signal: "SIGINT"})
		p.shell(`echo "rc-$?"`, "rc-130")
	})
	t.Run("SIGKILL ends the shell", func(t *testing.T) {
		id := createPTY(t, tc, nil)
		p := dialPTY(t, tc, id, "")
		p.shell("echo up-$((1))", "up-1")
		p.send(api.PTYMessage{Type: "signal", Signal: "SIGKILL"})
		p.wantExit(128 + int(syscall.SIGKILL))
	})
	t.Run("SIGTERM in pipe mode", func(t *testing.T) {
		id := createPTY(t, tc, api.CreatePTYRequest{Command: "exec sleep 100"})
		p := dialPTY(t, tc, id, "?pty=0")
		p.send(api.PTYMessage{Type: "signal", Signal: "SIGTERM"})
		p.wantExit(128 + int(syscall.SIGTERM))
	})
}

func TestPTYInvalidFrames(t *testing.T) {
	_, tc := newTestServer(t, nil)
	id := createPTY(t, tc, nil)
	p := dialPTY(t, tc, id, "")
	cases := []struct {
		name string
		typ  websocket.MessageType
		data string
	}{
		{"empty binary", websocket.MessageBinary, ""},
		{"unknown binary kind", websocket.MessageBinary, "\x07abc"},
		{"replay kind from client", websocket.MessageBinary, "\x03abc"},
		{"not JSON", websocket.MessageText, "echo hi"},
		{"no type", websocket.MessageText, `{}`},
		{"unknown type", websocket.MessageText, `{"type":"bogus"}`},
		{"server message type", websocket.MessageText, `{"type":"connected"}`},
		{"resize zero cols", websocket.MessageText, `{"type":"resize","cols":0,"rows":10}`},
		{"resize negative rows", websocket.MessageText, `{"type":"resize","cols":10,"rows":-1}`},
		{"resize too large", websocket.MessageText, `{"type":"resize","cols":70000,"rows":10}`},
		{"resize string", websocket.MessageText, `{"type":"resize","cols":"80","rows":10}`},
		{"unsupported signal", websocket.MessageText, `{"type":"signal","signal":"SIGUSR1"}`},
		{"missing signal", websocket.MessageText, `{"type":"signal"}`},
		{"stdin not a string", websocket.MessageText, `{"type":"stdin","data":42}`},
	}
	for _, c := range cases {
		p.write(c.typ, []byte(c.data))
		if m := p.next(); m.Type != "error" || m.Code != "INVALID_FRAME" || m.Error == "" {
			t.Errorf("%s: sent %q, got %+v; want error INVALID_FRAME", c.name, c.data, m)
		}
	}
	p.send(api.PTYMessage{Type: "ping"})
	if m := p.next(); m.Type != "pong" {
		t.Fatalf("ping after invalid frames: got %+v, want pong", m)
	}
	p.shell("echo alive-$((9))", "alive-9")
}

func TestPTYDelete(t *testing.T) {
	s, tc := newTestServer(t, nil)
	id := createPTY(t, tc, nil)
	p := dialPTY(t, tc, id, "")
	// A background job runs in a process group of its own too.
	p.shell(`sleep 200 & echo "bg-$!-end"`, "-end\r\n")
	var bg int
	if _, err := fmt.Sscanf(string(p.stdout[strings.LastIndex(string(p.stdout), "bg-"):]), "bg-%d-", &bg); err != nil {
		t.Fatalf("background job pid in %q: %v", p.stdout, err)
	}
	// A foreground job runs in its own process group.
	p.shell(`bash -c 'echo "job-$$-"; exec sleep 100'`, "-\r\n")
	var job int
	if _, err := fmt.Sscanf(string(p.stdout[strings.LastIndex(string(p.stdout), "job-"):]), "job-%d-", &job); err != nil {
		t.Fatalf("job pid in %q: %v", p.stdout, err)
	}
	shell := ptySessionOf(t, s, id).proc.Pid()

	if body := tc.call(http.MethodDelete, "/pty/"+id, nil, http.StatusOK, nil); len(body) != 0 {
		t.Fatalf("DELETE body %q, want empty", body)
	}
	if !pidGone(shell) {
		t.Fatalf("shell %d still exists after DELETE", shell)
	}
	waitFor(t, "the foreground job to be killed", func() bool { return len(liveMembers(job)) == 0 })
	waitFor(t, "the background job to be killed", func() bool { return len(liveMembers(bg)) == 0 })
	p.wantExit(128 + int(syscall.SIGKILL))
	tc.wantError(http.MethodGet, "/pty/"+id, nil, http.StatusNotFound, api.CodeContextNotFound)
	tc.wantError(http.MethodDelete, "/pty/"+id, nil, http.StatusNotFound, api.CodeContextNotFound)

	// A session whose shell never started.
	id = createPTY(t, tc, nil)
	tc.call(http.MethodDelete, "/pty/"+id, nil, http.StatusOK, nil)
	tc.wantError(http.MethodGet, "/pty/"+id+"/ws", nil, http.StatusNotFound, api.CodeContextNotFound)
}

func TestPTYEvict(t *testing.T) {
	s, tc := newTestServer(t, nil)
	const idle, exited = time.Minute, 10 * time.Second
	exists := func(id string) bool {
		_, err := s.ptys.get(id)
		return err == nil
	}

	fresh := createPTY(t, tc, nil)
	attached := createPTY(t, tc, nil)
	a := dialPTY(t, tc, attached, "")
	a.shell("echo here-$((1))", "here-1")
	detached := createPTY(t, tc, nil)
	d := dialPTY(t, tc, detached, "")
	d.shell("echo here-$((2))", "here-2")
	d.conn.Close(websocket.StatusNormalClosure, "")
	waitDetached(t, s, detached)
	detachedPid := ptySessionOf(t, s, detached).proc.Pid()
	done := createPTY(t, tc, api.CreatePTYRequest{Command: "exit 0"})
	dialPTY(t, tc, done, "").wantExit(0)
	waitDetached(t, s, done)

	now := time.Now()
	s.ptys.evict(now.Add(exited/2), idle, exited)
	for _, id := range []string{fresh, attached, detached, done} {
		if !exists(id) {
			t.Fatalf("session %s evicted before any timeout", id)
		}
	}
	s.ptys.evict(now.Add(2*exited), idle, exited)
	if exists(done) {
		t.Fatalf("exited session %s kept %v after exit", done, 2*exited)
	}
	if !exists(fresh) || !exists(detached) {
		t.Fatalf("running or unstarted session evicted by the exited TTL")
	}
	s.ptys.evict(now.Add(2*idle), idle, exited)
	if exists(fresh) || exists(detached) {
		t.Fatalf("idle sessions kept after %v", 2*idle)
	}
	waitFor(t, "the idle shell to be killed", func() bool { return pidGone(detachedPid) })
	if !exists(attached) {
		t.Fatalf("session with a client evicted")
	}
	a.shell("echo still-$((3))", "still-3")

	tc.wantError(http.MethodGet, "/pty/"+fresh, nil, http.StatusNotFound, api.CodeContextNotFound)
}

func TestPTYReadDeadline(t *testing.T) {
	s, tc := newTestServer(t, nil)
	t.Run("silent client is dropped", func(t *testing.T) {
		setTimings(s, func(tm *ptyTimings) { tm.readTimeout, tm.pingInterval = 300*time.Millisecond, time.Hour })
		id := createPTY(t, tc, api.CreatePTYRequest{Command: "sleep 100"})
		p := dialPTY(t, tc, id, "")
		start := time.Now()
		waitDetached(t, s, id)
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("silent client dropped after %v, want about 300ms", d)
		}
		ctx, cancel := context.WithTimeout(t.Context(), ptyWait)
		defer cancel()
		if _, _, err := p.conn.Read(ctx); err == nil {
			t.Fatalf("read on a dropped connection succeeded")
		}
		dialPTY(t, tc, id, "") // no 409: the session is free
	})
	t.Run("pongs keep the connection", func(t *testing.T) {
		setTimings(s, func(tm *ptyTimings) { tm.readTimeout, tm.pingInterval = 300*time.Millisecond, 50*time.Millisecond })
		id := createPTY(t, tc, api.CreatePTYRequest{Command: "sleep 100"})
		p := dialPTY(t, tc, id, "")
		// A pending read answers the server's pings; the client sends
		// nothing else for several read deadlines.
		got := make(chan string, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), ptyWait)
			defer cancel()
			_, data, err := p.conn.Read(ctx)
			if err != nil {
				got <- err.Error()
				return
			}
			got <- string(data)
		}()
		time.Sleep(time.Second)
		if !ptySessionOf(t, s, id).attached() {
			t.Fatalf("client answering pings was dropped")
		}
		p.send(api.PTYMessage{Type: "ping"})
		if m := <-got; m != `{"type":"pong"}` {
			t.Fatalf("after 1s of pongs only: got %s, want pong", m)
		}
	})
}

func TestPTYNoShell(t *testing.T) {
	envFile := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(envFile, []byte("PATH="+t.TempDir()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, tc := newTestServer(t, func(c *Config) { c.EnvFile = envFile })
	id := createPTY(t, tc, nil)
	conn, _, err := dialPTYRaw(t, tc, id, "")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	p := &ptyConn{t: t, url: "no shell", conn: conn}
	if m := p.next(); m.Type != "error" || m.Code != "START_FAILED" {
		t.Fatalf("attach without a shell: got %+v, want error START_FAILED", m)
	}
	p.wantClose(websocket.StatusInternalError, "start failed")
	if st := ptyStatus(t, tc, id); st.Running {
		t.Fatalf("GET after failed start = %+v, want not running", st)
	}
}

func TestPTYShellLookup(t *testing.T) {
	bin := t.TempDir()
	onlySh := t.TempDir()
	for _, f := range []string{filepath.Join(bin, "bash"), filepath.Join(bin, "sh"), filepath.Join(onlySh, "sh")} {
		if err := os.WriteFile(f, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	notExec := t.TempDir()
	if err := os.WriteFile(filepath.Join(notExec, "bash"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, command string
		wantPath            string
		wantArgs            []string
	}{
		{"bash", bin, "", filepath.Join(bin, "bash"), []string{"bash", "--norc", "--noprofile"}},
		{"bash command", bin, "ls", filepath.Join(bin, "bash"), []string{"bash", "--norc", "--noprofile", "-c", "ls"}},
		{"sh fallback", notExec + ":" + onlySh, "", filepath.Join(onlySh, "sh"), []string{"sh"}},
		{"sh command", onlySh, "ls -l", filepath.Join(onlySh, "sh"), []string{"sh", "-c", "ls -l"}},
		{"relative dirs ignored", "relative:" + onlySh, "", filepath.Join(onlySh, "sh"), []string{"sh"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path, args, err := ptyShell([]string{"PATH=" + c.path}, c.command)
			if err != nil || path != c.wantPath || strings.Join(args, "\x00") != strings.Join(c.wantArgs, "\x00") {
				t.Fatalf("ptyShell(PATH=%s, %q) = %q, %q, %v; want %q, %q", c.path, c.command, path, args, err, c.wantPath, c.wantArgs)
			}
		})
	}
	if _, _, err := ptyShell([]string{"PATH=" + notExec}, ""); err == nil {
		t.Fatalf("ptyShell with no executable shell: no error")
	}
}

// TestPTYLargeOutput checks that output and replay larger than one frame
// arrive whole, in frames that fit the client's 32 KiB message limit.
func TestPTYLargeOutput(t *testing.T) {
	s, tc := newTestServer(t, nil)
	const size = 200_000
	id := createPTY(t, tc, api.CreatePTYRequest{Command: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", size)})
	p := dialPTY(t, tc, id, "")
	p.wantExit(0)
	if len(p.stdout) != size || strings.Trim(string(p.stdout), "x") != "" {
		t.Fatalf("stdout: %d bytes, want %d x", len(p.stdout), size)
	}
	waitDetached(t, s, id)
	q := dialPTY(t, tc, id, "?since=1000")
	if q.replayFrom != 1000 || len(q.replay) != size-1000 {
		t.Fatalf("replay from %d, %d bytes; want from 1000, %d bytes", q.replayFrom, len(q.replay), size-1000)
	}
	q.wantExit(0)
}

func FuzzParsePTYFrame(f *testing.F) {
	f.Add(true, []byte("\x00ls\n"))
	f.Add(true, []byte{})
	f.Add(true, []byte("\x03"))
	f.Add(false, []byte(`{"type":"stdin","data":"ls\n"}`))
	f.Add(false, []byte(`{"type":"resize","cols":120,"rows":40}`))
	f.Add(false, []byte(`{"type":"resize","cols":1e9,"rows":-40}`))
	f.Add(false, []byte(`{"type":"signal","signal":"SIGINT"}`))
	f.Add(false, []byte(`{"type":"ping"}`))
	f.Add(false, []byte(`{"type":`))
	f.Fuzz(func(t *testing.T, bin bool, data []byte) {
		typ := websocket.MessageText
		if bin {
			typ = websocket.MessageBinary
		}
		cmd, err := parsePTYFrame(typ, data)
		if err != nil {
			if cmd.op != 0 {
				t.Fatalf("parsePTYFrame(%v, %q) = %+v with error %v", bin, data, cmd, err)
			}
			return
		}
		switch cmd.op {
		case ptyOpStdin:
			if bin && string(cmd.data) != string(data[1:]) {
				t.Fatalf("parsePTYFrame(%q): stdin %q", data, cmd.data)
			}
		case ptyOpResize:
			if cmd.cols < 1 || cmd.rows < 1 || cmd.cols > 0xffff || cmd.rows > 0xffff {
				t.Fatalf("parsePTYFrame(%q): resize %dx%d", data, cmd.cols, cmd.rows)
			}
		case ptyOpSignal:
			found := false
			for _, sig := range ptySignals {
				found = found || sig == cmd.signal
			}
			if !found {
				t.Fatalf("parsePTYFrame(%q): signal %v", data, cmd.signal)
			}
		case ptyOpPing:
		default:
			t.Fatalf("parsePTYFrame(%v, %q) = %+v, no error and no operation", bin, data, cmd)
		}
	})
}
