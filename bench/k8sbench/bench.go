package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/sdk"
)

// row is one line of the results table.
type row = report.Row

// poolName is the pool of the pooled row.
const poolName = "bench"

// pooledTarget is the target of the pooled row's p50, in milliseconds.
const pooledTarget = 300.0

// The figures the pooled row is compared with, as the table's note says
// them: measured elsewhere, not in this run.
const anchors = "anchors (not measured here): reference OpenSandbox pooled allocation ~1 s; kubernetes-sigs/agent-sandbox 500-800 ms from its warm pool"

// The kinds of create, in the order of the table.
const (
	kindCold = iota
	kindColdNode
	kindPooled
	kindBase
	numKinds
)

var kindNames = [numKinds]string{"cold", "cold, execd from the node", "pooled", "baseline"}

// The client's own steps, beside the pod's.
const (
	stepResponse = "create answered"  // POST /v1/sandboxes returned
	stepRunning  = "Running (client)" // the client's GET saw Running
	stepCommand  = "first command"    // `true` returned
)

// kindSteps are the steps shown for each kind, in order.
var kindSteps = [numKinds][]string{
	kindCold:     {stepResponse, stepSeen, stepScheduled, stepInitRun, stepInit, stepStarted, stepReady, stepRunning, stepCommand},
	kindColdNode: {stepResponse, stepSeen, stepScheduled, stepStarted, stepReady, stepRunning, stepCommand},
	kindPooled:   {stepTaken, stepToken, stepHandedIn, stepResponse, stepCommand},
	kindBase:     {stepSeen, stepScheduled, stepStarted, stepCommand},
}

// timedRun is one timed create to first command.
type timedRun struct {
	total time.Duration
	steps map[string]time.Duration // from the create request
}

// bench holds what every step needs.
type bench struct {
	set settings
	cl  *cluster
	srv *server
	// nodeSrv is a second server whose pods mount execd from a directory
	// of the node (execd_host_dir) instead of an init container.
	nodeSrv  *server
	watch    *podWatch
	progress io.Writer

	runs [numKinds][]timedRun
}

// runAll warms up, then times the cold creates alternating with the
// baseline's, then the pooled creates, and returns the table's rows.
func (b *bench) runAll(ctx context.Context) ([]row, error) {
	t := time.Now()
	if _, err := b.cold(ctx, b.srv, kindCold); err != nil {
		return nil, fmt.Errorf("warm-up, cold create: %w", err)
	}
	if _, err := b.cold(ctx, b.nodeSrv, kindColdNode); err != nil {
		return nil, fmt.Errorf("warm-up, cold create with execd from the node: %w", err)
	}
	if _, err := b.baseline(ctx, "warm-up"); err != nil {
		return nil, fmt.Errorf("warm-up, baseline: %w", err)
	}
	fmt.Fprintf(b.progress, "k8sbench: warm-up took %.1f s\n", time.Since(t).Seconds())

	t = time.Now()
	for i := range b.set.creates {
		r, err := b.cold(ctx, b.srv, kindCold)
		if err != nil {
			return nil, fmt.Errorf("cold create %d: %w", i+1, err)
		}
		b.runs[kindCold] = append(b.runs[kindCold], r)
		if r, err = b.cold(ctx, b.nodeSrv, kindColdNode); err != nil {
			return nil, fmt.Errorf("cold create with execd from the node %d: %w", i+1, err)
		}
		b.runs[kindColdNode] = append(b.runs[kindColdNode], r)
		if r, err = b.baseline(ctx, fmt.Sprintf("base-%d", i)); err != nil {
			return nil, fmt.Errorf("baseline %d: %w", i+1, err)
		}
		b.runs[kindBase] = append(b.runs[kindBase], r)
	}
	fmt.Fprintf(b.progress, "k8sbench: 2 x %d cold creates and %d baseline pods took %.1f s\n", b.set.creates, b.set.creates, time.Since(t).Seconds())

	t = time.Now()
	if err := b.pooledAll(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(b.progress, "k8sbench: the pool's fill and %d pooled creates took %.1f s\n", b.set.creates, time.Since(t).Seconds())
	return b.rows(), nil
}

// cold times one cold create to first command through srv and deletes
// the sandbox.
func (b *bench) cold(ctx context.Context, srv *server, kind int) (timedRun, error) {
	start := time.Now()
	id, answered, running, err := srv.createToCommand(ctx, coldRequest())
	if id == "" {
		return timedRun{}, err
	}
	end := time.Now()
	r := b.stepsOf("osb-"+id, start, kind)
	r.total = end.Sub(start)
	r.steps[stepResponse], r.steps[stepRunning], r.steps[stepCommand] = answered.Sub(start), running.Sub(start), r.total
	return r, errors.Join(err, b.deleteSandbox(ctx, srv, id))
}

// baseline times one bare pod to first command and deletes the pod.
func (b *bench) baseline(ctx context.Context, name string) (timedRun, error) {
	start := time.Now()
	made, err := b.baselineCreateToCommand(ctx, name)
	end := time.Now()
	r := b.stepsOf(name, start, kindBase)
	r.total = end.Sub(start)
	r.steps[stepCommand] = r.total
	if made != "" {
		err = errors.Join(err, b.deletePod(ctx, made))
	}
	return r, err
}

// poolBuffer is the pool's size: bufferMin = bufferMax = poolMin =
// poolMax. A claimed sandbox still counts against poolMax until it is
// deleted, so the pool starts its replacement only after the run, and
// the next run waits until it is ready: every create finds the pool full
// and no pod starts on the node while a create is timed.
const poolBuffer = 4

// pooledAll fills the pool, then times the pooled creates one at a time,
// each once the pool is full again.
func (b *bench) pooledAll(ctx context.Context) (retErr error) {
	n := b.set.creates
	c := sdk.Capacity{BufferMin: poolBuffer, BufferMax: poolBuffer, PoolMin: poolBuffer, PoolMax: poolBuffer}
	tmpl := sdk.PoolTemplate{Image: image, Entrypoint: entrypoint, Resources: limits}
	if err := benchkit.CreatePool(ctx, b.srv.c, poolName, tmpl, c); err != nil {
		return err
	}
	defer func() {
		retErr = errors.Join(retErr, benchkit.DeletePool(context.WithoutCancel(ctx), b.srv.c, poolName))
	}()
	t := time.Now()
	if err := benchkit.WaitPool(ctx, b.srv.c, poolName, poolBuffer, time.Minute, poolPoll); err != nil {
		return err
	}
	fmt.Fprintf(b.progress, "k8sbench: the pool of %d was full after %.1f s\n", poolBuffer, time.Since(t).Seconds())
	for i := range n {
		if err := benchkit.WaitPool(ctx, b.srv.c, poolName, poolBuffer, time.Minute, poolPoll); err != nil {
			return fmt.Errorf("pooled create %d: %w", i+1, err)
		}
		// The replacement's readiness probe and status updates are done.
		time.Sleep(time.Second)
		start := time.Now()
		id, answered, _, err := b.srv.createToCommand(ctx, pooledRequest(poolName))
		if id == "" {
			return fmt.Errorf("pooled create %d: %w", i+1, err)
		}
		end := time.Now()
		if err != nil {
			return errors.Join(fmt.Errorf("pooled create %d: %w", i+1, err), b.deleteSandbox(ctx, b.srv, id))
		}
		// The watch may see the hand-over's last write after the client
		// has its answer.
		b.watch.wait(ctx, "osb-"+id, stepHandedIn, 5*time.Second)
		r := b.stepsOf("osb-"+id, start, kindPooled)
		r.total = end.Sub(start)
		r.steps[stepResponse], r.steps[stepCommand] = answered.Sub(start), r.total
		b.runs[kindPooled] = append(b.runs[kindPooled], r)
		if err := b.deleteSandbox(ctx, b.srv, id); err != nil {
			return err
		}
	}
	return nil
}

// stepsOf reads the steps of the pod from the watch, from start.
func (b *bench) stepsOf(pod string, start time.Time, kind int) timedRun {
	r := timedRun{steps: map[string]time.Duration{}}
	for _, s := range kindSteps[kind] {
		if t, ok := b.watch.at(pod, s); ok {
			r.steps[s] = t.Sub(start)
		}
	}
	return r
}

// deleteSandbox deletes a sandbox through the server and waits until its
// pod is gone, so that the next run does not share the node with its
// teardown.
func (b *bench) deleteSandbox(ctx context.Context, srv *server, id string) error {
	ctx = context.WithoutCancel(ctx)
	if err := benchkit.Kill(ctx, srv.c, id); err != nil {
		return err
	}
	_, err := b.watch.wait(ctx, "osb-"+id, stepGone, time.Minute)
	return err
}

// deletePod deletes a baseline pod at once and waits until it is gone.
func (b *bench) deletePod(ctx context.Context, name string) error {
	ctx = context.WithoutCancel(ctx)
	zero := int64(0)
	if err := b.cl.cs.CoreV1().Pods(b.cl.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	_, err := b.watch.wait(ctx, name, stepGone, time.Minute)
	return err
}

func totals(runs []timedRun) []time.Duration {
	ds := make([]time.Duration, len(runs))
	for i, r := range runs {
		ds[i] = r.total
	}
	return ds
}

// spread is the note's "p90 X, mean Y ms".
func spread(ds []time.Duration) string {
	return fmt.Sprintf("p90 %s, mean %s ms", report.FormatValue(report.Percentile(ds, 0.9)), report.FormatValue(report.Mean(ds)))
}

// rows builds the table: cold and pooled against the baseline, and the
// baseline alone.
func (b *bench) rows() []row {
	const baseName = "bare Pod + exec through the API server"
	base := totals(b.runs[kindBase])
	n := b.set.creates
	mk := func(name string, ds []time.Duration, note string) row {
		r := row{Name: name, Unit: "ms", Value: report.Percentile(ds, 0.5), P99: report.Percentile(ds, 0.99),
			BaseName: baseName, Baseline: report.Percentile(base, 0.5), BaseP99: report.Percentile(base, 0.99),
			Note: spread(ds) + "; " + note}
		if r.Value > 0 {
			r.Ratio = r.Baseline / r.Value
		}
		return r
	}
	cold := mk("create to first command, cold, p50 (p99)", totals(b.runs[kindCold]),
		fmt.Sprintf("%d runs alternating with the baseline's; busybox, sleep, 500m/256Mi", n))
	coldNode := mk("create to first command, cold, execd from the node, p50 (p99)", totals(b.runs[kindColdNode]),
		fmt.Sprintf("%d runs; execd_host_dir: the pod mounts execd from the node, no init container", n))
	pooledDs := totals(b.runs[kindPooled])
	pooled := mk("create to first command, pooled, p50 (p99)", pooledDs,
		fmt.Sprintf("%d runs, each from a full pool of %d (refilled between runs); pooled p50 / target = %.2f; %s",
			n, poolBuffer, report.Percentile(pooledDs, 0.5)/pooledTarget, anchors))
	pooled.Target = fmt.Sprintf("p50 < %.0f ms", pooledTarget)
	pooled = pooled.Judge(pooled.Value < pooledTarget)
	baseline := row{Name: "baseline: " + baseName + ", p50 (p99)", Unit: "ms",
		Value: report.Percentile(base, 0.5), P99: report.Percentile(base, 0.99),
		Note: spread(base) + fmt.Sprintf("; kubectl run + kubectl exec true, through client-go (watch until the container runs, exec over WebSocket); %d runs", n)}
	return []row{cold, coldNode, pooled, baseline}
}

// printPhases prints, per kind of create, the median time from the create
// request to each step.
func (b *bench) printPhases(w io.Writer) {
	fmt.Fprintln(w, "\nwhere the time goes: median ms from the create request to each step, as the harness's watch saw it")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for k := range numKinds {
		var cells []string
		for _, s := range kindSteps[k] {
			var ds []time.Duration
			for _, r := range b.runs[k] {
				if d, ok := r.steps[s]; ok {
					ds = append(ds, d)
				}
			}
			if len(ds) == 0 {
				continue
			}
			cells = append(cells, fmt.Sprintf("%s %s", s, report.FormatValue(report.Percentile(ds, 0.5))))
		}
		fmt.Fprintf(tw, "  %s:\t%s\n", kindNames[k], strings.Join(slices.Clip(cells), ", "))
	}
	tw.Flush()
}
