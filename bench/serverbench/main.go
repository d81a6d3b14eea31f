// Command serverbench measures opensandbox-server on the local Docker
// engine against the engine alone, in one run, and prints a table:
//
//   - create-to-first-command: POST /v1/sandboxes, wait for Running, get
//     the execd endpoint, run `true`; baseline `docker run -d` then the
//     first `docker exec true`, on the same image;
//
//   - listing 500 sandboxes (GET /v1/sandboxes?pageSize=200);
//
//   - the server's RSS with those 500 sandboxes.
//
//     go run ./bench/serverbench [-mode full|quick] [-out bench/results]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
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
	"github.com/opensandbox/opensandbox/bench/internal/lcclient"
	"github.com/opensandbox/opensandbox/bench/internal/report"
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

// row is one line of the results table.
type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	flag.Parse()
	set := benchkit.Mode("serverbench", *mode, modes)
	b, err := startServer(set)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverbench:", err)
		os.Exit(1)
	}
	rows, err := b.runAll()
	b.stop()
	rep := report.Report{Benchmark: "server", Subject: "server", Mode: *mode, RatioNote: "server time / baseline time (below 1.0 is faster than the baseline)", RatioFormat: "%.2f", Rows: rows}
	rep.Print(os.Stdout)
	if err == nil {
		err = rep.Write(*out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serverbench:", err)
		os.Exit(1)
	}
}

// bench is the server this harness started and a client for it.
type bench struct {
	lcclient.Client
	set   settings
	dir   string
	scope string
	cmd   *exec.Cmd
}

func startServer(set settings) (*bench, error) {
	dir, err := os.MkdirTemp("", "serverbench-")
	if err != nil {
		return nil, err
	}
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "./cmd/execd", "./cmd/opensandbox-server")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	b := &bench{set: set, dir: dir, scope: "bench-" + lcclient.RandomHex(4), Client: lcclient.Client{
		Key: lcclient.RandomHex(24), Base: "http://" + addr,
		HC: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}}
	cfg := fmt.Sprintf(`version = 1
[server]
listen = %q
api_key = %q
log_level = "warn"
[runtime]
type = "docker"
[runtime.docker]
data_dir = %q
label_scope = %q
default_memory = "256Mi"
`, addr, b.Key, filepath.Join(dir, "data"), b.scope)
	os.WriteFile(filepath.Join(dir, "sandbox.toml"), []byte(cfg), 0o600)
	b.cmd = exec.Command(filepath.Join(dir, "opensandbox-server"), "--config", filepath.Join(dir, "sandbox.toml"))
	b.cmd.Stderr = os.Stderr
	if err := b.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(b.Base + "/health"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			b.stop()
			return nil, fmt.Errorf("server did not start")
		}
	}
	return b, nil
}

// stop stops the server and removes everything of its scope.
func (b *bench) stop() {
	if b.cmd != nil && b.cmd.Process != nil {
		b.cmd.Process.Signal(os.Interrupt)
		b.cmd.Wait()
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

func (b *bench) create(entrypoint ...string) (string, error) {
	code, data, err := b.Do(context.Background(), "POST", "/v1/sandboxes", api.CreateSandboxRequest{
		Image: &api.ImageSpec{URI: b.set.image}, Entrypoint: entrypoint,
		ResourceLimits: map[string]string{"cpu": "1", "memory": "256Mi"},
	})
	if err != nil || code != 202 {
		return "", fmt.Errorf("create: %d %s %v", code, data, err)
	}
	var resp api.CreateSandboxResponse
	json.Unmarshal(data, &resp)
	return resp.ID, nil
}

func (b *bench) waitRunning(id string) error {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		_, data, err := b.Do(context.Background(), "GET", "/v1/sandboxes/"+id, nil)
		if err != nil {
			return err
		}
		var sb api.Sandbox
		json.Unmarshal(data, &sb)
		switch sb.Status.State {
		case "Running":
			return nil
		case "Failed":
			return fmt.Errorf("sandbox %s failed: %s", id, sb.Status.Message)
		}
	}
	return fmt.Errorf("sandbox %s did not start", id)
}

// firstCommand runs `true` through the sandbox's execd endpoint.
func (b *bench) firstCommand(id string) error {
	_, err := b.Run(context.Background(), id, "true")
	return err
}

// docker runs the docker CLI (see benchkit.Docker).
func docker(args ...string) (string, error) {
	return benchkit.Docker(context.Background(), 2*time.Minute, args...)
}

func (b *bench) createToFirstCommand() (row, error) {
	warm := func() { // first runs of each warm caches; not counted
		if id, err := b.create("sleep", "infinity"); err == nil {
			b.waitRunning(id)
			b.Do(context.Background(), "DELETE", "/v1/sandboxes/"+id, nil)
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
		id, err := b.create("sleep", "infinity")
		if err == nil {
			err = b.waitRunning(id)
		}
		if err == nil {
			err = b.firstCommand(id)
		}
		if err != nil {
			return row{}, err
		}
		ours = append(ours, time.Since(start))
		b.Do(context.Background(), "DELETE", "/v1/sandboxes/"+id, nil)
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
// memory.
func (b *bench) fleetRows() ([]row, error) {
	n := b.set.fleet
	start := time.Now()
	ids := make(chan string, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id, err := b.create("sleep", "infinity")
			if err == nil {
				err = b.waitRunning(id)
			}
			if err != nil {
				errs <- err
				return
			}
			ids <- id
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	fleetTime := time.Since(start)

	var lat []time.Duration
	for range b.set.lists {
		t := time.Now()
		code, data, err := b.Do(context.Background(), "GET", "/v1/sandboxes?pageSize=200", nil)
		if err != nil || code != 200 {
			return nil, fmt.Errorf("list: %d %v", code, err)
		}
		lat = append(lat, time.Since(t))
		var list api.ListSandboxesResponse
		json.Unmarshal(data, &list)
		if list.Pagination.TotalItems != n {
			return nil, fmt.Errorf("list reports %d sandboxes, want %d", list.Pagination.TotalItems, n)
		}
	}
	var filtered []time.Duration
	for range b.set.lists {
		t := time.Now()
		if code, _, err := b.Do(context.Background(), "GET", "/v1/sandboxes?state=Running&metadata=team%3Dnone&pageSize=200", nil); err != nil || code != 200 {
			return nil, fmt.Errorf("filtered list: %d %v", code, err)
		}
		filtered = append(filtered, time.Since(t))
	}
	time.Sleep(2 * time.Second)
	rss, err := readRSS(b.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	return []row{
		{Name: fmt.Sprintf("list %d sandboxes (pageSize=200), p50 (p99)", n), Unit: "ms", Value: report.Percentile(lat, 0.5), P99: report.Percentile(lat, 0.99), Target: "< 20 ms"},
		{Name: fmt.Sprintf("list %d sandboxes, filtered, p50 (p99)", n), Unit: "ms", Value: report.Percentile(filtered, 0.5), P99: report.Percentile(filtered, 0.99)},
		{Name: fmt.Sprintf("server RSS with %d sandboxes", n), Unit: "MB", Value: rss},
		{Name: fmt.Sprintf("%d creates, 16 at a time, until all Running", n), Unit: "s", Value: fleetTime.Seconds()},
	}, nil
}

func readRSS(pid int) (float64, error) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1000, err
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}

func (b *bench) runAll() ([]row, error) {
	r, err := b.createToFirstCommand()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "  %s: %.1f ms\n", r.Name, r.Value)
	rows := []row{r}
	fleet, err := b.fleetRows()
	return append(rows, fleet...), err
}
