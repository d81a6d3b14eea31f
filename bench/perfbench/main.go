// Command perfbench prints the one table of the performance issue: this
// project against the Docker engine alone, measured in the same run.
//
//   - create to first command, p50 (p99), cold and from a warm pool:
//     POST /v1/sandboxes, GET until Running, GET the execd endpoint, run
//     `true` through execd; baseline `docker run -d` + `docker exec true`;
//   - the round trip of `true` through execd against `docker exec`;
//   - 100 concurrent creates (30 in quick mode), cold and pooled: wall
//     time, p99 of one create to its first command, errors; baseline the
//     same number of concurrent `docker run -d` + `docker exec true`;
//   - stdout stream and file throughput through execd against
//     `docker exec` and `docker cp`;
//   - density: idle sandboxes per GiB against idle `docker run -d`
//     containers of the same image, measured the same way, on the fleets
//     the concurrent cold creates leave.
//
// It builds execd (static) and opensandbox-server from this tree, starts
// the server on a throwaway configuration with its own label scope on
// the local Docker engine, and uses the image opensandbox/busybox (make
// images). When the server answers 501 on /v1/pools, the pooled rows say
// so and the run goes on. Every container it made is removed at the end,
// on a failure, and on Ctrl-C.
//
//	go run ./bench/perfbench [-mode full|quick] [-out bench/results] [-server-log FILE]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
)

// image is the image of every sandbox and baseline container.
const image = "opensandbox/busybox"

// limits are the resource limits of every sandbox, the pool's template's
// too; the baseline containers get the same.
var limits = map[string]string{"cpu": "500m", "memory": "256Mi"}

// entrypoint is what every sandbox of a normal create runs.
var entrypoint = []string{"sleep", "infinity"}

// settings are the sizes of one mode.
type settings struct {
	creates     int   // sequential creates to first command: cold, pooled, and baseline each
	poolBuffer  int   // the pool's buffer for the sequential pooled creates
	concurrent  int   // creates fired at once, cold, pooled and baseline each
	roundTrips  int   // timed `true` through execd
	dockerExecs int   // timed `docker exec true`
	streamBytes int64 // stdout streamed, in 1000-byte lines
	fileBytes   int64 // the file uploaded and downloaded
	fileRuns    int   // runs of each transfer; the median counts
}

var modes = map[string]settings{
	"full": {creates: 40, poolBuffer: 4, concurrent: 100, roundTrips: 500, dockerExecs: 30,
		streamBytes: 100_000_000, fileBytes: 512 << 20, fileRuns: 3},
	"quick": {creates: 10, poolBuffer: 4, concurrent: 30, roundTrips: 100, dockerExecs: 10,
		streamBytes: 20_000_000, fileBytes: 64 << 20, fileRuns: 1},
}

// row is one line of the results table.
type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	serverLog := flag.String("server-log", "", "write the server's log, at debug level, to this file (default: warnings to stderr)")
	flag.Parse()
	set := benchkit.Mode("perfbench", *mode, modes)
	ctx := benchkit.Interruptible()
	os.Exit(run(ctx, set, *mode, *out, *serverLog))
}

// run measures every row, prints the table, writes the results, and
// returns the exit status.
func run(ctx context.Context, set settings, mode, out, serverLog string) int {
	start := time.Now()
	removeLeftovers()
	defer removeLabelled(baselineLabel)
	logTo, level := io.Writer(os.Stderr), "warn"
	if serverLog != "" {
		f, err := os.Create(serverLog)
		if err != nil {
			fmt.Fprintln(os.Stderr, "perfbench: server log:", err)
			return 1
		}
		defer f.Close()
		logTo, level = f, "debug"
	}
	srv, err := startServer(ctx, logTo, level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "perfbench:", err)
		return 1
	}
	defer srv.stop()
	b := &bench{set: set, srv: srv, progress: os.Stderr}
	rows, failed := b.runAll(ctx)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "perfbench: interrupted; removing the containers")
		return 130
	}
	rep := report.Report{Benchmark: "perf", Subject: "opensandbox", Mode: mode, Rows: rows,
		RatioNote:   "how many times better than the baseline: baseline time / our time, our rate / baseline rate, our density / baseline density (below 1: the baseline is better)",
		RatioFormat: "%.2fx"}
	rep.Print(os.Stdout)
	return rep.Finish("perfbench", out, start, failed)
}

// bench holds what every step needs.
type bench struct {
	set      settings
	srv      *server
	progress io.Writer

	// baseline is the baseline's create-to-first-command runs, which the
	// cold and the pooled rows share.
	baseline []time.Duration
	// concurrentBase is the baseline's concurrent run, which the cold and
	// the pooled concurrent rows share.
	concurrentBase fired
	// ourIdle and baseIdle are the memory of the fleets of the concurrent
	// cold run, read once they idled: the density row.
	ourIdle, baseIdle footprint
}

// The rows of the table, in the order; the steps measure them in
// another.
const (
	rowCold = iota
	rowPooled
	rowRoundTrip
	rowConcurrentCold
	rowConcurrentPooled
	rowStream
	rowUpload
	rowDownload
	rowDensity
	numRows
)

// step measures one or more rows. On failure it returns the rows with
// their names, which the table then shows as failed.
type step struct {
	what string
	rows []int // where its rows go in the table, in the order it returns them
	run  func(ctx context.Context) ([]row, error)
}

// runAll runs every step. A step that fails marks its rows failed and the
// run goes on; its error is returned.
func (b *bench) runAll(ctx context.Context) (rows []row, failed []error) {
	steps := []step{
		{"warm-up", nil, b.warmUp},
		{"create to first command, cold", []int{rowCold}, b.coldCreates},
		{"create to first command, pooled", []int{rowPooled}, b.pooledCreates},
		{"round trip and throughput", []int{rowRoundTrip, rowStream, rowUpload, rowDownload}, b.throughput},
		{"concurrent creates, cold, and density", []int{rowConcurrentCold, rowDensity}, b.concurrentCold},
		{"concurrent creates, pooled", []int{rowConcurrentPooled}, b.concurrentPooled},
	}
	table := make([]*row, numRows)
	for _, s := range steps {
		if ctx.Err() != nil {
			break
		}
		t := time.Now()
		got, err := s.run(ctx)
		switch {
		case errors.Is(err, errNoPools):
			for i := range got {
				got[i].Missing = errNoPools.Error()
			}
		case err != nil:
			failed = append(failed, fmt.Errorf("%s: %w", s.what, err))
			for i := range got {
				got[i].Missing = "failed (see the log)"
			}
		}
		for i, r := range got {
			fmt.Fprintf(b.progress, "  %s: %s\n", r.Name, r.Ours())
			if i < len(s.rows) {
				table[s.rows[i]] = &got[i]
			}
		}
		fmt.Fprintf(b.progress, "perfbench: %s took %.1f s\n", s.what, time.Since(t).Seconds())
	}
	for _, r := range table {
		if r != nil {
			rows = append(rows, *r)
		}
	}
	return rows, failed
}

// cleanupCtx is for removing what a step made, even once ctx is done.
func cleanupCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// warmUp runs one create of each kind, untimed, so that the first timed
// run pays for no cold cache (image layers, the network, the engine's).
func (b *bench) warmUp(ctx context.Context) ([]row, error) {
	id, err := b.srv.createToCommand(ctx, benchkit.Sandbox(image, entrypoint, limits), 5*time.Millisecond)
	if id != "" {
		b.srv.delete(cleanupCtx(ctx), id)
	}
	if err != nil {
		return nil, err
	}
	cid, err := baselineCreateToCommand(ctx, image)
	if cid != "" {
		removeContainers([]string{cid})
	}
	return nil, err
}
