package api

// Error codes in the lifecycle API's {code,message} error body. Codes are
// namespaced PREFIX::NAME, as the reference server spells them; the
// constant's name is Code, the prefix and the name in Go case. Clients
// compare codes exactly: a prefix (SANDBOX::) says which part of the
// server answered, not what is missing. testdata/codes.golden pins the
// spelling of every code.

// Codes of the server itself, whatever its runtime.
const (
	// CodeSandboxInvalidParameter answers a request that cannot be
	// carried out as given (400).
	CodeSandboxInvalidParameter = "SANDBOX::INVALID_PARAMETER"
	// CodeSandboxInvalidMetadataLabel answers metadata that breaks the
	// label rules or uses the reserved prefix, at create (400). PATCH
	// .../metadata answers CodeInvalidMetadataLabel, as the reference.
	CodeSandboxInvalidMetadataLabel = "SANDBOX::INVALID_METADATA_LABEL"
	// CodeSandboxAPINotSupported answers an operation this runtime cannot
	// do (pause on a runtime without it, signed endpoints on Docker).
	CodeSandboxAPINotSupported = "SANDBOX::API_NOT_SUPPORTED"
	// CodeSandboxUnsupportedPoolRef answers extensions.poolRef where the
	// runtime has no pools (400).
	CodeSandboxUnsupportedPoolRef = "SANDBOX::UNSUPPORTED_POOL_REF"
	// CodeSandboxAlreadyExists answers a create whose id is taken (409).
	CodeSandboxAlreadyExists = "SANDBOX::ALREADY_EXISTS"
	// CodeSandboxConflict answers an operation the object's state does
	// not allow, when no more precise code applies (409).
	CodeSandboxConflict = "SANDBOX::CONFLICT"
	// CodeSandboxNotImplemented answers what the runtime does not do,
	// when no more precise code applies (501).
	CodeSandboxNotImplemented = "SANDBOX::NOT_IMPLEMENTED"
	// CodeSandboxUnavailable answers when the engine, the cluster or a
	// registry cannot be reached (503).
	CodeSandboxUnavailable = "SANDBOX::UNAVAILABLE"
	// CodeSandboxRequestTooLarge answers a body over the server's limit
	// (413).
	CodeSandboxRequestTooLarge = "SANDBOX::REQUEST_TOO_LARGE"
	// CodeSandboxUnknownError answers a failure of the server itself
	// (500); the details are in its log under the request id.
	CodeSandboxUnknownError = "SANDBOX::UNKNOWN_ERROR"
	// CodeSandboxBadGateway answers a proxied request the sandbox did not
	// answer (502).
	CodeSandboxBadGateway = "SANDBOX::BAD_GATEWAY"
	// CodeSandboxRouteNotFound answers a path no route serves (404). It
	// does not say a sandbox is missing: that is
	// CodeDockerSandboxNotFound or CodeKubernetesSandboxNotFound.
	CodeSandboxRouteNotFound = "SANDBOX::NOT_FOUND"
	// CodeSandboxMethodNotAllowed answers a method the path does not
	// serve (405).
	CodeSandboxMethodNotAllowed = "SANDBOX::METHOD_NOT_ALLOWED"

	// CodeMissingAPIKey answers a request without OPEN-SANDBOX-API-KEY
	// (401).
	CodeMissingAPIKey = "MISSING_API_KEY"
	// CodeInvalidAPIKey answers a request whose key does not match (401).
	CodeInvalidAPIKey = "INVALID_API_KEY"
	// CodeInvalidMetadataLabel answers PATCH .../metadata with a key or
	// value that breaks the label rules (400).
	CodeInvalidMetadataLabel = "INVALID_METADATA_LABEL"
	// CodeInvalidMetadataFormat answers a metadata list filter that does
	// not parse (400).
	CodeInvalidMetadataFormat = "INVALID_METADATA_FORMAT"

	// CodeDiagnosticsInvalidScope answers a diagnostics scope the server
	// does not know (400).
	CodeDiagnosticsInvalidScope = "DIAGNOSTICS::INVALID_SCOPE"
)

// Codes whose prefix names the runtime that answers (DOCKER:: or
// KUBERNETES::). The two runtimes answer the same cases with the same
// names, each under its own prefix.
const (
	// CodeDockerSandboxNotFound answers an unknown sandbox id (404).
	CodeDockerSandboxNotFound = "DOCKER::SANDBOX_NOT_FOUND"
	// CodeDockerInvalidEntrypoint answers a missing or empty entrypoint
	// (400).
	CodeDockerInvalidEntrypoint = "DOCKER::INVALID_ENTRYPOINT"
	// CodeDockerInvalidPort answers a port outside 1..65535 (400).
	CodeDockerInvalidPort = "DOCKER::INVALID_PORT"
	// CodeDockerInvalidExpiration answers a renewal to a time not in the
	// future (400) or of a sandbox without expiry (409).
	CodeDockerInvalidExpiration = "DOCKER::INVALID_EXPIRATION"
	// CodeDockerSandboxNotRunning answers a pause of a sandbox that is
	// not Running (409).
	CodeDockerSandboxNotRunning = "DOCKER::SANDBOX_NOT_RUNNING"
	// CodeDockerSandboxNotPaused answers a resume of a sandbox that is
	// not Paused (409).
	CodeDockerSandboxNotPaused = "DOCKER::SANDBOX_NOT_PAUSED"
	// CodeDockerNetworkModeEndpointUnavailable answers an endpoint of a
	// sandbox whose network mode publishes no ports (409).
	CodeDockerNetworkModeEndpointUnavailable = "DOCKER::NETWORK_MODE_ENDPOINT_UNAVAILABLE"

	// CodeKubernetesSandboxNotFound answers an unknown sandbox id (404).
	CodeKubernetesSandboxNotFound = "KUBERNETES::SANDBOX_NOT_FOUND"
	// CodeKubernetesInvalidEntrypoint: see CodeDockerInvalidEntrypoint.
	CodeKubernetesInvalidEntrypoint = "KUBERNETES::INVALID_ENTRYPOINT"
	// CodeKubernetesInvalidPort: see CodeDockerInvalidPort.
	CodeKubernetesInvalidPort = "KUBERNETES::INVALID_PORT"
	// CodeKubernetesInvalidExpiration: see CodeDockerInvalidExpiration.
	CodeKubernetesInvalidExpiration = "KUBERNETES::INVALID_EXPIRATION"
	// CodeKubernetesSandboxNotRunning answers an endpoint of a sandbox
	// that failed or ended before its pod had an address (409).
	CodeKubernetesSandboxNotRunning = "KUBERNETES::SANDBOX_NOT_RUNNING"
	// CodeKubernetesQuotaExceeded answers a create the namespace's quota
	// refuses (503).
	CodeKubernetesQuotaExceeded = "KUBERNETES::QUOTA_EXCEEDED"
	// CodeKubernetesForbidden answers a create the server's service
	// account may not make (503).
	CodeKubernetesForbidden = "KUBERNETES::FORBIDDEN"
	// CodeKubernetesPolicyViolation answers a create an admission policy
	// of the cluster refuses (400).
	CodeKubernetesPolicyViolation = "KUBERNETES::POLICY_VIOLATION"
)

// Codes of the ingress gateway (osb-ingress and the server's own
// gateway listener). An unauthenticated request learns nothing about a
// sandbox: it gets CodeIngressUnauthorized whether or not the sandbox
// exists.
const (
	// CodeIngressInvalidRoute answers a request without a route, or
	// with one that does not parse (400).
	CodeIngressInvalidRoute = "INGRESS::INVALID_ROUTE"
	// CodeIngressUnauthorized answers a request with neither the
	// sandbox's access token nor a valid, unexpired signed route (401).
	CodeIngressUnauthorized = "INGRESS::UNAUTHORIZED"
	// CodeIngressSandboxNotFound answers an authenticated request for a
	// sandbox that does not exist (404).
	CodeIngressSandboxNotFound = "INGRESS::SANDBOX_NOT_FOUND"
	// CodeIngressSandboxNotRunning answers a request for a sandbox that
	// is not Running (503); the message says its state and reason.
	CodeIngressSandboxNotRunning = "INGRESS::SANDBOX_NOT_RUNNING"
	// CodeIngressBadGateway answers a request the sandbox's port did not
	// answer (502).
	CodeIngressBadGateway = "INGRESS::BAD_GATEWAY"
	// CodeIngressUnavailable answers when the gateway cannot find out
	// where sandboxes are (the lifecycle server or the cluster cannot be
	// reached) or has no keys to check signatures with (503).
	CodeIngressUnavailable = "INGRESS::UNAVAILABLE"
)

// Snapshot codes.
const (
	CodeSnapshotNotFound = "SNAPSHOT::NOT_FOUND"
	// CodeSnapshotNotReady answers a restore from a snapshot that is not
	// Ready (409).
	CodeSnapshotNotReady = "SNAPSHOT::NOT_READY"
	// CodeSnapshotNotImplemented answers snapshots on a runtime without
	// them (501).
	CodeSnapshotNotImplemented = "SNAPSHOT::NOT_IMPLEMENTED"
	// CodeSnapshotInvalidState answers a delete of a snapshot still being
	// made (409).
	CodeSnapshotInvalidState = "SNAPSHOT::INVALID_STATE"
	// CodeSnapshotInvalidSourceState answers a snapshot of a sandbox that
	// is not Running (409).
	CodeSnapshotInvalidSourceState = "SNAPSHOT::INVALID_SOURCE_STATE"
	// CodeSnapshotInvalidRestoreConfig answers a restore from a snapshot
	// that has no image (409).
	CodeSnapshotInvalidRestoreConfig = "SNAPSHOT::INVALID_RESTORE_CONFIG"
)

// Warm pool codes.
const (
	CodePoolNotFound      = "POOL::NOT_FOUND"
	CodePoolAlreadyExists = "POOL::ALREADY_EXISTS"
	// CodePoolInvalidParameter answers a pool the runtime cannot keep as
	// given (400).
	CodePoolInvalidParameter = "POOL::INVALID_PARAMETER"
	// CodePoolNotImplemented answers /pools on a runtime without pools
	// (501).
	CodePoolNotImplemented = "POOL::NOT_IMPLEMENTED"
)

// Volume codes (400 unless said otherwise).
const (
	CodeVolumeInvalidName        = "VOLUME::INVALID_NAME"
	CodeVolumeDuplicateName      = "VOLUME::DUPLICATE_NAME"
	CodeVolumeInvalidBackend     = "VOLUME::INVALID_BACKEND"
	CodeVolumeUnsupportedBackend = "VOLUME::UNSUPPORTED_BACKEND"
	CodeVolumeInvalidMountPath   = "VOLUME::INVALID_MOUNT_PATH"
	CodeVolumeInvalidSubPath     = "VOLUME::INVALID_SUB_PATH"
	CodeVolumeInvalidHostPath    = "VOLUME::INVALID_HOST_PATH"
	CodeVolumeHostPathNotAllowed = "VOLUME::HOST_PATH_NOT_ALLOWED"
	CodeVolumeInvalidPVCName     = "VOLUME::INVALID_PVC_NAME"
	CodeVolumeInvalidSize        = "VOLUME::INVALID_SIZE"
	// CodeVolumePVCNotFound answers a claim that does not exist and may
	// not be made (404).
	CodeVolumePVCNotFound = "VOLUME::PVC_NOT_FOUND"
	// CodeVolumePVCSubPathUnsupportedDriver answers a sub path of a named
	// volume whose files are not in a plain local directory.
	CodeVolumePVCSubPathUnsupportedDriver = "VOLUME::PVC_SUBPATH_UNSUPPORTED_DRIVER"
	// CodeVolumeNotAllowed answers a named volume the server did not
	// make and is not allowed to mount.
	CodeVolumeNotAllowed = "VOLUME::NOT_ALLOWED"
	// CodeVolumeUnsupported answers host volumes and sub paths where the
	// server cannot mount them safely.
	CodeVolumeUnsupported = "VOLUME::UNSUPPORTED"
)
