// Package dnsproxy is the DNS filter of osb-egress: a DNS server on
// egress.DNSPort (UDP and TCP) that answers names the policy allows by
// asking the upstream resolvers, answers NXDOMAIN for the others, removes
// from every answer the addresses the policy refuses (DNS rebinding), and
// reports what each allowed name resolved to so that the firewall and the
// transparent proxy can admit connections to those addresses only.
//
// Only cmd/osb-egress imports it.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/opensandbox/opensandbox/egress"
)

// DefaultTimeout is how long one upstream resolver is given to answer
// before the next one is asked.
const DefaultTimeout = 2 * time.Second

const (
	// upstreamUDPSize is the EDNS(0) buffer size of the queries sent
	// upstream and advertised to clients (the DNS flag day 2020 value,
	// which avoids IP fragmentation).
	upstreamUDPSize = 1232
	// maxInflight bounds the queries being forwarded at once, so that a
	// flood from the sandbox cannot grow goroutines and sockets without
	// limit. Queries beyond it are answered SERVFAIL.
	maxInflight = 1024
	// shutdownGrace is how long Close waits for queries being answered.
	shutdownGrace = 5 * time.Second
)

// Config configures a Server.
type Config struct {
	// Listen is the address served, over UDP and TCP on the same port.
	// Default 127.0.0.1:15353 (egress.DNSPort). With port 0 both
	// transports share one port picked by the system; Addr reports it.
	Listen string
	// Upstreams are the resolvers asked, as host:port, in order: the
	// next one is asked when one fails, times out or answers SERVFAIL or
	// REFUSED. Required.
	Upstreams []string
	// Timeout is how long each upstream is given. Default DefaultTimeout.
	Timeout time.Duration
	// Decider decides which names may be resolved and which of their
	// addresses may be returned. Required.
	Decider egress.Decider
	// Learn, when set, is called with the addresses an answer returns to
	// the client, once for the question name and once for every CNAME
	// target on its chain (lower case, no trailing dot), with the
	// smallest TTL of those address records (capped at MaxTTL, possibly
	// 0). It is called before the client gets the answer, so a consumer
	// that admits connections to learned addresses has them in place by
	// the time the client connects. It must not block for long.
	Learn func(name string, addrs []netip.Addr, ttl time.Duration)
	// Deny, when set, is called for every query answered NXDOMAIN by
	// policy. It must not block for long.
	Deny func(egress.Denial)
	// Control, when set, is called on each socket opened to an upstream
	// before it connects; osb-egress uses it to set egress.Mark so that
	// the namespace's firewall lets its own queries out.
	Control func(network, address string, c syscall.RawConn) error
	// Logger receives upstream failures at debug level. Default: discard.
	Logger *slog.Logger
}

// Server is the DNS filter. Create it with New, then Start it.
type Server struct {
	cfg Config
	log *slog.Logger
	udp *dns.Client
	tcp *dns.Client
	// exchange asks the upstreams; it is forward outside tests.
	exchange func(ctx context.Context, m *dns.Msg) (*dns.Msg, error)
	inflight chan struct{}

	ctx    context.Context // done when the server closes
	cancel context.CancelFunc

	mu      sync.Mutex
	started bool
	closed  bool
	addr    string
	servers []*dns.Server
	serving sync.WaitGroup
}

// New checks cfg and returns a Server that is not yet listening.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(egress.DNSPort))
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("dnsproxy: Listen %q: %w", cfg.Listen, err)
	}
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("dnsproxy: Upstreams is empty")
	}
	for _, u := range cfg.Upstreams {
		if _, port, err := net.SplitHostPort(u); err != nil || port == "" {
			return nil, fmt.Errorf("dnsproxy: upstream %q is not host:port", u)
		}
	}
	if cfg.Decider == nil {
		return nil, errors.New("dnsproxy: Decider is nil")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		inflight: make(chan struct{}, maxInflight),
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, Control: cfg.Control}
	s.udp = &dns.Client{Net: "udp", Dialer: dialer, Timeout: cfg.Timeout, UDPSize: upstreamUDPSize}
	s.tcp = &dns.Client{Net: "tcp", Dialer: dialer, Timeout: cfg.Timeout}
	s.exchange = s.forward
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Start binds the UDP and TCP sockets and returns once both serve.
func (s *Server) Start() (retErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return errors.New("dnsproxy: Start called twice or after Close")
	}
	pc, ln, err := listen(s.cfg.Listen)
	if err != nil {
		return err
	}
	s.started = true
	s.addr = pc.LocalAddr().String()
	s.servers = []*dns.Server{
		{PacketConn: pc, Handler: s.handler("udp"), UDPSize: dns.MaxMsgSize, MsgAcceptFunc: acceptQuery},
		{Listener: ln, Handler: s.handler("tcp"), MsgAcceptFunc: acceptQuery},
	}
	defer func() {
		if retErr != nil {
			s.shutdownLocked()
			pc.Close() // a server that never started leaves its socket open
			ln.Close()
		}
	}()
	errc := make(chan error, len(s.servers))
	for _, srv := range s.servers {
		up := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(up) }
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			if err := srv.ActivateAndServe(); err != nil {
				errc <- err
			}
		}()
		select {
		case <-up:
		case err := <-errc:
			return fmt.Errorf("dnsproxy: serve %s: %w", s.addr, err)
		}
	}
	return nil
}

// Addr is the address served (UDP and TCP), empty before Start.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Close stops serving and waits, for a few seconds at most, for the
// queries being answered. It may be called more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.shutdownLocked()
	return nil
}

func (s *Server) shutdownLocked() {
	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	for _, srv := range s.servers {
		if err := srv.ShutdownContext(ctx); err != nil {
			s.log.Debug("dns server shutdown", "err", err)
		}
	}
	s.servers = nil
	s.serving.Wait()
}

// listen binds addr over UDP, then TCP on the port UDP got. When addr
// asks for any port, a port taken over TCP only is retried with another.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	_, port, _ := net.SplitHostPort(addr)
	tries := 1
	if port == "0" {
		tries = 20
	}
	var lastErr error
	for range tries {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("dnsproxy: listen udp %s: %w", addr, err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		lastErr = err
	}
	return nil, nil, fmt.Errorf("dnsproxy: listen tcp %s: %w", addr, lastErr)
}

// acceptQuery lets through plain queries with one question. Responses and
// messages that carry records in answer or authority are dropped without
// a reply; other opcodes get NOTIMP.
func acceptQuery(h dns.Header) dns.MsgAcceptAction {
	const qr = 1 << 15
	switch {
	case h.Bits&qr != 0:
		return dns.MsgIgnore
	case int(h.Bits>>11)&0xF != dns.OpcodeQuery:
		return dns.MsgRejectNotImplemented
	case h.Qdcount != 1 || h.Ancount != 0 || h.Nscount != 0 || h.Arcount > 2:
		return dns.MsgIgnore
	}
	return dns.MsgAccept
}

// handler answers queries that arrived over network ("udp" or "tcp").
func (s *Server) handler(network string) dns.Handler {
	return dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		reply := s.handle(s.ctx, req)
		if reply == nil {
			return
		}
		if network == "udp" {
			reply.Truncate(clientUDPSize(req))
		}
		if err := w.WriteMsg(reply); err != nil {
			s.log.Debug("write dns answer", "network", network, "err", err)
		}
	})
}

// clientUDPSize is the largest UDP answer the client of req accepts.
func clientUDPSize(req *dns.Msg) int {
	if opt := req.IsEdns0(); opt != nil && opt.UDPSize() > dns.MinMsgSize {
		return int(opt.UDPSize())
	}
	return dns.MinMsgSize
}

// forward asks the upstreams in order and returns the first usable answer.
func (s *Server) forward(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	var lastErr error
	for _, up := range s.cfg.Upstreams {
		r, err := s.ask(ctx, up, m)
		if err == nil && (r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused) {
			err = fmt.Errorf("answered %s", dns.RcodeToString[r.Rcode])
		}
		if err == nil {
			return r, nil
		}
		lastErr = fmt.Errorf("ask upstream %s: %w", up, err)
		s.log.Debug("dns upstream failed", "upstream", up, "name", m.Question[0].Name, "err", err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// ask sends m to one upstream over UDP and, when the answer is truncated,
// again over TCP.
func (s *Server) ask(ctx context.Context, upstream string, m *dns.Msg) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	r, _, err := s.udp.ExchangeContext(ctx, m, upstream)
	if err == nil && r.Truncated {
		r, _, err = s.tcp.ExchangeContext(ctx, m, upstream)
	}
	if err != nil {
		return nil, err
	}
	if r.Id != m.Id || !r.Response || len(r.Question) != 1 || !sameQuestion(r.Question[0], m.Question[0]) {
		return nil, errors.New("answer does not match the query")
	}
	if r.Truncated {
		return nil, errors.New("answer truncated over TCP")
	}
	return r, nil
}

func sameQuestion(a, b dns.Question) bool {
	return a.Qtype == b.Qtype && a.Qclass == b.Qclass && dns.CanonicalName(a.Name) == dns.CanonicalName(b.Name)
}
