package main

import (
	"context"
	"fmt"
	"time"
)

// settle is how long a fleet idles before its memory is read: long
// enough for the starts' transient memory to go.
const settle = 2 * time.Second

// gib is a GiB in bytes; mib a MiB.
const (
	gib = 1 << 30
	mib = 1 << 20
)

// densityRow fills r from the memory of the idle fleets of the
// concurrent cold run: sandboxes made through the server, and the
// baseline's containers (`docker run -d` of the same image, command and
// limits, plus the one `docker exec true` the sandboxes also ran). A
// container's memory is its cgroup's (the anonymous memory of execd and
// its child, the page cache charged to it, the kernel's memory for it)
// plus the proportional share of its containerd-shim, which lives outside
// the cgroup; see footprint.
func (b *bench) densityRow(r row) row {
	ours, theirs := b.ourIdle, b.baseIdle
	r.Value, r.Baseline = gib/ours.total(), gib/theirs.total()
	r.Ratio = r.Value / r.Baseline
	r.Note = fmt.Sprintf("per sandbox %.2f MiB = cgroup %.2f + shim PSS %.2f (execd RSS %.1f MiB, %.2f anonymous); baseline %.2f = %.2f + %.2f",
		ours.total()/mib, ours.cgroup/mib, ours.shimPSS/mib, ours.initRSS/mib, ours.initAnon/mib,
		theirs.total()/mib, theirs.cgroup/mib, theirs.shimPSS/mib)
	return r
}

// measureFleet lets the fleet idle, then reads its memory.
func measureFleet(ctx context.Context, cids []string) (footprint, error) {
	select {
	case <-ctx.Done():
		return footprint{}, ctx.Err()
	case <-time.After(settle):
	}
	return measureFootprint(ctx, cids)
}
