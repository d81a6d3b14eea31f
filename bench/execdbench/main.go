// Command execdbench measures execd inside a real container against the
// Docker engine doing the same work (docker exec, docker cp) on the same
// container, in one run, and prints a table with the ratio of each row.
//
//	go run ./bench/execdbench [-mode full|quick] [-out bench/results]
//
// It needs a running Docker engine and the local images (make images).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
)

const execdPath = "/opt/opensandbox/bin/execd"

type settings struct {
	image       string
	roundTrips  int // sequential `true` runs through execd
	dockerExecs int // sequential `docker exec true` runs
	streamBytes int64
	fileBytes   int64
	concurrency int
	// idleAfter is how long execd idles after the runs before its RSS is
	// read again; 0 leaves that row out (quick mode: it would take most
	// of the run).
	idleAfter time.Duration
}

var modes = map[string]settings{
	"full":  {image: "opensandbox/python:3.11", roundTrips: 1000, dockerExecs: 50, streamBytes: 100_000_000, fileBytes: 1 << 30, concurrency: 200, idleAfter: 25 * time.Second},
	"quick": {image: "opensandbox/python:3.11", roundTrips: 200, dockerExecs: 15, streamBytes: 20_000_000, fileBytes: 128 << 20, concurrency: 50},
}

// row is one line of the results table.
type row = report.Row

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	flag.Parse()
	set := benchkit.Mode("execdbench", *mode, modes)
	rows, err := runAll(set)
	rep := report.Report{Benchmark: "execd", Subject: "execd", Mode: *mode, RatioNote: "how many times better execd is than the baseline (time: baseline/execd; rate: execd/baseline)", RatioFormat: "%.1fx", Rows: rows}
	rep.Print(os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "execdbench:", err)
		os.Exit(1)
	}
	if err := rep.Write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "execdbench:", err)
		os.Exit(1)
	}
}

// bench holds the container under test and a client for its execd.
type bench struct {
	set    settings
	cid    string
	base   string
	token  string
	hc     *http.Client
	tmp    string
	stderr io.Writer
}

func runAll(set settings) (rows []row, err error) {
	tmp, err := os.MkdirTemp("", "execdbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "execd")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/execd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build execd: %v\n%s", err, out)
	}
	var tok [16]byte
	rand.Read(tok[:])
	b := &bench{set: set, token: hex.EncodeToString(tok[:]), tmp: tmp, stderr: os.Stderr,
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}}
	out, err := dockerOut("run", "-d", "--label", "osb-bench=1", "-p", fmt.Sprintf("127.0.0.1::%d", api.ExecdPort),
		"--tmpfs", fmt.Sprintf("/scratch:size=%d", 2*set.fileBytes+64<<20),
		"-v", bin+":"+execdPath+":ro", "--entrypoint", execdPath, set.image,
		"--access-token", b.token, "--", "sleep", "infinity")
	if err != nil {
		return nil, err
	}
	b.cid = strings.TrimSpace(out)
	defer exec.Command("docker", "rm", "-f", b.cid).Run()
	port, err := dockerOut("port", b.cid, fmt.Sprintf("%d/tcp", api.ExecdPort))
	if err != nil {
		return nil, err
	}
	b.base = "http://" + strings.TrimSpace(strings.Split(port, "\n")[0])
	if err := b.waitReady(); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond)
	idle, idleAnon, err := b.execdRSS()
	if err != nil {
		return nil, err
	}

	steps := []func() (row, error){
		b.roundTrip,
		b.prefixedRoundTrip,
		func() (row, error) { return b.streaming(1000) },
		func() (row, error) { return b.streaming(76) },
		func() (row, error) { return b.upload("/tmp", "the container's disk (overlay), fsync included") },
		func() (row, error) { return b.upload("/scratch", "a tmpfs in the container: no disk in the way") },
		b.download,
		b.concurrent,
	}
	for _, step := range steps {
		r, err := step()
		if err != nil {
			return rows, err
		}
		fmt.Fprintf(b.stderr, "  %s: %.3g %s\n", r.Name, r.Value, r.Unit)
		rows = append(rows, r)
	}
	rows = append(rows, row{Name: "execd RSS, idle after start", Unit: "MB", Value: idle, Target: "< 15 MB",
		Note: fmt.Sprintf("anonymous %.1f MB, the rest the binary's shared pages", idleAnon)})
	if set.idleAfter == 0 {
		return rows, nil
	}
	time.Sleep(set.idleAfter) // two janitor ticks: the heap of the runs is returned
	after, afterAnon, err := b.execdRSS()
	if err != nil {
		return rows, err
	}
	rows = append(rows, row{Name: fmt.Sprintf("execd RSS, idle %.0f s after the runs above", set.idleAfter.Seconds()), Unit: "MB", Value: after, Target: "< 15 MB",
		Note: fmt.Sprintf("anonymous %.1f MB", afterAnon)})
	return rows, nil
}

// dockerOut runs the docker CLI (see benchkit.Docker).
func dockerOut(args ...string) (string, error) {
	return benchkit.Docker(context.Background(), 5*time.Minute, args...)
}

func (b *bench) req(method, path string, body io.Reader) *http.Request {
	return b.reqAt(b.base, method, path, body)
}

// reqAt is req against another base URL of the same execd.
func (b *bench) reqAt(base, method, path string, body io.Reader) *http.Request {
	req, _ := http.NewRequest(method, base+path, body)
	req.Header.Set(api.HeaderExecdToken, b.token)
	return req
}

func (b *bench) waitReady() error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := b.hc.Do(b.req("GET", "/ping", nil))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
	}
	return errors.New("execd did not answer")
}

// execdRSS reads execd's resident set size from the host's /proc, in MB:
// the whole of it, and the anonymous part (heap and stacks; the rest is
// the binary's pages, shared and reclaimable).
func (b *bench) execdRSS() (total, anon float64, err error) {
	out, err := dockerOut("inspect", "-f", "{{.State.Pid}}", b.cid)
	if err != nil {
		return 0, 0, err
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(out) + "/status")
	if err != nil {
		return 0, 0, err
	}
	field := func(name string) float64 {
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				return kb / 1000
			}
		}
		return 0
	}
	return field("VmRSS"), field("RssAnon"), nil
}

// command runs a foreground command and consumes its stream, returning
// the number of output bytes and the exit evalue ("0" on success).
func (b *bench) command(cmd string) (int64, string, error) {
	return b.commandAt(b.base, cmd)
}

// commandAt is command against another base URL of the same execd.
func (b *bench) commandAt(base, cmd string) (int64, string, error) {
	body, _ := json.Marshal(api.RunCommandRequest{Command: cmd})
	resp, err := b.hc.Do(b.reqAt(base, "POST", "/command", bytes.NewReader(body)))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		return 0, "", fmt.Errorf("status %d: %s", resp.StatusCode, data)
	}
	dec := api.NewEventDecoder(resp.Body)
	var n int64
	exit := ""
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			return n, exit, nil
		}
		if err != nil {
			return n, exit, err
		}
		switch ev.Type {
		case api.EventStdout, api.EventStderr:
			n += int64(len(ev.Text)) + 1
		case api.EventComplete:
			exit = "0"
		case api.EventError:
			exit = ev.Error.EValue
		}
	}
}

func (b *bench) roundTrip() (row, error) {
	for i := 0; i < 20; i++ { // warm up connections and caches
		b.command("true")
	}
	var ours []time.Duration
	for i := 0; i < b.set.roundTrips; i++ {
		start := time.Now()
		if _, exit, err := b.command("true"); err != nil || exit != "0" {
			return row{}, fmt.Errorf("true through execd: exit %q, %v", exit, err)
		}
		ours = append(ours, time.Since(start))
	}
	var theirs []time.Duration
	for i := 0; i < b.set.dockerExecs; i++ {
		start := time.Now()
		if _, err := dockerOut("exec", b.cid, "true"); err != nil {
			return row{}, err
		}
		theirs = append(theirs, time.Since(start))
	}
	r := row{Name: "`true` round trip, p50 (p99)", Unit: "ms",
		Value: report.Percentile(ours, 0.5), P99: report.Percentile(ours, 0.99),
		Baseline: report.Percentile(theirs, 0.5), BaseP99: report.Percentile(theirs, 0.99), BaseName: "docker exec",
		Target: "p50 < 3 ms, >= 20x faster"}
	r.Ratio = r.Baseline / r.Value
	return r, nil
}

// prefixedRoundTrip compares the `true` round trip through the endpoint
// form {host}:{port}/proxy/{execd's port} with the plain one, alternating
// the two so that both see the same machine. execd serves the prefix in
// process, so the two should not differ beyond noise.
func (b *bench) prefixedRoundTrip() (row, error) {
	prefixed := b.base + "/proxy/" + strconv.Itoa(api.ExecdPort)
	for i := 0; i < 20; i++ {
		b.commandAt(prefixed, "true")
	}
	var with, without []time.Duration
	for i := 0; i < b.set.roundTrips; i++ {
		for _, base := range []string{prefixed, b.base} {
			start := time.Now()
			if _, exit, err := b.commandAt(base, "true"); err != nil || exit != "0" {
				return row{}, fmt.Errorf("true through %s: exit %q, %v", base, exit, err)
			}
			if base == prefixed {
				with = append(with, time.Since(start))
			} else {
				without = append(without, time.Since(start))
			}
		}
	}
	r := row{Name: "`true` round trip via /proxy/{execd port}, p50 (p99)", Unit: "ms",
		Value: report.Percentile(with, 0.5), P99: report.Percentile(with, 0.99),
		Baseline: report.Percentile(without, 0.5), BaseP99: report.Percentile(without, 0.99), BaseName: "no prefix",
		Target: "p50 within 5% of no prefix"}
	r.Ratio = r.Baseline / r.Value
	return r.Judge(r.Value <= r.Baseline*1.05), nil
}

// streaming prints streamBytes in lines of lineLen bytes.
func (b *bench) streaming(lineLen int) (row, error) {
	lines := b.set.streamBytes / int64(lineLen)
	cmd := fmt.Sprintf("yes %s | head -n %d", strings.Repeat("x", lineLen-1), lines)
	start := time.Now()
	n, exit, err := b.command(cmd)
	if err != nil || exit != "0" {
		return row{}, fmt.Errorf("stream: exit %q, %v", exit, err)
	}
	ours := time.Since(start)
	if n != lines*int64(lineLen) {
		return row{}, fmt.Errorf("stream: got %d bytes, want %d", n, lines*int64(lineLen))
	}
	start = time.Now()
	dc := exec.Command("docker", "exec", b.cid, "sh", "-c", cmd)
	var count countingWriter
	dc.Stdout = &count
	if err := dc.Run(); err != nil {
		return row{}, err
	}
	theirs := time.Since(start)
	mb := float64(n) / 1e6
	r := row{Name: fmt.Sprintf("stdout stream %d MB, %d-byte lines", int(mb), lineLen), Unit: "MB/s",
		Value: mb / ours.Seconds(), Baseline: float64(count.n) / 1e6 / theirs.Seconds(), BaseName: "docker exec"}
	if lineLen >= 1000 {
		r.Target = ">= 200 MB/s"
	} else {
		r.Note = "one JSON event per line"
	}
	r.Ratio = r.Value / r.Baseline
	return r, nil
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// pattern is a reader of n pseudo-random-looking bytes that costs nothing
// to produce.
type pattern struct {
	n, off int64
	block  []byte
}

func newPattern(n int64) *pattern {
	block := make([]byte, 1<<20)
	rand.Read(block)
	return &pattern{n: n, block: block}
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	k := copy(b, p.block[p.off%int64(len(p.block)):])
	k = int(min(int64(k), p.n-p.off))
	p.off += int64(k)
	return k, nil
}

// repeats is how many times the file transfers run; the median counts.
const repeats = 3

// upload sends the file into dir in the container, through execd and
// through docker cp.
func (b *bench) upload(dir, where string) (row, error) {
	var runs []time.Duration
	for range repeats {
		d, err := b.uploadOnce(dir + "/bench.bin")
		if err != nil {
			return row{}, err
		}
		runs = append(runs, d)
	}
	ours := benchkit.Median(runs)
	local := filepath.Join(b.tmp, "bench.bin")
	f, err := os.Create(local)
	if err != nil {
		return row{}, err
	}
	io.CopyBuffer(f, newPattern(b.set.fileBytes), make([]byte, 1<<20))
	f.Close()
	start := time.Now()
	if _, err := dockerOut("cp", local, b.cid+":"+dir+"/bench-cp.bin"); err != nil {
		return row{}, err
	}
	theirs := time.Since(start)
	os.Remove(local)
	mb := float64(b.set.fileBytes) / 1e6
	r := row{Name: fmt.Sprintf("upload %d MiB to %s (median of %d)", b.set.fileBytes>>20, dir, repeats), Unit: "MB/s",
		Value: mb / ours.Seconds(), Baseline: mb / theirs.Seconds(), BaseName: "docker cp in",
		Target: ">= 500 MB/s", Note: where}
	r.Ratio = r.Value / r.Baseline
	return r, nil
}

// uploadOnce sends the file the way a careful client does: one multipart
// body whose length is known up front, so it travels without chunked
// encoding, with the file's bytes streamed, never held in memory.
func (b *bench) uploadOnce(path string) (time.Duration, error) {
	var head bytes.Buffer
	mw := multipart.NewWriter(&head)
	h := make(map[string][]string)
	h["Content-Disposition"] = []string{`form-data; name="metadata"; filename="metadata"`}
	h["Content-Type"] = []string{"application/json"}
	part, _ := mw.CreatePart(h)
	fmt.Fprintf(part, `{"path":%q,"mode":644}`, path)
	mw.CreateFormFile("file", "bench.bin")
	tail := "\r\n--" + mw.Boundary() + "--\r\n"
	body := io.MultiReader(&head, newPattern(b.set.fileBytes), strings.NewReader(tail))
	req := b.req("POST", "/files/upload", body)
	req.ContentLength = int64(head.Len()) + b.set.fileBytes + int64(len(tail))
	req.Header.Set("Content-Type", mw.FormDataContentType())
	start := time.Now()
	resp, err := b.hc.Do(req)
	if err != nil {
		return 0, err
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("upload: %d %s", resp.StatusCode, data)
	}
	return time.Since(start), nil
}

func (b *bench) download() (row, error) {
	var runs []time.Duration
	buf := make([]byte, 1<<20)
	for range repeats {
		start := time.Now()
		resp, err := b.hc.Do(b.req("GET", "/files/download?path=/tmp/bench.bin", nil))
		if err != nil {
			return row{}, err
		}
		n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n != b.set.fileBytes {
			return row{}, fmt.Errorf("download: status %d, %d bytes, %v", resp.StatusCode, n, err)
		}
		runs = append(runs, time.Since(start))
	}
	ours := benchkit.Median(runs)
	local := filepath.Join(b.tmp, "bench-out.bin")
	start := time.Now()
	if _, err := dockerOut("cp", b.cid+":/tmp/bench-cp.bin", local); err != nil {
		return row{}, err
	}
	theirs := time.Since(start)
	os.Remove(local)
	b.command("rm -f /tmp/bench.bin /tmp/bench-cp.bin /scratch/bench.bin /scratch/bench-cp.bin")
	mb := float64(b.set.fileBytes) / 1e6
	r := row{Name: fmt.Sprintf("download %d MiB from /tmp (median of %d)", b.set.fileBytes>>20, repeats), Unit: "MB/s",
		Value: mb / ours.Seconds(), Baseline: mb / theirs.Seconds(), BaseName: "docker cp out", Target: ">= 500 MB/s"}
	r.Ratio = r.Value / r.Baseline
	return r, nil
}

// concurrent starts `concurrency` commands at once, through execd and
// through docker exec.
func (b *bench) concurrent() (row, error) {
	run := func(one func(i int) error) (time.Duration, []time.Duration, int) {
		var mu sync.Mutex
		var lat []time.Duration
		errs := 0
		var wg sync.WaitGroup
		start := time.Now()
		for i := 0; i < b.set.concurrency; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := time.Now()
				err := one(i)
				mu.Lock()
				defer mu.Unlock()
				lat = append(lat, time.Since(t))
				if err != nil {
					errs++
					if errs <= 3 {
						fmt.Fprintln(b.stderr, "  concurrent error:", err)
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start), lat, errs
	}
	ourWall, ourLat, ourErrs := run(func(i int) error {
		n, exit, err := b.command("echo " + strconv.Itoa(i))
		if err == nil && (exit != "0" || n != int64(len(strconv.Itoa(i))+1)) {
			err = fmt.Errorf("command %d: exit %q, %d bytes", i, exit, n)
		}
		return err
	})
	theirWall, theirLat, theirErrs := run(func(i int) error {
		out, err := dockerOut("exec", b.cid, "echo", strconv.Itoa(i))
		if err == nil && strings.TrimSpace(out) != strconv.Itoa(i) {
			err = fmt.Errorf("docker exec %d: %q", i, out)
		}
		return err
	})
	r := row{Name: fmt.Sprintf("%d concurrent commands: wall (p99)", b.set.concurrency), Unit: "ms",
		Value: float64(ourWall.Milliseconds()), P99: report.Percentile(ourLat, 0.99),
		Baseline: float64(theirWall.Milliseconds()), BaseP99: report.Percentile(theirLat, 0.99), BaseName: "docker exec",
		Target: "zero errors", Note: fmt.Sprintf("errors: execd %d, docker exec %d", ourErrs, theirErrs)}
	r.Ratio = r.Baseline / r.Value
	if ourErrs > 0 {
		return r, fmt.Errorf("%d of %d concurrent commands failed", ourErrs, b.set.concurrency)
	}
	return r, nil
}
