package execd

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

var unauthorized = api.UnauthorizedResponse{
	Error: "Unauthorized: invalid or missing header " + api.HeaderExecdToken,
}

// authenticate requires the access token on every request, the proxy and
// the PTY WebSocket included. The comparison takes the same time whatever
// the token sent.
//
// Without a token (Insecure), any process that can reach the port is
// trusted, but a web page open in a browser on the same machine is not:
// cross-origin requests that change anything are refused, and so are
// cross-origin WebSocket upgrades (see attachPTY).
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.cfg.AccessToken == "" {
		return http.NewCrossOriginProtection().Handler(next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Comparing digests keeps even the token's length secret. The
		// token changes once if the sandbox is claimed from a pool.
		want := s.tokenDigest.Load()
		got := sha256.Sum256([]byte(r.Header.Get(api.HeaderExecdToken)))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			httpx.WriteJSON(w, http.StatusUnauthorized, unauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
