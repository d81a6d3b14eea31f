package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/ingress"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Route modes of an ingress gateway: how an endpoint names the sandbox
// and port it goes to (lifecycle.md §8.1).
const (
	// RouteHeader: endpoint = the gateway's address, the route in the
	// OpenSandbox-Ingress-To header.
	RouteHeader = "header"
	// RouteURI: endpoint = {address}/{sandboxId}/{port}.
	RouteURI = "uri"
	// RouteWildcard: endpoint = {sandboxId}-{port}.{domain}.
	RouteWildcard = "wildcard"
)

// dnsLabelMax is the length of a DNS label, which a wildcard route must
// fit in.
const dnsLabelMax = 63

// IngressSigner signs gateway routes and makes sandboxes' access tokens:
// *ingress.Keys. Empty reports a set without keys (a nil *ingress.Keys
// included), which signs nothing.
type IngressSigner interface {
	Empty() bool
	SignedRoute(sandboxID string, port int, expires time.Time, labelMax int) (string, error)
	AccessToken(sandboxID string) (string, error)
}

// IngressConfig says whether endpoints go through an ingress gateway, and
// how its routes are written. The zero value is direct endpoints.
type IngressConfig struct {
	// Gateway makes the endpoint API answer the gateway's routes instead
	// of the runtime's direct endpoints (use_server_proxy still answers
	// this server's proxy route).
	Gateway bool
	// RouteMode is RouteHeader, RouteURI or RouteWildcard.
	RouteMode string
	// Address is the gateway's host[:port] as clients reach it, without
	// scheme or path (header and uri modes).
	Address string
	// Domain is the domain whose subdomains reach the gateway, host[:port]
	// (wildcard mode): a route is "{sandboxId}-{port}.{Domain}".
	Domain string
	// Keys returns the current signing keys; nil, or a func that returns
	// an empty set: no access tokens and no signed routes (expires is
	// then answered 400 SANDBOX::API_NOT_SUPPORTED, as without a gateway).
	Keys func() IngressSigner
}

// validate reports the first field that cannot work, naming it.
func (c *IngressConfig) validate() error {
	if !c.Gateway {
		return nil
	}
	switch c.RouteMode {
	case RouteHeader, RouteURI:
		if err := CheckHostPort(c.Address); err != nil {
			return fmt.Errorf("Ingress.Address %q: %v", c.Address, err)
		}
	case RouteWildcard:
		if err := CheckHostPort(c.Domain); err != nil {
			return fmt.Errorf("Ingress.Domain %q: %v", c.Domain, err)
		}
	default:
		return fmt.Errorf("Ingress.RouteMode %q: want header, uri or wildcard", c.RouteMode)
	}
	return nil
}

// CheckHostPort accepts host or host:port, without scheme, path or
// wildcard: a gateway's address or domain.
func CheckHostPort(v string) error {
	switch {
	case v == "":
		return errors.New("empty")
	case strings.Contains(v, "://"):
		return errors.New("want host[:port] without a scheme (clients choose http or https)")
	case strings.ContainsAny(v, "/?#@ *"):
		return errors.New("want host[:port] without path, wildcard or spaces")
	}
	host := v
	if h, port, err := net.SplitHostPort(v); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q is not 1 to 65535", port)
		}
		host = h
	}
	if host == "" || strings.HasPrefix(host, ".") || strings.HasSuffix(host, ".") || strings.Contains(host, "..") {
		return errors.New("not a host name")
	}
	return nil
}

// keys returns the signing keys, nil when there are none.
func (c *IngressConfig) keys() IngressSigner {
	if c.Keys == nil {
		return nil
	}
	k := c.Keys()
	if k == nil || k.Empty() {
		return nil
	}
	return k
}

// maxExpiresDigits bounds the expires query parameter (lifecycle.md §5.8).
const maxExpiresDigits = 20

// parseExpires reads the expires parameter of the endpoint API: decimal
// Unix seconds, no sign and no leading zero, after now.
func parseExpires(v string, now time.Time) (time.Time, error) {
	if v == "" || len(v) > maxExpiresDigits || strings.Trim(v, "0123456789") != "" || (len(v) > 1 && v[0] == '0') {
		return time.Time{}, invalid(codeInvalidParameter, "expires %q: want Unix seconds as a decimal number", v)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > math.MaxInt64 {
		return time.Time{}, invalid(codeInvalidParameter, "expires %q: too far in the future", v)
	}
	t := time.Unix(int64(n), 0)
	if !t.After(now) {
		return time.Time{}, invalid(codeInvalidParameter, "expires %q: must be after now (%d)", v, now.Unix())
	}
	return t, nil
}

// gatewayEndpoint is the endpoint of port of sandbox id through the
// gateway: the route in the configured mode, with the sandbox's access
// token, or, when expires is set, the signed route (which is its own
// authorization, so no token). direct is the runtime's endpoint, whose
// egress token still goes to the client: the egress API checks it itself.
func (s *Server) gatewayEndpoint(id sandbox.ID, port int, direct sandbox.Endpoint, expires *time.Time) (api.Endpoint, error) {
	ic := &s.cfg.Ingress
	keys := ic.keys()
	route := string(id) + "-" + strconv.Itoa(port)
	headers := map[string]string{}
	if tok := direct.Headers[api.HeaderEgressAuth]; tok != "" {
		headers[api.HeaderEgressAuth] = tok
	}
	// execd's token too, as a direct endpoint gives it: a gateway that
	// reads the cluster's pods (osb-ingress --kubernetes) may not read
	// the Secret that holds it, so the client sends it.
	if tok := direct.Headers[sandbox.HeaderExecdToken]; tok != "" && port == api.ExecdPort {
		headers[sandbox.HeaderExecdToken] = tok
	}
	if expires != nil {
		labelMax := 0
		if ic.RouteMode == RouteWildcard {
			labelMax = dnsLabelMax
		}
		signed, err := keys.SignedRoute(string(id), port, *expires, labelMax)
		if err != nil {
			return api.Endpoint{}, invalid(codeInvalidParameter, "expires: %v", err)
		}
		route = signed
	} else if keys != nil {
		tok, err := keys.AccessToken(string(id))
		if err != nil {
			return api.Endpoint{}, fmt.Errorf("access token of %s: %w", id, err)
		}
		headers[api.HeaderSecureAccess] = tok
	}
	var ep api.Endpoint
	switch ic.RouteMode {
	case RouteHeader:
		ep.Endpoint = ic.Address
		headers[api.HeaderIngressTo] = route
	case RouteURI:
		// The signed form of a path route is /{id}/{port}/{exp}/{sig}.
		ep.Endpoint = ic.Address + "/" + url.PathEscape(string(id)) + "/" + strconv.Itoa(port)
		if expires != nil {
			rest := strings.TrimPrefix(route, string(id)+"-"+strconv.Itoa(port)+"-")
			exp, sig, _ := strings.Cut(rest, "-")
			ep.Endpoint += "/" + exp + "/" + sig
		}
	case RouteWildcard:
		ep.Endpoint = route + "." + ic.Domain
	}
	if len(headers) > 0 {
		ep.Headers = headers
	}
	return ep, nil
}

// IngressTarget tells a gateway where port of sandbox id is and whether
// it may be served: the sandbox's state, and while it is Running, the
// runtime's direct endpoint and its headers. An unknown sandbox is an
// error wrapping sandbox.ErrNotFound. The in-process gateway calls it
// directly; remote gateways through GET /v1/ingress/targets/{id}/{port}.
func (s *Server) IngressTarget(ctx context.Context, id string, port int) (api.IngressTarget, error) {
	if port < 1 || port > 65535 {
		return api.IngressTarget{}, invalid(s.codes().invalidPort, "port %d: want an integer from 1 to 65535", port)
	}
	sb, err := s.rt.Get(ctx, sandbox.ID(id))
	if err != nil {
		return api.IngressTarget{}, err
	}
	t := api.IngressTarget{
		SandboxID: id,
		Port:      port,
		State:     string(sb.Status.State),
		Reason:    sb.Status.Reason,
		Public:    sb.Extensions[extIngressPublic] == "true",
		ExpiresAt: sb.ExpiresAt,
	}
	if n, err := renewExtendOf(sb.Extensions[extRenewExtend]); err == nil && sb.ExpiresAt != nil {
		t.RenewExtendSeconds = int(n / time.Second)
	}
	if sb.Status.State != sandbox.StateRunning {
		return t, nil
	}
	ep, err := s.rt.Endpoint(ctx, sandbox.ID(id), port)
	if err != nil {
		return api.IngressTarget{}, err
	}
	t.Endpoint, t.Headers = ep.Address, ep.Headers
	return t, nil
}

// IngressRenew is renew-on-access for traffic a gateway carried to
// sandbox id: the same throttled renewal as the proxy route's, which
// never shortens an expiry. An unknown sandbox is an error wrapping
// sandbox.ErrNotFound.
func (s *Server) IngressRenew(ctx context.Context, id string, port int) error {
	if _, err := s.rt.Get(ctx, sandbox.ID(id)); err != nil {
		return err
	}
	s.renewOnAccess(ctx, sandbox.ID(id))
	return nil
}

// InProcessGateway is the server as an in-process gateway's source of
// sandboxes (ingress.Resolver and ingress.Renewer), without HTTP: an
// unknown sandbox is ingress.ErrNotFound.
type InProcessGateway struct{ Server *Server }

// Target implements ingress.Resolver.
func (g InProcessGateway) Target(ctx context.Context, id string, port int) (api.IngressTarget, error) {
	t, err := g.Server.IngressTarget(ctx, id, port)
	if errors.Is(err, sandbox.ErrNotFound) {
		return t, fmt.Errorf("sandbox %s: %w", id, ingress.ErrNotFound)
	}
	return t, err
}

// Renew implements ingress.Renewer.
func (g InProcessGateway) Renew(ctx context.Context, id string, port int) error {
	return g.Server.IngressRenew(ctx, id, port)
}

// ingressTarget answers GET /ingress/targets/{id}/{port}.
func (s *Server) ingressTarget(w http.ResponseWriter, r *http.Request) error {
	port, ok := parsePort(r.PathValue("port"))
	if !ok {
		return invalid(s.codes().invalidPort, "port %q: want an integer from 1 to 65535", r.PathValue("port"))
	}
	t, err := s.IngressTarget(r.Context(), r.PathValue("id"), port)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, t)
}

// ingressRenew answers POST /ingress/renew/{id}: 204 whether or not the
// expiry moved.
func (s *Server) ingressRenew(w http.ResponseWriter, r *http.Request) error {
	var req api.IngressRenewRequest
	if err := s.decodeJSON(w, r, &req, true); err != nil {
		return err
	}
	if err := s.IngressRenew(r.Context(), r.PathValue("id"), req.Port); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
