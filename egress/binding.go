package egress

import "errors"

// The credential vault's bindings, as the intercepting proxy asks them.
// egress/vault implements Binder over the vault in force; egress/mitm
// asks it for every connection and request it intercepts.

// Binder answers which outbound requests get credentials. It is an
// immutable view: a change to the vault swaps in a new Binder.
type Binder interface {
	// Intercepts reports whether any binding could match a request to
	// host (lower case, no trailing dot) on port over scheme ("https" or
	// "http"): only then is a connection terminated and read.
	Intercepts(host string, port uint16, scheme string) bool
	// HostBound reports whether any binding names host, on any port or
	// scheme; a connection to such a host that Intercepts refuses is
	// reported, since a request there goes out without its credential.
	HostBound(host string) bool
	// Bind returns the injection for one request. It fails with an error
	// wrapping ErrNoBinding when no binding matches (the request goes out
	// unchanged), or ErrAmbiguous when more than one does (the request is
	// refused).
	Bind(BindRequest) (Injection, error)
	// Secrets are the values of every credential, for redaction.
	Secrets() []string
}

// BindRequest is one intercepted request. Host is the TLS server name
// (for https) or the Host header's name (for http), which the
// interceptor has checked agree.
type BindRequest struct {
	Scheme string
	Host   string
	Port   uint16
	Method string
	// Path is the request's path as sent, still escaped (URL.EscapedPath).
	Path string
}

// Injection is what a binding adds to a request.
type Injection struct {
	// Binding names the binding that matched.
	Binding string
	// Headers are set on the request, replacing any the client sent with
	// the same name. Names are canonical.
	Headers []InjectedHeader
	// Path is the request path, normalised (escaped), that the binding
	// matched: the request goes upstream with this path, so the server
	// sees the path that was judged.
	Path string
}

// InjectedHeader is one header of an Injection.
type InjectedHeader struct {
	Name  string
	Value string
}

// Errors of Binder.Bind.
var (
	ErrNoBinding = errors.New("no binding matches")
	ErrAmbiguous = errors.New("more than one binding matches")
)
