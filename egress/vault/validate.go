package vault

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// The auth types of a binding.
const (
	AuthBearer        = "bearer"
	AuthBasic         = "basic"
	AuthAPIKey        = "apiKey"
	AuthCustomHeaders = "customHeaders"
)

// The defaults of a binding's match.
var (
	defaultSchemes = []string{"https"}
	defaultPorts   = []int{443}
	defaultMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	defaultPaths   = []string{"/*"}
)

// forbiddenHeaders are the headers a binding may not set: they frame the
// message, route it, or belong to a proxy.
var forbiddenHeaders = map[string]bool{
	"Host":                true,
	"Content-Length":      true,
	"Content-Type":        true,
	"Transfer-Encoding":   true,
	"Connection":          true,
	"Upgrade":             true,
	"Te":                  true,
	"Trailer":             true,
	"Proxy-Authorization": true,
	"Proxy-Authenticate":  true,
	"Forwarded":           true,
	"X-Forwarded-For":     true,
	"X-Forwarded-Host":    true,
	"X-Forwarded-Proto":   true,
}

// checkName checks a credential's or a binding's name: not blank, no
// surrounding spaces, no control characters, not too long.
func checkName(where, name string) error {
	switch {
	case strings.TrimSpace(name) == "":
		return invalid("%s: required, not blank", where)
	case strings.TrimSpace(name) != name:
		return invalid("%s: %q has leading or trailing spaces", where, name)
	case len(name) > MaxNameBytes:
		return invalid("%s: longer than %d bytes", where, MaxNameBytes)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return invalid("%s: %q contains a control character", where, name)
		}
	}
	return nil
}

// newCredential checks one credential of a request. Errors never hold the
// value.
func newCredential(where string, c api.Credential, rev int64) (credential, error) {
	if err := checkName(where+".name", c.Name); err != nil {
		return credential{}, err
	}
	typ := c.Source.Type
	if typ == "" {
		typ = SourceInline
	}
	if typ != SourceInline {
		return credential{}, invalid("%s.source.type: %q is not supported, want %q", where, c.Source.Type, SourceInline)
	}
	if c.Source.Value == "" {
		return credential{}, invalid("%s.source.value: required, not empty", where)
	}
	for i := 0; i < len(c.Source.Value); i++ {
		// A header value may not hold CR, LF, NUL or other controls
		// (RFC 7230 §3.2); tab is allowed.
		if b := c.Source.Value[i]; b < 0x20 && b != '\t' || b == 0x7f {
			return credential{}, invalid("%s.source.value: contains a control character at byte %d; a header value cannot carry it", where, i)
		}
	}
	return credential{value: c.Source.Value, sourceType: typ, revision: rev}, nil
}

// normaliseBinding checks one binding of a request against opt and
// returns it normalised: defaults filled in, hosts, schemes and methods
// in their canonical case, lists without repeats, header names
// canonical. Credentials it names are checked later, by compile.
func normaliseBinding(where string, b api.CredentialBinding, opt Options) (api.CredentialBinding, error) {
	if err := checkName(where+".name", b.Name); err != nil {
		return b, err
	}
	out := api.CredentialBinding{Name: b.Name}
	m := b.Match

	if len(m.Hosts) == 0 {
		return b, invalid("%s.match.hosts: required, at least one", where)
	}
	if err := checkLen(where+".match.hosts", len(m.Hosts)); err != nil {
		return b, err
	}
	for i, raw := range m.Hosts {
		w := fmt.Sprintf("%s.match.hosts[%d]", where, i)
		h, err := normaliseHost(w, raw)
		if err != nil {
			return b, err
		}
		if opt.HostAllowed != nil {
			if err := opt.HostAllowed(h); err != nil {
				return b, invalid("%s: %v", w, err)
			}
		}
		if !slices.Contains(out.Match.Hosts, h) {
			out.Match.Hosts = append(out.Match.Hosts, h)
		}
	}

	schemes := m.Schemes
	if len(schemes) == 0 {
		schemes = defaultSchemes
	}
	if err := checkLen(where+".match.schemes", len(schemes)); err != nil {
		return b, err
	}
	for i, s := range schemes {
		w := fmt.Sprintf("%s.match.schemes[%d]", where, i)
		s = strings.ToLower(s)
		switch s {
		case "https":
		case "http":
			if !opt.AllowHTTP {
				return b, invalid(`%s: "http" is not enabled: the operator must allow credential injection into plain-HTTP requests`, w)
			}
		default:
			return b, invalid(`%s: %q is not supported, want "https" or "http"`, w, schemes[i])
		}
		if !slices.Contains(out.Match.Schemes, s) {
			out.Match.Schemes = append(out.Match.Schemes, s)
		}
	}

	ports := m.Ports
	if len(ports) == 0 {
		ports = defaultPorts
	}
	if err := checkLen(where+".match.ports", len(ports)); err != nil {
		return b, err
	}
	for i, p := range ports {
		if p != 80 && p != 443 {
			return b, invalid("%s.match.ports[%d]: %d is not intercepted, want 80 or 443", where, i, p)
		}
		if !slices.Contains(out.Match.Ports, p) {
			out.Match.Ports = append(out.Match.Ports, p)
		}
	}

	methods := m.Methods
	if len(methods) == 0 {
		methods = defaultMethods
	}
	if err := checkLen(where+".match.methods", len(methods)); err != nil {
		return b, err
	}
	for i, meth := range methods {
		if !isToken(meth) {
			return b, invalid("%s.match.methods[%d]: %q is not an HTTP method (a token)", where, i, meth)
		}
		meth = strings.ToUpper(meth)
		if !slices.Contains(out.Match.Methods, meth) {
			out.Match.Methods = append(out.Match.Methods, meth)
		}
	}

	paths := m.Paths
	if len(paths) == 0 {
		paths = defaultPaths
	}
	if err := checkLen(where+".match.paths", len(paths)); err != nil {
		return b, err
	}
	for i, p := range paths {
		if _, err := parsePathPattern(p); err != nil {
			return b, invalid("%s.match.paths[%d]: %v", where, i, err)
		}
		if !slices.Contains(out.Match.Paths, p) {
			out.Match.Paths = append(out.Match.Paths, p)
		}
	}

	auth, err := normaliseAuth(where+".auth", b.Auth)
	if err != nil {
		return b, err
	}
	out.Auth = auth
	return out, nil
}

// checkLen checks a list's length against MaxListItems.
func checkLen(where string, n int) error {
	if n > MaxListItems {
		return invalid("%s: %d items, the limit is %d", where, n, MaxListItems)
	}
	return nil
}

// normaliseHost checks a binding host and returns it in lower case
// without a trailing dot: a name with at least two labels, or a wildcard
// "*.suffix" whose suffix has at least two labels.
func normaliseHost(where, raw string) (string, error) {
	h := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(raw)), ".")
	switch {
	case h == "":
		return "", invalid("%s: required, not empty", where)
	case strings.Contains(h, "://"):
		return "", invalid("%s: %q has a scheme, want a host name only", where, raw)
	case strings.ContainsAny(h, "/?#"):
		return "", invalid("%s: %q has a path, want a host name only", where, raw)
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return "", invalid("%s: %q is an address, want a name", where, raw)
	}
	if strings.Contains(h, ":") {
		return "", invalid("%s: %q has a port, want a host name only (ports go in match.ports)", where, raw)
	}
	name, wildcard := strings.CutPrefix(h, "*.")
	if err := egress.CheckHostName(name); err != nil {
		return "", invalid("%s: %q: %v", where, raw, err)
	}
	if !strings.Contains(name, ".") {
		if wildcard {
			return "", invalid("%s: %q: the suffix of a wildcard needs at least two labels", where, raw)
		}
		return "", invalid("%s: %q is not a fully qualified name (it has no dot)", where, raw)
	}
	if wildcard {
		// Under a public suffix (s3.amazonaws.com, github.io, co.uk) anyone
		// can hold a name with a valid certificate: the sandbox could send
		// the credential to a tenant of its own.
		if ps, _ := publicsuffix.PublicSuffix(name); ps == name {
			return "", invalid("%s: %q: %s is a public suffix, under which other parties hold names: bind the names themselves", where, raw, name)
		}
	}
	return h, nil
}

// isToken reports whether s is an RFC 7230 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// headerName checks and canonicalises the name of an injected header.
func headerName(where, name string) (string, error) {
	if !isToken(name) {
		return "", invalid("%s: %q is not a valid header name (RFC 7230 token)", where, name)
	}
	if len(name) > MaxNameBytes {
		return "", invalid("%s: longer than %d bytes", where, MaxNameBytes)
	}
	c := textproto.CanonicalMIMEHeaderKey(name)
	if forbiddenHeaders[c] {
		return "", invalid("%s: %q may not be set by a binding", where, name)
	}
	return c, nil
}

// normaliseAuth checks a binding's auth and canonicalises its header
// names. Fields its type does not use must be empty.
func normaliseAuth(where string, a api.CredentialAuth) (api.CredentialAuth, error) {
	out := api.CredentialAuth{Type: a.Type}
	needCredential := func() error {
		if a.Credential == "" {
			return invalid("%s.credential: required for type %q (the name of a vault credential)", where, a.Type)
		}
		out.Credential = a.Credential
		return nil
	}
	unused := func(field string, set bool) error {
		if set {
			return invalid("%s.%s: not used by type %q", where, field, a.Type)
		}
		return nil
	}
	switch a.Type {
	case AuthBearer, AuthBasic:
		if err := needCredential(); err != nil {
			return out, err
		}
		if err := unused("name", a.Name != ""); err != nil {
			return out, err
		}
		if err := unused("headers", len(a.Headers) > 0); err != nil {
			return out, err
		}
	case AuthAPIKey:
		if a.Name == "" {
			return out, invalid("%s.name: required for type %q (the header name)", where, a.Type)
		}
		n, err := headerName(where+".name", a.Name)
		if err != nil {
			return out, err
		}
		out.Name = n
		if err := needCredential(); err != nil {
			return out, err
		}
		if err := unused("headers", len(a.Headers) > 0); err != nil {
			return out, err
		}
	case AuthCustomHeaders:
		if err := unused("credential", a.Credential != ""); err != nil {
			return out, err
		}
		if err := unused("name", a.Name != ""); err != nil {
			return out, err
		}
		if len(a.Headers) == 0 {
			return out, invalid("%s.headers: required for type %q, at least one", where, a.Type)
		}
		if err := checkLen(where+".headers", len(a.Headers)); err != nil {
			return out, err
		}
		for i, h := range a.Headers {
			w := fmt.Sprintf("%s.headers[%d]", where, i)
			n, err := headerName(w+".name", h.Name)
			if err != nil {
				return out, err
			}
			for _, prev := range out.Headers {
				if prev.Name == n {
					return out, invalid("%s.name: %q appears more than once", w, h.Name)
				}
			}
			if h.Credential == "" {
				return out, invalid("%s.credential: required (the name of a vault credential)", w)
			}
			out.Headers = append(out.Headers, api.CredentialHeader{Name: n, Credential: h.Credential})
		}
	case "":
		return out, invalid(`%s.type: required: "bearer", "basic", "apiKey" or "customHeaders"`, where)
	default:
		return out, invalid(`%s.type: %q is not supported, want "bearer", "basic", "apiKey" or "customHeaders"`, where, a.Type)
	}
	return out, nil
}
