package proxy

import (
	"bytes"
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// errHostMismatch means an absolute-form request target names another
// host than the Host header.
var errHostMismatch = errors.New("the Host header and the request target disagree")

// maxHeadLen bounds an HTTP/1.x request head (request line and headers)
// the proxy reads before it decides.
const maxHeadLen = 16 << 10

// maxMethodLen bounds the method token of a request line; longer tokens
// are taken for some other protocol.
const maxMethodLen = 24

// httpHead is what the proxy needs from an HTTP/1.x request head.
type httpHead struct {
	method string
	// target is the request-target: origin form ("/x"), absolute form
	// ("http://h/x"), authority form ("h:443", CONNECT) or "*".
	target string
	// host is the Host header's value; hasHost is false without one.
	host    string
	hasHost bool
	// length is the head's length in bytes, up to and including the blank
	// line that ends it.
	length int
}

// parseHTTPHead parses the first bytes a client sent as an HTTP/1.x
// request head. It returns errIncomplete while b is a prefix of one,
// errNotHTTP when b does not start with an HTTP/1.x request line, and
// errMalformed when a request line is followed by something a server
// might read differently from the proxy: folded or nameless header
// lines, stray CRs, two Host headers, or a head longer than maxHeadLen.
func parseHTTPHead(b []byte) (httpHead, error) {
	var h httpHead
	// The request line: method SP target SP HTTP/1.x. Rule it out as
	// early as the bytes allow, so other protocols are not kept waiting.
	sp := -1
	for i := 0; i < len(b) && i <= maxMethodLen; i++ {
		if b[i] == ' ' {
			sp = i
			break
		}
		if !isTokenByte(b[i]) {
			return h, errNotHTTP
		}
	}
	if sp == 0 || (sp < 0 && len(b) > maxMethodLen) {
		return h, errNotHTTP
	}
	lineEnd := bytes.IndexByte(b, '\n')
	if sp < 0 || lineEnd < 0 {
		if len(b) >= maxHeadLen {
			return h, errNotHTTP
		}
		return h, errIncomplete
	}
	line := trimCR(b[:lineEnd])
	method, rest, _ := bytes.Cut(line, []byte(" "))
	target, version, ok := bytes.Cut(rest, []byte(" "))
	if !ok || !isHTTP1(version) {
		return h, errNotHTTP
	}
	if len(target) == 0 || bytes.ContainsAny(target, " \t\r\x00") {
		return h, errMalformed
	}
	h.method, h.target = string(method), string(target)

	// The header lines, up to the empty line.
	pos := lineEnd + 1
	for {
		if pos > maxHeadLen {
			return h, errMalformed
		}
		end := bytes.IndexByte(b[pos:], '\n')
		if end < 0 {
			if len(b) >= maxHeadLen {
				return h, errMalformed
			}
			return h, errIncomplete
		}
		line := trimCR(b[pos : pos+end])
		pos += end + 1
		if pos > maxHeadLen {
			return h, errMalformed
		}
		if len(line) == 0 {
			h.length = pos
			return h, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return h, errMalformed // obsolete line folding (RFC 9112 5.2)
		}
		if bytes.ContainsAny(line, "\r\x00") {
			return h, errMalformed
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 {
			return h, errMalformed
		}
		for _, c := range name {
			if !isTokenByte(c) {
				return h, errMalformed // includes "Host :" (RFC 9112 5.1)
			}
		}
		if !asciiEqualFold(name, "host") {
			continue
		}
		if h.hasHost {
			return h, errMalformed // two Host headers (RFC 9112 3.2)
		}
		h.host, h.hasHost = string(bytes.Trim(value, " \t")), true
	}
}

// requestHost is the destination an HTTP request names.
type requestHost struct {
	// name is the canonical host name, or "" when the request names an
	// address (ip) or nothing at all.
	name string
	ip   netip.Addr
	// port is the port the request names, 0 when it names none.
	port uint16
}

// destination returns the host the request is for: the Host header, or
// the absolute-form target's host, which must then agree with the Host
// header; for CONNECT the authority-form target. It returns
// errHostMismatch when they disagree and errMalformed when a name is
// invalid.
func (h httpHead) destination() (requestHost, error) {
	if h.method == "CONNECT" {
		rh, err := parseAuthority(h.target)
		if err != nil || rh.port == 0 {
			return requestHost{}, errMalformed
		}
		return rh, nil
	}
	var fromHost requestHost
	if h.hasHost {
		var err error
		if fromHost, err = parseAuthority(h.host); err != nil {
			return requestHost{}, err
		}
	}
	scheme, rest, ok := strings.Cut(h.target, "://")
	if !ok || !isScheme(scheme) {
		if !h.hasHost {
			return requestHost{}, nil // HTTP/1.0 without Host: names nothing
		}
		return fromHost, nil
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	if strings.Contains(authority, "@") {
		return requestHost{}, errMalformed // userinfo: a classic confusion
	}
	fromTarget, err := parseAuthority(authority)
	if err != nil {
		return requestHost{}, err
	}
	if h.hasHost && (fromTarget.name != fromHost.name || fromTarget.ip != fromHost.ip) {
		return requestHost{}, errHostMismatch
	}
	return fromTarget, nil
}

// parseAuthority parses "host", "host:port", "[v6]" or "[v6]:port".
func parseAuthority(s string) (requestHost, error) {
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return requestHost{}, errMalformed
		}
		host, port = s[1:end], s[end+1:]
		if port != "" {
			if port[0] != ':' {
				return requestHost{}, errMalformed
			}
			port = port[1:]
		}
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return requestHost{}, errMalformed
		}
		p, err := parsePort(port)
		if err != nil {
			return requestHost{}, err
		}
		return requestHost{ip: a.Unmap(), port: p}, nil
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host, port = s[:i], s[i+1:]
	}
	p, err := parsePort(port)
	if err != nil {
		return requestHost{}, err
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return requestHost{}, errMalformed // a bare IPv6 literal must be bracketed
		}
		return requestHost{ip: a, port: p}, nil
	}
	name, ok := canonicalName(host)
	if !ok {
		return requestHost{}, errMalformed
	}
	return requestHost{name: name, port: p}, nil
}

// parsePort parses a decimal port; "" is port 0 (none given).
func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, nil
	}
	if len(s) > 5 {
		return 0, errMalformed
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errMalformed
		}
	}
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil || p == 0 {
		return 0, errMalformed
	}
	return uint16(p), nil
}

// canonicalName returns a DNS host name in the form Decider.Name takes
// (lower case, no trailing dot), or false when s is not a host name:
// empty, too long, a label that is empty or over 63 bytes, a byte other
// than a letter, digit, '-' or '_', or an all-numeric last label (which
// some resolvers read as an address, as in "127.1").
func canonicalName(s string) (string, bool) {
	s = strings.TrimSuffix(s, ".")
	if len(s) == 0 || len(s) > 253 {
		return "", false
	}
	labelLen, digitsOnly := 0, true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if labelLen == 0 {
				return "", false
			}
			labelLen, digitsOnly = 0, true
			continue
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
			digitsOnly = false
		default:
			return "", false
		}
		labelLen++
		if labelLen > 63 {
			return "", false
		}
	}
	if labelLen == 0 || digitsOnly {
		return "", false
	}
	return strings.ToLower(s), true
}

func trimCR(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\r' {
		return b[:len(b)-1]
	}
	return b
}

// isHTTP1 reports whether v is "HTTP/1." followed by one digit.
func isHTTP1(v []byte) bool {
	return len(v) == 8 && string(v[:7]) == "HTTP/1." && v[7] >= '0' && v[7] <= '9'
}

// isScheme reports whether s is a URI scheme (RFC 3986 3.1).
func isScheme(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alpha := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !alpha && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

// isTokenByte reports whether c may appear in an HTTP token (RFC 9110 5.6.2).
func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func asciiEqualFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
