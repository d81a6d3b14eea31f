package sandbox

import "time"

// Spec is what a sandbox is made from. The lifecycle server builds it
// from a validated request; runtimes treat it as trusted.
type Spec struct {
	// Image is the container image reference. When restoring a snapshot
	// the server sets it to the snapshot's image.
	Image string
	// ImageAuth holds registry credentials for this create only; runtimes
	// never store them.
	ImageAuth *RegistryAuth
	// SnapshotID names the snapshot the sandbox is restored from, if any.
	SnapshotID string
	// Entrypoint is the sandbox's main process, argv form, started by
	// execd.
	Entrypoint []string
	Env        map[string]string
	Metadata   map[string]string
	Resources  Resources
	Volumes    []Volume
	Platform   *Platform
	// Extensions are free-form settings; runtimes read the keys they
	// know (see each runtime's documentation and ExtensionReader). The
	// lifecycle server lets through only keys that it or the runtime
	// reads, and those the operator allows, which runtimes keep as they
	// are.
	Extensions map[string]string
	// SecureAccess asks for an access token on ingress routes.
	SecureAccess bool
	// NetworkPolicy is the egress policy as JSON; nil means none.
	NetworkPolicy []byte
	// CredentialProxy turns on the credential vault's intercepting proxy
	// in osb-egress; it needs a NetworkPolicy.
	CredentialProxy bool
	// ExpiresAt is when the sandbox is deleted automatically; nil means
	// never.
	ExpiresAt *time.Time
}

// RegistryAuth is a username and password for an image registry.
type RegistryAuth struct {
	Username string
	Password string
}

// Resources bounds what a sandbox may use. Zero values mean the runtime's
// defaults.
type Resources struct {
	// CPUMillis is the CPU limit in thousandths of a CPU (1500 = 1.5).
	CPUMillis int64
	// MemoryBytes is the memory limit.
	MemoryBytes int64
	// GPUs is "" (none), "all", or a count ("1").
	GPUs string
	// Pids bounds the number of processes.
	Pids int64
	// StorageBytes bounds the disk a sandbox may fill: its own file
	// system (the container's writable layer) and the volumes the server
	// made that it mounts writable. It is resourceLimits'
	// "ephemeral-storage", as Kubernetes names it.
	StorageBytes int64
}

// Volume is storage mounted into a sandbox. Exactly one of HostPath and
// Claim is set.
type Volume struct {
	Name      string
	MountPath string
	ReadOnly  bool
	// SubPath mounts a directory inside the volume instead of its root.
	SubPath string
	// HostPath is a directory of the host (allowed only under the
	// server's configured prefixes), with the server's symbolic links
	// resolved.
	HostPath string
	// HostPathAsWritten is the same directory as the request wrote it,
	// cleaned, links not resolved: a runtime whose mounts happen on
	// other machines (Kubernetes nodes), where the server's links mean
	// nothing, mounts this and lets the node keep it inside the
	// allow-list.
	HostPathAsWritten string
	// Claim is a named volume (a Docker volume, a Kubernetes PVC).
	Claim *Claim
}

// Claim is a named, runtime-managed volume.
type Claim struct {
	Name              string
	CreateIfNotExists bool
	// DeleteOnTermination removes a volume the runtime created for this
	// sandbox when the sandbox is deleted.
	DeleteOnTermination bool
	StorageClass        string
	Size                string
	AccessModes         []string
}
