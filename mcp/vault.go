package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// VaultCredential is a secret of the operator's that vault_attach may
// put into a sandbox's credential vault. Its value leaves osb mcp only
// in that write to the sandbox's egress API: no tool returns it, and it
// formats, logs and marshals as "[redacted]" with its hosts.
type VaultCredential struct {
	// Value is the secret.
	Value string
	// Hosts limits the hosts a binding of it may match: names
	// (api.github.com) and wildcards (*.github.com, subdomains only). Empty
	// allows every host the sandbox's egress policy allows, which an agent
	// with egress_allow can widen: then it can send the secret anywhere.
	Hosts []string
}

// String hides the value.
func (c VaultCredential) String() string {
	if len(c.Hosts) == 0 {
		return "[redacted]"
	}
	return "[redacted] for " + strings.Join(c.Hosts, ",")
}

// GoString hides the value from %#v.
func (c VaultCredential) GoString() string { return "mcp.VaultCredential{" + c.String() + "}" }

// LogValue hides the value from log/slog.
func (c VaultCredential) LogValue() slog.Value { return slog.StringValue(c.String()) }

// MarshalJSON writes the hosts only.
func (c VaultCredential) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Value string   `json:"value"`
		Hosts []string `json:"hosts,omitempty"`
	}{"[redacted]", c.Hosts})
}

// Bounds of a binding's lists given by the model.
const maxBindingItems = 20

// VaultBinding is a binding of a sandbox's credential vault: which
// requests carry a credential, and how.
type VaultBinding struct {
	Name     string   `json:"name"`
	Hosts    []string `json:"hosts"`
	Methods  []string `json:"methods" jsonschema:"HTTP methods of the requests it matches"`
	Paths    []string `json:"paths" jsonschema:"URL paths it matches: exact (/v1/user) or prefixes (/v1/*)"`
	AuthType string   `json:"auth_type" jsonschema:"how the credential is sent: bearer, basic, apiKey or customHeaders"`
	Header   string   `json:"header,omitempty" jsonschema:"the header of an apiKey binding"`
}

// VaultOutput is a sandbox's credential vault as the tools show it:
// names, never values.
type VaultOutput struct {
	SandboxID   string         `json:"sandbox_id"`
	Exists      bool           `json:"exists" jsonschema:"whether the sandbox has a credential vault yet; vault_attach creates it"`
	Revision    int64          `json:"revision,omitempty"`
	Credentials []string       `json:"credentials" jsonschema:"names of the credentials in the vault; their values are never shown to you"`
	Bindings    []VaultBinding `json:"bindings"`
	Available   []string       `json:"available_credentials" jsonschema:"names of the operator's credentials that vault_attach can attach"`
	Note        string         `json:"note,omitempty"`
}

type attachInput struct {
	SandboxArg
	Credential string   `json:"credential" jsonschema:"name of one of the operator's credentials, as vault_get lists in available_credentials"`
	Binding    string   `json:"binding,omitempty" jsonschema:"name of the binding, to detach it later; default: the credential's name. An existing binding of this name is replaced"`
	Hosts      []string `json:"hosts" jsonschema:"hosts whose HTTPS requests get the credential: names (api.github.com) or wildcards (*.github.com: subdomains only); each must be allowed by the sandbox's egress policy"`
	Paths      []string `json:"paths,omitempty" jsonschema:"URL paths that get it: exact (/v1/user) or prefixes (/v1/*); default every path"`
	Methods    []string `json:"methods,omitempty" jsonschema:"HTTP methods that get it, such as GET; default GET, POST, PUT, PATCH, DELETE"`
	AuthType   string   `json:"auth_type" jsonschema:"how requests carry it: bearer (Authorization: Bearer), basic (Authorization: Basic, the credential being base64 user:password) or apiKey (a header of its own, named by header)"`
	Header     string   `json:"header,omitempty" jsonschema:"the header of auth_type apiKey, such as X-Api-Key"`
}

func (in attachInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if strings.TrimSpace(in.Credential) == "" {
		return argErrorf("credential is empty: name one of the operator's credentials (vault_get lists them)")
	}
	switch {
	case len(in.Hosts) == 0:
		return argErrorf("hosts is empty: name the hosts whose requests get the credential")
	case len(in.Hosts) > maxBindingItems || len(in.Paths) > maxBindingItems || len(in.Methods) > maxBindingItems:
		return argErrorf("give at most %d hosts, paths and methods", maxBindingItems)
	}
	for _, h := range in.Hosts {
		h = strings.TrimSpace(h)
		if h == "" || !strings.Contains(h, ".") || strings.ContainsAny(h, "/: \t\n@") {
			return argErrorf("host %q is not a host name or wildcard (no scheme, port or path: api.github.com, *.github.com)", h)
		}
	}
	for _, p := range in.Paths {
		if !strings.HasPrefix(strings.TrimSpace(p), "/") {
			return argErrorf("path %q must start with / (such as /v1/* or /user)", p)
		}
	}
	switch in.AuthType {
	case "apiKey":
		if strings.TrimSpace(in.Header) == "" {
			return argErrorf("auth_type apiKey needs header, the header that carries the credential (such as X-Api-Key)")
		}
	case "bearer", "basic":
		if in.Header != "" {
			return argErrorf("header goes with auth_type apiKey only; %s uses Authorization", in.AuthType)
		}
	default:
		return argErrorf("auth_type %q: want bearer, basic or apiKey", in.AuthType)
	}
	return nil
}

type detachInput struct {
	SandboxArg
	Binding    string `json:"binding" jsonschema:"name of the binding to remove, as vault_get lists"`
	Credential string `json:"credential,omitempty" jsonschema:"the operator's credential the binding used, to remove it too when no other binding uses it; default: the one vault_attach attached"`
}

func (in detachInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if strings.TrimSpace(in.Binding) == "" {
		return argErrorf("binding is empty: name the binding to remove (vault_get lists them)")
	}
	return nil
}

// vaultHint tells the model, in each vault tool, what it never sees.
const vaultHint = "The credential's value is never shown to you, in any result."

func (s *Server) addVaultTools() {
	add(s, &gomcp.Tool{
		Name: "vault_get",
		Description: `Show a sandbox's credential vault: the credentials (names only) whose values its outbound HTTPS requests carry, and the bindings that say which requests (hosts, paths, methods) carry which, and how.
Also lists available_credentials: the operator's credentials you can attach with vault_attach. ` + vaultHint,
		Annotations: &gomcp.ToolAnnotations{Title: "Get credential vault", ReadOnlyHint: true},
	}, func(ctx context.Context, in SandboxArg) (*gomcp.CallToolResult, VaultOutput, error) {
		st, err := s.client.Sandbox(in.SandboxID).Vault().Get(ctx)
		if errors.Is(err, sdk.ErrNoVault) {
			return s.vaultResult(in.SandboxID, nil, "the sandbox has no credential vault yet; vault_attach creates it")
		} else if err != nil {
			return nil, VaultOutput{}, err
		}
		return s.vaultResult(in.SandboxID, &st, "")
	})

	add(s, &gomcp.Tool{
		Name: "vault_attach",
		Description: `Make a sandbox's HTTPS requests to some hosts carry one of the operator's credentials (an API token, a password), by name: the sandbox's credential proxy adds it to each matching request on its way out, so neither you nor the code in the sandbox ever sees it. ` + vaultHint + `
Use it instead of asking for a secret: code in the sandbox calls the API without credentials and the request arrives authenticated.
Needs a sandbox created with allowed_hosts and credential_proxy: true, and hosts its egress policy allows. Creates the vault, or changes it; a binding of the same name is replaced. Returns the vault.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Attach credential", DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(true)},
	}, s.vaultAttach, enum("auth_type", "bearer", "basic", "apiKey"))

	add(s, &gomcp.Tool{
		Name:        "vault_detach",
		Description: `Stop a sandbox's requests carrying a credential: removes a binding from its credential vault and, when no other binding uses it, the operator's credential it used. ` + vaultHint + ` Returns the vault.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Detach credential", DestructiveHint: ptr(true), IdempotentHint: false},
	}, s.vaultDetach)
}

// vaultTries bounds the attempts of a change that meets another change
// of the same vault.
const vaultTries = 3

// vaultAttach creates the vault with the credential and binding, or
// patches it at the revision it read: the operator's credential is set
// (added, or replaced with the operator's value) and the binding added
// or replaced.
func (s *Server) vaultAttach(ctx context.Context, in attachInput) (*gomcp.CallToolResult, VaultOutput, error) {
	name := strings.TrimSpace(in.Credential)
	vc, err := s.operatorCredential(name)
	if err != nil {
		return nil, VaultOutput{}, err
	}
	b := api.CredentialBinding{
		Name:  cmpOr(strings.TrimSpace(in.Binding), name),
		Match: api.CredentialMatch{Hosts: lowerAll(in.Hosts), Paths: trimList(in.Paths), Methods: upperAll(in.Methods)},
		Auth:  api.CredentialAuth{Type: in.AuthType, Credential: name, Name: strings.TrimSpace(in.Header)},
	}
	for _, h := range b.Match.Hosts {
		if len(vc.Hosts) > 0 && !hostCovered(h, vc.Hosts) {
			return nil, VaultOutput{}, argErrorf("the operator allows credential %s only for %s, not for %s", name, strings.Join(vc.Hosts, ", "), h)
		}
	}
	cred := api.Credential{Name: name, Source: api.CredentialSource{Type: "inline", Value: vc.Value}}
	v := s.client.Sandbox(in.SandboxID).Vault()
	for range vaultTries {
		st, err := v.Get(ctx)
		switch {
		case errors.Is(err, sdk.ErrNoVault):
			st, err = v.Create(ctx, api.CredentialVaultCreateRequest{Credentials: []api.Credential{cred}, Bindings: []api.CredentialBinding{b}})
			if errors.Is(err, sdk.ErrVaultExists) {
				continue // made meanwhile: patch it
			}
		case err != nil:
			return nil, VaultOutput{}, err
		default:
			m := api.CredentialVaultMutationRequest{ExpectedRevision: &st.Revision,
				Credentials: &api.CredentialMutation{}, Bindings: &api.BindingMutation{}}
			if hasCredential(st, name) {
				m.Credentials.Replace = []api.Credential{cred}
			} else {
				m.Credentials.Add = []api.Credential{cred}
			}
			if hasBinding(st, b.Name) {
				m.Bindings.Replace = []api.CredentialBinding{b}
			} else {
				m.Bindings.Add = []api.CredentialBinding{b}
			}
			st, err = v.Patch(ctx, m)
			if errors.Is(err, sdk.ErrRevisionConflict) {
				continue // changed meanwhile: read it again
			}
		}
		if errors.Is(err, sdk.ErrInvalid) && !errors.Is(err, sdk.ErrNoCredentialProxy) && !errors.Is(err, sdk.ErrVaultNeedsTLS) {
			return nil, VaultOutput{}, withHint(err, "Every host must be allowed by an allow rule of the sandbox's egress policy naming it (egress_get shows the policy, egress_allow adds a rule).")
		}
		if err != nil {
			return nil, VaultOutput{}, err
		}
		s.remember(in.SandboxID, b.Name, name)
		note := fmt.Sprintf("requests to %s now carry credential %s (%s)", strings.Join(b.Match.Hosts, ", "), name, in.AuthType)
		return s.vaultResult(in.SandboxID, &st, note)
	}
	return nil, VaultOutput{}, fmt.Errorf("the credential vault of sandbox %s kept changing while attaching %s; try again", in.SandboxID, name)
}

// vaultDetach removes a binding and, in the same change, the operator's
// credential it used. The egress API refuses to delete a credential
// another binding uses: the binding alone is removed then.
func (s *Server) vaultDetach(ctx context.Context, in detachInput) (*gomcp.CallToolResult, VaultOutput, error) {
	binding := strings.TrimSpace(in.Binding)
	cred := cmpOr(strings.TrimSpace(in.Credential), s.remembered(in.SandboxID, binding))
	if cred != "" {
		if _, err := s.operatorCredential(cred); err != nil {
			return nil, VaultOutput{}, err
		}
	}
	v := s.client.Sandbox(in.SandboxID).Vault()
	for range vaultTries {
		st, err := v.Get(ctx)
		if err != nil {
			return nil, VaultOutput{}, err
		}
		if !hasBinding(st, binding) {
			names := make([]string, len(st.Bindings))
			for i, b := range st.Bindings {
				names[i] = b.Name
			}
			return nil, VaultOutput{}, argErrorf("sandbox %s's vault has no binding %q; its bindings: %s", in.SandboxID, binding, listOrNone(names))
		}
		m := api.CredentialVaultMutationRequest{ExpectedRevision: &st.Revision, Bindings: &api.BindingMutation{Delete: []string{binding}}}
		withCred := cred != "" && hasCredential(st, cred)
		if withCred {
			m.Credentials = &api.CredentialMutation{Delete: []string{cred}}
		}
		note := "removed binding " + binding
		after, err := v.Patch(ctx, m)
		if withCred && err == nil {
			note += " and credential " + cred
		}
		if withCred && errors.Is(err, sdk.ErrInvalid) {
			m.Credentials = nil
			after, err = v.Patch(ctx, m)
			note += "; credential " + cred + " stays, another binding uses it"
		}
		if errors.Is(err, sdk.ErrRevisionConflict) {
			continue
		}
		if err != nil {
			return nil, VaultOutput{}, err
		}
		s.forget(in.SandboxID, binding)
		return s.vaultResult(in.SandboxID, &after, note)
	}
	return nil, VaultOutput{}, fmt.Errorf("the credential vault of sandbox %s kept changing while detaching %s; try again", in.SandboxID, binding)
}

// operatorCredential returns the operator's credential name, or an
// error listing the names there are.
func (s *Server) operatorCredential(name string) (VaultCredential, error) {
	if vc, ok := s.cfg.VaultCredentials[name]; ok {
		return vc, nil
	}
	if len(s.cfg.VaultCredentials) == 0 {
		return VaultCredential{}, argErrorf("no credential %q: osb mcp was started without credentials to attach (a person gives them with osb mcp --vault-credential NAME=env:VAR)", name)
	}
	return VaultCredential{}, argErrorf("no credential %q: the operator's credentials are %s", name, strings.Join(s.credentialNames(), ", "))
}

// credentialNames are the operator's credential names, sorted.
func (s *Server) credentialNames() []string {
	names := make([]string, 0, len(s.cfg.VaultCredentials))
	for n := range s.cfg.VaultCredentials {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// remember notes which credential vault_attach bound to a binding, so
// that vault_detach can remove it with the binding.
func (s *Server) remember(sandboxID, binding, cred string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.attached == nil {
		s.attached = map[[2]string]string{}
	}
	s.attached[[2]string{sandboxID, binding}] = cred
}

func (s *Server) remembered(sandboxID, binding string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attached[[2]string{sandboxID, binding}]
}

func (s *Server) forget(sandboxID, binding string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.attached, [2]string{sandboxID, binding})
}

// vaultResult describes st (nil: no vault).
func (s *Server) vaultResult(id string, st *api.CredentialVaultState, note string) (*gomcp.CallToolResult, VaultOutput, error) {
	out := VaultOutput{SandboxID: id, Credentials: []string{}, Bindings: []VaultBinding{}, Available: s.credentialNames(), Note: note}
	if st != nil {
		out.Exists, out.Revision = true, st.Revision
		for _, c := range st.Credentials {
			out.Credentials = append(out.Credentials, c.Name)
		}
		for _, b := range st.Bindings {
			out.Bindings = append(out.Bindings, VaultBinding{Name: b.Name, Hosts: nonNil(b.Match.Hosts), Methods: nonNil(b.Match.Methods),
				Paths: nonNil(b.Match.Paths), AuthType: b.Auth.Type, Header: b.Auth.Name})
		}
	}
	return text(vaultText(out)), out, nil
}

// vaultText is the vault as the model reads it.
func vaultText(o VaultOutput) string {
	var b strings.Builder
	if o.Note != "" {
		fmt.Fprintf(&b, "%s\n", o.Note)
	}
	if o.Exists {
		fmt.Fprintf(&b, "sandbox %s credential vault, revision %d\n", o.SandboxID, o.Revision)
		fmt.Fprintf(&b, "credentials (values never shown): %s\n", listOrNone(o.Credentials))
		if len(o.Bindings) == 0 {
			b.WriteString("no bindings: no request carries a credential\n")
		}
		for _, bd := range o.Bindings {
			auth := bd.AuthType
			if bd.Header != "" {
				auth += " header " + bd.Header
			}
			fmt.Fprintf(&b, "binding %s: %s %s %s, as %s\n", bd.Name, strings.Join(bd.Methods, ","), strings.Join(bd.Hosts, ","), strings.Join(bd.Paths, ","), auth)
		}
	}
	fmt.Fprintf(&b, "operator's credentials you can attach with vault_attach: %s\n", listOrNone(o.Available))
	return b.String()
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func hasCredential(st api.CredentialVaultState, name string) bool {
	return slices.ContainsFunc(st.Credentials, func(c api.CredentialMetadata) bool { return c.Name == name })
}

func hasBinding(st api.CredentialVaultState, name string) bool {
	return slices.ContainsFunc(st.Bindings, func(b api.CredentialBindingMetadata) bool { return b.Name == name })
}

// hostCovered reports whether a binding host is one the operator allows
// for a credential: equal to a pattern, or under a wildcard pattern
// (*.github.com covers api.github.com and *.api.github.com, and
// *.github.com itself, not github.com).
func hostCovered(host string, patterns []string) bool {
	host = strings.ToLower(host)
	for _, p := range patterns {
		p = strings.ToLower(strings.TrimSpace(p))
		if host == p {
			return true
		}
		if suffix, ok := strings.CutPrefix(p, "*."); ok && strings.HasSuffix(strings.TrimPrefix(host, "*."), "."+suffix) {
			return true
		}
	}
	return false
}

func lowerAll(s []string) []string {
	out := trimList(s)
	for i := range out {
		out[i] = strings.ToLower(out[i])
	}
	return out
}

func upperAll(s []string) []string {
	out := trimList(s)
	for i := range out {
		out[i] = strings.ToUpper(out[i])
	}
	return out
}

// trimList trims each item; nil stays nil, so that the egress API's
// defaults apply.
func trimList(s []string) []string {
	if s == nil {
		return nil
	}
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.TrimSpace(v)
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// explainVault explains the errors of the credential vault; "" for
// others.
func explainVault(err error, sandboxID string) string {
	switch {
	case errors.Is(err, sdk.ErrNoCredentialProxy):
		return fmt.Sprintf("sandbox %s has no credential proxy: it was created without credential_proxy, or it is still starting. To use credentials, create a new sandbox with sandbox_create, allowed_hosts and credential_proxy: true; if this one has just started, try again in a few seconds. (%v)", sandboxID, err)
	case errors.Is(err, sdk.ErrNoVault):
		return fmt.Sprintf("sandbox %s has no credential vault: no credential is attached. vault_attach creates it. (%v)", sandboxID, err)
	case errors.Is(err, sdk.ErrVaultNeedsTLS):
		return fmt.Sprintf("the egress API of sandbox %s takes credentials only over TLS, and osb mcp reaches it over plain HTTP; a person must configure osb mcp with protocol https. Retrying will not help. (%v)", sandboxID, err)
	}
	return ""
}
