package api

import (
	"encoding/json"
	"strings"
	"time"
)

// Lifecycle API headers.
const (
	HeaderAPIKey    = "OPEN-SANDBOX-API-KEY"
	HeaderRequestID = "X-Request-ID"
	// HeaderEgressAuth carries the egress sidecar's token.
	HeaderEgressAuth = "OPENSANDBOX-EGRESS-AUTH"
)

// ImageSpec names the image of a sandbox, with optional registry
// credentials.
type ImageSpec struct {
	URI  string     `json:"uri"`
	Auth *ImageAuth `json:"auth,omitempty"`
}

// ImageAuth is a registry username and password.
type ImageAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// PlatformSpec constrains the OS and architecture.
type PlatformSpec struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
}

// NetworkPolicy is the egress policy of a sandbox. The egress API sends
// Egress as [] when there are no rules, never null or absent.
type NetworkPolicy struct {
	DefaultAction string        `json:"defaultAction,omitempty"`
	Egress        []NetworkRule `json:"egress"`
}

// NetworkRule is one rule of a NetworkPolicy.
type NetworkRule struct {
	Action string `json:"action"`
	Target string `json:"target"`
}

// CredentialProxy turns the credential-injecting proxy on.
type CredentialProxy struct {
	Enabled bool `json:"enabled"`
}

// Volume is storage mounted into a sandbox; exactly one of Host, PVC and
// OSSFS is set.
type Volume struct {
	Name      string       `json:"name"`
	MountPath string       `json:"mountPath"`
	ReadOnly  bool         `json:"readOnly,omitempty"`
	SubPath   string       `json:"subPath,omitempty"`
	Host      *HostVolume  `json:"host,omitempty"`
	PVC       *PVCVolume   `json:"pvc,omitempty"`
	OSSFS     *OSSFSVolume `json:"ossfs,omitempty"`
}

// HostVolume is a directory of the host.
type HostVolume struct {
	Path string `json:"path"`
}

// PVCVolume is a named volume (a Docker volume, a Kubernetes PVC).
type PVCVolume struct {
	ClaimName                  string   `json:"claimName"`
	CreateIfNotExists          *bool    `json:"createIfNotExists,omitempty"`
	DeleteOnSandboxTermination bool     `json:"deleteOnSandboxTermination,omitempty"`
	StorageClass               *string  `json:"storageClass,omitempty"`
	Storage                    *string  `json:"storage,omitempty"`
	AccessModes                []string `json:"accessModes,omitempty"`
}

// OSSFSVolume is an object-storage bucket mounted with ossfs.
type OSSFSVolume struct {
	Bucket          string   `json:"bucket"`
	Endpoint        string   `json:"endpoint"`
	Version         string   `json:"version,omitempty"`
	Options         []string `json:"options,omitempty"`
	AccessKeyID     string   `json:"accessKeyId"`
	AccessKeySecret string   `json:"accessKeySecret"`
}

// CreateSandboxRequest is the body of POST /sandboxes. Timeout is a
// pointer so that an explicit null (no expiry) and an omitted field mean
// the same, and 0 can be told apart from them.
type CreateSandboxRequest struct {
	Image           *ImageSpec         `json:"image,omitempty"`
	SnapshotID      string             `json:"snapshotId,omitempty"`
	Entrypoint      []string           `json:"entrypoint,omitempty"`
	Timeout         *int64             `json:"timeout,omitempty"`
	ResourceLimits  map[string]string  `json:"resourceLimits,omitempty"`
	Env             map[string]*string `json:"env,omitempty"`
	Metadata        map[string]string  `json:"metadata,omitempty"`
	Platform        *PlatformSpec      `json:"platform,omitempty"`
	NetworkPolicy   json.RawMessage    `json:"networkPolicy,omitempty"`
	CredentialProxy *CredentialProxy   `json:"credentialProxy,omitempty"`
	SecureAccess    bool               `json:"secureAccess,omitempty"`
	Volumes         []Volume           `json:"volumes,omitempty"`
	Extensions      map[string]string  `json:"extensions,omitempty"`
}

// SandboxStatus is the status of a sandbox on the wire.
type SandboxStatus struct {
	State            string     `json:"state"`
	Reason           string     `json:"reason,omitempty"`
	Message          string     `json:"message,omitempty"`
	LastTransitionAt *time.Time `json:"lastTransitionAt,omitempty"`
}

// ReasonEntrypointFailed is the status reason of a sandbox whose
// entrypoint could not start: the file is missing, not executable or not
// a valid executable. Its state is Failed and its message execd's error.
// An entrypoint that started and exited later leaves the sandbox Running.
const ReasonEntrypointFailed = "ENTRYPOINT_FAILED"

// Sandbox is a sandbox on the wire (GET, list items, PATCH metadata).
type Sandbox struct {
	ID         string            `json:"id"`
	Image      *ImageSpec        `json:"image,omitempty"`
	SnapshotID string            `json:"snapshotId,omitempty"`
	Platform   *PlatformSpec     `json:"platform,omitempty"`
	Status     SandboxStatus     `json:"status"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Entrypoint []string          `json:"entrypoint"`
	ExpiresAt  *time.Time        `json:"expiresAt,omitempty"`
	CreatedAt  time.Time         `json:"createdAt"`
}

// CreateSandboxResponse is the 202 body of POST /sandboxes: a Sandbox
// without image and snapshotId.
type CreateSandboxResponse struct {
	ID         string            `json:"id"`
	Status     SandboxStatus     `json:"status"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Platform   *PlatformSpec     `json:"platform,omitempty"`
	ExpiresAt  *time.Time        `json:"expiresAt,omitempty"`
	CreatedAt  time.Time         `json:"createdAt"`
	Entrypoint []string          `json:"entrypoint"`
}

// PaginationInfo describes a page of a list.
type PaginationInfo struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"pageSize"`
	TotalItems  int  `json:"totalItems"`
	TotalPages  int  `json:"totalPages"`
	HasNextPage bool `json:"hasNextPage"`
}

// ListSandboxesResponse is the body of GET /sandboxes.
type ListSandboxesResponse struct {
	Items      []Sandbox      `json:"items"`
	Pagination PaginationInfo `json:"pagination"`
}

// RenewExpirationRequest is the body of POST .../renew-expiration and its
// answer.
type RenewExpirationRequest struct {
	ExpiresAt time.Time `json:"expiresAt"`
}

// Endpoint is the body of GET .../endpoints/{port}.
type Endpoint struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers,omitempty"`
}

// URL is the endpoint as a URL with scheme ("http" or "https"), ending
// in "/" so that relative links of a page served under a path prefix
// resolve under it. An endpoint that already has a scheme keeps it.
func (e Endpoint) URL(scheme string) string {
	u := e.Endpoint
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		u = scheme + "://" + u
	}
	if !strings.HasSuffix(u, "/") {
		u += "/"
	}
	return u
}

// SnapshotStatus is the status of a snapshot.
type SnapshotStatus struct {
	State            string     `json:"state"`
	Reason           string     `json:"reason,omitempty"`
	Message          string     `json:"message,omitempty"`
	LastTransitionAt *time.Time `json:"lastTransitionAt,omitempty"`
}

// Snapshot is a snapshot on the wire.
type Snapshot struct {
	ID        string         `json:"id"`
	SandboxID string         `json:"sandboxId"`
	Name      string         `json:"name,omitempty"`
	Status    SnapshotStatus `json:"status"`
	CreatedAt time.Time      `json:"createdAt"`
}

// CreateSnapshotRequest is the optional body of POST .../snapshots.
type CreateSnapshotRequest struct {
	Name *string `json:"name,omitempty"`
}

// ListSnapshotsResponse is the body of GET /snapshots.
type ListSnapshotsResponse struct {
	Items      []Snapshot     `json:"items"`
	Pagination PaginationInfo `json:"pagination"`
}

// DiagnosticContent is the descriptor answered by the diagnostics routes.
type DiagnosticContent struct {
	SandboxID     string     `json:"sandboxId"`
	Kind          string     `json:"kind"`
	Scope         string     `json:"scope"`
	Delivery      string     `json:"delivery"`
	ContentType   string     `json:"contentType"`
	Truncated     bool       `json:"truncated"`
	Content       *string    `json:"content,omitempty"`
	ContentURL    string     `json:"contentUrl,omitempty"`
	ExpiresAt     *time.Time `json:"expiresAt,omitempty"`
	ContentLength *int64     `json:"contentLength,omitempty"`
	Warnings      []string   `json:"warnings,omitempty"`
}

// Health is the body of GET /health.
type Health struct {
	Status string `json:"status"`
	// Version is the server's version, when it reports one (servers of
	// other implementations may not).
	Version string `json:"version,omitempty"`
}

// Limits is the body of GET /limits, an extension of this server (not in
// the OpenSandbox protocol): the bounds it puts on what clients ask, so
// that a client can state them before a request is refused.
type Limits struct {
	// MinTimeoutSeconds is the smallest timeout a create accepts.
	MinTimeoutSeconds int64 `json:"minTimeoutSeconds"`
	// MaxTimeoutSeconds is the largest timeout a create accepts, and how
	// far ahead a renewal may move an expiry; absent when there is no
	// bound.
	MaxTimeoutSeconds *int64 `json:"maxTimeoutSeconds,omitempty"`
	// NoExpiryAllowed: a create with timeout null (or left out) makes a
	// sandbox that lives until it is deleted.
	NoExpiryAllowed bool `json:"noExpiryAllowed"`
}

// PoolTemplate is what a warm pool's sandboxes are made from, on Docker:
// the create request's image, entrypoint, env and resourceLimits.
type PoolTemplate struct {
	Image          *ImageSpec        `json:"image,omitempty"`
	Entrypoint     []string          `json:"entrypoint,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	// NetworkPolicy, when set, is enforced on the pool's sandboxes from
	// their start: a claimed sandbox runs with it (an extension of the
	// reference's pool template).
	NetworkPolicy json.RawMessage `json:"networkPolicy,omitempty"`
	// Extensions are given to each sandbox handed out to a create that
	// names the pool (extensions.poolRef), under the create's own:
	// ExtensionIngressPublic and ExtensionRenewExtend (an extension of the
	// reference's pool template).
	Extensions map[string]string `json:"extensions,omitempty"`
}

// CapacitySpec bounds a warm pool: ready sandboxes are refilled to
// BufferMax when they fall below BufferMin; the pool's sandboxes, handed
// out ones included, number from PoolMin to PoolMax.
type CapacitySpec struct {
	BufferMax int `json:"bufferMax"`
	BufferMin int `json:"bufferMin"`
	PoolMax   int `json:"poolMax"`
	PoolMin   int `json:"poolMin"`
}

// PoolRequest is the body of POST /pools and PUT /pools/{name}.
type PoolRequest struct {
	Name         string        `json:"name"`
	Template     *PoolTemplate `json:"template"`
	CapacitySpec *CapacitySpec `json:"capacitySpec"`
}

// PoolStatus is what a pool holds. Starting, Claims, Misses and Error are
// not in the reference.
type PoolStatus struct {
	Total     int    `json:"total"`
	Allocated int    `json:"allocated"`
	Available int    `json:"available"`
	Revision  string `json:"revision"`
	Starting  int    `json:"starting"`
	Claims    uint64 `json:"claims"`
	Misses    uint64 `json:"misses"`
	Error     string `json:"error,omitempty"`
}

// Pool is a warm pool on the wire.
type Pool struct {
	Name         string        `json:"name"`
	Template     *PoolTemplate `json:"template,omitempty"`
	CapacitySpec CapacitySpec  `json:"capacitySpec"`
	Status       *PoolStatus   `json:"status,omitempty"`
	CreatedAt    *time.Time    `json:"createdAt,omitempty"`
}

// ListPoolsResponse answers GET /pools.
type ListPoolsResponse struct {
	Items []Pool `json:"items"`
}
