package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/opensandbox/opensandbox/api"
)

// Error kinds of the credential vault. A vault call's error answer
// matches (errors.Is) one of these when its status says so, besides the
// general kind of its status (ErrNotFound, ErrConflict, ErrInvalid) and
// the *APIError it came from.
var (
	// ErrNoVault: the sandbox has no credential vault (404 on the vault,
	// its lists, a patch or a delete).
	ErrNoVault = errors.New("the sandbox has no credential vault")
	// ErrNoVaultEntry: no credential or binding of that name (404 on
	// Vault.Credential or Vault.Binding; the egress API answers the same
	// when there is no vault at all, which Vault.Get tells apart).
	ErrNoVaultEntry = errors.New("no such credential or binding in the vault")
	// ErrVaultExists: Vault.Create on a sandbox that already has a vault
	// (409); change it with Vault.Patch, or Vault.Delete it first.
	ErrVaultExists = errors.New("the sandbox already has a credential vault")
	// ErrRevisionConflict: a patch's ExpectedRevision is not the vault's
	// revision (409): someone changed it since it was read.
	ErrRevisionConflict = errors.New("the credential vault changed since the expected revision")
	// ErrNoCredentialProxy: the sandbox's credential proxy is off (it
	// was created without CredentialProxy) or not ready yet (412).
	ErrNoCredentialProxy = errors.New("the sandbox's credential proxy is not enabled or not ready")
	// ErrVaultNeedsTLS: the egress API takes vault writes only over TLS
	// or from a peer it trusts (426).
	ErrVaultNeedsTLS = errors.New("the credential vault takes writes only over TLS")
)

// Vault is the credential vault of a sandbox's egress API (port
// PortEgress, reached like EgressPolicy): named secrets and the bindings
// that say which outbound requests the sandbox's credential proxy puts
// them into, so that the secrets never enter the sandbox.
//
// Values are write-only: Create and Patch send them, and no answer holds
// them. The SDK never logs or formats a request body, so a value appears
// in no error either. Only a sandbox created with CredentialProxy (which
// needs a NetworkPolicy) has a usable vault; writes on others fail with
// ErrNoCredentialProxy, and every call on a sandbox without a policy
// fails with ErrNoEgress.
//
// Stability: the routes and shapes are those of the egress API's
// credential vault (egress.md §5); the error kinds may grow.
type Vault struct {
	s *Sandbox
}

// Vault returns the sandbox's credential vault. It makes no call.
func (s *Sandbox) Vault() *Vault { return &Vault{s: s} }

// vaultPath is the root of the vault's routes.
const vaultPath = "/credential-vault"

// Create creates the vault with its credentials and bindings; the vault
// starts at revision 1. Every binding's hosts must be allowed by the
// sandbox's egress policy through an explicit allow rule. A sandbox that
// has a vault already fails with ErrVaultExists. Create is not retried.
func (v *Vault) Create(ctx context.Context, req api.CredentialVaultCreateRequest) (api.CredentialVaultState, error) {
	var out api.CredentialVaultState
	err := v.s.egressDo(ctx, egressCall{
		op: "create credential vault of sandbox " + v.s.ID, method: http.MethodPost, path: vaultPath,
		body: req, vault: true, conflict: ErrVaultExists, notFound: ErrNoVault,
	}, &out)
	return out, err
}

// Get returns the vault's state: its revision, and the metadata of its
// credentials and bindings, sorted by name.
func (v *Vault) Get(ctx context.Context) (api.CredentialVaultState, error) {
	var out api.CredentialVaultState
	err := v.s.egressDo(ctx, egressCall{
		op: "get credential vault of sandbox " + v.s.ID, method: http.MethodGet, path: vaultPath,
		idempotent: true, vault: true, notFound: ErrNoVault,
	}, &out)
	return out, err
}

// Patch changes the vault atomically: per collection, deletes, then
// replacements, then additions, all or nothing. With ExpectedRevision
// set, a vault at another revision is left alone and the error matches
// ErrRevisionConflict. The vault's revision goes up by one. Patch is not
// retried.
func (v *Vault) Patch(ctx context.Context, req api.CredentialVaultMutationRequest) (api.CredentialVaultState, error) {
	var out api.CredentialVaultState
	err := v.s.egressDo(ctx, egressCall{
		op: "patch credential vault of sandbox " + v.s.ID, method: http.MethodPatch, path: vaultPath,
		body: req, vault: true, conflict: ErrRevisionConflict, notFound: ErrNoVault,
	}, &out)
	return out, err
}

// Delete deletes the vault: its credentials are forgotten and no request
// gets one any more. A sandbox without a vault fails with ErrNoVault.
func (v *Vault) Delete(ctx context.Context) error {
	return v.s.egressDo(ctx, egressCall{
		op: "delete credential vault of sandbox " + v.s.ID, method: http.MethodDelete, path: vaultPath,
		vault: true, notFound: ErrNoVault,
	}, nil)
}

// Credentials lists the vault's credentials, without their values.
func (v *Vault) Credentials(ctx context.Context) (api.CredentialListResponse, error) {
	var out api.CredentialListResponse
	err := v.s.egressDo(ctx, egressCall{
		op: "list credentials of sandbox " + v.s.ID, method: http.MethodGet, path: vaultPath + "/credentials",
		idempotent: true, vault: true, notFound: ErrNoVault,
	}, &out)
	return out, err
}

// Credential describes the credential name, without its value. No such
// credential (or no vault) fails with ErrNoVaultEntry.
func (v *Vault) Credential(ctx context.Context, name string) (api.CredentialMetadata, error) {
	var out api.CredentialMetadata
	op := fmt.Sprintf("get credential %q of sandbox %s", name, v.s.ID)
	if err := checkVaultName(op, name); err != nil {
		return out, err
	}
	err := v.s.egressDo(ctx, egressCall{
		op: op, method: http.MethodGet, path: vaultPath + "/credentials/" + url.PathEscape(name),
		idempotent: true, vault: true, notFound: ErrNoVaultEntry,
	}, &out)
	return out, err
}

// Bindings lists the vault's bindings, their match rules with every
// default filled in.
func (v *Vault) Bindings(ctx context.Context) (api.CredentialBindingListResponse, error) {
	var out api.CredentialBindingListResponse
	err := v.s.egressDo(ctx, egressCall{
		op: "list credential bindings of sandbox " + v.s.ID, method: http.MethodGet, path: vaultPath + "/bindings",
		idempotent: true, vault: true, notFound: ErrNoVault,
	}, &out)
	return out, err
}

// Binding describes the binding name. No such binding (or no vault)
// fails with ErrNoVaultEntry.
func (v *Vault) Binding(ctx context.Context, name string) (api.CredentialBindingMetadata, error) {
	var out api.CredentialBindingMetadata
	op := fmt.Sprintf("get credential binding %q of sandbox %s", name, v.s.ID)
	if err := checkVaultName(op, name); err != nil {
		return out, err
	}
	err := v.s.egressDo(ctx, egressCall{
		op: op, method: http.MethodGet, path: vaultPath + "/bindings/" + url.PathEscape(name),
		idempotent: true, vault: true, notFound: ErrNoVaultEntry,
	}, &out)
	return out, err
}

// checkVaultName refuses a name that cannot be a path segment of the
// vault's routes.
func checkVaultName(op, name string) error {
	if strings.TrimSpace(name) == "" {
		return fmt.Errorf("%s: %w: empty name", op, ErrInvalid)
	}
	return nil
}

// vaultKind is the vault error kind of an error answer, given what a 404
// and a 409 mean for the call; nil when the status has none.
func vaultKind(status int, notFound, conflict error) error {
	switch status {
	case http.StatusNotFound:
		return notFound
	case http.StatusConflict:
		return conflict
	case http.StatusPreconditionFailed:
		return ErrNoCredentialProxy
	case http.StatusUpgradeRequired:
		return ErrVaultNeedsTLS
	}
	return nil
}

// vaultError is an error answer of a vault route with its vault kind. It
// matches the kind and is the *APIError it came from. Its text is the
// answer's: the egress API never puts a value in an error.
type vaultError struct {
	kind error
	ae   *APIError
}

func (e *vaultError) Error() string {
	return fmt.Sprintf("%s: %v: %s (HTTP %d)", e.ae.Op, e.kind, cmpStr(e.ae.Message, http.StatusText(e.ae.StatusCode)), e.ae.StatusCode)
}

func (e *vaultError) Unwrap() []error { return []error{e.kind, e.ae} }
