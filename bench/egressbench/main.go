// Command egressbench prints the egress table of the performance
// section: what a network policy (strict mode, osb-egress beside the
// sandbox) costs, each figure against the same measure without a policy,
// in the same run.
//
//   - create to first command, cold, with a policy against without one
//     (a warm pool cannot hold sandboxes with a policy yet: the row says
//     so);
//   - connection setup, measured inside the sandbox by netprobe (bench
//     http): TCP connect plus one small HTTP request to the web server of
//     the local internet, through the strict proxy against a sandbox
//     without a policy, p50 (p99); and a DNS answer through the DNS proxy
//     against Docker's resolver;
//   - throughput of one large download through the proxy against without
//     it;
//   - policy update latency (PATCH /policy until it answers, which it does
//     once the change is persisted, in nftables and in the matcher) with
//     10 and 1,000 rules, against GET /policy on the same API;
//   - osb-egress RSS (VmRSS of its supervisor and worker) idle, and with
//     1,000 connections held open through the proxy.
//
// The local internet is a network namespace made by internal/standin,
// with a name server for bench.test and a web server on addresses of
// 203.0.113.0/24 routed to it from the host only: no packet leaves the
// machine. It needs root, Docker, and the images opensandbox/busybox and
// opensandbox/egress (make images). It builds execd, opensandbox-server
// and netprobe from this tree, starts the server on a throwaway
// configuration, and removes every container, network and namespace it
// made at the end, on a failure, and on Ctrl-C.
//
//	go run ./bench/egressbench [-mode full|quick] [-out bench/results] [-server-log FILE]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/sdk"
)

// image is the image of every sandbox.
const image = "opensandbox/busybox"

// entrypoint is what every sandbox runs.
var entrypoint = []string{"sleep", "infinity"}

// createLimits are the limits of the sandboxes of the create rows;
// probeLimits those of the two sandboxes the other rows measure in,
// enough that a CPU quota does not set the pace of a download.
var (
	createLimits = map[string]string{"cpu": "500m", "memory": "256Mi"}
	probeLimits  = map[string]string{"cpu": "2", "memory": "1Gi"}
)

// settings are the sizes of one mode.
type settings struct {
	creates   int   // cold creates, with and without a policy each
	conns     int   // connections timed in each sandbox, over rounds
	rounds    int   // alternations of the connection and DNS measures
	queries   int   // DNS queries timed in each sandbox, over rounds
	download  int64 // bytes of the large download
	downloads int   // downloads in each sandbox; the median counts
	updates   int   // timed PATCHes at each policy size, and GETs
	held      int   // connections held open for the RSS row
}

var modes = map[string]settings{
	"full":  {creates: 30, conns: 1000, rounds: 4, queries: 1000, download: 1 << 30, downloads: 3, updates: 50, held: 1000},
	"quick": {creates: 10, conns: 200, rounds: 2, queries: 200, download: 256 << 20, downloads: 1, updates: 20, held: 1000},
}

// row is one line of the results table.
type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	serverLog := flag.String("server-log", "", "write the server's log, at debug level, to this file (default: warnings to stderr)")
	flag.Parse()
	set := benchkit.Mode("egressbench", *mode, modes)
	ctx := benchkit.Interruptible()
	os.Exit(run(ctx, set, *mode, *out, *serverLog))
}

// run measures every row, prints the table, writes the results, and
// returns the exit status.
func run(ctx context.Context, set settings, mode, out, serverLog string) int {
	start := time.Now()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "egressbench: needs root (a network namespace stands in for the internet)")
		return 1
	}
	logTo, level := io.Writer(os.Stderr), "warn"
	if serverLog != "" {
		f, err := os.Create(serverLog)
		if err != nil {
			fmt.Fprintln(os.Stderr, "egressbench: server log:", err)
			return 1
		}
		defer f.Close()
		logTo, level = f, "debug"
	}
	in, err := newInternet()
	if err != nil {
		fmt.Fprintln(os.Stderr, "egressbench:", err)
		return 1
	}
	defer in.close()
	srv, err := startServer(ctx, in, logTo, level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "egressbench:", err)
		return 1
	}
	defer srv.stop()
	b := &bench{set: set, srv: srv, in: in, progress: os.Stderr}
	rows, failed := b.runAll(ctx)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "egressbench: interrupted; removing the containers")
		return 130
	}
	rep := report.Report{Benchmark: "egress", Subject: "with a policy (strict)", Mode: mode, Rows: rows,
		RatioNote:   "with a policy / without one (the baseline; for the RSS row, idle): above 1 costs more time or memory, below 1 moves fewer bytes",
		RatioFormat: "%.2fx"}
	rep.Print(os.Stdout)
	return rep.Finish("egressbench", out, start, failed)
}

// bench holds what every step needs.
type bench struct {
	set      settings
	srv      *server
	in       *internet
	progress io.Writer

	// ours runs with the policy, free without one; both have netprobe at
	// /tmp/netprobe. Made by the step "the probe sandboxes".
	ours, free *sdk.Sandbox
	// idleRSS is osb-egress's RSS, in bytes, before any traffic.
	idleRSS float64
}

// The rows of the table, in order.
const (
	rowCold = iota
	rowPooled
	rowConnect
	rowDNS
	rowDownload
	rowUpdate10
	rowUpdate1000
	rowRSSIdle
	rowRSSHeld
	numRows
)

// step measures one or more rows. On failure it returns the rows with
// their names, which the table then shows as failed.
type step struct {
	what string
	rows []int // where its rows go in the table, in the order it returns them
	run  func(ctx context.Context) ([]row, error)
	// probes: the step measures in the probe sandboxes, so it cannot run
	// when they could not be made.
	probes bool
}

// runAll runs every step; a step that fails marks its rows failed and the
// run goes on, unless it was the one that makes the probe sandboxes.
func (b *bench) runAll(ctx context.Context) (rows []row, failed []error) {
	defer b.deleteProbes(cleanupCtx(ctx))
	steps := []step{
		{"warm-up", nil, b.warmUp, false},
		{"create to first command, cold", []int{rowCold}, b.creates, false},
		{"create to first command, pooled", []int{rowPooled}, b.pooledCreates, false},
		{"the probe sandboxes, osb-egress idle", []int{rowRSSIdle}, b.probes, false},
		{"connection setup and DNS", []int{rowConnect, rowDNS}, b.connections, true},
		{"download", []int{rowDownload}, b.download, true},
		{"policy updates", []int{rowUpdate10, rowUpdate1000}, b.updates, true},
		{"osb-egress with connections held", []int{rowRSSHeld}, b.heldRSS, true},
	}
	table := make([]*row, numRows)
	for _, s := range steps {
		if ctx.Err() != nil {
			break
		}
		if s.probes && b.ours == nil {
			failed = append(failed, fmt.Errorf("%s: skipped, no probe sandboxes", s.what))
			continue
		}
		t := time.Now()
		got, err := s.run(ctx)
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", s.what, err))
			for i := range got {
				if got[i].Missing == "" {
					got[i].Missing = "failed (see the log)"
				}
			}
		}
		for i, r := range got {
			fmt.Fprintf(b.progress, "  %s: %s\n", r.Name, r.Ours())
			if i < len(s.rows) {
				table[s.rows[i]] = &got[i]
			}
		}
		fmt.Fprintf(b.progress, "egressbench: %s took %.1f s\n", s.what, time.Since(t).Seconds())
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

// basePolicy is the policy of every sandbox with one: deny by default,
// the web server's name allowed.
func basePolicy() *api.NetworkPolicy {
	return &api.NetworkPolicy{DefaultAction: "deny", Egress: []api.NetworkRule{{Action: "allow", Target: webName}}}
}

// sandboxOpts is a create of a sandbox with limits, with policy when not
// nil.
func sandboxOpts(limits map[string]string, policy *api.NetworkPolicy) sdk.CreateOptions {
	o := benchkit.Sandbox(image, entrypoint, limits)
	o.NetworkPolicy = policy
	return o
}

// warmUp runs one create of each kind, untimed, so that the first timed
// run pays for no cold cache (image layers, the network, the engine's).
func (b *bench) warmUp(ctx context.Context) ([]row, error) {
	var errs []error
	for _, p := range []*api.NetworkPolicy{basePolicy(), nil} {
		sb, err := b.srv.createToCommand(ctx, sandboxOpts(createLimits, p))
		errs = append(errs, err, b.srv.delete(cleanupCtx(ctx), sb))
	}
	return nil, errors.Join(errs...)
}

// probeResult is netprobe's bench line (internal/netprobe/bench.go).
type probeResult struct {
	OK      bool    `json:"ok"`
	Detail  string  `json:"detail"`
	N       int     `json:"n"`
	Samples []int64 `json:"samples_us"`
	Bytes   int64   `json:"bytes"`
	Micros  int64   `json:"micros"`
}

// netprobe runs /tmp/netprobe with args in sb and returns its last line,
// which must say ok.
func netprobe(ctx context.Context, sb *sdk.Sandbox, args string) (probeResult, error) {
	res, err := sb.Run(ctx, "/tmp/netprobe "+args, nil)
	if err != nil {
		return probeResult{}, fmt.Errorf("netprobe %s in %s: %w", args, sb.ID, err)
	}
	var p probeResult
	if err := json.Unmarshal([]byte(lastLine(res.Stdout)), &p); err != nil {
		return p, fmt.Errorf("netprobe %s in %s: output %q %q: %w", args, sb.ID, res.Stdout, res.Stderr, err)
	}
	if !p.OK {
		return p, fmt.Errorf("netprobe %s in %s: %s", args, sb.ID, p.Detail)
	}
	return p, nil
}
