package ingress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"
)

// The zero-copy path for large downloads.
//
// A GET or HEAD of an HTTP/1.x client whose connection can be hijacked,
// without a body and without an upgrade, goes to the sandbox over one of
// the gateway's own HTTP/1.1 connections (spliceTransport) instead of
// Config.Transport. The response head is read there; everything about it
// is then done by the reverse proxy as for any response (hop-by-hop
// headers, the gateway's X-Request-ID, 1xx answers). Only when the
// response is a GET's with a Content-Length of at least Config.SpliceMin
// and no Transfer-Encoding does the respWriter, when the proxy writes
// the status, hijack the client connection, write the head itself (with
// Connection: close) and move the body with io.CopyN between the two TCP
// connections, which Go does with splice(2): the bytes never enter the
// gateway's memory. Any other response is relayed by the proxy from the
// same connection, so every response is answered exactly once.

// DefaultSpliceMin is the smallest Content-Length that takes the
// zero-copy path.
const DefaultSpliceMin = 1 << 20

// Bounds of the gateway's own pool of connections to sandboxes.
const (
	spliceIdlePerAddr = 64
	spliceIdleTotal   = 1024
	spliceIdleTimeout = 30 * time.Second
	// spliceMax1xx bounds the informational answers before the real one.
	spliceMax1xx = 10
	// spliceLinger is how long a client connection stays half-open after
	// a zero-copy body, for the client to read it all and close.
	spliceLinger = 2 * time.Second
)

// splicer is one request's state of the zero-copy path; the transport
// fills pending when the response qualifies.
type splicer struct {
	req     *http.Request // the client's
	pool    *backendPool
	x       *exchange
	pending *spliceResp
	done    bool // the body went (or failed) over the zero-copy path
}

type spliceResp struct {
	c    *backendConn
	resp *http.Response
	stop func() bool // stops closing c when the request's context ends
}

// spliceEligible reports whether r may take the zero-copy path: w must
// be the server's own HTTP/1.x response writer.
func spliceEligible(w http.ResponseWriter, r *http.Request) bool {
	if r.ProtoMajor != 1 || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		return false
	}
	if (r.Body != nil && r.Body != http.NoBody) || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	if r.Header.Get("Upgrade") != "" {
		return false
	}
	_, ok := w.(http.Hijacker)
	return ok
}

// roundTrip carries the proxy's requests: those marked for the zero-copy
// path over the gateway's own connections, the rest over
// Config.Transport.
func (g *Gateway) roundTrip(req *http.Request) (*http.Response, error) {
	if f, _ := req.Context().Value(forwardKey{}).(*forward); f != nil && f.splice != nil {
		return g.spliceRoundTrip(req, f.splice)
	}
	return g.cfg.Transport.RoundTrip(req)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// errNothingRead marks a failure before any byte of the answer: on a
// reused connection (closed by the sandbox while idle) the request is
// sent again on another.
var errNothingRead = errors.New("the connection closed before an answer")

func (g *Gateway) spliceRoundTrip(req *http.Request, s *splicer) (*http.Response, error) {
	addr := req.URL.Host
	ctx := req.Context()
	for {
		c, reused := g.pool.get(addr)
		if c == nil {
			conn, err := g.dialer.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			c = newBackendConn(addr, conn)
		}
		stop := context.AfterFunc(ctx, func() { c.conn.Close() })
		resp, err := c.roundTrip(req)
		if err != nil {
			stop()
			c.conn.Close()
			if reused && errors.Is(err, errNothingRead) && ctx.Err() == nil {
				continue
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if req.Method == http.MethodGet && g.cfg.SpliceMin > 0 && resp.ContentLength >= g.cfg.SpliceMin &&
			len(resp.TransferEncoding) == 0 && bodyAllowed(resp.StatusCode) {
			inner := &pooledBody{rc: resp.Body, c: c, pool: g.pool, stop: stop, keep: !resp.Close}
			s.pending = &spliceResp{c: c, resp: resp, stop: stop}
			resp.Body = &splicedBody{s: s, inner: inner}
			return resp, nil
		}
		resp.Body = &pooledBody{rc: resp.Body, c: c, pool: g.pool, stop: stop, keep: !resp.Close}
		return resp, nil
	}
}

func bodyAllowed(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}

// backendConn is one of the gateway's own connections to a sandbox.
type backendConn struct {
	addr  string
	conn  net.Conn
	br    *bufio.Reader
	bw    *bufio.Writer
	timer *time.Timer // closes it when idle too long
}

func newBackendConn(addr string, conn net.Conn) *backendConn {
	return &backendConn{addr: addr, conn: conn, br: bufio.NewReaderSize(conn, 64<<10), bw: bufio.NewWriterSize(conn, 4<<10)}
}

// roundTrip sends req and reads the answer's head; informational
// answers go to the request's trace (the reverse proxy passes them on).
func (c *backendConn) roundTrip(req *http.Request) (*http.Response, error) {
	if err := req.Write(c.bw); err != nil {
		return nil, fmt.Errorf("%w: %w", errNothingRead, err)
	}
	if err := c.bw.Flush(); err != nil {
		return nil, fmt.Errorf("%w: %w", errNothingRead, err)
	}
	if _, err := c.br.Peek(1); err != nil {
		return nil, fmt.Errorf("%w: %w", errNothingRead, err)
	}
	for range spliceMax1xx {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("the sandbox switched protocols unasked")
		case resp.StatusCode < 200:
			if trace := httptrace.ContextClientTrace(req.Context()); trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
					return nil, err
				}
			}
			continue
		}
		return resp, nil
	}
	return nil, errors.New("too many informational answers")
}

// backendPool keeps idle connections per sandbox address.
type backendPool struct {
	mu    sync.Mutex
	idle  map[string][]*backendConn
	count int
}

func (p *backendPool) get(addr string) (*backendConn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[addr]
	if len(l) == 0 {
		return nil, false
	}
	c := l[len(l)-1]
	l[len(l)-1] = nil
	if len(l) == 1 {
		delete(p.idle, addr)
	} else {
		p.idle[addr] = l[:len(l)-1]
	}
	p.count--
	return c, true
}

func (p *backendPool) put(c *backendConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.count >= spliceIdleTotal || len(p.idle[c.addr]) >= spliceIdlePerAddr {
		c.conn.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*backendConn{}
	}
	p.idle[c.addr] = append(p.idle[c.addr], c)
	p.count++
	if c.timer == nil {
		c.timer = time.AfterFunc(spliceIdleTimeout, func() { p.expire(c) })
	} else {
		c.timer.Reset(spliceIdleTimeout)
	}
}

// expire closes c if it is still idle.
func (p *backendPool) expire(c *backendConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[c.addr]
	for i, x := range l {
		if x == c {
			l = append(l[:i], l[i+1:]...)
			if len(l) == 0 {
				delete(p.idle, c.addr)
			} else {
				p.idle[c.addr] = l
			}
			p.count--
			c.conn.Close()
			return
		}
	}
}

// closeIdle closes every idle connection.
func (p *backendPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.idle {
		for _, c := range l {
			c.conn.Close()
		}
	}
	p.idle, p.count = nil, 0
}

// pooledBody is a response body on a backendConn: read to its end, the
// connection goes back to the pool; closed early, it is closed.
type pooledBody struct {
	rc     io.ReadCloser
	c      *backendConn
	pool   *backendPool
	stop   func() bool
	keep   bool
	eof    bool
	closed bool
}

func (b *pooledBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *pooledBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	if !b.eof {
		// Closing the connection first: draining the body could block.
		b.release(false)
		b.rc.Close()
		return nil
	}
	err := b.rc.Close()
	b.release(b.keep)
	return err
}

// release pools the connection when reuse is true and the request's
// context has not ended, and closes it otherwise.
func (b *pooledBody) release(reuse bool) {
	if b.stop() && reuse {
		b.pool.put(b.c)
		return
	}
	b.c.conn.Close()
}

// splicedBody is what the reverse proxy reads of a response that went
// over the zero-copy path: nothing. Had the proxy not written the status
// (it always does), it reads the body from the connection.
type splicedBody struct {
	s     *splicer
	inner *pooledBody
}

func (b *splicedBody) Read(p []byte) (int, error) {
	if b.s.done {
		return 0, io.EOF
	}
	return b.inner.Read(p)
}

func (b *splicedBody) Close() error {
	if b.s.done {
		return nil
	}
	b.s.pending = nil
	return b.inner.Close()
}

// serve answers the client with the pending response, the head written
// here from w's header map (what the proxy would have sent), the body
// moved between the connections by the kernel. It reports false, with
// nothing written, when the connection cannot be hijacked.
func (s *splicer) serve(w *respWriter, code int) bool {
	p := s.pending
	cl := p.resp.ContentLength
	h := w.Header()
	if _, ok := h["Content-Type"]; !ok {
		// As net/http would, from the first bytes of the body.
		b, _ := p.c.br.Peek(int(min(512, cl)))
		h.Set("Content-Type", http.DetectContentType(b))
	}
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return false
	}
	s.pending, s.done = nil, true
	conn.SetDeadline(time.Time{})
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	h.Set("Connection", "close")
	proto := "HTTP/1.1"
	if !s.req.ProtoAtLeast(1, 1) {
		proto = "HTTP/1.0"
	}
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + fmt.Sprint(code)
	}
	bw := brw.Writer
	fmt.Fprintf(bw, "%s %03d %s\r\n", proto, code, text)
	h.Write(bw)
	bw.WriteString("\r\n")

	// The part of the body already read with the head, then the rest
	// by splice(2).
	n0 := min(int64(p.c.br.Buffered()), cl)
	head, _ := p.c.br.Peek(int(n0))
	_, err = bw.Write(head)
	if err == nil {
		err = bw.Flush()
	}
	var sent int64
	if err == nil {
		sent = n0
		p.c.br.Discard(int(n0))
		// The client is watched while the body flows: gone, it takes the
		// sandbox's connection with it, even when the sandbox is silent.
		var state atomic.Int32 // 0 copying, 1 done, 2 aborted
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			var b [512]byte
			for {
				if _, err := conn.Read(b[:]); err != nil {
					if state.CompareAndSwap(0, 2) {
						p.c.conn.Close()
					}
					conn.Close()
					return
				}
			}
		}()
		var m int64
		m, err = io.CopyN(conn, p.c.conn, cl-n0)
		sent += m
		if err == nil && state.CompareAndSwap(0, 1) {
			// Let the client read the end before the connection closes.
			if cw, ok := conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				conn.SetReadDeadline(time.Now().Add(spliceLinger))
			} else {
				conn.Close()
			}
			if p.stop() && !p.resp.Close {
				s.pool.put(p.c)
			} else {
				p.c.conn.Close()
			}
		} else {
			if err == nil {
				err = errors.New("the client went away")
			}
			state.Store(2)
			p.stop()
			p.c.conn.Close()
			conn.Close()
			<-watched
		}
	} else {
		p.stop()
		p.c.conn.Close()
		conn.Close()
	}
	w.code = code
	w.out.Add(sent)
	if err != nil {
		s.x.err = fmt.Errorf("zero-copy body after %d of %d bytes: %w", sent, cl, err)
	}
	return true
}
