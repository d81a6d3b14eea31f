package ingress

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/api"
)

// Route modes: where a request carried its route.
const (
	ModeHeader    = "header"
	ModeSubdomain = "subdomain"
	ModePath      = "path"
)

// Route is what a request asks the gateway for: a sandbox's port, the
// signed parts when the route is signed, and the path to forward.
type Route struct {
	SandboxID string
	Port      int
	// Expires (base36 Unix seconds) and Signature are set together, on a
	// signed route only.
	Expires   string
	Signature string
	// Path is the escaped path to send to the sandbox: the request's own
	// in header and subdomain modes, what follows the route in path mode
	// ("" when nothing does).
	Path string
	// Mode is ModeHeader, ModeSubdomain or ModePath.
	Mode string
}

// Signed reports whether the route carries a signature.
func (rt Route) Signed() bool { return rt.Signature != "" }

// ErrNoRoute is ParseRoute's answer for a request that names no sandbox
// by any route form.
var ErrNoRoute = errors.New("the request names no sandbox: send the OpenSandbox-Ingress-To header, a {sandboxId}-{port} subdomain or a /{sandboxId}/{port}/ path")

// RouteError is a route that is present but malformed.
type RouteError struct {
	Mode   string
	Reason string
}

func (e *RouteError) Error() string { return e.Mode + " route: " + e.Reason }

// Bounds of a route's parts.
const (
	// maxSandboxID is the longest sandbox id a route may name (a
	// Kubernetes label value).
	maxSandboxID = 63
	// maxExpires is the longest base36 expiry (uint64 seconds).
	maxExpires = 13
)

// ParseRoute finds the route of r: the OpenSandbox-Ingress-To header (or
// its legacy spelling), else the first DNS label of Host when Host is
// directly under domain (domain "" disables subdomain routes), else the
// first path segments. It answers ErrNoRoute when there is none and a
// *RouteError when the one it found is malformed.
func ParseRoute(r *http.Request, domain string) (Route, error) {
	for _, h := range []string{api.HeaderIngressTo, api.HeaderIngressLegacy} {
		if vs, ok := r.Header[http.CanonicalHeaderKey(h)]; ok {
			if len(vs) != 1 {
				return Route{}, &RouteError{ModeHeader, "send the " + h + " header once"}
			}
			rt, err := parseDashRoute(strings.TrimSpace(vs[0]))
			if err != nil {
				return Route{}, &RouteError{ModeHeader, err.Error()}
			}
			rt.Mode, rt.Path = ModeHeader, requestPath(r)
			return rt, nil
		}
	}
	if label, ok := subdomainLabel(r.Host, domain); ok {
		if strings.Contains(label, ".") {
			return Route{}, &RouteError{ModeSubdomain, "the route is one DNS label directly under " + domain}
		}
		rt, err := parseDashRoute(label)
		if err != nil {
			return Route{}, &RouteError{ModeSubdomain, err.Error()}
		}
		rt.Mode, rt.Path = ModeSubdomain, requestPath(r)
		return rt, nil
	}
	if rt, ok := parsePathRoute(r.URL.EscapedPath()); ok {
		return rt, nil
	}
	return Route{}, ErrNoRoute
}

// requestPath is the escaped path of r, "/" when it has none.
func requestPath(r *http.Request) string {
	if p := r.URL.EscapedPath(); p != "" {
		return p
	}
	return "/"
}

// subdomainLabel returns the label of host that sits directly under
// domain, lowercased (DNS names are case-insensitive, routes are
// lowercase). ok is false when host is not under domain; a host more
// than one label under it returns that whole prefix, which then fails
// to parse.
func subdomainLabel(host, domain string) (string, bool) {
	domain = strings.Trim(strings.ToLower(domain), ".")
	if domain == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || label == "" {
		return "", false
	}
	return label, true
}

// parseDashRoute reads "{id}-{port}" or "{id}-{port}-{expires}-{sig}".
// The id may itself hold dashes, so the route is read from the right:
// a last field of one to five digits is the port of an unsigned route
// (a signature is never that short).
func parseDashRoute(s string) (Route, error) {
	if s == "" {
		return Route{}, errors.New("empty route")
	}
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return Route{}, errors.New(`want "{sandboxId}-{port}"`)
	}
	last := s[i+1:]
	if len(last) <= 5 && allDigits(last) {
		port, err := parsePort(last)
		if err != nil {
			return Route{}, err
		}
		id := s[:i]
		if err := checkSandboxID(id); err != nil {
			return Route{}, err
		}
		return Route{SandboxID: id, Port: port}, nil
	}
	// Signed: {id}-{port}-{expires}-{sig}.
	sig, rest := last, s[:i]
	i = strings.LastIndexByte(rest, '-')
	if i < 0 {
		return Route{}, errors.New(`want "{sandboxId}-{port}" or "{sandboxId}-{port}-{expires}-{signature}"`)
	}
	exp, rest := rest[i+1:], rest[:i]
	i = strings.LastIndexByte(rest, '-')
	if i < 0 {
		return Route{}, errors.New(`want "{sandboxId}-{port}-{expires}-{signature}"`)
	}
	portS, id := rest[i+1:], rest[:i]
	port, err := parsePort(portS)
	if err != nil {
		return Route{}, err
	}
	if err := checkSandboxID(id); err != nil {
		return Route{}, err
	}
	if !isExpires(exp) {
		return Route{}, fmt.Errorf("expiry %q: want base36 Unix seconds", exp)
	}
	if !isSignature(sig) {
		return Route{}, fmt.Errorf("signature %q is malformed", truncate(sig, 60))
	}
	return Route{SandboxID: id, Port: port, Expires: exp, Signature: sig}, nil
}

// parsePathRoute reads "/{id}/{port}[/{rest}]" or
// "/{id}/{port}/{expires}/{sig}[/{rest}]" from an escaped path. Segments
// three and four make a signed route when they are shaped like an expiry
// and a signature; anything else after the port is the path to forward.
func parsePathRoute(p string) (Route, bool) {
	p, ok := strings.CutPrefix(p, "/")
	if !ok {
		return Route{}, false
	}
	id, p, _ := strings.Cut(p, "/")
	portS, rest, more := strings.Cut(p, "/")
	if checkSandboxID(id) != nil {
		return Route{}, false
	}
	port, err := parsePort(portS)
	if err != nil {
		return Route{}, false
	}
	rt := Route{SandboxID: id, Port: port, Mode: ModePath}
	if !more {
		return rt, true
	}
	exp, after, _ := strings.Cut(rest, "/")
	sig, tail, hasTail := strings.Cut(after, "/")
	if isExpires(exp) && isSignature(sig) {
		rt.Expires, rt.Signature = exp, sig
		if hasTail {
			rt.Path = "/" + tail
		}
		return rt, true
	}
	rt.Path = "/" + rest
	return rt, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// parsePort reads a port: 1..65535 in digits, no sign, no leading zero.
func parsePort(s string) (int, error) {
	if !allDigits(s) || len(s) > 5 || s[0] == '0' {
		return 0, fmt.Errorf("port %q: want an integer from 1 to 65535", truncate(s, 20))
	}
	n, _ := strconv.Atoi(s)
	if n > 65535 {
		return 0, fmt.Errorf("port %q: want an integer from 1 to 65535", s)
	}
	return n, nil
}

// checkSandboxID accepts what a sandbox id may be: 1 to 63 letters,
// digits, '-', '_' or '.', starting and ending with a letter or digit
// (the server's ids are UUIDs; Kubernetes carries them in labels).
func checkSandboxID(id string) error {
	if id == "" || len(id) > maxSandboxID {
		return fmt.Errorf("sandbox id %q: want 1 to %d characters", truncate(id, 80), maxSandboxID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if alnum {
			continue
		}
		if (c == '-' || c == '_' || c == '.') && i > 0 && i < len(id)-1 {
			continue
		}
		return fmt.Errorf("sandbox id %q: want letters, digits, '-', '_' and '.', starting and ending with a letter or digit", truncate(id, 80))
	}
	return nil
}

// isExpires reports whether s is shaped like a base36 expiry.
func isExpires(s string) bool {
	if s == "" || len(s) > maxExpires {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isKeyID(s[i]) {
			return false
		}
	}
	return true
}

// isSignature reports whether s is shaped like a signature: base32
// digest characters then a key id.
func isSignature(s string) bool {
	if len(s) < MinSignatureChars+1 || len(s) > FullSignatureChars+1 || !isKeyID(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s)-1; i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
