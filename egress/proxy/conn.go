package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// maxPeek bounds the bytes read before a decision: a ClientHello of
// maxHelloLen split into records, or a request head of maxHeadLen.
const maxPeek = 2 * maxHelloLen

// The kinds of Denial the proxy reports.
const (
	kindTCP  = "tcp"
	kindTLS  = "tls"
	kindHTTP = "http"
)

// connectEstablished is the answer to a CONNECT the proxy carries out.
const connectEstablished = "HTTP/1.1 200 Connection established\r\n\r\n"

// class is what a connection's first bytes turned out to be.
type class int

const (
	classOpaque class = iota // nothing, or neither TLS nor HTTP/1.x
	classTLS
	classHTTP
)

// peeked is the start of a client's stream and what it says.
type peeked struct {
	data  []byte
	class class
	hello clientHello
	head  httpHead
	// err is nil, errMalformed, or errIncomplete when the client stopped
	// sending (or ran out of time) in the middle of a hello or head.
	err error
	// silent means the client sent nothing within the first wait: the
	// server may speak first, and the client's first bytes are still to
	// be checked once they come.
	silent bool
}

// decision is where a connection may go.
type decision struct {
	kind string // the Denial kind if it is refused
	// refuse, when set, is why the connection is refused outright.
	refuse string
	// name is the allowed host name to dial; "" means the connection
	// goes to its original destination if that address is allowed.
	name string
	// port is the port to dial name on.
	port uint16
	// addrReason is the Denial reason when the address is not allowed.
	addrReason string
	// connect means the client asked for a CONNECT tunnel, which the
	// proxy answers itself once the upstream is dialed.
	connect bool
	// payload is what to send upstream before splicing.
	payload []byte
}

// handle serves one accepted connection: decides, dials and splices.
func (p *Proxy) handle(c *net.TCPConn, self netip.AddrPort) {
	defer c.Close()
	dst, err := p.cfg.OriginalDst(c)
	if err == nil && !dst.IsValid() {
		err = errors.New("no original destination")
	}
	if err != nil {
		p.log.Debug("original destination", keyError, err)
		reset(c)
		return
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	if isSelf(dst, self) {
		p.refuse(c, kindTCP, "", dst, "destination is the proxy itself")
		return
	}

	pk, err := p.peek(c, p.cfg.PeekTimeout)
	if err != nil {
		p.log.Debug("read first bytes", keyDst, dst, keyError, err)
		reset(c)
		return
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		reset(c)
		return
	}
	d := p.decide(dst, pk)
	if d.refuse != "" {
		p.refuse(c, d.kind, d.name, dst, d.refuse)
		return
	}

	if d.name != "" && !d.connect && p.cfg.Intercept != nil {
		scheme := "https"
		if pk.class == classHTTP {
			scheme = "http"
		}
		if h := p.cfg.Intercept(scheme, d.name, dst); h != nil {
			h(c, pk.data)
			return
		}
	}
	var up net.Conn
	if d.name == "" {
		if !p.addrAllowed(dst.Addr()) {
			p.refuse(c, d.kind, "", dst, d.addrReason)
			return
		}
		up, err = p.dial(dst)
	} else {
		var reason string
		up, reason, err = p.dialName(d.name, dst, d.port)
		if reason != "" {
			p.refuse(c, d.kind, d.name, dst, reason)
			return
		}
	}
	if err != nil {
		p.log.Debug("dial upstream", keyName, d.name, keyDst, dst, keyError, err)
		reset(c)
		return
	}
	if d.connect {
		if _, err := io.WriteString(c, connectEstablished); err != nil {
			up.Close()
			reset(c)
			return
		}
	}
	var gate func() ([]byte, bool)
	if pk.silent {
		gate = p.lateGate(c, dst)
	}
	p.splice(c, up, d.payload, gate)
}

// lateGate returns the check of a silent client's first bytes, which
// splice runs before it passes any of them upstream. The connection went
// to its original destination as opaque TCP; a ClientHello or request
// head that comes late must name a name that address was learned for,
// or else a client could wait out PeekTimeout to carry a denied SNI to
// an allowed name's address (a CDN neighbour).
func (p *Proxy) lateGate(c *net.TCPConn, dst netip.AddrPort) func() ([]byte, bool) {
	return func() ([]byte, bool) {
		pk, err := p.peek(c, 0)
		if err != nil || c.SetReadDeadline(time.Time{}) != nil {
			return nil, false
		}
		d := p.decide(dst, pk)
		reason := d.refuse
		if reason == "" && d.name != "" && (p.cfg.Learned == nil || !p.cfg.Learned.Has(d.name, dst.Addr())) {
			reason = "name sent late to an address not learned for it"
		}
		if reason != "" {
			p.refuse(c, d.kind, d.name, dst, reason)
			return nil, false
		}
		return pk.data, true
	}
}

// peek reads the client's first bytes until they show what the
// connection is: a ClientHello, a request head, or something else. It
// waits up to first for the first byte (0: without limit); when none
// comes the result is opaque and silent (a protocol where the server
// speaks first). Once bytes arrive, the rest of a hello or head must
// follow within HeadTimeout.
func (p *Proxy) peek(c *net.TCPConn, first time.Duration) (peeked, error) {
	var deadline time.Time
	if first > 0 {
		deadline = time.Now().Add(first)
	}
	if err := c.SetReadDeadline(deadline); err != nil {
		return peeked{}, fmt.Errorf("set read deadline: %w", err)
	}
	buf := make([]byte, 0, 2048)
	started := false
	for {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(2*cap(buf), maxPeek))
			copy(grown, buf)
			buf = grown
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > 0 {
			pk := classify(buf)
			if pk.err != errIncomplete {
				return pk, nil
			}
			if len(buf) >= maxPeek {
				pk.err = errMalformed
				return pk, nil
			}
			if !started {
				started = true
				if err := c.SetReadDeadline(time.Now().Add(p.cfg.HeadTimeout)); err != nil {
					return peeked{}, fmt.Errorf("set read deadline: %w", err)
				}
			}
		}
		if err == nil {
			continue
		}
		timeout := errors.Is(err, os.ErrDeadlineExceeded)
		switch {
		case len(buf) == 0 && timeout:
			return peeked{class: classOpaque, silent: true}, nil
		case len(buf) == 0 && err == io.EOF:
			return peeked{class: classOpaque}, nil // the client sends nothing at all
		case timeout || err == io.EOF:
			return classify(buf), nil // still incomplete
		}
		return peeked{}, err
	}
}

// classify says what buf, the start of a client's stream, is.
func classify(buf []byte) peeked {
	pk := peeked{data: buf}
	if buf[0] == recordTypeHandshake {
		hello, err := parseClientHello(buf)
		if err == errNotTLS {
			return pk // class opaque
		}
		pk.class, pk.hello, pk.err = classTLS, hello, err
		return pk
	}
	head, err := parseHTTPHead(buf)
	if err == errNotHTTP {
		return pk
	}
	pk.class, pk.head, pk.err = classHTTP, head, err
	return pk
}

// decide applies the policy's name rules to what the client sent. It
// does no I/O; the address rules are applied by handle, the resolved
// addresses' by dialName.
func (p *Proxy) decide(dst netip.AddrPort, pk peeked) decision {
	dec := p.cfg.Decider
	switch pk.class {
	case classTLS:
		d := decision{kind: kindTLS, port: dst.Port(), payload: pk.data}
		switch {
		case pk.err == errIncomplete:
			d.refuse = "incomplete ClientHello"
		case pk.err != nil:
			d.refuse = "malformed ClientHello"
		case pk.hello.encrypted:
			d.name, _ = canonicalName(pk.hello.serverName)
			d.refuse = "encrypted ClientHello"
		case !pk.hello.hasServerName:
			d.addrReason = "no SNI, address not allowed"
		default:
			if _, err := netip.ParseAddr(pk.hello.serverName); err == nil {
				d.addrReason = "SNI is an address, address not allowed"
				break
			}
			name, ok := canonicalName(pk.hello.serverName)
			switch {
			case !ok:
				d.refuse = "invalid SNI"
			case !dec.Name(name):
				d.name, d.refuse = name, "name not allowed"
			default:
				d.name = name
			}
		}
		return d
	case classHTTP:
		d := decision{kind: kindHTTP, port: dst.Port(), payload: pk.data}
		if pk.err == errIncomplete {
			d.refuse = "incomplete request head"
			return d
		} else if pk.err != nil {
			d.refuse = "malformed request head"
			return d
		}
		rh, err := pk.head.destination()
		switch {
		case errors.Is(err, errHostMismatch):
			d.refuse = "Host and request target disagree"
		case err != nil:
			d.refuse = "invalid Host or request target"
		case pk.head.method == "CONNECT" && rh.name == "":
			d.refuse = "CONNECT to an address"
		case rh.name == "":
			d.addrReason = "no Host name, address not allowed"
		case !dec.Name(rh.name):
			d.name, d.refuse = rh.name, "name not allowed"
		default:
			d.name = rh.name
			if pk.head.method == "CONNECT" {
				d.connect, d.port, d.payload = true, rh.port, pk.data[pk.head.length:]
			}
		}
		return d
	default:
		return decision{kind: kindTCP, payload: pk.data, addrReason: "address not allowed"}
	}
}

// addrAllowed reports whether a connection may go to a as addressed: a
// was learned for a name still allowed and may be used, or an IP rule
// allows it.
func (p *Proxy) addrAllowed(a netip.Addr) bool {
	dec := p.cfg.Decider
	if p.cfg.Learned != nil && dec.Resolved(a) {
		for _, n := range p.cfg.Learned.Names(a) {
			if dec.Name(n) {
				return true
			}
		}
	}
	return dec.Addr(a)
}

// dialName connects to an allowed name on port: to the original
// destination's address when it was learned for this very name,
// otherwise to the name's addresses the policy accepts, in the order the
// resolver gave them. A non-empty reason means the policy refuses every
// address the name has.
func (p *Proxy) dialName(name string, dst netip.AddrPort, port uint16) (_ net.Conn, reason string, _ error) {
	dec := p.cfg.Decider
	if p.cfg.Learned != nil && p.cfg.Learned.Has(name, dst.Addr()) && dec.Resolved(dst.Addr()) {
		c, err := p.dial(netip.AddrPortFrom(dst.Addr(), port))
		return c, "", err
	}
	network := "ip4"
	if dst.Addr().Is6() {
		network = "ip6"
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	addrs, err := p.cfg.Resolver.LookupNetIP(ctx, network, name)
	cancel()
	if err != nil {
		return nil, "", fmt.Errorf("resolve %s: %w", name, err)
	}
	var errs []error
	usable := 0
	for _, a := range addrs {
		a = a.Unmap()
		if !dec.Resolved(a) {
			continue
		}
		usable++
		c, err := p.dial(netip.AddrPortFrom(a, port))
		if err == nil {
			return c, "", nil
		}
		errs = append(errs, err)
	}
	if usable == 0 {
		if len(addrs) == 0 {
			return nil, "", fmt.Errorf("resolve %s: no addresses", name)
		}
		return nil, "resolves to a blocked address", nil
	}
	return nil, "", errors.Join(errs...)
}

// DialName connects to name on port for an interceptor's upstream
// request, as the proxy connects a client that named it: only when the
// policy allows the name, and only to its addresses the policy accepts.
func (p *Proxy) DialName(ctx context.Context, name string, port uint16) (net.Conn, error) {
	name, ok := canonicalName(name)
	if !ok || !p.cfg.Decider.Name(name) {
		return nil, fmt.Errorf("dial %s: name not allowed", name)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, reason, err := p.dialName(name, netip.AddrPort{}, port)
	if reason != "" {
		return nil, fmt.Errorf("dial %s: %s", name, reason)
	}
	return c, err
}

// dial connects to a with Config.Dial, bounded by DialTimeout.
func (p *Proxy) dial(a netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	defer cancel()
	c, err := p.cfg.Dial(ctx, "tcp", net.JoinHostPort(a.Addr().String(), strconv.Itoa(int(a.Port()))))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", a, err)
	}
	return c, nil
}

// splice sends payload upstream, then copies both ways until both sides
// have finished sending. A side's EOF is passed on as a half-close; an
// error on either side resets both. There is no idle timeout: TCP
// keepalives find dead peers, and long quiet streams stay up. A non-nil
// gate runs before the client's bytes flow upstream (while the
// upstream's already flow to the client): it returns the bytes it read
// to pass on, or false to reset both sides.
func (p *Proxy) splice(c *net.TCPConn, up net.Conn, payload []byte, gate func() ([]byte, bool)) {
	if !p.track(up) {
		up.Close()
		reset(c)
		return
	}
	defer p.untrack(up)
	defer up.Close()
	if len(payload) > 0 {
		if _, err := up.Write(payload); err != nil {
			reset(c)
			return
		}
	}
	var once sync.Once
	abort := func() {
		once.Do(func() {
			if tc, ok := up.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			up.Close()
			reset(c)
		})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if gate != nil {
			data, ok := gate()
			if !ok {
				abort()
				return
			}
			if _, err := up.Write(data); err != nil {
				abort()
				return
			}
		}
		// *net.TCPConn's ReadFrom moves the bytes with splice(2).
		if _, err := io.Copy(up, c); err != nil || closeWrite(up) != nil {
			abort()
		}
	}()
	if _, err := io.Copy(c, up); err != nil || c.CloseWrite() != nil {
		abort()
	}
	wg.Wait()
}

// closeWrite half-closes c when it can; a connection that cannot is
// closed by splice once the other direction ends.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// refuse resets c and reports the denial.
func (p *Proxy) refuse(c *net.TCPConn, kind, name string, dst netip.AddrPort, reason string) {
	p.refused.Add(1)
	reset(c)
	p.log.Debug("refused", keyKind, kind, keyName, name, keyDst, dst, keyReason, reason)
	if p.cfg.Deny != nil {
		p.cfg.Deny(egress.Denial{
			Time:   time.Now(),
			Kind:   kind,
			Name:   name,
			Addr:   dst.Addr(),
			Port:   dst.Port(),
			Reason: reason,
		})
	}
}

// isSelf reports whether dst is the proxy's own listening address: a
// client that connects there directly must not make the proxy dial
// itself.
func isSelf(dst, self netip.AddrPort) bool {
	if !self.IsValid() || dst.Port() != self.Port() {
		return false
	}
	if self.Addr().IsUnspecified() {
		return dst.Addr().IsLoopback() || dst.Addr().IsUnspecified()
	}
	return dst.Addr() == self.Addr()
}
