package lifecycle

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Answers to a request without the right credentials.
var (
	errMissingAPIKey = httpErr(http.StatusUnauthorized, codeMissingAPIKey,
		"authentication required: send the API key in the "+api.HeaderAPIKey+" header")
	errInvalidAPIKey = httpErr(http.StatusUnauthorized, codeInvalidAPIKey,
		"the API key in the "+api.HeaderAPIKey+" header is not valid")
	errProxyUnauthorized = httpErr(http.StatusUnauthorized, codeMissingAPIKey,
		"authentication required: send the API key in "+api.HeaderAPIKey+
			" or the sandbox's token (from its endpoint headers) in "+sandbox.HeaderExecdToken)
)

// authenticate requires the API key, unless the server has none
// (Insecure).
func (s *Server) authenticate(r *http.Request) error {
	if s.cfg.APIKey == "" {
		return nil
	}
	key := r.Header.Get(api.HeaderAPIKey)
	if key == "" {
		return errMissingAPIKey
	}
	if !s.validKey(key) {
		return errInvalidAPIKey
	}
	return nil
}

// errMetricsUnauthorized answers GET /metrics without credentials.
var errMetricsUnauthorized = httpErr(http.StatusUnauthorized, codeMissingAPIKey,
	"authentication required: send the API key in the "+api.HeaderAPIKey+" header or as \"Authorization: Bearer KEY\"")

// errMetricsInvalidKey answers GET /metrics with a wrong key.
var errMetricsInvalidKey = httpErr(http.StatusUnauthorized, codeInvalidAPIKey, "the API key sent is not valid")

// authenticateMetrics requires the API key, unless the server has none,
// in OPEN-SANDBOX-API-KEY or as a bearer token: Prometheus sends the
// latter from a scrape config's authorization section.
func (s *Server) authenticateMetrics(r *http.Request) error {
	if s.cfg.APIKey == "" {
		return nil
	}
	key := r.Header.Get(api.HeaderAPIKey)
	if key == "" {
		auth := r.Header.Get("Authorization")
		if scheme, token, ok := strings.Cut(auth, " "); ok && strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(token)
		}
	}
	if key == "" {
		return errMetricsUnauthorized
	}
	if !s.validKey(key) {
		return errMetricsInvalidKey
	}
	return nil
}

// validKey compares key with the API key in constant time.
func (s *Server) validKey(key string) bool {
	got := sha256.Sum256([]byte(key))
	return subtle.ConstantTimeCompare(got[:], s.keyDigest[:]) == 1
}

// authenticateProxy admits a request to sandbox id's proxy route that
// carries either the API key or the sandbox's own execd token, the one
// its endpoints hand out: the SDKs' use_server_proxy mode sends an
// endpoint's headers, not the API key. An unknown sandbox is answered as
// a missing credential, so the route tells nothing to strangers.
func (s *Server) authenticateProxy(ctx context.Context, r *http.Request, id sandbox.ID) error {
	if s.cfg.APIKey == "" {
		return nil
	}
	key := r.Header.Get(api.HeaderAPIKey)
	if key != "" && s.validKey(key) {
		return nil
	}
	token := r.Header.Get(sandbox.HeaderExecdToken)
	if token != "" {
		ep, err := s.rt.Endpoint(ctx, id, api.ExecdPort)
		if err != nil && ctx.Err() != nil {
			return err
		}
		if want := ep.Headers[sandbox.HeaderExecdToken]; err == nil && want != "" {
			a, b := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(want))
			if subtle.ConstantTimeCompare(a[:], b[:]) == 1 {
				return nil
			}
		}
	}
	if key != "" || token != "" {
		return httpErr(http.StatusUnauthorized, codeInvalidAPIKey,
			"neither the API key nor the sandbox token sent is valid for this sandbox")
	}
	return errProxyUnauthorized
}
