package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
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

// poolInvalid is an ErrInvalid saying msg. The wire code is the caller's
// to choose: this package knows no codes.
func poolInvalid(msg string) error { return fmt.Errorf("%s: %w", msg, ErrInvalid) }

// Check refuses a pool that cannot work, whatever the runtime: no name,
// no image, capacity values negative or out of order, or a template with
// more than image, entrypoint, environment and resources.
func (p *Pool) Check() error {
	c := p.Capacity
	switch {
	case p.Name == "":
		return poolInvalid("a pool needs a name")
	case p.Template.Image == "":
		return poolInvalid("the pool's template needs an image")
	case c.BufferMin < 0 || c.BufferMax < 0 || c.PoolMin < 0 || c.PoolMax < 0:
		return poolInvalid("capacity values must not be negative")
	case c.BufferMin > c.BufferMax:
		return poolInvalid("bufferMin must not exceed bufferMax")
	case c.PoolMin > c.PoolMax:
		return poolInvalid("poolMin must not exceed poolMax")
	case c.BufferMax > c.PoolMax:
		return poolInvalid("bufferMax must not exceed poolMax")
	}
	if len(p.Template.Volumes) > 0 || p.Template.SnapshotID != "" || p.Template.ImageAuth != nil {
		return poolInvalid("a pool's template takes image, entrypoint, env and resourceLimits only")
	}
	return nil
}

// MemberSpec is what a pool's warm sandboxes are started from: the
// template without its entrypoint, which starts when one is claimed.
func MemberSpec(t *Spec) Spec {
	return Spec{Image: t.Image, Env: maps.Clone(t.Env), Resources: t.Resources, NetworkPolicy: bytes.Clone(t.NetworkPolicy)}
}

// SameMembers reports whether two templates start the same warm
// sandboxes (their entrypoints aside; no variables however written).
func SameMembers(a, b *Spec) bool {
	return a.Image == b.Image && a.Resources == b.Resources && maps.Equal(a.Env, b.Env) &&
		bytes.Equal(a.NetworkPolicy, b.NetworkPolicy)
}

// Satisfies reports whether a warm sandbox of p can be what a create that
// names p asks for: an image and resources, if given, are the template's,
// and nothing else needs the sandbox made for it (volumes, a platform,
// secure access, a network policy other than the template's, registry credentials, or one of the
// runtime's creation-time extensions, createExts). A create that asks for
// more is made cold.
func (p *Pool) Satisfies(spec *Spec, createExts ...string) bool {
	t := &p.Template
	if !((spec.Image == "" || spec.Image == t.Image) &&
		(spec.Resources == Resources{} || spec.Resources == t.Resources) &&
		spec.SnapshotID == "" && spec.ImageAuth == nil && len(spec.Volumes) == 0 && spec.Platform == nil &&
		!spec.SecureAccess && !spec.CredentialProxy && (spec.NetworkPolicy == nil || bytes.Equal(spec.NetworkPolicy, t.NetworkPolicy))) {
		return false
	}
	for _, k := range createExts {
		if spec.Extensions[k] != "" {
			return false
		}
	}
	return true
}

// Matches reports whether a create that names no pool may be served,
// transparently, by p: same image and resources, and Satisfies. A
// template with environment variables of its own serves only creates that
// name it: a plain create must not get variables it did not ask for.
func (p *Pool) Matches(spec *Spec, createExts ...string) bool {
	t := &p.Template
	return spec.Image == t.Image && spec.Resources == t.Resources && len(t.Env) == 0 && p.Satisfies(spec, createExts...)
}

// WithTemplateExtensions returns ext with the extensions of the pool
// template t whose keys it lacks: what a create that names a pool gets
// of its template (ingress.public...), its own values first.
func WithTemplateExtensions(ext map[string]string, t *Spec) map[string]string {
	if len(t.Extensions) == 0 {
		return ext
	}
	out := maps.Clone(t.Extensions)
	maps.Copy(out, ext)
	return out
}
