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
