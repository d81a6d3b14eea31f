package egress

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/opensandbox/opensandbox/api"
)

// Limits of the egress API.
const (
	// MaxBodyBytes is the largest request body the API reads; larger
	// ones get 413.
	MaxBodyBytes = 1 << 20
	// DefaultMaxRules is the default cap on the number of user rules.
	DefaultMaxRules = 4096
	// ProxyPrefix is the path prefix the API is also served under, for
	// clients given an endpoint "host:port/proxy/18080".
	ProxyPrefix = "/proxy/18080"
)

// The reasons the API puts in a PolicyStatus.
const (
	reasonReset    = "policy reset to default deny-all"
	reasonNoTarget = "no matching targets found"
)

// Store persists the policy; FileStore is the one osb-egress uses.
type Store interface {
	Save(Policy) error
}

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	// Token is the value the OPENSANDBOX-EGRESS-AUTH header must carry.
	// Empty turns authentication off (as the reference sidecar does when
	// OPENSANDBOX_EGRESS_TOKEN is unset); the lifecycle server always sets
	// one.
	Token string
	// EnforcementMode is reported as "enforcementMode": ModeStrict,
	// ModeDNSNft or ModeDNS.
	EnforcementMode string
	// MaxRules caps the number of user rules a change may leave; a change
	// over it gets 413. 0 means no cap; DefaultHandlerConfig sets
	// DefaultMaxRules.
	MaxRules int
	// Store, when set, persists each new policy before it is applied.
	Store Store
	// Apply, when set, puts a new policy in force outside the process
	// (the namespace's firewall). It runs after Store and before the
	// matcher is swapped; an error answers 500 and leaves the policy in
	// force unchanged.
	Apply func(Policy) error
	// Ready, when set, is asked by /healthz: an error answers 503 with
	// its text. Nil means always ready.
	Ready func() error
	// Denials, when set, is served by GET /denials.
	Denials *Denials
	// Logger receives one line per policy change and every 5xx. Nil
	// discards.
	Logger *slog.Logger
	// Vault, when set, serves the credential vault's routes
	// (/credential-vault and below it, at the root and under
	// ProxyPrefix) and does its own authentication. Nil answers 412 on
	// every vault route, after the token check: the sandbox has no
	// credential proxy.
	Vault http.Handler
	// CheckPolicy, when set, is asked about every policy change before it
	// is persisted, with the matcher the new policy would have; an error
	// refuses the change with 400 "credential vault policy validation:
	// ...". The credential vault uses it to keep every binding host
	// allowed.
	CheckPolicy func(*Matcher) error
}

// DefaultHandlerConfig returns the defaults: strict enforcement, the
// default rule cap.
func DefaultHandlerConfig() HandlerConfig {
	return HandlerConfig{EnforcementMode: ModeStrict, MaxRules: DefaultMaxRules}
}

// Handler serves the egress API (the wire contract of the reference
// sidecar), at the root and again under ProxyPrefix:
//
//	GET    /policy   the user policy (without the operator's overlay)
//	POST   /policy   replace the policy (PUT too); an empty body resets to deny-all
//	PATCH  /policy   merge rules: the patch's first, then the old ones it does not name
//	DELETE /policy   remove the rules with the given targets
//	GET    /healthz  200 "ok", 503 while not ready; needs no token
//	GET    /denials  the most recent refused attempts, oldest first, as a JSON
//	                 list of Denial; the header X-Denials-Total counts all of
//	                 them. An extension of this implementation, for diagnostics.
//	*      /credential-vault, /credential-vault/...
//	                 the credential vault, served by HandlerConfig.Vault
//
// Every route but /healthz needs the OPENSANDBOX-EGRESS-AUTH header.
// Errors are text/plain. Changes are serialized and applied in order:
// persisted (Store), applied (Apply), then the Live matcher swapped; a
// failure at any step answers 500 and changes nothing in force.
type Handler struct {
	cfg  HandlerConfig
	live *Live
	log  *slog.Logger
	mux  *http.ServeMux
	mu   sync.Mutex // serializes changes
}

// NewHandler returns the API over live, whose current matcher holds the
// policy in force; the handler swaps in a new matcher (same overlay) on
// each change.
func NewHandler(cfg HandlerConfig, live *Live) (*Handler, error) {
	if live == nil || live.Load() == nil {
		return nil, errors.New("egress handler: no matcher in force")
	}
	switch cfg.EnforcementMode {
	case ModeStrict, ModeDNSNft, ModeDNS:
	default:
		return nil, fmt.Errorf("egress handler: enforcement mode %q: want %s, %s or %s", cfg.EnforcementMode, ModeStrict, ModeDNSNft, ModeDNS)
	}
	if cfg.MaxRules < 0 {
		return nil, fmt.Errorf("egress handler: MaxRules %d: want >= 0", cfg.MaxRules)
	}
	h := &Handler{cfg: cfg, live: live, log: cfg.Logger, mux: http.NewServeMux()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.routes("")
	h.routes(ProxyPrefix)
	return h, nil
}

// routes lists the whole API under prefix. The mux answers 405 with an
// Allow header for a known path and another method.
func (h *Handler) routes(prefix string) {
	h.mux.Handle("GET "+prefix+"/policy", h.auth(h.getPolicy))
	h.mux.Handle("POST "+prefix+"/policy", h.auth(h.setPolicy))
	h.mux.Handle("PUT "+prefix+"/policy", h.auth(h.setPolicy))
	h.mux.Handle("PATCH "+prefix+"/policy", h.auth(h.patchPolicy))
	h.mux.Handle("DELETE "+prefix+"/policy", h.auth(h.deletePolicy))
	h.mux.Handle("GET "+prefix+"/denials", h.auth(h.getDenials))
	h.mux.Handle("GET "+prefix+"/healthz", http.HandlerFunc(h.healthz))
	vault := h.cfg.Vault
	if vault == nil {
		vault = h.auth(noVault)
	}
	h.mux.Handle(prefix+"/credential-vault", vault)
	h.mux.Handle(prefix+"/credential-vault/", vault)
}

// noVault answers the vault's routes in a sandbox without a credential
// proxy.
func noVault(http.ResponseWriter, *http.Request) error {
	return &httpError{http.StatusPreconditionFailed, "the credential proxy is not enabled for this sandbox"}
}

// ServeHTTP serves the API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// httpError is an error with the status it answers.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// Authorized reports whether r carries token in the
// OPENSANDBOX-EGRESS-AUTH header, compared in constant time. An empty
// token authorizes every request (authentication is off).
func Authorized(r *http.Request, token string) bool {
	if token == "" {
		return true
	}
	got := r.Header.Get(api.HeaderEgressAuth)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// ClearTextOK reports whether r may carry secrets: it came over TLS, or
// from a loopback peer, or from a peer in trusted.
func ClearTextOK(r *http.Request, trusted []netip.Prefix) bool {
	if r.TLS != nil {
		return true
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a := ap.Addr().WithZone("").Unmap()
	return a.IsLoopback() || slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(a) })
}

// auth checks the token in constant time, then runs fn and answers its
// error: ErrInvalid is 400, an httpError its status, anything else 500.
func (h *Handler) auth(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Authorized(r, h.cfg.Token) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		err := fn(w, r)
		var he *httpError
		switch {
		case err == nil:
		case errors.As(err, &he):
			http.Error(w, he.msg, he.status)
		case errors.Is(err, ErrInvalid):
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			h.log.Error("egress API", "method", r.Method, "path", r.URL.Path, "err", err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}

// readBody reads a body of at most MaxBodyBytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", MaxBodyBytes)}
	} else if err != nil {
		return nil, &httpError{http.StatusBadRequest, "read request body: " + err.Error()}
	}
	return data, nil
}

func (h *Handler) getPolicy(w http.ResponseWriter, r *http.Request) error {
	p := h.live.Load().Policy()
	wire := p.API()
	return writeJSON(w, api.PolicyStatus{Status: "ok", Mode: p.Mode(), EnforcementMode: h.cfg.EnforcementMode, Policy: &wire})
}

func (h *Handler) setPolicy(w http.ResponseWriter, r *http.Request) error {
	data, err := readBody(w, r)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		// The reference sidecar answers a reset without enforcementMode.
		if err := h.change(r, func(Policy) (Policy, error) { return DenyAll(), nil }); err != nil {
			return err
		}
		return writeJSON(w, api.PolicyStatus{Status: "ok", Mode: PolicyDenyAll, Reason: reasonReset})
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return err
	}
	if err := h.change(r, func(Policy) (Policy, error) { return p, nil }); err != nil {
		return err
	}
	return writeJSON(w, h.status(p, ""))
}

func (h *Handler) patchPolicy(w http.ResponseWriter, r *http.Request) error {
	data, err := readBody(w, r)
	if err != nil {
		return err
	}
	rules, err := ParsePatch(data)
	if err != nil {
		return err
	}
	var next Policy
	err = h.change(r, func(cur Policy) (Policy, error) {
		next = cur.Patch(rules)
		return next, nil
	})
	if err != nil {
		return err
	}
	return writeJSON(w, h.status(next, ""))
}

func (h *Handler) deletePolicy(w http.ResponseWriter, r *http.Request) error {
	data, err := readBody(w, r)
	if err != nil {
		return err
	}
	targets, err := ParseTargets(data)
	if err != nil {
		return err
	}
	var next Policy
	removed := 0
	err = h.change(r, func(cur Policy) (Policy, error) {
		next, removed = cur.Delete(targets)
		if removed == 0 {
			return cur, errUnchanged
		}
		return next, nil
	})
	if errors.Is(err, errUnchanged) {
		return writeJSON(w, h.status(next, reasonNoTarget))
	} else if err != nil {
		return err
	}
	return writeJSON(w, h.status(next, ""))
}

func (h *Handler) getDenials(w http.ResponseWriter, r *http.Request) error {
	list := []Denial{}
	if h.cfg.Denials != nil {
		list = h.cfg.Denials.List()
		w.Header().Set("X-Denials-Total", strconv.FormatUint(h.cfg.Denials.Total(), 10))
	} else {
		w.Header().Set("X-Denials-Total", "0")
	}
	return writeJSON(w, list)
}

func (h *Handler) healthz(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Ready != nil {
		if err := h.cfg.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok")
}

// errUnchanged tells change that the edit changed nothing: nothing is
// persisted or applied.
var errUnchanged = errors.New("policy unchanged")

// change computes the next policy from the one in force under the change
// lock, checks the rule cap, and puts it in force: persisted, applied,
// swapped. Any failure leaves the policy in force as it was.
func (h *Handler) change(r *http.Request, edit func(cur Policy) (Policy, error)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := h.live.Load()
	next, err := edit(cur.Policy())
	if err != nil {
		return err
	}
	if h.cfg.MaxRules > 0 && len(next.Egress) > h.cfg.MaxRules {
		return &httpError{http.StatusRequestEntityTooLarge,
			fmt.Sprintf("too many rules: %d, the limit is %d", len(next.Egress), h.cfg.MaxRules)}
	}
	m, err := cur.WithPolicy(next)
	if err != nil {
		return err // a target the parser accepted but the matcher refuses: ErrInvalid, 400
	}
	if h.cfg.CheckPolicy != nil {
		if err := h.cfg.CheckPolicy(m); err != nil {
			return invalid("credential vault policy validation: %v", err)
		}
	}
	if h.cfg.Store != nil {
		if err := h.cfg.Store.Save(next); err != nil {
			return fmt.Errorf("persist policy: %w", err)
		}
	}
	if h.cfg.Apply != nil {
		if err := h.cfg.Apply(next); err != nil {
			if h.cfg.Store != nil {
				// Put the file back to the policy still in force, so a
				// restart does not bring up one that was never applied.
				if rerr := h.cfg.Store.Save(cur.Policy()); rerr != nil {
					h.log.Error("restore policy file after a failed apply", "err", rerr)
				}
			}
			return fmt.Errorf("apply policy: %w", err)
		}
	}
	h.live.Store(m)
	h.log.Info("egress policy changed", "method", r.Method, "mode", next.Mode(), "rules", len(next.Egress))
	return nil
}

// status is the answer to a successful change.
func (h *Handler) status(p Policy, reason string) api.PolicyStatus {
	return api.PolicyStatus{Status: "ok", Mode: p.Mode(), EnforcementMode: h.cfg.EnforcementMode, Reason: reason}
}

// writeJSON marshals v before writing anything, so an encoding error
// still becomes a clean 500.
func writeJSON(w http.ResponseWriter, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(append(data, '\n')) // an error means the client left: no one to tell
	return nil
}
