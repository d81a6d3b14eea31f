// Package vault is the credential vault of a sandbox's egress sidecar
// (egress.md §5): named secrets, and bindings that say which outbound
// requests get which secret, injected as headers by the intercepting
// proxy so the secrets never enter the sandbox.
//
// A Vault is an immutable value: Create makes the first one, Mutate the
// next, and Live holds the one in force. A Vault is the egress.Binder the
// intercepting proxy asks. Seal and Open encrypt a vault at rest;
// FileStore keeps it in a file. Handler serves the vault's HTTP routes,
// which egress.Handler mounts.
//
// cmd/osb-egress and the intercepting proxy import it; it imports only
// egress and api.
package vault

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/egress"
)

// SourceInline is the only credential source type: the value is in the
// request.
const SourceInline = "inline"

// Limits on a vault's size, so that validation (which compares every
// pair of bindings) stays fast. A vault over them is invalid.
const (
	MaxCredentials = 256
	MaxBindings    = 256
	// MaxListItems caps each list of a binding: hosts, schemes, ports,
	// methods, paths and custom headers.
	MaxListItems = 32
	// MaxNameBytes caps credential, binding and header names.
	MaxNameBytes = 256
)

// ErrConflict is returned by Mutate when the request's expectedRevision
// is not the vault's revision; the API answers 409.
var ErrConflict = errors.New("credential vault revision conflict")

// invalidError is a request the vault refuses. Its text names the field;
// it wraps egress.ErrInvalid, which the API answers with 400. It never
// holds a credential's value.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }
func (e *invalidError) Unwrap() error { return egress.ErrInvalid }

// invalid returns an error wrapping egress.ErrInvalid.
func invalid(format string, args ...any) error {
	return &invalidError{fmt.Sprintf(format, args...)}
}

// Options are what a change to the vault is checked against, besides
// the request itself.
type Options struct {
	// AllowHTTP lets bindings match plain-HTTP requests (scheme "http");
	// the operator enables it. Without it a binding with scheme "http" is
	// invalid.
	AllowHTTP bool
	// HostAllowed reports why a binding may not name a host (an exact
	// name or "*.suffix"), nil when it may: the egress policy's check,
	// (*egress.Matcher).BindingHostAllowed of the policy in force. Nil
	// skips the check.
	HostAllowed func(host string) error
}

// credential is one secret of a vault.
type credential struct {
	value      string
	sourceType string
	revision   int64 // the vault revision that added or last replaced it
}

// Vault is one revision of a credential vault: its credentials, and its
// bindings compiled for matching. It never changes after it is made and
// is safe for concurrent use. A nil *Vault is an egress.Binder that binds
// nothing (Intercepts, HostBound, Bind, Secrets and CheckHosts accept
// it); its other methods need a vault.
type Vault struct {
	revision int64
	creds    map[string]credential
	// bindings are sorted by name.
	bindings []*binding
	byName   map[string]*binding
	// exact and wild index the bindings by host: an exact host, and the
	// suffix of a wildcard host.
	exact, wild map[string][]*binding
	secrets     []string
}

var _ egress.Binder = (*Vault)(nil)

// Create makes the first revision (1) of a vault from a create request,
// checked against opt. Errors wrap egress.ErrInvalid and name the field.
func Create(req api.CredentialVaultCreateRequest, opt Options) (*Vault, error) {
	if req.Credentials == nil {
		return nil, invalid("credentials: required (send [] for none)")
	}
	if req.Bindings == nil {
		return nil, invalid("bindings: required (send [] for none)")
	}
	const rev = 1
	creds := make(map[string]credential, len(req.Credentials))
	for i, c := range req.Credentials {
		where := fmt.Sprintf("credentials[%d]", i)
		nc, err := newCredential(where, c, rev)
		if err != nil {
			return nil, err
		}
		if _, dup := creds[c.Name]; dup {
			return nil, invalid("%s.name: %q appears more than once", where, c.Name)
		}
		creds[c.Name] = nc
	}
	specs := make(map[string]api.CredentialBinding, len(req.Bindings))
	for i, b := range req.Bindings {
		where := fmt.Sprintf("bindings[%d]", i)
		nb, err := normaliseBinding(where, b, opt)
		if err != nil {
			return nil, err
		}
		if _, dup := specs[nb.Name]; dup {
			return nil, invalid("%s.name: %q appears more than once", where, nb.Name)
		}
		specs[nb.Name] = nb
	}
	return build(rev, creds, specs)
}

// Mutate returns the next revision of v with the mutation applied, or v's
// errors: ErrConflict when expectedRevision is set and is not v's
// revision; an error wrapping egress.ErrInvalid for an invalid request.
// Per collection, deletes apply first, then replacements, then
// additions; a name may appear in one operation only, a replaced or
// deleted name must exist, an added one must not. The mutation applies
// whole or not at all. Added and replaced bindings are checked against
// opt; bindings left as they were are not checked again.
func (v *Vault) Mutate(req api.CredentialVaultMutationRequest, opt Options) (*Vault, error) {
	if v == nil {
		return nil, errors.New("mutate a credential vault: no vault")
	}
	if req.ExpectedRevision != nil && *req.ExpectedRevision != v.revision {
		return nil, fmt.Errorf("%w: expectedRevision is %d, the vault is at revision %d", ErrConflict, *req.ExpectedRevision, v.revision)
	}
	cm, bm := req.Credentials, req.Bindings
	if cm == nil {
		cm = &api.CredentialMutation{}
	}
	if bm == nil {
		bm = &api.BindingMutation{}
	}
	if len(cm.Add)+len(cm.Replace)+len(cm.Delete)+len(bm.Add)+len(bm.Replace)+len(bm.Delete) == 0 {
		return nil, invalid("the mutation has no operations: want credentials or bindings with add, replace or delete")
	}
	rev := v.revision + 1

	// Credentials.
	if err := checkOps("credentials", cm.Delete, names(cm.Replace, credName), names(cm.Add, credName), v.hasCredential); err != nil {
		return nil, err
	}
	creds := maps.Clone(v.creds)
	for _, name := range cm.Delete {
		delete(creds, name)
	}
	for i, c := range cm.Replace {
		nc, err := newCredential(fmt.Sprintf("credentials.replace[%d]", i), c, rev)
		if err != nil {
			return nil, err
		}
		creds[c.Name] = nc
	}
	for i, c := range cm.Add {
		nc, err := newCredential(fmt.Sprintf("credentials.add[%d]", i), c, rev)
		if err != nil {
			return nil, err
		}
		creds[c.Name] = nc
	}

	// Bindings.
	replace := make([]api.CredentialBinding, len(bm.Replace))
	for i, b := range bm.Replace {
		nb, err := normaliseBinding(fmt.Sprintf("bindings.replace[%d]", i), b, opt)
		if err != nil {
			return nil, err
		}
		replace[i] = nb
	}
	add := make([]api.CredentialBinding, len(bm.Add))
	for i, b := range bm.Add {
		nb, err := normaliseBinding(fmt.Sprintf("bindings.add[%d]", i), b, opt)
		if err != nil {
			return nil, err
		}
		add[i] = nb
	}
	if err := checkOps("bindings", bm.Delete, names(replace, bindingName), names(add, bindingName), v.hasBinding); err != nil {
		return nil, err
	}
	specs := make(map[string]api.CredentialBinding, len(v.bindings)+len(add))
	for _, b := range v.bindings {
		specs[b.name] = b.spec
	}
	for _, name := range bm.Delete {
		delete(specs, name)
	}
	for _, b := range replace {
		specs[b.Name] = b
	}
	for _, b := range add {
		specs[b.Name] = b
	}
	return build(rev, creds, specs)
}

func credName(c api.Credential) string           { return c.Name }
func bindingName(b api.CredentialBinding) string { return b.Name }

// names lists the names of items.
func names[T any](items []T, name func(T) string) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = name(it)
	}
	return out
}

// checkOps checks the names of one collection's operations: each in one
// operation once, deleted and replaced ones existing, added ones not.
func checkOps(collection string, del, repl, add []string, exists func(string) bool) error {
	seen := make(map[string]string, len(del)+len(repl)+len(add))
	for _, op := range []struct {
		name  string
		names []string
	}{{"delete", del}, {"replace", repl}, {"add", add}} {
		for i, n := range op.names {
			where := fmt.Sprintf("%s.%s[%d]", collection, op.name, i)
			if prev, ok := seen[n]; ok {
				return invalid("%s: %q is already in %s; a name may appear in one operation once", where, n, prev)
			}
			seen[n] = fmt.Sprintf("%s.%s", collection, op.name)
			switch {
			case op.name == "add" && exists(n):
				return invalid("%s: %q already exists (use replace)", where, n)
			case op.name != "add" && !exists(n):
				return invalid("%s: %q does not exist", where, n)
			}
		}
	}
	return nil
}

func (v *Vault) hasCredential(name string) bool { _, ok := v.creds[name]; return ok }
func (v *Vault) hasBinding(name string) bool    { _, ok := v.byName[name]; return ok }

// build compiles a vault from checked credentials and normalised
// bindings: every credential a binding names must exist, no two bindings
// may overlap, and the size limits hold.
func build(rev int64, creds map[string]credential, specs map[string]api.CredentialBinding) (*Vault, error) {
	if len(creds) > MaxCredentials {
		return nil, invalid("credentials: %d of them, the limit is %d", len(creds), MaxCredentials)
	}
	if len(specs) > MaxBindings {
		return nil, invalid("bindings: %d of them, the limit is %d", len(specs), MaxBindings)
	}
	v := &Vault{
		revision: rev,
		creds:    creds,
		byName:   make(map[string]*binding, len(specs)),
		exact:    make(map[string][]*binding),
		wild:     make(map[string][]*binding),
	}
	for _, name := range slices.Sorted(maps.Keys(specs)) {
		b, err := compile(specs[name], creds)
		if err != nil {
			return nil, err
		}
		v.bindings = append(v.bindings, b)
		v.byName[name] = b
		for _, h := range b.hosts {
			if h.wildcard {
				v.wild[h.name] = appendOnce(v.wild[h.name], b)
			} else {
				v.exact[h.name] = appendOnce(v.exact[h.name], b)
			}
		}
	}
	for i, a := range v.bindings {
		for _, b := range v.bindings[i+1:] {
			if w, ok := overlap(a, b); ok {
				return nil, invalid("bindings %q and %q overlap: both match %s", a.name, b.name, w)
			}
		}
	}
	seen := make(map[string]bool, len(creds))
	for _, name := range slices.Sorted(maps.Keys(creds)) {
		if val := creds[name].value; !seen[val] {
			seen[val] = true
			v.secrets = append(v.secrets, val)
		}
	}
	return v, nil
}

// appendOnce appends b unless it is the last element already (a binding
// listing the same host twice is normalised away, but keep the index
// clean regardless).
func appendOnce(list []*binding, b *binding) []*binding {
	if len(list) > 0 && list[len(list)-1] == b {
		return list
	}
	return append(list, b)
}

// Revision returns the vault's revision: 1 after create, one more per
// mutation.
func (v *Vault) Revision() int64 { return v.revision }

// Credentials returns the credentials' metadata, sorted by name.
func (v *Vault) Credentials() []api.CredentialMetadata {
	out := make([]api.CredentialMetadata, 0, len(v.creds))
	for name, c := range v.creds {
		out = append(out, api.CredentialMetadata{Name: name, SourceType: c.sourceType, Revision: c.revision})
	}
	slices.SortFunc(out, func(a, b api.CredentialMetadata) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Credential returns one credential's metadata.
func (v *Vault) Credential(name string) (api.CredentialMetadata, bool) {
	c, ok := v.creds[name]
	if !ok {
		return api.CredentialMetadata{}, false
	}
	return api.CredentialMetadata{Name: name, SourceType: c.sourceType, Revision: c.revision}, true
}

// Bindings returns the bindings' metadata, sorted by name: match with
// every default filled in, auth without credential names.
func (v *Vault) Bindings() []api.CredentialBindingMetadata {
	out := make([]api.CredentialBindingMetadata, len(v.bindings))
	for i, b := range v.bindings {
		out[i] = b.metadata(v.revision)
	}
	return out
}

// Binding returns one binding's metadata.
func (v *Vault) Binding(name string) (api.CredentialBindingMetadata, bool) {
	b, ok := v.byName[name]
	if !ok {
		return api.CredentialBindingMetadata{}, false
	}
	return b.metadata(v.revision), true
}

// State returns the vault as its API describes it (no values).
func (v *Vault) State() api.CredentialVaultState {
	return api.CredentialVaultState{Revision: v.revision, Credentials: v.Credentials(), Bindings: v.Bindings()}
}

// CheckHosts checks every binding's hosts with hostAllowed, as a change
// of the egress policy must (egress.HandlerConfig.CheckPolicy): an error
// wrapping egress.ErrInvalid names the first binding host it refuses.
func (v *Vault) CheckHosts(hostAllowed func(host string) error) error {
	if v == nil {
		return nil
	}
	for _, b := range v.bindings {
		for _, h := range b.spec.Match.Hosts {
			if err := hostAllowed(h); err != nil {
				return invalid("binding %q: match.hosts: %v", b.name, err)
			}
		}
	}
	return nil
}

// Live holds the vault in force. The zero Live holds none.
type Live struct {
	v atomic.Pointer[Vault]
}

// Load returns the vault in force, nil when there is none.
func (l *Live) Load() *Vault { return l.v.Load() }

// Store puts v in force; nil removes the vault.
func (l *Live) Store(v *Vault) { l.v.Store(v) }

// Binder returns the vault in force as an egress.Binder, or a nil
// interface when there is none.
func (l *Live) Binder() egress.Binder {
	if v := l.v.Load(); v != nil {
		return v
	}
	return nil
}
