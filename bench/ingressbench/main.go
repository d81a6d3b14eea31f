// Command ingressbench prints the ingress table of the performance
// section: what the gateway (the real osb-ingress binary) costs against
// reaching the same port directly, in the same run.
//
//   - latency of small responses over one keep-alive connection, p50
//     (p99), through the gateway against direct (target: under 0.5 ms
//     added at p50);
//   - requests/s with 100 concurrent connections, against direct;
//   - throughput of a large download, against direct (target: at least
//     0.8x);
//   - route lookup with 5,000 sandboxes known: requests/s and p50 (p99)
//     with 100 connections each asking for a random one of 5,000
//     sandboxes, against 100 connections to one sandbox (every answer
//     then comes from the gateway's cache);
//   - the gateway's RSS idle and after the load.
//
// The sandbox's port is a separate process (this binary, re-executed as
// a plain HTTP server on loopback). The gateway finds sandboxes through
// a stand-in of the lifecycle server's ingress routes in this process
// (api.IngressTargetsPath), which knows 5,000 sandboxes, all on that
// port. Client, gateway and backend share the machine's cores, as they
// would on one host; the table says how many there were. Nothing needs
// root or Docker.
//
//	go run ./bench/ingressbench [-mode full|quick] [-out bench/results]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/ingress"
)

// settings are the sizes of one mode.
type settings struct {
	small     int           // sequential small requests, each way
	loadFor   time.Duration // each concurrent load run
	download  int64         // bytes of the large download
	downloads int           // downloads each way; the best counts
}

var modes = map[string]settings{
	"full":  {small: 5000, loadFor: 10 * time.Second, download: 1 << 30, downloads: 3},
	"quick": {small: 1000, loadFor: 3 * time.Second, download: 256 << 20, downloads: 2},
}

// Sizes of the setup.
const (
	sandboxes   = 5000
	connections = 100
	smallBody   = 64
	port        = 8080
)

type row = report.Row

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-backend" {
		serveBackend(os.Args[2])
		return
	}
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	flag.Parse()
	set := benchkit.Mode("ingressbench", *mode, modes)
	ctx := benchkit.Interruptible()
	os.Exit(run(ctx, set, *mode, *out))
}

// serveBackend is the sandbox's app: /small answers 64 bytes, /big?n=N
// streams N bytes.
func serveBackend(addr string) {
	small := []byte(strings.Repeat("x", smallBody))
	big := make([]byte, 256<<10)
	for i := range big {
		big[i] = byte(i)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(small)))
		w.Write(small)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k := min(n, int64(len(big)))
			if _, err := w.Write(big[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, mux))
	os.Exit(1)
}

// env is what the measures run against.
type env struct {
	direct  string // http://backend
	gateway string // http://gateway
	keys    *ingress.Keys
	ids     []string
	tokens  []string
	gwPID   int
	client  *http.Client
}

func run(ctx context.Context, set settings, mode, out string) int {
	start := time.Now()
	load0 := loadAverage()
	e, cleanup, err := setup(ctx)
	defer cleanup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingressbench:", err)
		return 1
	}
	var rows []row
	var failed []error
	add := func(name string, f func() (row, error)) {
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintf(os.Stderr, "ingressbench: %s\n", name)
		r, err := f()
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", name, err))
			r = row{Name: name, Missing: "failed: " + err.Error()}
		}
		rows = append(rows, r)
	}
	idle := rssMiB(e.gwPID)
	add("small response latency", func() (row, error) { return e.latency(ctx, set) })
	add("requests/s, 100 connections", func() (row, error) { return e.throughputRPS(ctx, set) })
	add("large download", func() (row, error) { return e.download(ctx, set) })
	add("route lookup, 5,000 sandboxes", func() (row, error) { return e.lookup(ctx, set) })
	rows = append(rows, row{Name: "gateway RSS", Unit: "MiB", Value: rssMiB(e.gwPID), Baseline: idle, BaseName: "idle",
		Ratio: rssMiB(e.gwPID) / idle, Note: "after the rows above; baseline: just started"})
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "ingressbench: interrupted")
		return 130
	}
	rep := report.Report{Benchmark: "ingress", Subject: "through osb-ingress", Mode: mode, Rows: rows,
		RatioNote:   "through the gateway / the baseline: above 1 costs more time or memory, below 1 moves fewer requests or bytes; " + strconv.Itoa(runtime.NumCPU()) + " CPUs shared by client, gateway and backend; load average " + load0 + " at the start",
		RatioFormat: "%.2fx"}
	rep.Print(os.Stdout)
	return rep.Finish("ingressbench", out, start, failed)
}

// setup starts the backend process, the stand-in server, and the
// gateway binary.
func setup(ctx context.Context) (*env, func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	dir, err := os.MkdirTemp("", "ingressbench-")
	if err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() { os.RemoveAll(dir) })

	// The sandbox's port.
	backAddr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, cleanup, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, cleanup, err
	}
	back := exec.Command(self, "-backend", backAddr)
	back.Stderr = os.Stderr
	if err := back.Start(); err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() { back.Process.Kill(); back.Wait() })

	// 5,000 sandboxes, all on that port.
	spec, err := ingress.GenerateKey('a')
	if err != nil {
		return nil, cleanup, err
	}
	keys, err := ingress.ParseKeys([]string{spec})
	if err != nil {
		return nil, cleanup, err
	}
	e := &env{direct: "http://" + backAddr, keys: keys}
	targets := map[string]api.IngressTarget{}
	for i := range sandboxes {
		id := fmt.Sprintf("%08x-0000-4000-8000-%012x", rand.Uint32(), i)
		tok, _ := keys.AccessToken(id)
		e.ids, e.tokens = append(e.ids, id), append(e.tokens, tok)
		targets[id] = api.IngressTarget{SandboxID: id, Port: port, State: "Running", Endpoint: backAddr}
	}
	apiKey := benchkit.RandomHex(16)
	standIn := http.NewServeMux()
	standIn.HandleFunc("GET "+api.IngressTargetsPath+"{id}/{port}", func(w http.ResponseWriter, r *http.Request) {
		t, ok := targets[r.PathValue("id")]
		if r.Header.Get(api.HeaderAPIKey) != apiKey {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodeDockerSandboxNotFound, Message: "not found"})
			return
		}
		json.NewEncoder(w).Encode(t)
	})
	sln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, cleanup, err
	}
	ss := &http.Server{Handler: standIn}
	go ss.Serve(sln)
	undo = append(undo, func() { ss.Close() })

	// The gateway.
	if err := benchkit.Build(ctx, dir, "./cmd/osb-ingress"); err != nil {
		return nil, cleanup, err
	}
	keyFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keyFile, []byte(spec+"\n"), 0o600); err != nil {
		return nil, cleanup, err
	}
	gwAddr, err := benchkit.FreeAddr()
	if err != nil {
		return nil, cleanup, err
	}
	gw := exec.Command(filepath.Join(dir, "osb-ingress"), "--listen", gwAddr, "--server", "http://"+sln.Addr().String(),
		"--signing-keys-file", keyFile, "--log-level", "warn")
	gw.Env = append(os.Environ(), "OSB_API_KEY="+apiKey)
	gw.Stderr = os.Stderr
	if err := gw.Start(); err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() { gw.Process.Kill(); gw.Wait() })
	e.gateway, e.gwPID = "http://"+gwAddr, gw.Process.Pid
	e.client = &http.Client{Transport: &http.Transport{
		MaxIdleConns: 2 * connections, MaxIdleConnsPerHost: 2 * connections, DisableCompression: true,
		ReadBufferSize: 256 << 10, WriteBufferSize: 64 << 10,
	}}
	for _, u := range []string{e.direct + "/small", e.gateway + "/readyz"} {
		if err := waitOK(ctx, e.client, u); err != nil {
			return nil, cleanup, err
		}
	}
	return e, cleanup, nil
}

func waitOK(ctx context.Context, c *http.Client, u string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.Get(u)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer 200: %v", u, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get sends one request; via the gateway when i >= 0 (to sandbox i, in
// header mode with its token).
func (e *env) get(ctx context.Context, i int, path string) (int64, error) {
	u := e.direct + path
	if i >= 0 {
		u = e.gateway + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	if i >= 0 {
		req.Header.Set(api.HeaderIngressTo, e.ids[i]+"-"+strconv.Itoa(port))
		req.Header.Set(api.HeaderSecureAccess, e.tokens[i])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.CopyBuffer(io.Discard, resp.Body, make([]byte, 256<<10))
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return n, err
}

// latency: sequential small requests over one connection, alternating
// direct and through the gateway so both see the same machine.
func (e *env) latency(ctx context.Context, set settings) (row, error) {
	var direct, gw []time.Duration
	for range 50 { // warm both connections and the cache
		e.get(ctx, 0, "/small")
		e.get(ctx, -1, "/small")
	}
	for range set.small {
		t := time.Now()
		if _, err := e.get(ctx, -1, "/small"); err != nil {
			return row{}, err
		}
		direct = append(direct, time.Since(t))
		t = time.Now()
		if _, err := e.get(ctx, 0, "/small"); err != nil {
			return row{}, err
		}
		gw = append(gw, time.Since(t))
	}
	r := row{Name: "small response (64 B) latency", Unit: "ms",
		Value: report.Percentile(gw, .5), P99: report.Percentile(gw, .99),
		Baseline: report.Percentile(direct, .5), BaseP99: report.Percentile(direct, .99), BaseName: "direct",
		Target: "< 0.5 ms added at p50"}
	r.Ratio = r.Value / r.Baseline
	r.Note = fmt.Sprintf("%.3f ms added at p50", r.Value-r.Baseline)
	return r.Judge(r.Value-r.Baseline < 0.5), nil
}

// load runs connections workers for d, each picking the sandbox pick()
// (-1: direct), and returns requests/s and the latencies.
func (e *env) load(ctx context.Context, d time.Duration, pick func(*rand.Rand) int) (float64, []time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var all []time.Duration
	var n atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := range connections {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var mine []time.Duration
			for ctx.Err() == nil {
				t := time.Now()
				if _, err := e.get(ctx, pick(rng), "/small"); err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
					}
					break
				}
				mine = append(mine, time.Since(t))
				n.Add(1)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, nil, err
	}
	return float64(n.Load()) / time.Since(start).Seconds(), all, nil
}

func (e *env) throughputRPS(ctx context.Context, set settings) (row, error) {
	direct, _, err := e.load(ctx, set.loadFor, func(*rand.Rand) int { return -1 })
	if err != nil {
		return row{}, err
	}
	gw, _, err := e.load(ctx, set.loadFor, func(*rand.Rand) int { return 0 })
	if err != nil {
		return row{}, err
	}
	return row{Name: "requests/s, 100 connections, 64 B", Unit: "req/s", Value: gw, Baseline: direct, BaseName: "direct",
		Ratio: gw / direct}, nil
}

func (e *env) download(ctx context.Context, set settings) (row, error) {
	path := "/big?n=" + strconv.FormatInt(set.download, 10)
	best := func(i int) (float64, error) {
		var top float64
		for range set.downloads {
			t := time.Now()
			n, err := e.get(ctx, i, path)
			if err != nil {
				return 0, err
			}
			if n != set.download {
				return 0, fmt.Errorf("got %d of %d bytes", n, set.download)
			}
			top = max(top, float64(n)/(1<<20)/time.Since(t).Seconds())
		}
		return top, nil
	}
	direct, err := best(-1)
	if err != nil {
		return row{}, err
	}
	cpu0 := cpuSeconds(e.gwPID)
	gw, err := best(0)
	if err != nil {
		return row{}, err
	}
	cpuPerGiB := (cpuSeconds(e.gwPID) - cpu0) / (float64(set.download*int64(set.downloads)) / (1 << 30))
	r := row{Name: fmt.Sprintf("download of %d MiB", set.download>>20), Unit: "MiB/s", Value: gw, Baseline: direct, BaseName: "direct",
		Ratio: gw / direct, Target: ">= 0.8x direct",
		Note: fmt.Sprintf("best of %d; the gateway spent %.2f CPU s per GiB", set.downloads, cpuPerGiB)}
	return r.Judge(r.Ratio >= 0.8), nil
}

// lookup: 100 connections over 5,000 sandboxes (most requests find the
// answer cached for 1 s, the rest ask the stand-in server) against 100
// connections to one sandbox.
func (e *env) lookup(ctx context.Context, set settings) (row, error) {
	one, oneLat, err := e.load(ctx, set.loadFor, func(*rand.Rand) int { return 0 })
	if err != nil {
		return row{}, err
	}
	many, manyLat, err := e.load(ctx, set.loadFor, func(r *rand.Rand) int { return r.IntN(sandboxes) })
	if err != nil {
		return row{}, err
	}
	if len(manyLat) == 0 || len(oneLat) == 0 {
		return row{}, errors.New("no requests completed")
	}
	return row{Name: "100 connections over 5,000 sandboxes", Unit: "ms",
		Value: report.Percentile(manyLat, .5), P99: report.Percentile(manyLat, .99),
		Baseline: report.Percentile(oneLat, .5), BaseP99: report.Percentile(oneLat, .99), BaseName: "one sandbox",
		Ratio: report.Percentile(manyLat, .5) / report.Percentile(oneLat, .5),
		Note:  fmt.Sprintf("%.0f req/s (one sandbox: %.0f)", many, one)}, nil
}

// loadAverage is the machine's 1-minute load average, as text.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// cpuSeconds is the user and system CPU time a process has used.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 14th and 15th of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // USER_HZ
}

// rssMiB is a process's VmRSS in MiB.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
