// Command k8sbench measures create to first command on Kubernetes: the
// time from a client's create request until its first command (`true`)
// has returned, one create at a time, in three ways in the same run:
//
//   - cold: opensandbox-server on the Kubernetes runtime, through the SDK
//     (POST /v1/sandboxes, GET until Running, GET the execd endpoint,
//     POST /command to execd with the sandbox's token);
//   - pooled: the same, with "extensions":{"poolRef":...} on a warm pool
//     sized so that every create finds a ready sandbox;
//   - baseline: what `kubectl run` + `kubectl exec` do, through
//     client-go: a bare Pod of the same image and limits running sleep,
//     watched until Running, then `true` executed through the API
//     server (remotecommand, WebSocket with SPDY fallback).
//
// It builds opensandbox-server from this tree and runs it on a
// throwaway configuration in a namespace of its own, made at the start
// and deleted at the end (on a failure and on Ctrl-C too). It uses the
// test cluster of `make k8s-up` (its kubeconfig .k8s/kubeconfig, or
// -kubeconfig), with the images opensandbox/busybox and opensandbox/execd
// imported into it. Without a cluster it prints one line and exits 0, so
// that `make bench` works without one; with CI=true or OSB_REQUIRE_ALL=1
// it fails instead.
//
//	go run ./bench/k8sbench [-mode full|quick] [-out bench/results] [-kubeconfig FILE] [-server-log FILE]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// image is the image of every sandbox and baseline pod, as the cluster's
// containerd names it.
const image = "docker.io/opensandbox/busybox:latest"

// entrypoint is what every sandbox and baseline pod runs.
var entrypoint = []string{"sleep", "infinity"}

// limits are the resource limits of every sandbox, the pool's template's
// too; the baseline pods get the same.
var limits = map[string]string{"cpu": "500m", "memory": "256Mi"}

// The requests of every pod (the runtime's cpu_request and
// memory_request): small, so that a full pool fits the test node's 2
// cores.
const (
	cpuRequest    = "10m"
	memoryRequest = "16Mi"
)

// settings are the sizes of one mode.
type settings struct {
	creates int // sequential creates to first command of each kind
}

var modes = map[string]settings{
	"full":  {creates: 30},
	"quick": {creates: 10},
}

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	kubeconfig := flag.String("kubeconfig", ".k8s/kubeconfig", "kubeconfig of the cluster (make k8s-up writes .k8s/kubeconfig)")
	serverLog := flag.String("server-log", "", "write the server's log, at debug level, to this file (default: warnings to stderr)")
	flag.Parse()
	set := benchkit.Mode("k8sbench", *mode, modes)
	ctx := benchkit.Interruptible()
	os.Exit(run(ctx, set, *mode, *out, *kubeconfig, *serverLog))
}

// run measures every row, prints the table, writes the results, and
// returns the exit status.
func run(ctx context.Context, set settings, mode, out, kubeconfig, serverLog string) int {
	start := time.Now()
	cl, err := connect(ctx, kubeconfig)
	if err != nil {
		if testenv.Required() {
			fmt.Fprintf(os.Stderr, "k8sbench: no cluster: %v; start it with make k8s-up\n", err)
			return 1
		}
		fmt.Printf("k8sbench: skipped: no cluster (%v); start it with make k8s-up\n", err)
		return 0
	}
	if err := cl.makeNamespace(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "k8sbench:", err)
		return 1
	}
	defer cl.deleteNamespace()
	fmt.Fprintf(os.Stderr, "k8sbench: namespace %s\n", cl.ns)

	logTo, level := io.Writer(os.Stderr), "warn"
	if serverLog != "" {
		f, err := os.Create(serverLog)
		if err != nil {
			fmt.Fprintln(os.Stderr, "k8sbench: server log:", err)
			return 1
		}
		defer f.Close()
		logTo, level = f, "debug"
	}
	srv, err := startServer(ctx, cl, logTo, level, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sbench:", err)
		return 1
	}
	defer srv.stop()
	nodeSrv, err := startServer(ctx, cl, logTo, level, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sbench:", err)
		return 1
	}
	defer nodeSrv.stop()
	w, err := cl.watchPods(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sbench:", err)
		return 1
	}
	b := &bench{set: set, cl: cl, srv: srv, nodeSrv: nodeSrv, watch: w, progress: os.Stderr}
	rows, err := b.runAll(ctx)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "k8sbench: interrupted; deleting the namespace")
		return 130
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sbench:", err)
		return 1
	}
	rep := report.Report{Benchmark: "k8s", Subject: "opensandbox on kubernetes", Mode: mode, Rows: rows,
		RatioNote:   "how many times faster than the baseline: baseline p50 / our p50 (below 1: the baseline is faster)",
		RatioFormat: "%.2fx"}
	rep.Print(os.Stdout)
	b.printPhases(os.Stdout)
	return rep.Finish("k8sbench", out, start, nil)
}

// errTimeout is a step that did not finish in its time.
var errTimeout = benchkit.ErrTimeout
