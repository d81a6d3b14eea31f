package sandbox

import (
	"context"
	"errors"
	"time"
)

// ErrPoolEmpty is returned by Pooler.Claim when no pre-started sandbox
// fits: none is ready in the pool asked for, or no pool matches. The
// caller then creates the sandbox cold.
var ErrPoolEmpty = errors.New("no warm sandbox available")

// Pool is a warm pool: sandboxes started ahead of time from a template,
// handed out by creates.
type Pool struct {
	Name string
	// Template is what the pool's sandboxes are made from. Runtimes use
	// its Image, Entrypoint, Env and Resources; the entrypoint and the
	// environment are applied when a sandbox is claimed.
	Template Spec
	Capacity Capacity
	// Revision changes whenever the template does; sandboxes of an older
	// revision still waiting are replaced.
	Revision  int64
	CreatedAt time.Time
	// FromConfig marks a pool defined in the server's configuration.
	FromConfig bool
}

// Capacity bounds a pool. Available sandboxes are kept between BufferMin
// and BufferMax (refilled to BufferMax when they fall below BufferMin);
// the pool's sandboxes, handed out ones included, number at least PoolMin
// and at most PoolMax.
type Capacity struct {
	BufferMin int
	BufferMax int
	PoolMin   int
	PoolMax   int
}

// PoolStatus is what a pool holds now.
type PoolStatus struct {
	// Total is Allocated + Available + Starting.
	Total int
	// Allocated counts the pool's sandboxes handed out and still alive.
	Allocated int
	// Available counts the sandboxes ready to be claimed.
	Available int
	// Starting counts the sandboxes being started.
	Starting int
	// Claims and Misses count creates served from the pool, and creates
	// that asked for it but found it empty, since the server started.
	Claims, Misses uint64
	// Error is why the pool's last sandbox failed to start, until one
	// starts again; the pool retries with a growing delay meanwhile.
	Error string
}

// PoolInfo is a pool with its status.
type PoolInfo struct {
	Pool
	Status PoolStatus
}

// Pooler is a runtime with warm pools.
type Pooler interface {
	// CreatePool defines a pool and starts filling it. A pool of that
	// name is ErrConflict.
	CreatePool(ctx context.Context, p Pool) (*PoolInfo, error)
	// UpdatePool changes a pool's template and capacity. A sandbox not
	// yet handed out that was made from an older template is replaced.
	UpdatePool(ctx context.Context, p Pool) (*PoolInfo, error)
	GetPool(ctx context.Context, name string) (*PoolInfo, error)
	ListPools(ctx context.Context) ([]*PoolInfo, error)
	// DeletePool removes a pool and the sandboxes it holds; sandboxes it
	// handed out stay.
	DeletePool(ctx context.Context, name string) error
	// Claim hands out a ready sandbox of pool (or, when pool is empty, of
	// a pool whose template matches spec's image and resources), applying
	// spec's entrypoint, environment, metadata and expiry (the template's
	// entrypoint and environment when spec has none). The sandbox keeps the
	// id it was started with. With none ready it returns ErrPoolEmpty.
	Claim(ctx context.Context, pool string, spec Spec) (*Sandbox, error)
}
