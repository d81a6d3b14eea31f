package lifecycle

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// createSandbox answers POST /sandboxes: 202 with the new sandbox, which
// is normally still Pending.
func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	spec, err := s.specFromRequest(&req, s.now())
	if err != nil {
		return err
	}
	if err := s.checkHostSize(r.Context(), "resourceLimits", spec.Resources); err != nil {
		return err
	}
	sb, err := s.m.Create(r.Context(), spec)
	if err != nil {
		if spec.SnapshotID != "" {
			err = snapshotNotFound(err, sandbox.SnapshotID(spec.SnapshotID))
		}
		return err
	}
	return writeJSON(w, http.StatusAccepted, toCreateResponse(sb))
}

// listSandboxes answers GET /sandboxes: the sandboxes in any of the
// states asked (case-insensitive) whose metadata holds every pair of the
// metadata filter, newest first, one page of them.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	states := parseStates(q["state"])
	md, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		return err
	}
	page, size, err := parsePage(q)
	if err != nil {
		return err
	}
	all, err := s.rt.List(r.Context())
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	var match []*sandbox.Sandbox
	for _, sb := range all {
		if states.match(string(sb.Status.State)) && matchesMetadata(sb.Metadata, md) {
			match = append(match, sb)
		}
	}
	slices.SortFunc(match, func(a, b *sandbox.Sandbox) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(string(a.ID), string(b.ID)))
	})
	items, info := paginate(match, page, size)
	out := api.ListSandboxesResponse{Items: make([]api.Sandbox, 0, len(items)), Pagination: info}
	for _, sb := range items {
		out.Items = append(out.Items, toAPISandbox(sb))
	}
	return writeJSON(w, http.StatusOK, out)
}

// getSandbox answers GET /sandboxes/{id}.
func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.rt.Get(r.Context(), sandbox.ID(r.PathValue("id")))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

// deleteSandbox answers DELETE /sandboxes/{id}: 204 once it is gone.
func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id := sandbox.ID(r.PathValue("id"))
	if err := s.rt.Delete(r.Context(), id); err != nil {
		return err
	}
	s.renew.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// patchMetadata answers PATCH /sandboxes/{id}/metadata, a JSON merge
// patch of the metadata: a string sets its key, null deletes it, and the
// answer is the whole sandbox afterwards.
func (s *Server) patchMetadata(w http.ResponseWriter, r *http.Request) error {
	var patch map[string]*string
	if err := s.decodeJSON(w, r, &patch, false); err != nil {
		return err
	}
	if patch == nil {
		return invalid(codeInvalidParameter, "want a JSON object of metadata keys to string values (or null to delete)")
	}
	for _, k := range slices.Sorted(maps.Keys(patch)) {
		var err error
		if v := patch[k]; v != nil {
			err = checkLabel(k, *v)
		} else if strings.HasPrefix(k, reservedLabelPrefix) {
			err = fmt.Errorf("key %q: the prefix %s is reserved", k, reservedLabelPrefix)
		}
		if err != nil {
			return invalid(codePatchLabel, "metadata: %v", err)
		}
	}
	id := sandbox.ID(r.PathValue("id"))
	var sb *sandbox.Sandbox
	var err error
	if len(patch) == 0 {
		sb, err = s.rt.Get(r.Context(), id)
	} else {
		sb, err = s.rt.PatchMetadata(r.Context(), id, patch)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

// pauseSandbox answers POST /sandboxes/{id}/pause: 202, empty, once the
// sandbox is Paused.
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := s.m.Pause(r.Context(), sandbox.ID(r.PathValue("id"))); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// resumeSandbox answers POST /sandboxes/{id}/resume: 202, empty, once the
// sandbox is Running again.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	if err := s.m.Resume(r.Context(), sandbox.ID(r.PathValue("id"))); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// renewExpiration answers POST /sandboxes/{id}/renew-expiration: the new
// absolute expiry (a timestamp without zone is UTC), answered normalized
// to UTC.
func (s *Server) renewExpiration(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		ExpiresAt *string `json:"expiresAt"`
	}
	if err := s.decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.ExpiresAt == nil {
		return invalid(codeInvalidParameter, "expiresAt is required")
	}
	at, err := parseTimestamp(*req.ExpiresAt)
	if err != nil {
		return invalid(codeInvalidParameter, "expiresAt %q: %v", *req.ExpiresAt, err)
	}
	got, err := s.m.Renew(r.Context(), sandbox.ID(r.PathValue("id")), at)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.RenewExpirationRequest{ExpiresAt: got.UTC()})
}

// Timestamp layouts accepted by renew-expiration: RFC 3339 with a zone,
// or without one (taken as UTC), with "T" or a space between date and
// time, with or without fractional seconds.
var (
	zonedLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05.999999999Z07:00"}
	naiveLayouts = []string{"2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999"}
)

// parseTimestamp parses an expiry as the reference server does: a
// timestamp without zone is UTC.
func parseTimestamp(v string) (time.Time, error) {
	for _, l := range zonedLayouts {
		if t, err := time.Parse(l, v); err == nil {
			return t.UTC(), nil
		}
	}
	for _, l := range naiveLayouts {
		if t, err := time.ParseInLocation(l, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("want an RFC 3339 timestamp such as 2026-01-05T12:00:00Z")
}

// getEndpoint answers GET /sandboxes/{id}/endpoints/{port}: how a client
// reaches the port, either as the runtime says, through the ingress
// gateway ([ingress] mode = "gateway"), or through this server's proxy
// route (use_server_proxy=true) with the runtime endpoint's headers and
// the sandbox's token. A signed route (expires) needs the gateway and
// its signing keys.
func (s *Server) getEndpoint(w http.ResponseWriter, r *http.Request) error {
	port, ok := parsePort(r.PathValue("port"))
	if !ok {
		return invalid(s.codes().invalidPort, "port %q: want an integer from 1 to 65535", r.PathValue("port"))
	}
	q := r.URL.Query()
	useProxy := false
	if v := q.Get("use_server_proxy"); v != "" {
		b, ok := parseBool(v)
		if !ok {
			return invalid(codeInvalidParameter, "use_server_proxy %q: want true or false", v)
		}
		useProxy = b
	}
	gateway := s.cfg.Ingress.Gateway && !useProxy
	var expires *time.Time
	if q.Has("expires") {
		if useProxy {
			return invalid(codeInvalidParameter, "expires cannot be combined with use_server_proxy=true")
		}
		if !gateway || s.cfg.Ingress.keys() == nil {
			return invalid(codeAPINotSupported, "signed endpoints (expires) need the ingress gateway with signing keys ([ingress] mode = \"gateway\" and signing_keys in the server's configuration)")
		}
		t, err := parseExpires(q.Get("expires"), s.now())
		if err != nil {
			return err
		}
		expires = &t
	}
	id := sandbox.ID(r.PathValue("id"))
	if gateway {
		// The route does not depend on where the sandbox runs, so it is
		// answered while the sandbox starts (a pod without an address
		// yet included); only the egress port's token comes from the
		// runtime's endpoint. execd's token comes with execd's port
		// where the runtime tells it (a gateway that reads pods cannot
		// add it, see gatewayEndpoint).
		var direct sandbox.Endpoint
		var err error
		tokener, hasToken := s.rt.(sandbox.ExecdTokener)
		switch {
		case port == sandbox.PortEgress:
			direct, err = s.rt.Endpoint(r.Context(), id, port)
		case port == api.ExecdPort && hasToken:
			var tok string
			if tok, err = tokener.ExecdToken(r.Context(), id); err == nil {
				direct.Headers = map[string]string{sandbox.HeaderExecdToken: tok}
			}
		default:
			_, err = s.rt.Get(r.Context(), id)
		}
		if err != nil {
			return err
		}
		gep, err := s.gatewayEndpoint(id, port, direct, expires)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, gep)
	}
	ep, err := s.rt.Endpoint(r.Context(), id, port)
	if err != nil {
		return err
	}
	if !useProxy {
		return writeJSON(w, http.StatusOK, api.Endpoint{Endpoint: ep.Address, Headers: ep.Headers})
	}
	// Through the proxy route: the direct endpoint's headers (the
	// protocol asks for the same ones), and the sandbox's token, which
	// the route accepts in place of the API key.
	headers := maps.Clone(ep.Headers)
	if port != api.ExecdPort {
		execd, err := s.rt.Endpoint(r.Context(), id, api.ExecdPort)
		if err != nil {
			return err
		}
		if tok := execd.Headers[sandbox.HeaderExecdToken]; tok != "" {
			if headers == nil {
				headers = map[string]string{}
			}
			headers[sandbox.HeaderExecdToken] = tok
		}
	}
	return writeJSON(w, http.StatusOK, api.Endpoint{
		Endpoint: cmp.Or(s.cfg.PublicAddress, r.Host) + "/sandboxes/" + url.PathEscape(string(id)) + "/proxy/" + strconv.Itoa(port),
		Headers:  headers,
	})
}

// parsePort parses a port: decimal, 1 to 65535.
func parsePort(v string) (int, bool) {
	if v == "" || len(v) > 5 || strings.Trim(v, "0123456789") != "" {
		return 0, false
	}
	n, _ := strconv.Atoi(v)
	return n, n >= 1 && n <= 65535
}

// parseBool parses a query flag the way the reference server (FastAPI)
// does: true/false, 1/0, yes/no, on/off, any case.
func parseBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "true", "1", "yes", "on", "t", "y":
		return true, true
	case "false", "0", "no", "off", "f", "n":
		return false, true
	}
	return false, false
}

// snapshotNotFound turns a plain not-found error about a snapshot into
// SNAPSHOT::NOT_FOUND; other errors pass unchanged.
func snapshotNotFound(err error, id sandbox.SnapshotID) error {
	var ce *sandbox.CodedError
	if errors.Is(err, sandbox.ErrNotFound) && !errors.As(err, &ce) {
		return sandbox.Coded(sandbox.ErrNotFound, codeSnapshotNotFound, fmt.Sprintf("snapshot %s not found", id))
	}
	return err
}
