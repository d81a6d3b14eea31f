// Command serverbench measures opensandbox-server on the local Docker
// engine against the engine alone, in one run, and prints a table:
//
//   - create-to-first-command: a create through the SDK, wait for
//     Running, run `true` through execd; baseline `docker run -d` then
//     the first `docker exec`, on the same image;
//
//   - listing the fleet (500 sandboxes in full mode, 30 in quick):
//     GET /v1/sandboxes?pageSize=200, plain and filtered;
//
//   - the server's memory, at start and with the fleet: VmRSS and
//     RssAnon of its process (/proc/PID/status) and the Go heap in use
//     (go_memstats_heap_inuse_bytes of its /metrics), each read 2 s after
//     the server's last request, with no garbage collection forced.
//
// It talks to the server through the SDK, as a client would.
//
//	go run ./bench/serverbench [-mode full|quick] [-out bench/results]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/sdk"
)

type settings struct {
	image     string
	creates   int // sequential create-to-first-command runs
	baselines int // docker run + exec runs
	fleet     int // sandboxes for the list and memory rows
	lists     int // GET /sandboxes requests timed
}

var modes = map[string]settings{
	"full":  {image: "opensandbox/python:3.11", creates: 40, baselines: 20, fleet: 500, lists: 100},
	"quick": {image: "opensandbox/python:3.11", creates: 10, baselines: 5, fleet: 30, lists: 50},
}

// settle is how long the server is left alone before its memory is read.
const settle = 2 * time.Second

// row is one line of the results table.
type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	flag.Parse()
	set := benchkit.Mode("serverbench", *mode, modes)
	ctx := benchkit.Interruptible()
	start := time.Now()
	b, err := startServer(ctx, set)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverbench:", err)
		os.Exit(1)
	}
	rows, err := b.runAll(ctx)
	b.stop()
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "serverbench: interrupted; the containers were removed")
		os.Exit(130)
	}
	rep := report.Report{Benchmark: "server", Subject: "server", Mode: *mode, RatioNote: "server time / baseline time (below 1.0 is faster than the baseline)", RatioFormat: "%.2f", Rows: rows}
	rep.Print(os.Stdout)
	fmt.Printf("run time %.0f s\n", time.Since(start).Seconds())
	if err == nil {
		err = rep.Write(*out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverbench:", err)
		os.Exit(1)
	}
}

// bench is the server this harness started and an SDK client for it.
type bench struct {
	c     *sdk.Client
	set   settings
	dir   string
	addr  string
	key   string
	scope string
	proc  *benchkit.Process
}

func startServer(ctx context.Context, set settings) (_ *bench, retErr error) {
	dir, err := os.MkdirTemp("", "serverbench-")
	if err != nil {
		return nil, err
	}
	b := &bench{set: set, dir: dir, scope: "bench-" + benchkit.RandomHex(4), key: benchkit.RandomHex(24)}
	defer func() {
		if retErr != nil {
			b.stop()
		}
	}()
	if err := benchkit.Build(ctx, dir, "./cmd/execd", "./cmd/opensandbox-server"); err != nil {
		return nil, err
	}
	if b.addr, err = benchkit.FreeAddr(); err != nil {
		return nil, err
	}
	if b.c, err = benchkit.NewClient(b.addr, b.key, 64); err != nil {
		return nil, err
	}
	rt := fmt.Sprintf(`[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
default_memory = "256Mi"
`, filepath.Join(dir, "data"), b.scope)
	b.proc, err = benchkit.StartServer(ctx, benchkit.ServerConfig{Dir: dir, Addr: b.addr, APIKey: b.key, LogLevel: "warn",
		Runtime: rt, LogTo: os.Stderr, HealthWithin: 30 * time.Second})
	return b, err
}

// stop stops the server and removes everything of its scope.
func (b *bench) stop() {
	if b.proc != nil {
		b.proc.Stop()
	}
	if b.c != nil {
		b.c.Close()
	}
	// Eight at a time: the docker CLI removes the IDs it is given in
	// parallel, and Debian's dockerd 20.10 has been seen to deadlock in
	// its network code when fifty containers exit at once.
	ids, _ := exec.Command("docker", "ps", "-aq", "--filter", "label=opensandbox.scope="+b.scope).Output()
	for batch := range slices.Chunk(strings.Fields(string(ids)), 8) {
		exec.Command("docker", append([]string{"rm", "-f"}, batch...)...).Run()
	}
	os.RemoveAll(b.dir)
}

// sandbox is every sandbox of the run: the image of the settings,
// sleeping.
func (b *bench) sandbox() sdk.CreateOptions {
	return benchkit.Sandbox(b.set.image, []string{"sleep", "infinity"}, map[string]string{"cpu": "1", "memory": "256Mi"})
}

// docker runs the docker CLI (see benchkit.Docker).
func docker(args ...string) (string, error) {
	return benchkit.Docker(context.Background(), 2*time.Minute, args...)
}

func (b *bench) createToFirstCommand(ctx context.Context) (row, error) {
	warm := func() { // first runs of each warm caches; not counted
		if sb, err := benchkit.CreateToCommand(ctx, b.c, b.sandbox(), 2*time.Millisecond); sb != nil {
			benchkit.Kill(context.WithoutCancel(ctx), b.c, sb.ID)
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "serverbench: warm-up create:", err)
		}
		if id, err := docker("run", "-d", "--label", "opensandbox.scope="+b.scope, b.set.image, "sleep", "infinity"); err == nil {
			docker("exec", id, "true")
			docker("rm", "-f", id)
		}
	}
	warm()
	var ours, theirs []time.Duration
	for range b.set.creates {
		start := time.Now()
		sb, err := benchkit.CreateToCommand(ctx, b.c, b.sandbox(), 2*time.Millisecond)
		d := time.Since(start)
		if sb != nil {
			err = errors.Join(err, benchkit.Kill(context.WithoutCancel(ctx), b.c, sb.ID))
		}
		if err != nil {
			return row{}, err
		}
		ours = append(ours, d)
	}
	for range b.set.baselines {
		start := time.Now()
		id, err := docker("run", "-d", "--label", "opensandbox.scope="+b.scope, b.set.image, "sleep", "infinity")
		if err == nil {
			_, err = docker("exec", id, "true")
		}
		if err != nil {
			return row{}, err
		}
		theirs = append(theirs, time.Since(start))
		docker("rm", "-f", id)
	}
	r := row{Name: "create to first command, p50 (p99)", Unit: "ms",
		Value: report.Percentile(ours, 0.5), P99: report.Percentile(ours, 0.99),
		Baseline: report.Percentile(theirs, 0.5), BaseP99: report.Percentile(theirs, 0.99), BaseName: "docker run -d + docker exec",
		Target: "ratio <= 1.0 (not slower)",
		Note:   fmt.Sprintf("%s; %d runs (baseline %d)", b.set.image, b.set.creates, b.set.baselines)}
	r.Ratio = r.Value / r.Baseline
	return r, nil
}

// fleetRows creates the fleet, times listing it, and reads the server's
// memory: the rows of the lists and the creates, then those of memory.
func (b *bench) fleetRows(ctx context.Context) (_, mem []row, _ error) {
	n := b.set.fleet
	start := time.Now()
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := b.c.Create(ctx, b.sandbox())
			if err == nil {
				err = benchkit.WaitRunning(ctx, b.c, sb.ID, 20*time.Millisecond)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, nil, err
	}
	fleetTime := time.Since(start)

	var lat []time.Duration
	for range b.set.lists {
		t := time.Now()
		list, err := b.c.List(ctx, sdk.ListOptions{PageSize: 200})
		if err != nil {
			return nil, nil, err
		}
		lat = append(lat, time.Since(t))
		if list.Pagination.TotalItems != n {
			return nil, nil, fmt.Errorf("list reports %d sandboxes, want %d", list.Pagination.TotalItems, n)
		}
	}
	var filtered []time.Duration
	for range b.set.lists {
		t := time.Now()
		if _, err := b.c.List(ctx, sdk.ListOptions{States: []string{sdk.StateRunning}, Metadata: map[string]string{"team": "none"}, PageSize: 200}); err != nil {
			return nil, nil, fmt.Errorf("filtered list: %w", err)
		}
		filtered = append(filtered, time.Since(t))
	}
	mem, err := b.memory(ctx, fmt.Sprintf("with %d sandboxes", n), "the last list")
	if err != nil {
		return nil, nil, err
	}
	return []row{
		{Name: fmt.Sprintf("list %d sandboxes (pageSize=200), p50 (p99)", n), Unit: "ms", Value: report.Percentile(lat, 0.5), P99: report.Percentile(lat, 0.99), Target: "< 20 ms"},
		{Name: fmt.Sprintf("list %d sandboxes, filtered, p50 (p99)", n), Unit: "ms", Value: report.Percentile(filtered, 0.5), P99: report.Percentile(filtered, 0.99)},
		{Name: fmt.Sprintf("%d creates, 16 at a time, until all Running", n), Unit: "s", Value: fleetTime.Seconds()},
	}, mem, nil
}

// memory waits settle, then reads the server's memory: three rows named
// when, the last request before being after.
func (b *bench) memory(ctx context.Context, when, after string) ([]row, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(settle):
	}
	status, err := procStatus(b.proc.PID(), "VmRSS", "RssAnon")
	if err != nil {
		return nil, err
	}
	// Scraped after /proc was read, as the scrape itself allocates.
	heap, err := b.heapInUse(ctx)
	if err != nil {
		return nil, err
	}
	read := fmt.Sprintf("read %v after %s, no GC forced", settle, after)
	return []row{
		{Name: "server VmRSS " + when, Unit: "MiB", Value: status["VmRSS"] / 1024,
			Note: "/proc/PID/status VmRSS: every resident page of the process, its binary's file pages included; " + read},
		{Name: "server RssAnon " + when, Unit: "MiB", Value: status["RssAnon"] / 1024,
			Note: "/proc/PID/status RssAnon: resident anonymous memory (Go heap, stacks, runtime), what the process itself costs; " + read},
		{Name: "server Go heap in use " + when, Unit: "MiB", Value: heap / (1 << 20),
			Note: "go_memstats_heap_inuse_bytes of the server's /metrics: heap spans in use, live objects and garbage not yet collected; " + read},
	}, nil
}

// procStatus reads fields (in kB) of /proc/PID/status.
func procStatus(pid int, fields ...string) (map[string]float64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/status"
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !slices.Contains(fields, name) {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, name, err)
		}
		out[name] = kb
	}
	for _, name := range fields {
		if _, ok := out[name]; !ok {
			return nil, fmt.Errorf("%s has no %s", path, name)
		}
	}
	return out, sc.Err()
}

// heapInUse scrapes the server's /metrics for the Go heap in use, in
// bytes.
func (b *bench) heapInUse(ctx context.Context) (float64, error) {
	const series = "go_memstats_heap_inuse_bytes"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(api.HeaderAPIKey, b.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("scrape /metrics: %w", err)
	}
	return 0, fmt.Errorf("/metrics has no %s", series)
}

func (b *bench) runAll(ctx context.Context) ([]row, error) {
	idle, err := b.memory(ctx, "at start", "its /health answered")
	if err != nil {
		return nil, err
	}
	r, err := b.createToFirstCommand(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "  %s: %.1f ms\n", r.Name, r.Value)
	fleet, mem, err := b.fleetRows(ctx)
	rows := append([]row{r}, fleet...)
	rows = append(rows, idle...)
	return append(rows, mem...), err
}
