package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// density starts the idle sandboxes through the server and reads their
// memory, removes them, then does the same with as many baseline
// containers (`docker run -d` of the same image, command and limits).
// A container's memory is its cgroup's (execd's and its child's
// anonymous memory, the page cache charged to it, the kernel's memory for
// it) plus the proportional share of its containerd-shim, which lives
// outside the cgroup; see footprint.
func (b *bench) density(ctx context.Context) ([]row, error) {
	k := b.set.density
	r := row{Name: fmt.Sprintf("density: idle sandboxes per GiB (%d idle)", k), Unit: "/GiB", BaseName: "docker run -d"}
	ours, err := b.ourFleet(ctx, k)
	if err != nil {
		return []row{r}, err
	}
	theirs, err := b.baselineFleet(ctx, k)
	if err != nil {
		return []row{r}, err
	}
	r.Value, r.Baseline = gib/ours.total(), gib/theirs.total()
	r.Ratio = r.Value / r.Baseline
	r.Note = fmt.Sprintf("per sandbox %.2f MiB = cgroup %.2f + shim PSS %.2f (execd RSS %.1f MiB, %.2f anonymous); baseline %.2f = %.2f + %.2f",
		ours.total()/mib, ours.cgroup/mib, ours.shimPSS/mib, ours.initRSS/mib, ours.initAnon/mib,
		theirs.total()/mib, theirs.cgroup/mib, theirs.shimPSS/mib)
	return []row{r}, nil
}

// ourFleet starts k sandboxes through the server, a few at a time, reads
// their memory once they idle, and deletes them.
func (b *bench) ourFleet(ctx context.Context, k int) (footprint, error) {
	ids := make([]string, k)
	var mu sync.Mutex
	var failed error
	forEach(k, 8, func(i int) {
		id, state, err := b.srv.create(ctx, createRequest(image, limits))
		if err == nil && state != "Running" {
			err = b.srv.waitRunning(ctx, id, 50*time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		ids[i], failed = id, errors.Join(failed, err)
	})
	defer func() { b.warn(b.srv.deleteAll(cleanupCtx(ctx), ids)) }()
	if failed != nil {
		return footprint{}, failed
	}
	cids, err := b.srv.containersOf(ctx, ids)
	if err != nil {
		return footprint{}, err
	}
	return measureFleet(ctx, cids)
}

// baselineFleet starts k baseline containers, a few at a time, reads
// their memory once they idle, and removes them.
func (b *bench) baselineFleet(ctx context.Context, k int) (footprint, error) {
	cids := make([]string, k)
	var mu sync.Mutex
	var failed error
	forEach(k, 8, func(i int) {
		cid, err := baselineRun(ctx, image)
		mu.Lock()
		defer mu.Unlock()
		cids[i], failed = cid, errors.Join(failed, err)
	})
	defer removeContainers(cids)
	if failed != nil {
		return footprint{}, failed
	}
	return measureFleet(ctx, cids)
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
