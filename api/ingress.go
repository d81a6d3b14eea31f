package api

import "time"

// Ingress gateway headers (lifecycle.md §8.2).
const (
	// HeaderIngressTo routes a request in the gateway's header mode:
	// "{sandboxId}-{port}" or its signed form
	// "{sandboxId}-{port}-{expires}-{signature}".
	HeaderIngressTo = "OpenSandbox-Ingress-To"
	// HeaderIngressLegacy is the deprecated spelling of HeaderIngressTo,
	// still honoured.
	HeaderIngressLegacy = "OPEN-SANDBOX-INGRESS"
	// HeaderSecureAccess carries a sandbox's access token to the gateway.
	HeaderSecureAccess = "OpenSandbox-Secure-Access"
)

// Extensions the ingress gateway reads.
const (
	// ExtensionIngressPublic = "true" in a create request (or a pool
	// template) lets the gateway serve the sandbox's ports without a
	// token or a signed route: an explicit choice for demos, never the
	// default.
	ExtensionIngressPublic = "ingress.public"
	// ExtensionRenewExtend opts a sandbox into renew-on-access: decimal
	// seconds, 300..86400 (lifecycle.md §12).
	ExtensionRenewExtend = "access.renew.extend.seconds"
)

// Ingress routes of the lifecycle server, for gateways that find
// sandboxes through it (under /v1, with the API key).
const (
	// IngressTargetsPath + "{sandboxId}/{port}": GET answers an
	// IngressTarget.
	IngressTargetsPath = "/v1/ingress/targets/"
	// IngressRenewPath + "{sandboxId}": POST with an IngressRenewRequest
	// asks for a renew-on-access; 204 whether or not it moved the expiry.
	IngressRenewPath = "/v1/ingress/renew/"
)

// IngressTarget tells a gateway where a sandbox's port is and whether it
// may be served.
type IngressTarget struct {
	SandboxID string `json:"sandboxId"`
	Port      int    `json:"port"`
	// State is the sandbox's lifecycle state; only Running is served.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Endpoint is where the gateway sends the request (scheme-less
	// host:port[/path-prefix]) and Headers what it adds to it, as in the
	// endpoint API's direct answer. Empty unless State is Running.
	Endpoint string            `json:"endpoint,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
	// Public is set when the sandbox asked for ExtensionIngressPublic.
	Public bool `json:"public,omitempty"`
	// RenewExtendSeconds is the sandbox's renew-on-access extension, 0
	// when it did not opt in.
	RenewExtendSeconds int `json:"renewExtendSeconds,omitempty"`
	// ExpiresAt is the sandbox's current expiry, nil without one.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

// IngressRenewRequest is the body of POST IngressRenewPath{sandboxId}.
type IngressRenewRequest struct {
	// Port is the port the traffic went to (for the log).
	Port int `json:"port,omitempty"`
}
