// Package proxy is the transparent TCP proxy of strict mode. The sandbox
// namespace's firewall redirects every outbound TCP connection to it; it
// reads the connection's first bytes and lets a TLS connection through
// only when its SNI is an allowed name, an HTTP/1.x request only when its
// Host is, and dials that name itself, so an allowed name sent to some
// other address reaches the name's servers and never that address. Other
// TCP reaches only an address learned for an allowed name or one an IP
// rule allows.
//
// Only cmd/osb-egress imports it; it wires the Decider, the DNS proxy's
// learned table, a resolver and a dialer whose sockets carry egress.Mark.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// Learned is the table of what allowed names resolved to, as the DNS
// proxy answered them to this sandbox. Implementations are safe for
// concurrent use.
type Learned interface {
	// Names returns the names a was an answer for (canonical form).
	Names(a netip.Addr) []string
	// Has reports whether a was an answer for name.
	Has(name string, a netip.Addr) bool
}

// Resolver looks up a name's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Proxy. Zero fields take the defaults noted.
type Config struct {
	// Listen is the address Start listens on. Default "127.0.0.1:15001"
	// (egress.ProxyPort).
	Listen string
	// Decider answers the policy questions. Required.
	Decider egress.Decider
	// Learned is the DNS proxy's table. Nil means nothing was learned:
	// names are always resolved, and other TCP reaches only addresses
	// Decider.Addr allows.
	Learned Learned
	// Resolver resolves the names the proxy dials. Default
	// net.DefaultResolver.
	Resolver Resolver
	// Dial opens the upstream connections. osb-egress passes one whose
	// sockets carry egress.Mark so the namespace's firewall lets them out.
	// Default a net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// OriginalDst returns the destination the client connected to before
	// the firewall redirected it (nft.OriginalDst). Required.
	OriginalDst func(*net.TCPConn) (netip.AddrPort, error)
	// Intercept, when set, is asked about each connection the policy lets
	// through to a name it carries: TLS with that SNI (scheme "https") or
	// an HTTP/1.x request with that Host (scheme "http"); CONNECT tunnels
	// are not offered. A non-nil handler takes the connection over: it
	// gets the client's connection and the bytes read from it so far,
	// and the proxy neither dials nor splices. The credential vault's
	// interceptor (egress/mitm) is the one osb-egress passes.
	Intercept func(scheme, name string, dst netip.AddrPort) func(c net.Conn, peeked []byte)
	// Deny, when set, is told of every connection the policy refused. It
	// is called on the connection's goroutine and should not block.
	Deny func(egress.Denial)
	// Logger receives debug lines per refused or failed connection and
	// warnings for accept errors. Default: discard.
	Logger *slog.Logger

	// PeekTimeout is how long the proxy waits for a client's first bytes
	// before it takes the connection for a protocol where the server
	// speaks first. Default 300ms.
	PeekTimeout time.Duration
	// HeadTimeout bounds the time from a client's first byte to a
	// complete ClientHello or request head. Default 10s.
	HeadTimeout time.Duration
	// DialTimeout bounds each upstream dial and each name lookup.
	// Default 10s.
	DialTimeout time.Duration
	// MaxConns is the number of connections handled at once; those
	// beyond it are reset at once. Default 4096.
	MaxConns int
}

// Defaults of Config.
const (
	DefaultPeekTimeout = 300 * time.Millisecond
	DefaultHeadTimeout = 10 * time.Second
	DefaultDialTimeout = 10 * time.Second
	DefaultMaxConns    = 4096
)

func (c *Config) setDefaults() {
	if c.Listen == "" {
		c.Listen = net.JoinHostPort("127.0.0.1", fmt.Sprint(egress.ProxyPort))
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.Dial == nil {
		c.Dial = (&net.Dialer{}).DialContext
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.PeekTimeout <= 0 {
		c.PeekTimeout = DefaultPeekTimeout
	}
	if c.HeadTimeout <= 0 {
		c.HeadTimeout = DefaultHeadTimeout
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
}

// Proxy is the transparent proxy. Its methods are safe for concurrent use.
type Proxy struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // done on Close; bounds lookups and dials
	cancel context.CancelFunc

	active   atomic.Int64
	accepted atomic.Uint64
	refused  atomic.Uint64
	overload atomic.Uint64

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{} // clients and upstreams, closed by Close
	started   net.Listener          // Start's listener
	wg        sync.WaitGroup        // Serve loops and connection handlers
}

// New returns a Proxy for cfg; it listens only when Start or Serve is
// called.
func New(cfg Config) (*Proxy, error) {
	if cfg.Decider == nil {
		return nil, errors.New("proxy config: Decider is required")
	}
	if cfg.OriginalDst == nil {
		return nil, errors.New("proxy config: OriginalDst is required")
	}
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{
		cfg:       cfg,
		log:       cfg.Logger,
		ctx:       ctx,
		cancel:    cancel,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[net.Conn]struct{}),
	}, nil
}

// Start listens on Config.Listen and serves in the background until
// Close.
func (p *Proxy) Start() error {
	l, err := net.Listen("tcp", p.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", p.cfg.Listen, err)
	}
	p.mu.Lock()
	p.started = l
	p.mu.Unlock()
	go func() {
		if err := p.Serve(l); err != nil {
			p.log.Error("transparent proxy stopped", keyError, err)
		}
	}()
	return nil
}

// Serve accepts connections on l and handles each until l fails or Close
// is called; it returns nil after Close. Serve closes l.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return nil
	}
	p.listeners[l] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
		l.Close()
	}()

	self := listenAddrPort(l)
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of descriptors or memory: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				p.log.Warn("accept", keyError, err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept on %s: %w", l.Addr(), err)
		}
		backoff = 0
		p.accepted.Add(1)
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		if p.active.Load() >= int64(p.cfg.MaxConns) {
			p.overload.Add(1)
			reset(tc)
			continue
		}
		if !p.track(tc) {
			reset(tc)
			return nil
		}
		p.active.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.active.Add(-1)
			defer p.untrack(tc)
			p.handle(tc, self)
		}()
	}
}

// Close stops every Serve loop, closes every connection and waits for
// their handlers to return.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	for l := range p.listeners {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Stats are the proxy's counters, for metrics.
type Stats struct {
	// Active is the number of connections being handled now.
	Active int64
	// Accepted counts connections accepted since New.
	Accepted uint64
	// Refused counts connections the policy refused.
	Refused uint64
	// Overloaded counts connections reset because MaxConns were active.
	Overloaded uint64
}

// Stats returns the current counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Active:     p.active.Load(),
		Accepted:   p.accepted.Load(),
		Refused:    p.refused.Load(),
		Overloaded: p.overload.Load(),
	}
}

// Active returns the number of connections being handled now.
func (p *Proxy) Active() int64 { return p.active.Load() }

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track registers c to be closed by Close; false when Close has begun.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// listenAddrPort returns l's address, or the zero value when it is not
// a TCP address.
func listenAddrPort(l net.Listener) netip.AddrPort {
	if ta, ok := l.Addr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// reset closes c with an RST rather than a FIN, so a refused client
// learns at once and no TIME_WAIT is left behind.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// Log attribute keys.
const (
	keyError  = "error"
	keyName   = "name"
	keyDst    = "dst"
	keyKind   = "kind"
	keyReason = "reason"
)
