package sandbox

import (
	"context"
	"time"
)

// Observer receives measurements from runtimes, pools and the lifecycle
// manager, for metrics. Its methods are called on hot paths and from
// background goroutines: they must be safe for concurrent use, return
// quickly, and never call back into the runtime. A nil Observer is never
// passed around: components given none use NopObserver.
type Observer interface {
	// SandboxReady reports a sandbox that became Running, d after the
	// request that created it: made from its image (CreateCold) or taken
	// from a warm pool (CreatePooled). Sandboxes found again at a
	// restart are not reported.
	SandboxReady(mode CreateMode, d time.Duration)
	// ImagePulled reports one image pull that took d; err is nil on
	// success, and wraps context.Canceled when every caller waiting for
	// the pull gave up. Concurrent requests for one image are one pull,
	// reported once.
	ImagePulled(image string, d time.Duration, err error)
	// Reconciled reports one pass of a housekeeping loop (LoopRuntime,
	// LoopExpiry) that took d and ended with err (nil: it did all it
	// meant to).
	Reconciled(loop string, d time.Duration, err error)
	// PoolClaim reports a create that asked for warm pool pool: hit when
	// it got a pre-started sandbox, a miss when it had to start one
	// cold.
	PoolClaim(pool string, hit bool)
}

// CreateMode is how a sandbox was made ready.
type CreateMode string

// Create modes.
const (
	// CreateCold is a sandbox made from its image on request: pull if
	// needed, container, start, wait for execd.
	CreateCold CreateMode = "cold"
	// CreatePooled is a sandbox claimed from a warm pool.
	CreatePooled CreateMode = "pooled"
)

// Housekeeping loops reported to Observer.Reconciled.
const (
	// LoopRuntime is a runtime's own reconciliation (sandbox.Reconciler):
	// orphans and drift between its records and the engine.
	LoopRuntime = "runtime"
	// LoopExpiry is the lifecycle manager's sweep that deletes expired
	// sandboxes.
	LoopExpiry = "expiry"
)

// NopObserver is an Observer that ignores everything. Embed it in an
// Observer to implement only some methods.
type NopObserver struct{}

var _ Observer = NopObserver{}

// SandboxReady does nothing.
func (NopObserver) SandboxReady(CreateMode, time.Duration) {}

// ImagePulled does nothing.
func (NopObserver) ImagePulled(string, time.Duration, error) {}

// Reconciled does nothing.
func (NopObserver) Reconciled(string, time.Duration, error) {}

// PoolClaim does nothing.
func (NopObserver) PoolClaim(string, bool) {}

// PoolLister is a runtime (or pool manager) that keeps warm pools of
// pre-started sandboxes and can say how full they are.
type PoolLister interface {
	// Pools returns the current size of every pool, in no particular
	// order. It is served from memory, never with a call per sandbox.
	Pools(ctx context.Context) ([]PoolSize, error)
}

// PoolSize is how full a warm pool is at one moment.
type PoolSize struct {
	Name string
	// Total counts every sandbox of the pool: Available, Allocated, and
	// those still starting (or failed and waiting to be replaced).
	Total int
	// Allocated counts sandboxes claimed by creates and now owned by
	// their users.
	Allocated int
	// Available counts sandboxes Running and ready to be claimed.
	Available int
}
