package execd

import (
	"crypto/sha256"
	"maps"
	"net/http"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// minClaimToken is the shortest token a claim may set.
const minClaimToken = 16

// claimSandbox serves POST /claim: the lifecycle server hands a sandbox
// of a warm pool to its user. In one step, and only once in the sandbox's
// life, the access token is replaced (the pool's stops working), the
// user's variables join the environment of every later process, and the
// user's entrypoint starts. A second claim is refused with 409, so a
// sandbox can never be handed out twice. The Docker runtime claims a
// sandbox whose disk it measures in the same way, with its own token,
// to start its held entrypoint once it has measured it: the 409 keeps a
// server that hands it over again from starting it twice.
func (s *Server) claimSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.ClaimRequest
	if err := httpx.DecodeJSON(w, r, &req, 0, false); err != nil {
		return err
	}
	if !s.cfg.Claimable {
		return httpx.Errorf(http.StatusForbidden, api.CodeNotSupported, "this sandbox was not started for a warm pool: it cannot be claimed")
	}
	if s.cfg.AccessToken == "" {
		return httpx.Errorf(http.StatusConflict, api.CodeInvalidRequestBody, "execd runs without a token (--insecure): it cannot be claimed")
	}
	if len(req.Token) < minClaimToken {
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "token must be at least %d characters", minClaimToken)
	}
	for k := range req.Env {
		if k == "" || privateEnv[k] {
			return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "invalid environment variable name %q", k)
		}
	}
	s.claim.Lock()
	defer s.claim.Unlock()
	if s.claimed {
		return httpx.Errorf(http.StatusConflict, api.CodeInvalidRequestBody, "this sandbox has been claimed already")
	}
	if len(req.Entrypoint) > 0 && s.Entrypoint() != nil {
		return httpx.Errorf(http.StatusConflict, api.CodeInvalidRequestBody, "this sandbox already has an entrypoint")
	}
	s.claimed = true
	env := maps.Clone(req.Env)
	s.env.claimed.Store(&env)
	digest := sha256.Sum256([]byte(req.Token))
	s.tokenDigest.Store(&digest)
	if len(req.Entrypoint) > 0 {
		if _, err := s.StartEntrypoint(req.Entrypoint); err != nil {
			// As at start: the sandbox stays usable and the failure is in
			// the entrypoint's status.
			s.log.Error("entrypoint did not start", "argv", req.Entrypoint, "err", err)
		}
	}
	s.log.Info("sandbox claimed", "entrypoint", req.Entrypoint)
	return nil
}
