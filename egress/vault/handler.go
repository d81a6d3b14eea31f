package vault

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// Store persists the vault in force; FileStore is the one osb-egress
// uses. Save(nil) removes it.
type Store interface {
	Save(*Vault) error
}

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	// Token is the value the OPENSANDBOX-EGRESS-AUTH header must carry,
	// as for the rest of the egress API. Empty turns the check off, and
	// every write answers 412: the vault needs a token.
	Token string
	// Enabled says the transparent intercepting proxy is on (the sandbox
	// was created with credentialProxy.enabled). False answers 412 to
	// every write.
	Enabled bool
	// Ready, when set, reports why the intercepting proxy is not ready
	// yet; an error answers 412 to writes. Nil means ready.
	Ready func() error
	// AllowHTTP lets bindings match plain-HTTP requests (Options.AllowHTTP).
	AllowHTTP bool
	// HostAllowed is the egress policy's check of a binding host
	// (Options.HostAllowed); required.
	HostAllowed func(host string) error
	// PlainPeers are the networks, besides loopback, allowed to write
	// over plain HTTP. Writes from any other peer without TLS answer 426.
	PlainPeers []netip.Prefix
	// Live holds the vault in force; required.
	Live *Live
	// Store, when set, persists each new vault (nil when deleted) before
	// it is put in force; an error answers 500 and changes nothing.
	Store Store
	// OnChange, when set, is called with each new vault (nil when
	// deleted) after it is put in force, with the change lock held: calls
	// come in the order of the changes. It must not call the handler.
	OnChange func(*Vault)
	// Logger receives one line per change (revision and counts, never a
	// value) and every 5xx. Nil discards.
	Logger *slog.Logger
}

// Handler serves the credential vault's routes (egress.md §5.1) at the
// root and under egress.ProxyPrefix:
//
//	POST   /credential-vault                    create: 201 and the state; 409 if one exists
//	GET    /credential-vault                    the state, 404 without a vault
//	PATCH  /credential-vault                    mutate: 200 and the state; 404, 409 (revision)
//	DELETE /credential-vault                    204; 404 without a vault
//	GET    /credential-vault/credentials        {revision, credentials}
//	GET    /credential-vault/credentials/{name} one credential's metadata
//	GET    /credential-vault/bindings           {revision, bindings}
//	GET    /credential-vault/bindings/{name}    one binding's metadata
//	*      /credential-vault/_active            403 always: the vault with its values is never served
//
// Every route needs the OPENSANDBOX-EGRESS-AUTH token (401). Writes are
// then refused with 412 when the sidecar has no token, the credential
// proxy is not enabled or not ready, and with 426 when they come without
// TLS from a peer that is neither loopback nor in PlainPeers; then the
// body is read (1 MiB, 413) and checked (400). Writes are serialized.
// Errors are text/plain and never hold a credential's value.
type Handler struct {
	cfg HandlerConfig
	log *slog.Logger
	mux *http.ServeMux
	mu  sync.Mutex // serializes writes
}

// NewHandler returns the vault's API.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	if cfg.Live == nil {
		return nil, errors.New("credential vault handler: no Live")
	}
	if cfg.HostAllowed == nil {
		return nil, errors.New("credential vault handler: no HostAllowed policy check")
	}
	for _, p := range cfg.PlainPeers {
		if !p.IsValid() {
			return nil, fmt.Errorf("credential vault handler: invalid plain-HTTP peer prefix %v", p)
		}
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.routes("")
	h.routes(egress.ProxyPrefix)
	return h, nil
}

// routes lists the vault's API under prefix.
func (h *Handler) routes(prefix string) {
	p := prefix + "/credential-vault"
	h.mux.Handle("POST "+p, h.write(h.create))
	h.mux.Handle("GET "+p, h.read(h.get))
	h.mux.Handle("PATCH "+p, h.write(h.patch))
	h.mux.Handle("DELETE "+p, h.write(h.delete))
	h.mux.Handle("GET "+p+"/credentials", h.read(h.listCredentials))
	h.mux.Handle("GET "+p+"/credentials/{name}", h.read(h.getCredential))
	h.mux.Handle("GET "+p+"/bindings", h.read(h.listBindings))
	h.mux.Handle("GET "+p+"/bindings/{name}", h.read(h.getBinding))
	h.mux.HandleFunc(p+"/_active", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "forbidden: the active vault is served only to the intercepting proxy", http.StatusForbidden)
	})
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

var errNoVault = &httpError{http.StatusNotFound, "no credential vault"}

// read checks the token, then runs fn and answers its error.
func (h *Handler) read(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(r) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.answer(w, r, fn(w, r))
	})
}

// write checks the token, the preconditions and the transport, then runs
// fn and answers its error.
func (h *Handler) write(fn func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(r) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if err := h.precondition(); err != nil {
			h.answer(w, r, err)
			return
		}
		if !egress.ClearTextOK(r, h.cfg.PlainPeers) {
			w.Header().Set("Upgrade", "TLS/1.2, HTTP/1.1")
			http.Error(w, "credential vault writes need TLS, or a loopback peer", http.StatusUpgradeRequired)
			return
		}
		h.answer(w, r, fn(w, r))
	})
}

// authorized checks the token as the rest of the egress API does.
func (h *Handler) authorized(r *http.Request) bool { return egress.Authorized(r, h.cfg.Token) }

// precondition reports why the vault cannot be written (412).
func (h *Handler) precondition() error {
	switch {
	case !h.cfg.Enabled:
		return &httpError{http.StatusPreconditionFailed, "the credential proxy is not enabled for this sandbox"}
	case h.cfg.Token == "":
		return &httpError{http.StatusPreconditionFailed, "the credential vault needs the egress API's auth token, and none is configured"}
	}
	if h.cfg.Ready != nil {
		if err := h.cfg.Ready(); err != nil {
			return &httpError{http.StatusPreconditionFailed, "the credential proxy is not ready: " + err.Error()}
		}
	}
	return nil
}

// answer writes err: an httpError its status, egress.ErrInvalid 400,
// ErrConflict 409, anything else 500 (logged, and not shown).
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	switch {
	case err == nil:
	case errors.As(err, &he):
		http.Error(w, he.msg, he.status)
	case errors.Is(err, ErrConflict):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, egress.ErrInvalid):
		http.Error(w, err.Error(), http.StatusBadRequest)
	default:
		h.log.Error("credential vault API", "method", r.Method, "path", r.URL.Path, "err", err)
		http.Error(w, "internal error; see the sidecar's log", http.StatusInternalServerError)
	}
}

// readBody reads a body of at most egress.MaxBodyBytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, egress.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", egress.MaxBodyBytes)}
	} else if err != nil {
		return nil, &httpError{http.StatusBadRequest, "read request body: " + err.Error()}
	}
	return data, nil
}

func (h *Handler) options() Options {
	return Options{AllowHTTP: h.cfg.AllowHTTP, HostAllowed: h.cfg.HostAllowed}
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) error {
	data, err := readBody(w, r)
	if err != nil {
		return err
	}
	req, err := ParseCreate(data)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfg.Live.Load() != nil {
		return &httpError{http.StatusConflict, "a credential vault already exists; PATCH it, or DELETE it first"}
	}
	v, err := Create(req, h.options())
	if err != nil {
		return err
	}
	if err := h.changeLocked(r, "created", v); err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, v.State())
}

func (h *Handler) patch(w http.ResponseWriter, r *http.Request) error {
	data, err := readBody(w, r)
	if err != nil {
		return err
	}
	req, err := ParseMutation(data)
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := h.cfg.Live.Load()
	if cur == nil {
		return errNoVault
	}
	v, err := cur.Mutate(req, h.options())
	if err != nil {
		return err
	}
	if err := h.changeLocked(r, "changed", v); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, v.State())
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cfg.Live.Load() == nil {
		return errNoVault
	}
	if err := h.changeLocked(r, "deleted", nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// changeLocked puts v in force (nil: no vault): persisted, swapped,
// announced. A failure to persist changes nothing.
func (h *Handler) changeLocked(r *http.Request, what string, v *Vault) error {
	if h.cfg.Store != nil {
		if err := h.cfg.Store.Save(v); err != nil {
			return fmt.Errorf("persist credential vault: %w", err)
		}
	}
	h.cfg.Live.Store(v)
	if h.cfg.OnChange != nil {
		h.cfg.OnChange(v)
	}
	if v == nil {
		h.log.Info("credential vault "+what, "method", r.Method)
	} else {
		h.log.Info("credential vault "+what, "method", r.Method, "revision", v.Revision(), "credentials", len(v.creds), "bindings", len(v.bindings))
	}
	return nil
}

// current returns the vault in force, or errNoVault.
func (h *Handler) current() (*Vault, error) {
	v := h.cfg.Live.Load()
	if v == nil {
		return nil, errNoVault
	}
	return v, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) error {
	v, err := h.current()
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, v.State())
}

func (h *Handler) listCredentials(w http.ResponseWriter, r *http.Request) error {
	v, err := h.current()
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.CredentialListResponse{Revision: v.Revision(), Credentials: v.Credentials()})
}

func (h *Handler) getCredential(w http.ResponseWriter, r *http.Request) error {
	v, err := h.current()
	if err != nil {
		return err
	}
	c, ok := v.Credential(r.PathValue("name"))
	if !ok {
		return &httpError{http.StatusNotFound, fmt.Sprintf("no credential %q", r.PathValue("name"))}
	}
	return writeJSON(w, http.StatusOK, c)
}

func (h *Handler) listBindings(w http.ResponseWriter, r *http.Request) error {
	v, err := h.current()
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.CredentialBindingListResponse{Revision: v.Revision(), Bindings: v.Bindings()})
}

func (h *Handler) getBinding(w http.ResponseWriter, r *http.Request) error {
	v, err := h.current()
	if err != nil {
		return err
	}
	b, ok := v.Binding(r.PathValue("name"))
	if !ok {
		return &httpError{http.StatusNotFound, fmt.Sprintf("no binding %q", r.PathValue("name"))}
	}
	return writeJSON(w, http.StatusOK, b)
}

// writeJSON marshals v before writing anything, so an encoding error
// still becomes a clean 500.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n')) // an error means the client left: no one to tell
	return nil
}
