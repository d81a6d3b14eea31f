package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/sdk"
)

// baseCreate names the baseline of every create row.
const baseCreate = "docker run -d + docker exec"

// The targets of the issue.
const (
	pooledP50    = 50.0  // ms, pooled create to first command
	pooledP99    = 150.0 // ms
	concurrentP9 = 500.0 // ms, p99 of concurrent pooled creates
)

// coldCreates times create to first command of a new sandbox, and the
// baseline, alternating, one at a time; each sandbox and container is
// removed before the next run.
func (b *bench) coldCreates(ctx context.Context) ([]row, error) {
	r := row{Name: "create to first command, cold, p50 (p99)", Unit: "ms", BaseName: baseCreate,
		Target: "p50 not slower than baseline",
		Note:   fmt.Sprintf("%s, %d runs each, alternating", image, b.set.creates)}
	var ours []time.Duration
	for range b.set.creates {
		start := time.Now()
		id, err := b.srv.createToCommand(ctx, benchkit.Sandbox(image, entrypoint, limits), 5*time.Millisecond)
		d := time.Since(start)
		if id != "" {
			err = errors.Join(err, b.srv.delete(cleanupCtx(ctx), id))
		}
		if err != nil {
			return []row{r}, err
		}
		ours = append(ours, d)

		start = time.Now()
		cid, err := baselineCreateToCommand(ctx, image)
		d = time.Since(start)
		if cid != "" {
			removeContainers([]string{cid})
		}
		if err != nil {
			return []row{r}, err
		}
		b.baseline = append(b.baseline, d)
	}
	r = b.createRow(r, ours)
	return []row{r.Judge(r.Value <= r.Baseline)}, nil
}

// createRow fills r with the percentiles of ours and of the baseline.
func (b *bench) createRow(r row, ours []time.Duration) row {
	r.Value, r.P99 = report.Percentile(ours, 0.5), report.Percentile(ours, 0.99)
	r.Baseline, r.BaseP99 = report.Percentile(b.baseline, 0.5), report.Percentile(b.baseline, 0.99)
	if r.Value > 0 {
		r.Ratio = r.Baseline / r.Value
	}
	return r
}

// poolTemplate is the template of the pools: the sandbox of a cold create.
func poolTemplate() sdk.PoolTemplate {
	return sdk.PoolTemplate{Image: image, Entrypoint: entrypoint, Resources: limits}
}

// pooledCreates times create to first command of a sandbox taken from a
// warm pool. Before each run the pool is full again, so that every run
// finds a sandbox waiting; the pool's refill after the take runs during
// the measure, as it would for a client.
func (b *bench) pooledCreates(ctx context.Context) (_ []row, retErr error) {
	r := row{Name: "create to first command, pooled, p50 (p99)", Unit: "ms", BaseName: baseCreate,
		Target: fmt.Sprintf("p50 < %.0f ms, p99 < %.0f ms", pooledP50, pooledP99),
		Note:   fmt.Sprintf("pool buffer %d, %d runs; baseline as above", b.set.poolBuffer, b.set.creates)}
	r = b.createRow(r, nil)
	if err := b.srv.createPool(ctx, poolTemplate(), b.set.poolBuffer, 2*b.set.poolBuffer); err != nil {
		return []row{r}, err
	}
	defer func() { retErr = errors.Join(retErr, b.srv.deletePool(cleanupCtx(ctx))) }()
	var ours []time.Duration
	for range b.set.creates {
		if err := b.srv.waitPool(ctx, b.set.poolBuffer, time.Minute); err != nil {
			return []row{r}, err
		}
		start := time.Now()
		id, err := b.srv.createToCommand(ctx, benchkit.Pooled(poolName, nil), 2*time.Millisecond)
		d := time.Since(start)
		if id != "" {
			err = errors.Join(err, b.srv.delete(cleanupCtx(ctx), id))
		}
		if err != nil {
			return []row{r}, err
		}
		ours = append(ours, d)
	}
	r = b.createRow(r, ours)
	return []row{r.Judge(r.Value < pooledP50 && r.P99 < pooledP99)}, nil
}

// fired is the outcome of creates fired at once.
type fired struct {
	wall time.Duration
	lat  []time.Duration // of the creates that succeeded
	ids  []string        // what was made, "" where nothing was
	ok   []string        // what was made and succeeded
	errs []error
}

// fire starts n calls of one at the same instant and waits for all.
func fire(n int, one func() (string, error)) fired {
	f := fired{ids: make([]string, n)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			t := time.Now()
			id, err := one()
			d := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			f.ids[i] = id
			if err != nil {
				f.errs = append(f.errs, err)
			} else {
				f.lat = append(f.lat, d)
				f.ok = append(f.ok, id)
			}
		}()
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	f.wall = time.Since(start)
	return f
}

// concurrentRow is the row of n creates at once, against the baseline's.
func (b *bench) concurrentRow(name string, ours fired) row {
	base := b.concurrentBase
	r := row{Name: name, Unit: "ms", BaseName: baseCreate,
		Value: float64(ours.wall.Milliseconds()), P99: report.Percentile(ours.lat, 0.99),
		Baseline: float64(base.wall.Milliseconds()), BaseP99: report.Percentile(base.lat, 0.99),
		Note: fmt.Sprintf("wall (p99 of one create to its first command); errors: %d of %d (baseline %d)",
			len(ours.errs), b.set.concurrent, len(base.errs))}
	if r.Value > 0 {
		r.Ratio = r.Baseline / r.Value
	}
	return r
}

// concurrentCold fires the creates of new sandboxes at once, then the
// baseline's `docker run -d` + `docker exec true` at once. Failed creates
// are part of the measure: the row counts them. Each fleet, once it
// idles, is measured for the density row before it is removed.
func (b *bench) concurrentCold(ctx context.Context) ([]row, error) {
	n := b.set.concurrent
	name := fmt.Sprintf("%d concurrent creates, cold: wall (p99)", n)
	density := row{Name: fmt.Sprintf("density: idle sandboxes per GiB (%d idle)", n), Unit: "/GiB", BaseName: "docker run -d"}
	ours := fire(n, func() (string, error) {
		return b.srv.createToCommand(ctx, benchkit.Sandbox(image, entrypoint, limits), 50*time.Millisecond)
	})
	b.warnErrors("cold create", ours.errs)
	cids, err := b.srv.containersOf(ctx, ours.ok)
	if err == nil {
		b.ourIdle, err = measureFleet(ctx, cids)
	}
	b.warn(b.srv.deleteAll(cleanupCtx(ctx), ours.ids))
	if err != nil {
		return []row{b.concurrentRow(name, ours), density}, err
	}
	b.concurrentBase = fire(n, func() (string, error) { return baselineCreateToCommand(ctx, image) })
	b.warnErrors("baseline create", b.concurrentBase.errs)
	b.baseIdle, err = measureFleet(ctx, b.concurrentBase.ok)
	removeContainers(b.concurrentBase.ids)
	if err != nil {
		return []row{b.concurrentRow(name, ours), density}, err
	}
	return []row{b.concurrentRow(name, ours), b.densityRow(density)}, ctx.Err()
}

// concurrentPooled fills a pool with as many sandboxes as it then
// creates at once.
func (b *bench) concurrentPooled(ctx context.Context) (_ []row, retErr error) {
	n := b.set.concurrent
	name := fmt.Sprintf("%d concurrent creates, pooled: wall (p99)", n)
	target := fmt.Sprintf("0 errors, p99 < %.0f ms", concurrentP9)
	r := b.concurrentRow(name, fired{})
	r.Value, r.Target, r.Note = 0, target, fmt.Sprintf("pool buffer %d; baseline as above", n)
	if err := b.srv.createPool(ctx, poolTemplate(), n, n); err != nil {
		return []row{r}, err
	}
	defer func() { retErr = errors.Join(retErr, b.srv.deletePool(cleanupCtx(ctx))) }()
	ours := fire(n, func() (string, error) {
		return b.srv.createToCommand(ctx, benchkit.Pooled(poolName, nil), 10*time.Millisecond)
	})
	b.warnErrors("pooled create", ours.errs)
	b.warn(b.srv.deleteAll(cleanupCtx(ctx), ours.ids))
	r = b.concurrentRow(name, ours)
	r.Target = target
	r.Note += fmt.Sprintf("; pool buffer %d", n)
	return []row{r.Judge(len(ours.errs) == 0 && r.P99 < concurrentP9)}, ctx.Err()
}

// warnErrors reports how many of the concurrent calls failed, and the
// first failure.
func (b *bench) warnErrors(what string, errs []error) {
	if len(errs) > 0 {
		fmt.Fprintf(b.progress, "perfbench: %d failures of %s, the first: %v\n", len(errs), what, errs[0])
	}
}

// warn reports an error that spoils no figure, such as a failed cleanup.
func (b *bench) warn(err error) {
	if err != nil {
		fmt.Fprintln(b.progress, "perfbench: warning:", err)
	}
}
