package vault

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// binding is a normalised binding compiled for matching.
type binding struct {
	name string
	// spec is the binding as normalised from its request, for metadata
	// and sealing.
	spec    api.CredentialBinding
	hosts   []hostPattern
	schemes uint8 // schemeHTTPS | schemeHTTP
	ports   uint8 // port443 | port80
	methods []string
	paths   []pathPattern
	// headers are the injected headers, values included.
	headers []egress.InjectedHeader
}

// The bits of binding.schemes and binding.ports.
const (
	schemeHTTPS uint8 = 1 << iota
	schemeHTTP
)

const (
	port443 uint8 = 1 << iota
	port80
)

func schemeBit(s string) uint8 {
	switch s {
	case "https":
		return schemeHTTPS
	case "http":
		return schemeHTTP
	}
	return 0
}

// schemeOn is schemeBit for a request on port: plain HTTP matches only
// on port 80, so that a binding naming both schemes and both ports never
// sends its credential in clear text to the TLS port.
func schemeOn(s string, port uint16) uint8 {
	if s == "http" && port != 80 {
		return 0
	}
	return schemeBit(s)
}

func portBit(p int) uint8 {
	switch p {
	case 443:
		return port443
	case 80:
		return port80
	}
	return 0
}

// hostPattern is a binding host: an exact name, or (wildcard) every name
// below name, at any depth, not name itself, as egress.Matcher treats a
// wildcard rule.
type hostPattern struct {
	name     string
	wildcard bool
}

func (h hostPattern) String() string {
	if h.wildcard {
		return "*." + h.name
	}
	return h.name
}

// covers reports whether h matches every name o matches.
func (h hostPattern) covers(o hostPattern) bool {
	if !h.wildcard {
		return !o.wildcard && h.name == o.name
	}
	return strings.HasSuffix(o.name, "."+h.name) || o.wildcard && o.name == h.name
}

// pathPattern is a binding path: exact ("/a/b" matches only /a/b) or a
// prefix ("/a/*" matches every path below /a/, "/*" every path). p is
// the decoded path (with its trailing "/" for a prefix).
type pathPattern struct {
	p      string
	prefix bool
}

func (pp pathPattern) String() string {
	if pp.prefix {
		return pp.p + "*"
	}
	return pp.p
}

func (pp pathPattern) match(decoded string) bool {
	if pp.prefix {
		return strings.HasPrefix(decoded, pp.p)
	}
	return decoded == pp.p
}

// covers reports whether pp matches every path o matches.
func (pp pathPattern) covers(o pathPattern) bool {
	if !pp.prefix {
		return !o.prefix && pp.p == o.p
	}
	return strings.HasPrefix(o.p, pp.p)
}

// parsePathPattern parses a binding path: it starts with "/", has no
// query or fragment, a '*' only in a final "/*", valid escapes, and is in
// normal form (no "." or ".." segments, no "//").
func parsePathPattern(raw string) (pathPattern, error) {
	if !strings.HasPrefix(raw, "/") {
		return pathPattern{}, fmt.Errorf("%q does not start with /", raw)
	}
	if strings.ContainsAny(raw, "?#") {
		return pathPattern{}, fmt.Errorf("%q has a query or a fragment, want a path only", raw)
	}
	part, prefix := strings.CutSuffix(raw, "/*")
	if prefix {
		part += "/"
	}
	if strings.Contains(part, "*") {
		return pathPattern{}, fmt.Errorf("%q: '*' is allowed only as a final /* (a prefix), as in /v1/*", raw)
	}
	decoded, err := url.PathUnescape(part)
	if err != nil {
		return pathPattern{}, fmt.Errorf("%q: malformed escape", raw)
	}
	if strings.ContainsAny(decoded, "\\\x00") {
		return pathPattern{}, fmt.Errorf("%q: a backslash or NUL is not allowed", raw)
	}
	if c := cleanPath(decoded); c != decoded {
		want := c
		if prefix {
			want += "*"
		}
		return pathPattern{}, fmt.Errorf("%q is not in normal form (no ., .. or empty segments): want %q", raw, want)
	}
	return pathPattern{p: decoded, prefix: prefix}, nil
}

// cleanPath is path.Clean that keeps a trailing slash. It allocates only
// when p is not clean.
func cleanPath(p string) string {
	c := path.Clean(p)
	if c != "/" && strings.HasSuffix(p, "/") {
		if len(c)+1 == len(p) && p[:len(c)] == c {
			return p
		}
		return c + "/"
	}
	return c
}

// errPath is the reason a request path cannot be judged.
type errPath string

func (e errPath) Error() string { return string(e) }

// normalisePath returns the decoded, cleaned form of a request's escaped
// path, which bindings are matched against, and the escaped path to send
// upstream in its place. The request's own text is sent when it is
// already clean, validly escaped and free of an escaped '/' (which a
// server could read as a separator the match did not see); otherwise the
// cleaned path, escaped again. A malformed escape, a backslash or a NUL
// (raw or escaped) cannot be judged.
func normalisePath(escaped string) (decoded, send string, err error) {
	if escaped == "" {
		escaped = "/"
	}
	if escaped[0] != '/' {
		return "", "", errPath("the path does not start with /")
	}
	// One pass decides the common case: no escapes, nothing to clean
	// (no "//", no segment starting with '.'), only path characters.
	hasEscape, valid, dirty := false, true, false
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		switch {
		case c == '%':
			hasEscape = true
		case c == '\\' || c == 0:
			return "", "", errPath("the path holds a backslash or a NUL")
		case c == '/' && i+1 < len(escaped) && (escaped[i+1] == '/' || escaped[i+1] == '.'):
			dirty = true
		}
		valid = valid && pathChars[c]
	}
	if !hasEscape && !dirty && valid {
		return escaped, escaped, nil
	}
	decoded = escaped
	if hasEscape {
		decoded, err = url.PathUnescape(escaped)
		if err != nil {
			return "", "", errPath("the path has a malformed escape")
		}
		if strings.ContainsAny(decoded, "\\\x00") {
			return "", "", errPath("the path holds a backslash or a NUL")
		}
	}
	if dotParams(decoded) {
		// "/v1/..;/admin": path.Clean keeps "..;", which servers that
		// strip segment parameters then read as "..".
		return "", "", errPath("the path has a dot segment with parameters")
	}
	clean := cleanPath(decoded)
	if clean == decoded && valid && !(hasEscape && hasEscapedSlash(escaped)) {
		return clean, escaped, nil
	}
	return clean, (&url.URL{Path: clean}).EscapedPath(), nil
}

// dotParams reports whether a segment of p is "." or ".." followed by
// parameters (";...").
func dotParams(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if before, _, ok := strings.Cut(seg, ";"); ok && (before == "." || before == "..") {
			return true
		}
	}
	return false
}

// pathChars are the bytes a path may carry unescaped (RFC 3986 pchar and
// '/'), and '%'.
var pathChars = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range []byte("-._~!$&'()*+,;=:@/%") {
		t[c] = true
	}
	return t
}()

// hasEscapedSlash reports whether s holds "%2f" in either case.
func hasEscapedSlash(s string) bool {
	for i := strings.IndexByte(s, '%'); i >= 0 && i+2 < len(s); {
		if s[i+1] == '2' && (s[i+2] == 'f' || s[i+2] == 'F') {
			return true
		}
		j := strings.IndexByte(s[i+1:], '%')
		if j < 0 {
			break
		}
		i += j + 1
	}
	return false
}

// compile builds the matching form of a normalised binding, with its
// injected headers' values taken from creds.
func compile(spec api.CredentialBinding, creds map[string]credential) (*binding, error) {
	b := &binding{name: spec.Name, spec: spec, methods: spec.Match.Methods}
	for _, h := range spec.Match.Hosts {
		name, wildcard := strings.CutPrefix(h, "*.")
		b.hosts = append(b.hosts, hostPattern{name: name, wildcard: wildcard})
	}
	for _, s := range spec.Match.Schemes {
		b.schemes |= schemeBit(s)
	}
	for _, p := range spec.Match.Ports {
		b.ports |= portBit(p)
	}
	for _, raw := range spec.Match.Paths {
		pp, err := parsePathPattern(raw)
		if err != nil {
			return nil, invalid("binding %q: match.paths: %v", spec.Name, err)
		}
		b.paths = append(b.paths, pp)
	}
	value := func(field, name string) (string, error) {
		c, ok := creds[name]
		if !ok {
			return "", invalid("binding %q: %s: no credential %q in the vault", spec.Name, field, name)
		}
		return c.value, nil
	}
	a := spec.Auth
	switch a.Type {
	case AuthBearer, AuthBasic, AuthAPIKey:
		v, err := value("auth.credential", a.Credential)
		if err != nil {
			return nil, err
		}
		switch a.Type {
		case AuthBearer:
			b.headers = []egress.InjectedHeader{{Name: "Authorization", Value: "Bearer " + v}}
		case AuthBasic:
			b.headers = []egress.InjectedHeader{{Name: "Authorization", Value: "Basic " + v}}
		default:
			b.headers = []egress.InjectedHeader{{Name: a.Name, Value: v}}
		}
	case AuthCustomHeaders:
		for i, h := range a.Headers {
			v, err := value(fmt.Sprintf("auth.headers[%d].credential", i), h.Credential)
			if err != nil {
				return nil, err
			}
			b.headers = append(b.headers, egress.InjectedHeader{Name: h.Name, Value: v})
		}
	default:
		return nil, invalid("binding %q: auth.type %q is not supported", spec.Name, a.Type)
	}
	return b, nil
}

// metadata describes the binding as the API does.
func (b *binding) metadata(rev int64) api.CredentialBindingMetadata {
	m := b.spec.Match
	return api.CredentialBindingMetadata{
		Name:     b.name,
		Revision: rev,
		Match: api.CredentialMatch{
			Hosts:   slices.Clone(m.Hosts),
			Schemes: slices.Clone(m.Schemes),
			Ports:   slices.Clone(m.Ports),
			Methods: slices.Clone(m.Methods),
			Paths:   slices.Clone(m.Paths),
		},
		Auth: api.CredentialAuthMetadata{Type: b.spec.Auth.Type, Name: b.spec.Auth.Name},
	}
}

// overlap reports whether some request could match both a and b, and
// describes one such request.
func overlap(a, b *binding) (string, bool) {
	schemes, ports := a.schemes&b.schemes, a.ports&b.ports
	if schemes == 0 || ports == 0 {
		return "", false
	}
	method := ""
	for _, m := range a.methods {
		if slices.Contains(b.methods, m) {
			method = m
			break
		}
	}
	if method == "" {
		return "", false
	}
	var p pathPattern
	found := false
	for _, pa := range a.paths {
		for _, pb := range b.paths {
			switch {
			case pa.covers(pb):
				p, found = pb, true
			case pb.covers(pa):
				p, found = pa, true
			}
			if found {
				break
			}
		}
		if found {
			break
		}
	}
	if !found {
		return "", false
	}
	var h hostPattern
	found = false
	for _, ha := range a.hosts {
		for _, hb := range b.hosts {
			switch {
			case ha.covers(hb):
				h, found = hb, true
			case hb.covers(ha):
				h, found = ha, true
			}
			if found {
				break
			}
		}
		if found {
			break
		}
	}
	if !found {
		return "", false
	}
	scheme, port := "https", 443
	if schemes&schemeHTTPS == 0 {
		scheme = "http"
	}
	if ports&port443 == 0 {
		port = 80
	}
	return fmt.Sprintf("%s %s://%s:%d%s", method, scheme, h, port, p), true
}

// The stages of a match, in the order Bind checks them.
const (
	stageNone = iota
	stageHost
	stagePort
	stageScheme
	stageMethod
	stagePath
)

// Intercepts reports whether any binding could match a request to host
// on port over scheme.
func (v *Vault) Intercepts(host string, port uint16, scheme string) bool {
	if v == nil {
		return false
	}
	pb, sb := portBit(int(port)), schemeOn(scheme, port)
	if pb == 0 || sb == 0 {
		return false
	}
	found := false
	v.eachCandidate(canonicalHost(host), func(b *binding) bool {
		found = b.ports&pb != 0 && b.schemes&sb != 0
		return !found
	})
	return found
}

// HostBound reports whether any binding names host (exactly or by a
// wildcard), on any port or scheme.
func (v *Vault) HostBound(host string) bool {
	if v == nil {
		return false
	}
	found := false
	v.eachCandidate(canonicalHost(host), func(*binding) bool {
		found = true
		return false
	})
	return found
}

// eachCandidate calls fn for each binding whose hosts match host, until
// fn returns false. A binding may be visited more than once.
func (v *Vault) eachCandidate(host string, fn func(*binding) bool) {
	for _, b := range v.exact[host] {
		if !fn(b) {
			return
		}
	}
	if len(v.wild) == 0 {
		return
	}
	// A wildcard's suffix has at least two labels: the walk stops at the
	// last one.
	for i := strings.IndexByte(host, '.'); i >= 0; {
		suffix := host[i+1:]
		j := strings.IndexByte(suffix, '.')
		if j < 0 {
			return
		}
		for _, b := range v.wild[suffix] {
			if !fn(b) {
				return
			}
		}
		i += j + 1
	}
}

// canonicalHost lower-cases a host and drops one trailing dot,
// allocating only when it must.
func canonicalHost(h string) string {
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(h)
		}
	}
	return h
}

// Bind returns the injection of the one binding that matches req: its
// host (exact, or below a wildcard's suffix), port, scheme, method and
// path. The path is matched decoded and cleaned ("/v1/../x" is "/x"), and
// Injection.Path is the path to send instead of req.Path. With no match
// the error wraps egress.ErrNoBinding and says which part of the request
// no binding covers; with more than one it wraps egress.ErrAmbiguous.
// Errors never hold a credential's value.
func (v *Vault) Bind(req egress.BindRequest) (egress.Injection, error) {
	if v == nil || len(v.bindings) == 0 {
		return egress.Injection{}, fmt.Errorf("%w: the vault has no bindings", egress.ErrNoBinding)
	}
	host := canonicalHost(req.Host)
	pb, sb := portBit(int(req.Port)), schemeOn(req.Scheme, req.Port)
	var (
		match, other *binding
		stage        = stageNone
		decoded      string
		send         string
		pathErr      error
		pathDone     bool
	)
	v.eachCandidate(host, func(b *binding) bool {
		s := stageHost
		if b.ports&pb != 0 {
			s = stagePort
			if b.schemes&sb != 0 {
				s = stageScheme
				if slices.Contains(b.methods, req.Method) {
					s = stageMethod
					if !pathDone {
						decoded, send, pathErr = normalisePath(req.Path)
						pathDone = true
					}
					if pathErr == nil {
						for _, pp := range b.paths {
							if pp.match(decoded) {
								s = stagePath
								break
							}
						}
					}
				}
			}
		}
		stage = max(stage, s)
		if s == stagePath {
			if match == nil {
				match = b
			} else if match != b {
				other = b
				return false
			}
		}
		return true
	})
	switch {
	case other != nil:
		return egress.Injection{}, fmt.Errorf("%w: bindings %q and %q", egress.ErrAmbiguous, match.name, other.name)
	case match != nil:
		return egress.Injection{Binding: match.name, Headers: slices.Clone(match.headers), Path: send}, nil
	}
	var reason string
	switch stage {
	case stageNone:
		reason = fmt.Sprintf("no binding names host %q", host)
	case stageHost:
		reason = fmt.Sprintf("no binding for host %q covers port %d", host, req.Port)
	case stagePort:
		reason = fmt.Sprintf("no binding for host %q on port %d covers scheme %q", host, req.Port, req.Scheme)
	case stageScheme:
		reason = fmt.Sprintf("no binding for %s://%s:%d covers method %q", req.Scheme, host, req.Port, req.Method)
	default:
		if pathErr != nil {
			reason = pathErr.Error()
		} else {
			reason = fmt.Sprintf("no binding for %s %s://%s:%d covers path %q", req.Method, req.Scheme, host, req.Port, truncate(decoded, 200))
		}
	}
	return egress.Injection{}, fmt.Errorf("%w: %s", egress.ErrNoBinding, reason)
}

// truncate shortens s to at most n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Secrets returns the distinct values of the vault's credentials, for
// redaction.
func (v *Vault) Secrets() []string {
	if v == nil {
		return nil
	}
	return slices.Clone(v.secrets)
}
