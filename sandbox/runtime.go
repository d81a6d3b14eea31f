package sandbox

import (
	"context"
	"time"
)

// Runtime makes sandboxes real: on Docker, on Kubernetes, or in memory for
// tests. Every runtime passes the conformance suite in runtime/runtimetest.
//
// Implementations classify their errors by wrapping the sentinels of this
// package (ErrNotFound, ErrInvalid, ...); callers never see an engine's own
// error types.
type Runtime interface {
	// Create starts making a sandbox from spec and returns it at once,
	// normally Pending: pulling the image and starting the sandbox happen
	// in the background, and Get reports Running once the sandbox's execd
	// answers, or Failed with a reason. id is new; a Create for an id that
	// exists is ErrConflict.
	Create(ctx context.Context, id ID, spec Spec) (*Sandbox, error)
	// Get returns the sandbox, or ErrNotFound.
	Get(ctx context.Context, id ID) (*Sandbox, error)
	// List returns every sandbox, in no particular order. It is served
	// from memory, never with a call per sandbox.
	List(ctx context.Context) ([]*Sandbox, error)
	// Delete removes the sandbox and everything made for it. A sandbox
	// that is not there is ErrNotFound.
	Delete(ctx context.Context, id ID) error
	// Endpoint says how to reach port of the sandbox. It works as soon as
	// Create has returned, while the sandbox is still starting; it waits
	// (within ctx) for what it needs to know.
	Endpoint(ctx context.Context, id ID, port int) (Endpoint, error)
	// SetExpiry sets when the sandbox is deleted automatically (nil:
	// never), and keeps it across restarts.
	SetExpiry(ctx context.Context, id ID, at *time.Time) error
	// PatchMetadata applies a merge patch to the sandbox's metadata: a
	// nil value deletes its key. It returns the sandbox as it is after.
	PatchMetadata(ctx context.Context, id ID, patch map[string]*string) (*Sandbox, error)
	// Close releases the runtime's resources; sandboxes keep running.
	Close() error
}

// Pauser is a runtime that can freeze a sandbox with its processes and
// memory, and thaw it. Both return once the state is reached; pausing a
// sandbox that is not Running, or resuming one that is not Paused, is
// ErrConflict.
type Pauser interface {
	Pause(ctx context.Context, id ID) error
	Resume(ctx context.Context, id ID) error
}

// Snapshotter is a runtime that can capture a sandbox's file system as a
// snapshot from which new sandboxes can be created.
type Snapshotter interface {
	// CreateSnapshot starts capturing sandbox id and returns the snapshot,
	// Creating; it becomes Ready (or Failed) in the background. The sandbox
	// must be Running (else ErrConflict).
	CreateSnapshot(ctx context.Context, id ID, snap SnapshotID, name string) (*Snapshot, error)
	GetSnapshot(ctx context.Context, snap SnapshotID) (*Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*Snapshot, error)
	// DeleteSnapshot removes a snapshot; one still Creating is ErrConflict.
	DeleteSnapshot(ctx context.Context, snap SnapshotID) error
	// SnapshotImage returns the image a Ready snapshot restores from.
	SnapshotImage(ctx context.Context, snap SnapshotID) (string, error)
}

// Diagnoser is a runtime that can tell what happened to a sandbox.
type Diagnoser interface {
	// Logs returns the output of the sandbox's main process (its
	// container's log), at most tail lines when tail > 0, only what came
	// after since when since is not zero.
	Logs(ctx context.Context, id ID, tail int, since time.Time) (string, error)
	// Events returns what happened to the sandbox, oldest first: its
	// lifecycle transitions and the engine's events.
	Events(ctx context.Context, id ID) ([]Event, error)
	// Inspect returns a human-readable description of the sandbox's
	// runtime objects.
	Inspect(ctx context.Context, id ID) (string, error)
}

// Reconciler is a runtime with housekeeping of its own, which the
// lifecycle manager runs periodically: removing orphaned objects and
// correcting drift between what it recorded and what the engine has.
type Reconciler interface {
	Reconcile(ctx context.Context) error
}

// Event is one thing that happened to a sandbox.
type Event struct {
	Time time.Time
	// Source is "lifecycle" for state transitions and requests, "runtime"
	// for what the engine reported.
	Source  string
	Type    string // short code: CREATED, RUNNING, PAUSED, DIE, OOM, ...
	Message string
}

// Event sources.
const (
	SourceLifecycle = "lifecycle"
	SourceRuntime   = "runtime"
)

// SnapshotID identifies a snapshot.
type SnapshotID string

// NewSnapshotID returns a fresh random snapshot ID.
func NewSnapshotID() SnapshotID { return SnapshotID(newUUID()) }

// SnapshotState is where a snapshot is in its life.
type SnapshotState string

// Snapshot states.
const (
	SnapshotCreating SnapshotState = "Creating"
	SnapshotReady    SnapshotState = "Ready"
	SnapshotDeleting SnapshotState = "Deleting"
	SnapshotFailed   SnapshotState = "Failed"
)

// Snapshot is a captured file system of a sandbox.
type Snapshot struct {
	ID        SnapshotID
	SandboxID ID
	Name      string
	State     SnapshotState
	Reason    string
	Message   string
	Since     time.Time
	CreatedAt time.Time
}

// Elected is a runtime shared by several servers (replicas) that elect
// one of them to keep house. The lifecycle manager enforces expiry and
// runs Reconcile only while Leading reports true.
type Elected interface {
	Leading() bool
}

// Optional operations a runtime may lack, for Limited.
const (
	OpPause    = "pause"
	OpSnapshot = "snapshot"
)

// Limited is a runtime that says why it lacks an optional operation
// (OpPause, OpSnapshot): the message of the 501 the API answers.
type Limited interface {
	// Unsupported returns the reason, or "" to use a generic message.
	Unsupported(op string) string
}

// HostSize is what the largest machine a runtime can place a sandbox on
// offers: a sandbox that asks for more can never get it. Zero CPU or
// memory means unknown.
type HostSize struct {
	// CPUMillis is the machine's CPUs in thousandths (2 CPUs = 2000).
	CPUMillis int64
	// MemoryBytes is the machine's memory.
	MemoryBytes int64
	// GPUs is the machine's GPUs, when GPUsKnown.
	GPUs      int64
	GPUsKnown bool
	// Where names the machine in messages: "the Docker engine's host",
	// "node worker-1 (the largest)".
	Where string
}

// HostSizer is a runtime that knows how large its machines are. The
// lifecycle server refuses a create that asks for more CPU, memory or
// GPUs than HostSize reports, rather than accept a sandbox the engine
// would fail later or run without the limit asked for. Implementations
// answer from a cache or an informer, not with a call per create.
type HostSizer interface {
	HostSize(ctx context.Context) (HostSize, error)
}

// ExtensionReader is a runtime that reads extension keys of its own
// ("docker.runtime"). The lifecycle server refuses a create with an
// extension key that neither it nor the runtime reads, unless the
// operator lets the key through.
type ExtensionReader interface {
	// ExtensionKeys returns the keys the runtime reads; a key ending in
	// "*" stands for every key with what precedes it as a prefix.
	ExtensionKeys() []string
}

// ExpiryExtender is a runtime that moves an expiry forward in one
// conditional write, for renew-on-access when several servers share the
// runtime's state: each replica may be asked to renew the same sandbox
// at the same moment (by several gateways), and the renewal must land
// once, never shortening the expiry.
type ExpiryExtender interface {
	// ExtendExpiry sets the sandbox's expiry to at, unless the expiry it
	// has when the write is made is already at or after at - slack (or it
	// has none: ErrConflict). The decision is made on the stored state,
	// and a concurrent change makes the runtime decide again, so that of
	// replicas asked at once only one writes. It returns the expiry after
	// the call and whether this call wrote it.
	ExtendExpiry(ctx context.Context, id ID, at time.Time, slack time.Duration) (time.Time, bool, error)
}

// ExecdTokener is a runtime that tells a sandbox's execd token from the
// moment Create returns, without waiting for the sandbox's address: the
// lifecycle server hands it out with execd's gateway endpoint, because a
// gateway that reads only the cluster's pods cannot add it.
type ExecdTokener interface {
	ExecdToken(ctx context.Context, id ID) (string, error)
}
