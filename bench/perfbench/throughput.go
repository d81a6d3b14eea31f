package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/sdk"
)

// throughputLimits are the limits of the sandbox of the throughput rows:
// enough that neither a CPU quota nor page cache reclaim sets the pace.
var throughputLimits = map[string]string{"cpu": "2", "memory": "2Gi"}

// throughput measures, in one sandbox made through the server, the round
// trip of `true` and the stdout and file throughput of execd, against
// `docker exec` and `docker cp` on the sandbox's own container.
func (b *bench) throughput(ctx context.Context) (_ []row, retErr error) {
	mb := func(n int64) int64 { return n >> 20 }
	rows := []row{
		{Name: "command round trip (`true`), p50 (p99)", Unit: "ms", BaseName: "docker exec"},
		{Name: fmt.Sprintf("stdout stream, %d MB in 1000-byte lines", b.set.streamBytes/1_000_000), Unit: "MB/s", BaseName: "docker exec"},
		{Name: fmt.Sprintf("upload %d MiB to /tmp, median of %d", mb(b.set.fileBytes), b.set.fileRuns), Unit: "MB/s", BaseName: "docker cp in"},
		{Name: fmt.Sprintf("download %d MiB from /tmp, median of %d", mb(b.set.fileBytes), b.set.fileRuns), Unit: "MB/s", BaseName: "docker cp out"},
	}
	sb, err := benchkit.CreateToCommand(ctx, b.srv.c, benchkit.Sandbox(image, entrypoint, throughputLimits), 5*time.Millisecond)
	if sb != nil {
		defer func() { retErr = errors.Join(retErr, b.srv.delete(cleanupCtx(ctx), sb.ID)) }()
	}
	if err != nil {
		return rows, err
	}
	cids, err := b.srv.containersOf(ctx, []string{sb.ID})
	if err != nil {
		return rows, err
	}
	t := &transfer{b: b, sb: sb, cid: cids[0]}
	for i, measure := range []func(context.Context, *row) error{t.roundTrip, t.stream, t.upload, t.download} {
		if err := measure(ctx, &rows[i]); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// transfer measures one sandbox.
type transfer struct {
	b   *bench
	sb  *sdk.Sandbox
	cid string // the sandbox's container
}

// roundTrip times `true` through execd and through `docker exec`.
func (t *transfer) roundTrip(ctx context.Context, r *row) error {
	for range 20 { // warm the connection and the caches
		if err := benchkit.RunTrue(ctx, t.sb); err != nil {
			return err
		}
	}
	var ours, theirs []time.Duration
	for range t.b.set.roundTrips {
		start := time.Now()
		if err := benchkit.RunTrue(ctx, t.sb); err != nil {
			return err
		}
		ours = append(ours, time.Since(start))
	}
	for range t.b.set.dockerExecs {
		start := time.Now()
		if _, err := docker(ctx, "exec", t.cid, "true"); err != nil {
			return err
		}
		theirs = append(theirs, time.Since(start))
	}
	r.Value, r.P99 = report.Percentile(ours, 0.5), report.Percentile(ours, 0.99)
	r.Baseline, r.BaseP99 = report.Percentile(theirs, 0.5), report.Percentile(theirs, 0.99)
	r.Ratio = r.Baseline / r.Value
	r.Note = fmt.Sprintf("%d runs after 20 warm-ups; baseline %d runs", t.b.set.roundTrips, t.b.set.dockerExecs)
	return nil
}

// stream prints streamBytes in 1000-byte lines through execd, one event
// per line, and through `docker exec`, raw.
func (t *transfer) stream(ctx context.Context, r *row) error {
	const lineLen = 1000
	lines := t.b.set.streamBytes / lineLen
	cmd := fmt.Sprintf("yes %s | head -n %d", strings.Repeat("x", lineLen-1), lines)
	var got countingWriter
	start := time.Now()
	res, err := t.sb.Run(ctx, cmd, &sdk.RunOptions{Stdout: &got})
	ours := time.Since(start)
	if err == nil && !res.OK() {
		err = fmt.Errorf("stream: %s exited %d", cmd, res.ExitCode)
	}
	if err != nil {
		return err
	}
	n := got.n
	if n != lines*lineLen {
		return fmt.Errorf("stream: %d bytes through execd, want %d", n, lines*lineLen)
	}
	var count countingWriter
	dc := exec.CommandContext(ctx, "docker", "exec", t.cid, "sh", "-c", cmd)
	dc.Stdout = &count
	start = time.Now()
	if err := dc.Run(); err != nil {
		return fmt.Errorf("stream through docker exec: %w", err)
	}
	theirs := time.Since(start)
	if count.n != n {
		return fmt.Errorf("stream: %d bytes through docker exec, want %d", count.n, n)
	}
	r.Value, r.Baseline = float64(n)/1e6/ours.Seconds(), float64(n)/1e6/theirs.Seconds()
	r.Ratio = r.Value / r.Baseline
	r.Note = "execd sends one JSON event per line; docker exec raw bytes"
	return nil
}

// countingWriter counts what is written to it.
type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// upload sends fileBytes to /tmp through the SDK's upload (one multipart
// body, streamed) and with `docker cp`, fileRuns times each.
func (t *transfer) upload(ctx context.Context, r *row) error {
	local := filepath.Join(t.b.srv.dir, "upload.bin")
	f, err := os.Create(local)
	if err != nil {
		return fmt.Errorf("local file: %w", err)
	}
	_, err = io.CopyN(f, newPattern(t.b.set.fileBytes), t.b.set.fileBytes)
	if err = errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("local file: %w", err)
	}
	defer os.Remove(local)
	var ours, theirs []time.Duration
	for range t.b.set.fileRuns {
		d, err := t.uploadOnce(ctx, "/tmp/up.bin")
		if err != nil {
			return err
		}
		ours = append(ours, d)
		start := time.Now()
		if _, err := docker(ctx, "cp", local, t.cid+":/tmp/cp.bin"); err != nil {
			return err
		}
		theirs = append(theirs, time.Since(start))
	}
	mb := float64(t.b.set.fileBytes) / 1e6
	r.Value, r.Baseline = mb/benchkit.Median(ours).Seconds(), mb/benchkit.Median(theirs).Seconds()
	r.Ratio = r.Value / r.Baseline
	r.Note = "the container's disk (overlay); execd fsyncs, docker cp does not"
	return nil
}

// uploadOnce streams the file's bytes into path.
func (t *transfer) uploadOnce(ctx context.Context, path string) (time.Duration, error) {
	start := time.Now()
	if err := t.sb.Upload(ctx, sdk.UploadFile{Path: path, Content: newPattern(t.b.set.fileBytes), Mode: 0o644}); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// download reads the uploaded file back through execd and with
// `docker cp`, fileRuns times each, both into a file on the host.
func (t *transfer) download(ctx context.Context, r *row) error {
	local := filepath.Join(t.b.srv.dir, "download.bin")
	defer os.Remove(local)
	var ours, theirs []time.Duration
	for range t.b.set.fileRuns {
		d, err := t.downloadOnce(ctx, "/tmp/up.bin", local)
		if err != nil {
			return err
		}
		ours = append(ours, d)
		os.Remove(local)
		start := time.Now()
		if _, err := docker(ctx, "cp", t.cid+":/tmp/cp.bin", local); err != nil {
			return err
		}
		theirs = append(theirs, time.Since(start))
	}
	mb := float64(t.b.set.fileBytes) / 1e6
	r.Value, r.Baseline = mb/benchkit.Median(ours).Seconds(), mb/benchkit.Median(theirs).Seconds()
	r.Ratio = r.Value / r.Baseline
	return nil
}

// downloadOnce reads path from the sandbox into the file local.
func (t *transfer) downloadOnce(ctx context.Context, path, local string) (time.Duration, error) {
	start := time.Now()
	f, err := os.Create(local)
	if err != nil {
		return 0, fmt.Errorf("download: %w", err)
	}
	defer f.Close()
	rd, err := t.sb.Download(ctx, path)
	if err != nil {
		return 0, err
	}
	defer rd.Close()
	n, err := io.CopyBuffer(f, rd, make([]byte, 1<<20))
	if err == nil {
		err = f.Close()
	}
	if err != nil || n != t.b.set.fileBytes {
		return 0, fmt.Errorf("download: %d bytes of %d, %v", n, t.b.set.fileBytes, err)
	}
	return time.Since(start), nil
}

// pattern is a reader of n random-looking bytes that cost nothing to
// produce: one random MiB, repeated.
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
