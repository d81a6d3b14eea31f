package lifecycle

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
	"github.com/opensandbox/opensandbox/internal/httpx"
	"github.com/opensandbox/opensandbox/sandbox"
)

// proxyTransport carries the requests of the proxy route: one pool of
// keep-alive connections to sandboxes. It never uses an HTTP proxy from
// the environment, sets no response timeout (streams and long polls last
// as long as they last), and leaves encodings to client and backend.
var proxyTransport = &http.Transport{
	DialContext: (&net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
	}).DialContext,
	MaxIdleConns:          256,
	MaxIdleConnsPerHost:   64,
	IdleConnTimeout:       90 * time.Second,
	ExpectContinueTimeout: time.Second,
	DisableCompression:    true,
}

// proxyPath is a request path of the proxy route,
// [/v1]/sandboxes/{id}/proxy/{port}[/{rest}].
type proxyPath struct {
	id   sandbox.ID
	port string // as written; checked by serveProxy
	rest string // escaped: "" or "/..."
}

// parseProxyPath recognizes the proxy route in an escaped request path.
// The rest of the path is kept exactly as sent, "//" and dot segments
// included: it belongs to the application behind the proxy.
func parseProxyPath(escaped string) (proxyPath, bool) {
	p, ok := strings.CutPrefix(escaped, "/v1/sandboxes/")
	if !ok {
		if p, ok = strings.CutPrefix(escaped, "/sandboxes/"); !ok {
			return proxyPath{}, false
		}
	}
	idSeg, p, ok := strings.Cut(p, "/")
	if !ok || idSeg == "" {
		return proxyPath{}, false
	}
	p, ok = strings.CutPrefix(p, "proxy/")
	if !ok {
		return proxyPath{}, false
	}
	port, rest, slash := strings.Cut(p, "/")
	if port == "" {
		return proxyPath{}, false
	}
	id, err := url.PathUnescape(idSeg)
	if err != nil {
		return proxyPath{}, false
	}
	if slash {
		rest = "/" + rest
	}
	return proxyPath{id: sandbox.ID(id), port: port, rest: rest}, true
}

// proxyTarget is where serveProxy sends a request; it travels to the
// rewrite function in the request's context.
type proxyTarget struct {
	host    string // host:port
	path    string // escaped
	headers map[string]string
}

// proxyTargetKey keys the proxy target in a request's context.
type proxyTargetKey struct{}

// serveProxy answers the proxy route: any method, WebSocket upgrades
// included, is forwarded to the runtime's endpoint of the port, once the
// request has shown the API key or the sandbox's token. Each request
// counts as access for renew-on-access.
func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request, p proxyPath) {
	port, ok := parsePort(p.port)
	if !ok {
		s.writeError(w, r, invalid(s.codes().invalidPort, "port %q: want an integer from 1 to 65535", p.port))
		return
	}
	ctx := r.Context()
	if err := s.authenticateProxy(ctx, r, p.id); err != nil {
		s.writeError(w, r, err)
		return
	}
	if port == sandbox.PortEgress && vaultWrite(r.Method, p.rest) && !egress.ClearTextOK(r, nil) {
		// osb-egress takes this server's hop for a local one; the
		// client's own hop must not carry a secret in clear either.
		http.Error(w, "credential vault writes need TLS or a loopback client", http.StatusUpgradeRequired)
		return
	}
	ep, err := s.rt.Endpoint(ctx, p.id, port)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	host, prefix, hasPrefix := strings.Cut(ep.Address, "/")
	if hasPrefix {
		prefix = "/" + prefix
	}
	target := &proxyTarget{host: host, path: prefix + p.rest, headers: ep.Headers}
	if target.path == "" {
		target.path = "/"
	}
	s.renewOnAccess(ctx, p.id)
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, proxyTargetKey{}, target)))
}

// newProxy returns the reverse proxy of the proxy route. It streams both
// ways, flushing every write at once, and answers a backend that cannot
// be reached with a 502 envelope.
func (s *Server) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:       rewriteProxyRequest,
		Transport:     proxyTransport,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ModifyResponse: func(resp *http.Response) error {
			// The answer already carries this server's X-Request-ID.
			resp.Header.Del(api.HeaderRequestID)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client has gone
			}
			s.writeError(w, r, &httpx.Error{Status: http.StatusBadGateway, Code: codeBadGateway,
				Message: "the sandbox did not answer on this port", Err: err})
		},
	}
}

// rewriteProxyRequest aims an accepted proxy request at its target:
// http://{address}{rest of the path}?{query}, with the API key and the
// client's sandbox token removed (the token must never reach processes
// in the sandbox), then the endpoint's headers added (for ports behind
// execd's forwarder, the token, which execd checks and strips), the Host
// header the target's, and X-Forwarded-For/-Proto/-Host describing the
// client. Cookie and Authorization pass: they belong to the application
// behind the proxy. Hop-by-hop headers are removed by
// httputil.ReverseProxy.
func rewriteProxyRequest(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(proxyTargetKey{}).(*proxyTarget)
	u := pr.Out.URL
	u.Scheme, u.Host = "http", t.host
	if p, err := url.PathUnescape(t.path); err == nil {
		u.Path, u.RawPath = p, t.path
	} else {
		u.Path, u.RawPath = t.path, ""
	}
	pr.Out.Host = ""
	if prior := pr.In.Header.Values("X-Forwarded-For"); len(prior) > 0 {
		pr.Out.Header["X-Forwarded-For"] = slices.Clone(prior)
	}
	pr.SetXForwarded() // appends the client's address; sets Host and Proto
	pr.Out.Header.Del(api.HeaderAPIKey)
	pr.Out.Header.Del(sandbox.HeaderExecdToken)
	for k, v := range t.headers {
		pr.Out.Header.Set(k, v)
	}
	pr.Out.Header.Set(api.HeaderRequestID, requestIDOf(pr.In))
}

// renewThrottle remembers, per sandbox, when renew-on-access may look at
// it next.
type renewThrottle struct {
	mu   sync.Mutex
	next map[sandbox.ID]time.Time
}

// renewThrottleSweep is the size from which claim drops stale entries.
const renewThrottleSweep = 1024

// newRenewThrottle returns a throttle that holds nothing off.
func newRenewThrottle() *renewThrottle {
	return &renewThrottle{next: map[sandbox.ID]time.Time{}}
}

// claim reports whether id is due at now, and if so holds it off until
// hold, so that concurrent requests do not renew it again.
func (t *renewThrottle) claim(id sandbox.ID, now, hold time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if next, ok := t.next[id]; ok && now.Before(next) {
		return false
	}
	if len(t.next) >= renewThrottleSweep {
		for k, next := range t.next {
			if !now.Before(next) {
				delete(t.next, k)
			}
		}
	}
	t.next[id] = hold
	return true
}

// set holds id off until next.
func (t *renewThrottle) set(id sandbox.ID, next time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next[id] = next
}

// forget drops what the throttle knows of id.
func (t *renewThrottle) forget(id sandbox.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.next, id)
}

// renewOnAccess moves the expiry of a sandbox created with extension
// access.renew.extend.seconds = N, and with an expiry, to now + N (at most
// MaxTimeout ahead) when a request reaches it through the proxy: at most
// once per N/10 per sandbox, and never earlier than it already was.
// Failures are logged; the request goes on.
func (s *Server) renewOnAccess(ctx context.Context, id sandbox.ID) {
	now := s.now()
	if !s.renew.claim(id, now, now.Add(time.Minute)) {
		return
	}
	sb, err := s.rt.Get(ctx, id)
	if err != nil {
		s.renew.forget(id)
		return
	}
	n, err := renewExtendOf(sb.Extensions[extRenewExtend])
	if err != nil || sb.ExpiresAt == nil {
		// The extension and the presence of an expiry never change: look
		// again only once in a while.
		s.renew.set(id, now.Add(10*time.Minute))
		return
	}
	every := n / 10
	s.renew.set(id, now.Add(every))
	if s.cfg.MaxTimeout > 0 {
		n = min(n, s.cfg.MaxTimeout)
	}
	at := now.Add(n)
	if !at.After(*sb.ExpiresAt) {
		return
	}
	// An expiry less than one throttle period short of at is left as it
	// is: another replica (or gateway) renewed it a moment ago.
	wrote, err := s.m.RenewOnAccess(context.WithoutCancel(ctx), id, at, every)
	if err != nil {
		s.log.Warn("renew on access", logSandbox, id, logErr, err)
		return
	}
	if wrote {
		s.log.Debug("renewed on access", logSandbox, id, "expiresAt", at.UTC())
	}
}

// vaultWrite reports whether a request to the egress API's path rest
// (escaped) writes the credential vault.
func vaultWrite(method, rest string) bool {
	if method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions {
		return false
	}
	p, err := url.PathUnescape(rest)
	if err != nil {
		return true // osb-egress refuses it; so can this hop
	}
	p = path.Clean("/" + p)
	p = strings.TrimPrefix(p, "/proxy/"+strconv.Itoa(sandbox.PortEgress))
	return p == "/credential-vault" || strings.HasPrefix(p, "/credential-vault/")
}
