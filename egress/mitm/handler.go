package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/egress"
)

// reqState is what serveRequest decided about one request, for rewrite,
// modifyResponse and upstreamError.
type reqState struct {
	info    connInfo
	secrets []string // Binder.Secrets of the vault the request was bound by
	inj     *egress.Injection
	path    string // inj.Path unescaped
}

type reqStateKey struct{}

func stateFrom(ctx context.Context) *reqState {
	st, _ := ctx.Value(reqStateKey{}).(*reqState)
	return st
}

// reasonMax bounds the length of a reason taken from an error.
const reasonMax = 200

// serveRequest checks one request against its connection, binds it and
// proxies it. Each request of a connection is judged on its own.
func (ic *Interceptor) serveRequest(w http.ResponseWriter, r *http.Request) {
	ic.requests.Add(1)
	info, ok := connInfoFrom(r.Context())
	if !ok {
		plainError(w, http.StatusInternalServerError, "not an intercepted connection")
		return
	}
	if r.Method == http.MethodConnect {
		ic.refuse(info.name, info.dst, "CONNECT inside an intercepted connection")
		plainError(w, http.StatusMethodNotAllowed, "CONNECT is not allowed here")
		return
	}
	if !hostMatches(r.Host, info.name, info.dst.Port()) {
		ic.refuse(info.name, info.dst, "Host differs from the connection's name")
		plainError(w, http.StatusMisdirectedRequest, "misdirected request: Host does not match the connection")
		return
	}

	st := &reqState{info: info}
	var binder egress.Binder
	if ic.cfg.Binder != nil {
		binder = ic.cfg.Binder()
	}
	if binder == nil {
		ic.notInjected.Add(1)
		ic.report(info.name, info.dst, "not injected: no vault")
	} else {
		st.secrets = binder.Secrets()
		inj, err := binder.Bind(egress.BindRequest{
			Scheme: info.scheme,
			Host:   info.name,
			Port:   info.dst.Port(),
			Method: r.Method,
			Path:   r.URL.EscapedPath(),
		})
		switch {
		case errors.Is(err, egress.ErrAmbiguous):
			ic.refuse(info.name, info.dst, "more than one binding matches")
			plainError(w, http.StatusForbidden, "request matches more than one credential binding")
			return
		case errors.Is(err, egress.ErrNoBinding):
			ic.notInjected.Add(1)
			ic.report(info.name, info.dst, "not injected: "+ic.reason(err, st.secrets))
		case err != nil:
			ic.refuse(info.name, info.dst, "binding failed: "+ic.reason(err, st.secrets))
			plainError(w, http.StatusForbidden, "credential binding failed")
			return
		default:
			if inj.Path != "" {
				p, perr := url.PathUnescape(inj.Path)
				if perr != nil || !strings.HasPrefix(inj.Path, "/") {
					ic.refuse(info.name, info.dst, "binding gave an invalid path")
					plainError(w, http.StatusForbidden, "credential binding failed")
					return
				}
				st.path = p
			}
			st.inj = &inj
			ic.injected.Add(1)
		}
	}
	if len(st.secrets) > 0 {
		w = &interimRedactor{ResponseWriter: w, secrets: st.secrets}
	}
	ic.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), reqStateKey{}, st)))
}

// interimRedactor redacts the headers of informational (1xx) responses,
// which ReverseProxy passes on as they arrive, before modifyResponse
// sees anything. Flush and Hijack reach the writer beneath via Unwrap.
type interimRedactor struct {
	http.ResponseWriter
	secrets []string
}

func (w *interimRedactor) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		redactHeader(w.Header(), w.secrets)
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap is for http.ResponseController.
func (w *interimRedactor) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// reason is err's text for an event: cut short, secrets redacted.
func (ic *Interceptor) reason(err error, secrets []string) string {
	s := redactString(err.Error(), secrets)
	if len(s) > reasonMax {
		s = s[:reasonMax]
	}
	return s
}

// forwardingHeaders are the headers ReverseProxy strips before Rewrite;
// rewrite puts back what the client sent, so a request goes out as it
// came, unless it carries a credential.
var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// steeringHeaders make servers and their load balancers act on another
// host, path or method than the request line's, which the binding judged:
// a request that carries a credential goes out without them.
var steeringHeaders = []string{
	"X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server", "X-Forwarded-Uri", "X-Original-Host",
	"X-Http-Method-Override", "X-Http-Method", "X-Method-Override", "X-Original-Url", "X-Rewrite-Url", "X-Original-Uri",
}

// rewrite aims the outbound request at the connection's name and port
// and applies the injection.
func (ic *Interceptor) rewrite(pr *httputil.ProxyRequest) {
	st := stateFrom(pr.In.Context())
	out := pr.Out
	out.URL.Scheme = st.info.scheme
	out.URL.Host = net.JoinHostPort(st.info.name, strconv.Itoa(int(st.info.dst.Port())))
	out.URL.Opaque, out.URL.User, out.URL.Fragment = "", nil, ""
	// The name the Host check accepted, in its canonical form: case, a
	// trailing dot or a spelled-out default port go no further.
	out.Host = st.info.name
	if port := st.info.dst.Port(); port != defaultPort(st.info.scheme) {
		out.Host = net.JoinHostPort(st.info.name, strconv.Itoa(int(port)))
	}
	if ic.cfg.RedactBodyBytes > 0 && len(st.secrets) > 0 {
		// Every body on an intercepted connection is searched, so it is
		// asked for unencoded: a credential stored through a binding could
		// be read back by a request no binding covers.
		out.Header.Set("Accept-Encoding", "identity")
	}
	if st.inj == nil {
		for _, k := range forwardingHeaders {
			if v, ok := pr.In.Header[k]; ok {
				out.Header[k] = append([]string(nil), v...)
			}
		}
		return
	}
	for _, k := range steeringHeaders {
		out.Header.Del(k)
	}
	for _, h := range st.inj.Headers {
		for k := range out.Header {
			if strings.EqualFold(k, h.Name) {
				delete(out.Header, k)
			}
		}
	}
	for _, h := range st.inj.Headers {
		out.Header.Add(h.Name, h.Value)
	}
	if st.inj.Path != "" {
		out.URL.Path, out.URL.RawPath = st.path, st.inj.Path
	}
}

// defaultPort is the port a URL of scheme leaves out.
func defaultPort(scheme string) uint16 {
	if scheme == "http" {
		return 80
	}
	return 443
}

// modifyResponse redacts secrets from the response's headers and
// trailers and, for an injected request, from a text body.
func (ic *Interceptor) modifyResponse(res *http.Response) error {
	st := stateFrom(res.Request.Context())
	if st == nil || len(st.secrets) == 0 {
		return nil
	}
	redactHeader(res.Header, st.secrets)
	if res.StatusCode == http.StatusSwitchingProtocols {
		return nil // the body is the upgraded connection
	}
	body := &responseBody{body: res.Body, res: res, secrets: st.secrets}
	body.Reader = res.Body
	if ic.cfg.RedactBodyBytes > 0 && hasBody(res) &&
		isText(res.Header.Get("Content-Type")) && identityEncoded(res.Header) {
		if set := secretSet(st.secrets); len(set) > 0 {
			body.Reader = newRedactReader(res.Body, set, ic.cfg.RedactBodyBytes)
			res.Header.Del("Content-Length")
			res.ContentLength = -1
		}
	}
	res.Body = body
	return nil
}

// responseBody is a response body read through the redactor (or not),
// whose trailers are redacted once it is closed, which is when
// ReverseProxy copies them.
type responseBody struct {
	io.Reader
	body    io.ReadCloser
	res     *http.Response
	secrets []string
}

func (b *responseBody) Close() error {
	err := b.body.Close()
	redactHeader(b.res.Trailer, b.secrets)
	if rr, ok := b.Reader.(*redactReader); ok {
		rr.release() // ReverseProxy reads no more once it closes
	}
	return err
}

// hasBody reports whether res can carry a body.
func hasBody(res *http.Response) bool {
	if res.Request != nil && res.Request.Method == http.MethodHead {
		return false
	}
	c := res.StatusCode
	return res.Body != nil && res.Body != http.NoBody && c >= 200 && c != http.StatusNoContent && c != http.StatusNotModified
}

// identityEncoded reports whether the body is sent as is, not
// compressed.
func identityEncoded(h http.Header) bool {
	for _, v := range h.Values("Content-Encoding") {
		for e := range strings.SplitSeq(v, ",") {
			if e = strings.TrimSpace(e); e != "" && !strings.EqualFold(e, "identity") {
				return false
			}
		}
	}
	return true
}

// upstreamError answers 502 when the request could not be sent or its
// response not read. The answer says nothing more: the error could name
// what the sandbox should not learn.
func (ic *Interceptor) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client left
	}
	ic.upstreamErrors.Add(1)
	if st := stateFrom(r.Context()); st != nil {
		reason := "upstream request failed"
		var (
			unknown  x509.UnknownAuthorityError
			invalid  x509.CertificateInvalidError
			hostname x509.HostnameError
			verify   *tls.CertificateVerificationError
		)
		if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &hostname) || errors.As(err, &verify) {
			reason = "upstream certificate not trusted"
		}
		ic.log.Debug("upstream", keyName, st.info.name, keyMethod, r.Method, keyError, err)
		ic.report(st.info.name, st.info.dst, reason)
	}
	plainError(w, http.StatusBadGateway, "upstream request failed")
}

// hostMatches reports whether a request's Host (or :authority) names
// name, and, when it gives a port, port.
func hostMatches(host, name string, port uint16) bool {
	h := host
	if hh, ps, err := net.SplitHostPort(host); err == nil {
		h = hh
		if ps != "" {
			p, err := strconv.ParseUint(ps, 10, 16)
			if err != nil || uint16(p) != port {
				return false
			}
		}
	}
	return h != "" && canonicalName(h) == name
}

// plainError writes the interceptor's own short text answer.
func plainError(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	io.WriteString(w, msg+"\n")
}
