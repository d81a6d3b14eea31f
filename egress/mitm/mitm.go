// Package mitm is the credential vault's intercepting proxy. The
// transparent proxy (egress/proxy) hands it a client connection whose
// server name a vault binding covers; mitm terminates TLS there with a
// certificate signed by the sandbox's own CA, matches each request
// against the bindings, injects the credential's headers, and sends the
// request on over TLS verified against real roots. Secrets are redacted
// from what comes back.
//
// cmd/osb-egress wires it; egress/proxy hands it connections. It
// imports egress only.
package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opensandbox/opensandbox/egress"
)

// Config configures an Interceptor. Zero fields take the defaults noted.
type Config struct {
	// CA signs the certificates presented to the sandbox. Required.
	CA *CA
	// Binder returns the vault in force; a nil result means there is
	// none and requests go out unchanged. Required.
	Binder func() egress.Binder
	// Dial opens the upstream TCP connection to an allowed name on port;
	// osb-egress passes the transparent proxy's policy-checked dialer.
	// Required.
	Dial func(ctx context.Context, name string, port uint16) (net.Conn, error)
	// RootCAs verify the upstream servers. Nil means the system roots.
	// There is no way to turn verification off.
	RootCAs *x509.CertPool
	// RedactBodyBytes is how many bytes of an injected request's text
	// response body are scanned for secrets; the rest passes unchanged.
	// 0 means DefaultRedactBodyBytes; negative turns body redaction off.
	// Response headers are always redacted.
	RedactBodyBytes int64
	// Event, when set, is told of every request refused or sent without
	// its credential (Kind "vault"). It is called on the request's
	// goroutine and should not block.
	Event func(egress.Denial)
	// Logger receives debug lines per refused or failed request.
	// Default: discard.
	Logger *slog.Logger

	// HandshakeTimeout bounds a client's TLS handshake and the reading
	// of each request head. Default 10s.
	HandshakeTimeout time.Duration
	// IdleTimeout is how long a client connection may wait between
	// requests. Default 2m.
	IdleTimeout time.Duration
	// DialTimeout bounds each upstream dial. Default 10s.
	DialTimeout time.Duration
	// UpstreamHandshakeTimeout bounds each upstream TLS handshake.
	// Default 10s.
	UpstreamHandshakeTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for an upstream response's
	// head once the request is sent. Default 0: none, since a model API
	// may think for minutes before it answers.
	ResponseHeaderTimeout time.Duration
	// UpstreamIdleTimeout is how long an idle upstream connection stays
	// pooled. Default 90s.
	UpstreamIdleTimeout time.Duration
	// MaxIdleConnsPerHost is how many idle upstream connections are
	// pooled per name and port. Default 32.
	MaxIdleConnsPerHost int
}

// Defaults of Config.
const (
	DefaultRedactBodyBytes          = 1 << 20
	DefaultHandshakeTimeout         = 10 * time.Second
	DefaultIdleTimeout              = 2 * time.Minute
	DefaultDialTimeout              = 10 * time.Second
	DefaultUpstreamHandshakeTimeout = 10 * time.Second
	DefaultUpstreamIdleTimeout      = 90 * time.Second
	DefaultMaxIdleConnsPerHost      = 32
)

// EventKind is the Kind of the Denials an Interceptor reports.
const EventKind = "vault"

func (c *Config) setDefaults() error {
	if c.RedactBodyBytes == 0 {
		c.RedactBodyBytes = DefaultRedactBodyBytes
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.UpstreamHandshakeTimeout <= 0 {
		c.UpstreamHandshakeTimeout = DefaultUpstreamHandshakeTimeout
	}
	if c.UpstreamIdleTimeout <= 0 {
		c.UpstreamIdleTimeout = DefaultUpstreamIdleTimeout
	}
	if c.MaxIdleConnsPerHost <= 0 {
		c.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	if c.RootCAs == nil {
		roots, err := x509.SystemCertPool()
		if err != nil {
			return fmt.Errorf("system roots: %w", err)
		}
		c.RootCAs = roots
	}
	return nil
}

// Interceptor terminates intercepted connections and proxies their
// requests. Its methods are safe for concurrent use.
type Interceptor struct {
	cfg     Config
	log     *slog.Logger
	tlsConf *tls.Config // presented to clients
	srv     *http.Server
	ln      *chanListener
	tr      *http.Transport
	rp      *httputil.ReverseProxy
	served  chan struct{} // closed when srv.Serve returns

	connections    atomic.Uint64
	requests       atomic.Uint64
	injected       atomic.Uint64
	notInjected    atomic.Uint64
	refused        atomic.Uint64
	upstreamErrors atomic.Uint64

	mu     sync.Mutex
	closed bool
	conns  map[*clientConn]struct{}
}

// New returns an Interceptor for cfg, ready for ServeTLS and ServeHTTP1.
func New(cfg Config) (*Interceptor, error) {
	switch {
	case cfg.CA == nil:
		return nil, errors.New("mitm config: CA is required")
	case cfg.Binder == nil:
		return nil, errors.New("mitm config: Binder is required")
	case cfg.Dial == nil:
		return nil, errors.New("mitm config: Dial is required")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("mitm config: %w", err)
	}
	ic := &Interceptor{
		cfg:    cfg,
		log:    cfg.Logger,
		ln:     newChanListener(),
		served: make(chan struct{}),
		conns:  make(map[*clientConn]struct{}),
	}
	ic.tlsConf = &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: ic.certificate,
	}
	ic.tr = &http.Transport{
		DialContext: ic.dialUpstream,
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			RootCAs:    cfg.RootCAs,
		},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   cfg.UpstreamHandshakeTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		IdleConnTimeout:       cfg.UpstreamIdleTimeout,
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerHost,
		ExpectContinueTimeout: time.Second,
		// The client's Accept-Encoding goes upstream as sent and the
		// body comes back as the server encoded it.
		DisableCompression: true,
	}
	errLog := slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug)
	ic.rp = &httputil.ReverseProxy{
		Rewrite:        ic.rewrite,
		Transport:      ic.tr,
		FlushInterval:  -1,
		BufferPool:     copyBuffers{},
		ModifyResponse: ic.modifyResponse,
		ErrorHandler:   ic.upstreamError,
		ErrorLog:       errLog,
	}
	ic.srv = &http.Server{
		Handler: http.HandlerFunc(ic.serveRequest),
		// Serve sets up HTTP/2 only when this names h2; the connections
		// themselves are made with ic.tlsConf.
		TLSConfig:         &tls.Config{NextProtos: []string{"h2", "http/1.1"}},
		ReadHeaderTimeout: cfg.HandshakeTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ConnContext:       withConnInfo,
		ErrorLog:          errLog,
	}
	go func() {
		defer close(ic.served)
		ic.srv.Serve(ic.ln) // returns once ln is closed
	}()
	return ic, nil
}

// ServeTLS serves an intercepted TLS connection until it ends. c is the
// client's connection, from which the proxy already read peeked (the
// ClientHello); sni is its server name and dst the address the client
// connected to. ServeTLS presents a certificate for sni, refuses a
// handshake for any other name, and serves HTTP/1.1 and HTTP/2. It
// closes c.
func (ic *Interceptor) ServeTLS(c net.Conn, peeked []byte, sni string, dst netip.AddrPort) {
	name := canonicalName(sni)
	if name == "" {
		ic.refuse("", dst, "no TLS server name")
		c.Close()
		return
	}
	cc := newClientConn(c, peeked, connInfo{scheme: "https", name: name, dst: dst})
	ic.serve(cc, tls.Server(cc, ic.tlsConf))
}

// ServeHTTP1 serves an intercepted plain HTTP/1.x connection until it
// ends: c is the client's connection, from which the proxy already read
// peeked (the start of the first request), host is the Host name the
// proxy checked and dst the address the client connected to. It closes
// c.
func (ic *Interceptor) ServeHTTP1(c net.Conn, peeked []byte, host string, dst netip.AddrPort) {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = canonicalName(name)
	if name == "" {
		ic.refuse("", dst, "no Host name")
		c.Close()
		return
	}
	cc := newClientConn(c, peeked, connInfo{scheme: "http", name: name, dst: dst})
	ic.serve(cc, cc)
}

// serve hands conn, which reads and writes through cc, to the server and
// waits until cc is closed.
func (ic *Interceptor) serve(cc *clientConn, conn net.Conn) {
	if !ic.track(cc) {
		cc.Close()
		return
	}
	defer ic.untrack(cc)
	ic.connections.Add(1)
	if !ic.ln.hand(conn) {
		cc.Close()
		return
	}
	<-cc.done
}

// certificate presents the leaf for the connection's name, and refuses a
// client whose SNI names something else.
func (ic *Interceptor) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	cc, ok := hello.Conn.(*clientConn)
	if !ok {
		return nil, errors.New("not an intercepted connection")
	}
	if canonicalName(hello.ServerName) != cc.info.name {
		ic.refuse(cc.info.name, cc.info.dst, "TLS server name differs from the one checked")
		return nil, errors.New("TLS server name differs")
	}
	cert, err := ic.cfg.CA.Leaf(cc.info.name)
	if err != nil {
		ic.log.Error("leaf certificate", keyName, cc.info.name, keyError, err)
		return nil, errors.New("no certificate")
	}
	return cert, nil
}

// dialUpstream is the Transport's dialer: addr is the name and port the
// request's URL was given by rewrite.
func (ic *Interceptor) dialUpstream(ctx context.Context, _, addr string) (net.Conn, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("upstream address %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("upstream port %q: %w", ps, err)
	}
	ctx, cancel := context.WithTimeout(ctx, ic.cfg.DialTimeout)
	defer cancel()
	c, err := ic.cfg.Dial(ctx, host, uint16(port))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

// Close stops serving: it closes every intercepted connection, waits
// for their ServeTLS and ServeHTTP1 calls to return, and drops the idle
// upstream connections.
func (ic *Interceptor) Close() error {
	ic.mu.Lock()
	if ic.closed {
		ic.mu.Unlock()
		return nil
	}
	ic.closed = true
	ic.ln.Close()
	for cc := range ic.conns {
		cc.Close()
	}
	ic.mu.Unlock()
	err := ic.srv.Close()
	<-ic.served
	ic.tr.CloseIdleConnections()
	return err
}

func (ic *Interceptor) track(cc *clientConn) bool {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.closed {
		return false
	}
	ic.conns[cc] = struct{}{}
	return true
}

func (ic *Interceptor) untrack(cc *clientConn) {
	ic.mu.Lock()
	delete(ic.conns, cc)
	ic.mu.Unlock()
}

// Stats are an Interceptor's counters, for metrics.
type Stats struct {
	// Connections counts the connections handed to ServeTLS and
	// ServeHTTP1.
	Connections uint64
	// Requests counts the requests read from them.
	Requests uint64
	// Injected counts requests sent upstream with a credential.
	Injected uint64
	// NotInjected counts requests sent upstream unchanged because no
	// binding matched or no vault is in force.
	NotInjected uint64
	// Refused counts requests answered by the interceptor itself (421,
	// 403, 405) and handshakes refused.
	Refused uint64
	// UpstreamErrors counts requests answered 502.
	UpstreamErrors uint64
}

// Stats returns the current counters.
func (ic *Interceptor) Stats() Stats {
	return Stats{
		Connections:    ic.connections.Load(),
		Requests:       ic.requests.Load(),
		Injected:       ic.injected.Load(),
		NotInjected:    ic.notInjected.Load(),
		Refused:        ic.refused.Load(),
		UpstreamErrors: ic.upstreamErrors.Load(),
	}
}

// refuse counts and reports a refusal.
func (ic *Interceptor) refuse(name string, dst netip.AddrPort, reason string) {
	ic.refused.Add(1)
	ic.report(name, dst, reason)
}

// report tells Config.Event, and the debug log, of a refusal or a
// request sent without its credential. reason never holds a secret.
func (ic *Interceptor) report(name string, dst netip.AddrPort, reason string) {
	ic.log.Debug("vault", keyName, name, keyDst, dst, keyReason, reason)
	if ic.cfg.Event != nil {
		ic.cfg.Event(egress.Denial{
			Time:   time.Now(),
			Kind:   EventKind,
			Name:   name,
			Addr:   dst.Addr(),
			Port:   dst.Port(),
			Reason: reason,
		})
	}
}

// canonicalName is name in lower case without a trailing dot.
func canonicalName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// Log attribute keys.
const (
	keyError  = "error"
	keyName   = "name"
	keyDst    = "dst"
	keyReason = "reason"
	keyMethod = "method"
)
