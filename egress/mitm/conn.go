package mitm

import (
	"context"
	"net"
	"net/netip"
	"sync"
)

// clientConn is an intercepted client connection: the bytes the proxy
// already read come first, and Close tells ServeTLS or ServeHTTP1 that
// the connection has ended.
type clientConn struct {
	net.Conn
	info connInfo

	mu     sync.Mutex
	peeked []byte

	closeOnce sync.Once
	done      chan struct{}
}

// connInfo is what the proxy decided about a connection, handed to each
// of its requests through the request context.
type connInfo struct {
	scheme string // "https" or "http"
	// name is the SNI (https) or the Host name the proxy checked (http),
	// lower case, no trailing dot: the name dialed upstream.
	name string
	dst  netip.AddrPort // the original destination
}

func newClientConn(c net.Conn, peeked []byte, info connInfo) *clientConn {
	return &clientConn{
		Conn:   c,
		info:   info,
		peeked: append([]byte(nil), peeked...),
		done:   make(chan struct{}),
	}
}

func (c *clientConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.peeked) > 0 {
		n := copy(p, c.peeked)
		c.peeked = c.peeked[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() { close(c.done) })
	return err
}

type connInfoKey struct{}

// withConnInfo returns ctx carrying the connInfo of c, the connection
// http.Server accepted (a *tls.Conn over a *clientConn, or a
// *clientConn).
func withConnInfo(ctx context.Context, c net.Conn) context.Context {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = nc.NetConn()
	}
	if cc, ok := c.(*clientConn); ok {
		return context.WithValue(ctx, connInfoKey{}, cc.info)
	}
	return ctx
}

func connInfoFrom(ctx context.Context) (connInfo, bool) {
	info, ok := ctx.Value(connInfoKey{}).(connInfo)
	return info, ok
}

// chanListener is the listener the Interceptor's http.Server serves:
// ServeTLS and ServeHTTP1 hand it their connections.
type chanListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

// hand gives c to the server; false once the listener is closed.
func (l *chanListener) hand(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "mitm" }
func (pipeAddr) String() string  { return "mitm" }
