package execd

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// proxyTransport carries every request of the port proxy: one pool of
// keep-alive connections to the servers inside the sandbox. It never uses
// an HTTP proxy from the environment, and leaves Accept-Encoding and the
// response encoding to the client and the backend.
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

// The answers to a request path that names no usable port.
var (
	errPortRequired = errors.New("port is required")
	errInvalidPort  = errors.New("invalid port")
	errNestedSelf   = errors.New("nested proxy prefix: /proxy/{port} of execd's own port may appear once")
)

// proxyTarget splits the escaped path of a proxy request,
// "/proxy/{port}/{rest}", into the port (1 to 65535, decimal) and the
// escaped path to forward, "/{rest}".
func proxyTarget(escapedPath string) (port int, path string, err error) {
	rest, ok := strings.CutPrefix(escapedPath, "/proxy/")
	if !ok {
		return 0, "", errPortRequired
	}
	p, tail, _ := strings.Cut(rest, "/")
	p, err = url.PathUnescape(p)
	if err != nil {
		return 0, "", errInvalidPort
	}
	if p == "" {
		return 0, "", errPortRequired
	}
	if !isDecimal(p) {
		return 0, "", errInvalidPort
	}
	if digits := strings.TrimLeft(p, "0"); len(digits) <= 5 {
		port, _ = strconv.Atoi("0" + digits)
	}
	if port < 1 || port > 65535 {
		return 0, "", errInvalidPort
	}
	return port, "/" + tail, nil
}

// isDecimal reports whether s is a non-empty run of ASCII digits.
func isDecimal(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// proxy returns the handler of /proxy/{port}/{path...}: any method is
// forwarded to http://127.0.0.1:{port}/{path} with the query, the body and
// the headers (but not execd's access token), WebSocket upgrades included.
// Responses are flushed as they arrive, so event streams and long polls
// pass through at once. A bad port is a 400 and an unreachable backend a
// 502, both text/plain like the reference daemon's.
func (s *Server) proxy() http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite:       rewriteProxyRequest,
		Transport:     proxyTransport,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Debug("proxy: backend failed", "method", r.Method, "path", r.URL.Path, "err", err)
			http.Error(w, "Bad Gateway", http.StatusBadGateway)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		port, path, err := proxyTarget(r.URL.EscapedPath())
		if err != nil {
			s.log.Debug("proxy: rejected", "method", r.Method, "path", r.URL.Path, "err", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if port == s.cfg.Port {
			// execd's own port, as clients reach it through the
			// {host}:{port}/proxy/44772 endpoints of Docker-style
			// deployments: served here, the request already
			// authenticated, rather than sent back in without the token
			// the proxy strips. One prefix is all an endpoint carries; a
			// second one is refused rather than unwrapped again and
			// again.
			if inner, _, err := proxyTarget(path); err == nil && inner == s.cfg.Port {
				s.log.Debug("proxy: rejected", "method", r.Method, "path", r.URL.Path, "err", errNestedSelf)
				http.Error(w, errNestedSelf.Error(), http.StatusBadRequest)
				return
			}
			s.serveSelf(w, r, path)
			return
		}
		rp.ServeHTTP(w, r)
	})
}

// serveSelf serves a request for /proxy/{execd's port}{path} as a request
// for path.
func (s *Server) serveSelf(w http.ResponseWriter, r *http.Request, escapedPath string) {
	// A shallow copy: only the URL changes, and the handlers share the
	// headers and body with the original request, which nothing else
	// uses.
	r2 := r.WithContext(r.Context())
	u := *r.URL
	u.Path, _ = url.PathUnescape(escapedPath)
	u.RawPath = escapedPath
	r2.URL = &u
	r2.RequestURI = u.RequestURI()
	s.dispatch(w, r2)
}

// rewriteProxyRequest aims a request the proxy handler has accepted at the
// backend. The Host header stays the client's, as with the reference
// daemon; X-Forwarded-For gains the client's address, X-Forwarded-Proto
// is "http", X-Forwarded-Host is dropped and so is the access token, which
// the application inside the sandbox must never see.
func rewriteProxyRequest(pr *httputil.ProxyRequest) {
	port, path, _ := proxyTarget(pr.In.URL.EscapedPath()) // checked by the handler
	u := pr.Out.URL
	u.Scheme = "http"
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	u.Path, _ = url.PathUnescape(path) // a part of EscapedPath unescapes
	u.RawPath = path
	// The query (u.RawQuery) is the client's, untouched.

	if prior := pr.In.Header.Values("X-Forwarded-For"); len(prior) > 0 {
		pr.Out.Header["X-Forwarded-For"] = slices.Clone(prior)
	}
	pr.SetXForwarded() // appends the client's address
	pr.Out.Header.Del("X-Forwarded-Host")
	pr.Out.Header.Set("X-Forwarded-Proto", "http")
	pr.Out.Header.Del(api.HeaderExecdToken)
}
