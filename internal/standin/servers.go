package standin

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// connLifetime bounds how long a server keeps one connection, so that a
// client that never finishes cannot hold a goroutine past the test.
const connLifetime = time.Minute

// Server is one listener inside the namespace. It counts what reached it,
// so a test can show that a server a policy denies saw nothing at all.
type Server struct {
	// Addr is where it listens.
	Addr netip.AddrPort
	// URL is its address as a URL for HTTP and HTTPS servers
	// ("https://203.0.113.7:443/", "https://203.0.113.7:443/dns-query"),
	// empty for the others.
	URL string

	hits atomic.Int64
	mu   sync.Mutex
	seen []Seen
}

// Seen is what a server learned of one request (HTTP servers) or one
// TLS handshake (ServeDoT).
type Seen struct {
	// SNI is the server name of the ClientHello, the inner (hidden) one
	// when ECH was accepted; empty when the client sent none or the
	// server is not TLS.
	SNI string
	// ECH reports that the client used the Net's ECH configuration and
	// the server accepted it.
	ECH bool
	// Host is the HTTP request's Host; empty for DoT.
	Host string
	// Path is the HTTP request's path; empty for DoT.
	Path string
}

// Hits returns how many connections the server accepted (TCP, counted
// before any TLS handshake) or datagrams it received (UDP).
func (s *Server) Hits() int { return int(s.hits.Load()) }

// Seen returns what the server saw of each request or handshake, in
// order.
func (s *Server) Seen() []Seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Seen(nil), s.seen...)
}

func (s *Server) see(v Seen) {
	s.mu.Lock()
	s.seen = append(s.seen, v)
	s.mu.Unlock()
}

// counting is a listener that counts the connections it accepts into its
// server's hits.
type counting struct {
	net.Listener
	s *Server
}

func (l counting) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.s.hits.Add(1)
		c.SetDeadline(time.Now().Add(connLifetime))
	}
	return c, err
}

// listenCounted opens a TCP listener at addr inside the namespace whose
// accepted connections count into a new Server.
func (n *Net) listenCounted(addr netip.AddrPort) (*Server, net.Listener) {
	n.t.Helper()
	s := &Server{Addr: addr}
	return s, counting{Listener: n.Listen(addr), s: s}
}

// serveHTTP serves h on ln until the test ends.
func (n *Net) serveHTTP(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: connLifetime, ErrorLog: log.New(io.Discard, "", 0)} // refused handshakes are what tests provoke
	go srv.Serve(ln)
	n.t.Cleanup(func() { srv.Close() })
}

// seeRequest notes r in s.
func (s *Server) seeRequest(r *http.Request) {
	v := Seen{Host: r.Host, Path: r.URL.Path}
	if r.TLS != nil {
		v.SNI, v.ECH = r.TLS.ServerName, r.TLS.ECHAccepted
	}
	s.see(v)
}

// ServeWeb answers every HTTP request at addr, inside the namespace, with
// body (status 200), and notes each request's Host.
func (n *Net) ServeWeb(addr netip.AddrPort, body string) *Server {
	n.t.Helper()
	s, ln := n.listenCounted(addr)
	s.URL = "http://" + addr.String() + "/"
	n.serveHTTP(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.seeRequest(r)
		io.WriteString(w, body)
	}))
	return s
}

// ServeTLS answers every HTTPS request at addr, inside the namespace,
// with body (status 200). Its certificate, signed by the Net's CA (see
// CA), is for whatever name the client's SNI asks (or for addr when it
// asks none); it accepts ECH made with ECHConfigList. Each request's SNI
// and Host are noted (Seen) and returned in the response headers
// X-Standin-Sni and X-Standin-Host, so a client inside a sandbox can
// report them too.
func (n *Net) ServeTLS(addr netip.AddrPort, body string) *Server {
	n.t.Helper()
	s, ln := n.listenCounted(addr)
	s.URL = "https://" + addr.String() + "/"
	n.serveHTTP(tls.NewListener(ln, n.authority().serverConfig(nil)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.seeRequest(r)
		w.Header().Set("X-Standin-Sni", r.TLS.ServerName)
		w.Header().Set("X-Standin-Host", r.Host)
		io.WriteString(w, body)
	}))
	return s
}

// ServeTLSHandler serves h over TLS at addr, inside the namespace, with
// HTTP/2 and HTTP/1.1 offered; the certificate is as ServeTLS's. Each
// request is noted (Seen) before h runs.
func (n *Net) ServeTLSHandler(addr netip.AddrPort, h http.Handler) *Server {
	n.t.Helper()
	s, ln := n.listenCounted(addr)
	s.URL = "https://" + addr.String() + "/"
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.seeRequest(r)
			h.ServeHTTP(w, r)
		}),
		TLSConfig:         n.authority().serverConfig(nil),
		ReadHeaderTimeout: connLifetime,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go srv.ServeTLS(ln, "", "") // ServeTLS offers h2 through ALPN
	n.t.Cleanup(func() { srv.Close() })
	return s
}

// ServeDoH answers DNS over HTTPS at addr, inside the namespace, from d's
// records: RFC 8484 GET (?dns=, base64url) and POST (application/
// dns-message) on /dns-query; other paths are 404. TLS is as ServeTLS's.
func (n *Net) ServeDoH(addr netip.AddrPort, d *DNS) *Server {
	n.t.Helper()
	s, ln := n.listenCounted(addr)
	s.URL = "https://" + addr.String() + "/dns-query"
	mux := http.NewServeMux()
	mux.HandleFunc("/dns-query", func(w http.ResponseWriter, r *http.Request) {
		s.seeRequest(r)
		var msg []byte
		var err error
		switch r.Method {
		case http.MethodGet:
			msg, err = base64.RawURLEncoding.DecodeString(r.URL.Query().Get("dns"))
		case http.MethodPost:
			msg, err = io.ReadAll(http.MaxBytesReader(w, r.Body, 65535))
		default:
			http.Error(w, "GET or POST", http.StatusMethodNotAllowed)
			return
		}
		if err != nil {
			http.Error(w, "read query: "+err.Error(), http.StatusBadRequest)
			return
		}
		reply, err := d.replyWire(msg, r.RemoteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/dns-message")
		w.Write(reply)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.seeRequest(r)
		http.NotFound(w, r)
	})
	n.serveHTTP(tls.NewListener(ln, n.authority().serverConfig(nil)), mux)
	return s
}

// ServeDoT answers DNS over TLS on port 853 of addr, inside the
// namespace, from d's records. TLS is as ServeTLS's; each handshake's SNI
// is noted (Seen).
func (n *Net) ServeDoT(addr netip.Addr, d *DNS) *Server {
	n.t.Helper()
	s, ln := n.listenCounted(netip.AddrPortFrom(addr, 853))
	cfg := n.authority().serverConfig(nil)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				if err := tc.Handshake(); err != nil {
					return
				}
				cs := tc.ConnectionState()
				s.see(Seen{SNI: cs.ServerName, ECH: cs.ECHAccepted})
				serveDNSStream(tc, d)
			}()
		}
	}()
	return s
}

// serveDNSStream answers the queries of one stream connection, each
// message after its 2-byte length (RFC 7766, RFC 7858).
func serveDNSStream(c net.Conn, d *DNS) {
	r := bufio.NewReader(c)
	for {
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return
		}
		msg := make([]byte, int(l[0])<<8|int(l[1]))
		if _, err := io.ReadFull(r, msg); err != nil {
			return
		}
		reply, err := d.replyWire(msg, c.RemoteAddr().String())
		if err != nil {
			return
		}
		if _, err := c.Write(append([]byte{byte(len(reply) >> 8), byte(len(reply))}, reply...)); err != nil {
			return
		}
	}
}

// ServeBanner runs a TCP server at addr, inside the namespace, that
// speaks first: it sends banner and a newline as soon as a connection is
// accepted, then echoes each line it reads until the client closes.
func (n *Net) ServeBanner(addr netip.AddrPort, banner string) *Server {
	n.t.Helper()
	s, ln := n.listenCounted(addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.WriteString(c, banner+"\n"); err != nil {
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if len(line) > 0 {
						if _, err := c.Write(line); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return s
}

// ServeUDPEcho sends every datagram that reaches addr, inside the
// namespace, back to its sender.
func (n *Net) ServeUDPEcho(addr netip.AddrPort) *Server {
	n.t.Helper()
	var pc net.PacketConn
	err := n.inside(func() (err error) {
		pc, err = net.ListenPacket("udp", addr.String())
		return err
	})
	if err != nil {
		n.t.Fatalf("listen on udp %s in %s: %v", addr, n.Name, err)
	}
	n.t.Cleanup(func() { pc.Close() })
	s := &Server{Addr: addr}
	go func() {
		buf := make([]byte, 65535)
		for {
			m, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.hits.Add(1)
			pc.WriteTo(buf[:m], from)
		}
	}()
	return s
}
