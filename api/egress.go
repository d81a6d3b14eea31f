package api

// PolicyStatus answers the egress API's /policy routes. Every field is
// omitted when empty; Policy is set on GET only.
type PolicyStatus struct {
	Status string `json:"status,omitempty"`
	// Mode is "deny_all", "allow_all" or "enforcing".
	Mode string `json:"mode,omitempty"`
	// EnforcementMode is "strict", "dns+nft" or "dns".
	EnforcementMode string         `json:"enforcementMode,omitempty"`
	Reason          string         `json:"reason,omitempty"`
	Policy          *NetworkPolicy `json:"policy,omitempty"`
}

// The credential vault of the egress API (egress.md §5). Values of
// credentials are write-only: requests carry them, responses never do.

// Credential is a named secret, as a vault write sends it.
type Credential struct {
	Name   string           `json:"name"`
	Source CredentialSource `json:"source"`
}

// CredentialSource says where a credential's value comes from. Type
// "inline" (the only one, and the default when empty) carries Value.
type CredentialSource struct {
	Type  string `json:"type,omitempty"`
	Value string `json:"value"`
}

// String hides the value, so that a request printed with fmt (%v, %+v)
// shows no secret.
func (s CredentialSource) String() string {
	return "{" + s.Type + " [redacted]}"
}

// GoString hides the value from %#v as well.
func (s CredentialSource) GoString() string { return s.String() }

// CredentialBinding says which outbound requests get which credential.
type CredentialBinding struct {
	Name  string          `json:"name"`
	Match CredentialMatch `json:"match"`
	Auth  CredentialAuth  `json:"auth"`
}

// CredentialMatch selects requests. Empty lists take the contract's
// defaults: schemes ["https"], ports [443], methods GET POST PUT PATCH
// DELETE, paths ["/*"]. Hosts is required.
type CredentialMatch struct {
	Hosts   []string `json:"hosts"`
	Schemes []string `json:"schemes,omitempty"`
	Ports   []int    `json:"ports,omitempty"`
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
}

// CredentialAuth is how a binding's credential is put into a request:
// Type "bearer" or "basic" (Credential), "apiKey" (Name, Credential) or
// "customHeaders" (Headers). Credential fields name vault credentials.
type CredentialAuth struct {
	Type       string             `json:"type"`
	Credential string             `json:"credential,omitempty"`
	Name       string             `json:"name,omitempty"`
	Headers    []CredentialHeader `json:"headers,omitempty"`
}

// CredentialHeader is one header of a customHeaders binding.
type CredentialHeader struct {
	Name       string `json:"name"`
	Credential string `json:"credential"`
}

// CredentialVaultCreateRequest is the body of POST /credential-vault.
type CredentialVaultCreateRequest struct {
	Credentials []Credential        `json:"credentials"`
	Bindings    []CredentialBinding `json:"bindings"`
}

// CredentialVaultMutationRequest is the body of PATCH /credential-vault,
// applied atomically: per collection delete, then replace, then add.
type CredentialVaultMutationRequest struct {
	ExpectedRevision *int64              `json:"expectedRevision,omitempty"`
	Credentials      *CredentialMutation `json:"credentials,omitempty"`
	Bindings         *BindingMutation    `json:"bindings,omitempty"`
}

// CredentialMutation edits the vault's credentials.
type CredentialMutation struct {
	Add     []Credential `json:"add,omitempty"`
	Replace []Credential `json:"replace,omitempty"`
	Delete  []string     `json:"delete,omitempty"`
}

// BindingMutation edits the vault's bindings.
type BindingMutation struct {
	Add     []CredentialBinding `json:"add,omitempty"`
	Replace []CredentialBinding `json:"replace,omitempty"`
	Delete  []string            `json:"delete,omitempty"`
}

// CredentialMetadata describes a credential without its value.
type CredentialMetadata struct {
	Name       string `json:"name"`
	SourceType string `json:"sourceType"`
	// Revision is the vault revision that added or last replaced it.
	Revision int64 `json:"revision"`
}

// CredentialAuthMetadata is a binding's auth without credential names:
// its type, and the header name of an apiKey binding.
type CredentialAuthMetadata struct {
	Type string `json:"type"`
	Name string `json:"name,omitempty"`
}

// CredentialBindingMetadata describes a binding; Match has every default
// filled in.
type CredentialBindingMetadata struct {
	Name     string                 `json:"name"`
	Revision int64                  `json:"revision"`
	Match    CredentialMatch        `json:"match"`
	Auth     CredentialAuthMetadata `json:"auth"`
}

// CredentialVaultState answers the vault's create, get and patch.
// Lists are sorted by name.
type CredentialVaultState struct {
	Revision    int64                       `json:"revision"`
	Credentials []CredentialMetadata        `json:"credentials"`
	Bindings    []CredentialBindingMetadata `json:"bindings"`
}

// CredentialListResponse answers GET /credential-vault/credentials.
type CredentialListResponse struct {
	Revision    int64                `json:"revision"`
	Credentials []CredentialMetadata `json:"credentials"`
}

// CredentialBindingListResponse answers GET /credential-vault/bindings.
type CredentialBindingListResponse struct {
	Revision int64                       `json:"revision"`
	Bindings []CredentialBindingMetadata `json:"bindings"`
}
