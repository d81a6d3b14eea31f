// Command cpbench measures `osb cp` against `docker cp` on the same
// sandbox container, in one run, and prints a table:
//
//   - a directory of 1,000 small files (1 to 4 KiB), into the sandbox and
//     out of it;
//   - one large file (1 GiB; 128 MiB in quick mode), in and out;
//   - both uploads again with osb cp --sync, which returns only once the
//     data is on the sandbox's disk (docker cp never waits for that).
//
// Every copy is checked: the file count and bytes of the tree, the
// SHA-256 of the large file after its round trip.
//
//	go run ./bench/cpbench [-mode full|quick] [-out bench/results]
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
	"github.com/opensandbox/opensandbox/bench/internal/report"
	"github.com/opensandbox/opensandbox/internal/testserver"
	"github.com/opensandbox/opensandbox/sdk"
)

type settings struct {
	image      string
	smallFiles int
	largeBytes int64
	runs       int
}

var modes = map[string]settings{
	"full":  {image: "opensandbox/busybox", smallFiles: 1000, largeBytes: 1 << 30, runs: 3},
	"quick": {image: "opensandbox/busybox", smallFiles: 1000, largeBytes: 128 << 20, runs: 1},
}

func main() {
	mode := flag.String("mode", "full", "full or quick")
	out := flag.String("out", "bench/results", "directory for the JSON results and the PNG chart")
	flag.Parse()
	set := benchkit.Mode("cpbench", *mode, modes)
	rows, err := run(set)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cpbench:", err)
		os.Exit(1)
	}
	rep := report.Report{Benchmark: "cp", Subject: "osb cp", Mode: *mode, Rows: rows,
		RatioNote: "docker cp time / osb cp time (above 1.0: osb cp is faster)", RatioFormat: "%.2fx"}
	rep.Print(os.Stdout)
	if err := rep.Write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "cpbench:", err)
		os.Exit(1)
	}
}

// bench holds what every measure needs.
type bench struct {
	set       settings
	osb       string
	env       []string
	sb        *sdk.Sandbox
	container string
	local     string
}

func run(set settings) ([]report.Row, error) {
	dir, err := os.MkdirTemp("", "cpbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	osb := filepath.Join(dir, "osb")
	build := exec.Command("go", "build", "-trimpath", "-o", osb, "./cmd/osb")
	build.Dir = testserver.ModuleRoot()
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build osb: %v\n%s", err, out)
	}
	srv, err := testserver.New(testserver.Options{})
	if err != nil {
		return nil, err
	}
	defer srv.Close()

	ctx := context.Background()
	client, err := sdk.NewClient(sdk.Config{Domain: srv.Addr, APIKey: srv.APIKey})
	if err != nil {
		return nil, err
	}
	defer client.Close()
	sb, err := client.Create(ctx, sdk.CreateOptions{Image: set.image, Resources: map[string]string{"cpu": "2", "memory": "1Gi"}})
	if err != nil {
		return nil, err
	}
	container, err := docker("ps", "-q", "--filter", "label=opensandbox.id="+sb.ID)
	if err != nil || container == "" {
		return nil, fmt.Errorf("find the sandbox's container: %v", err)
	}
	b := &bench{set: set, osb: osb, sb: sb, container: container, local: dir,
		env: append(os.Environ(), "HOME="+dir, sdk.EnvDomain+"="+srv.Addr, sdk.EnvAPIKey+"="+srv.APIKey)}

	fmt.Fprintln(os.Stderr, "cpbench: writing the local data")
	tree := filepath.Join(dir, "tree")
	treeBytes, err := writeTree(tree, set.smallFiles)
	if err != nil {
		return nil, err
	}
	large := filepath.Join(dir, "large.bin")
	largeSum, err := writeLarge(large, set.largeBytes)
	if err != nil {
		return nil, err
	}

	var rows []report.Row
	for _, m := range []struct {
		name  string
		local string
		bytes int64
		check func(string) error
	}{
		{fmt.Sprintf("%d small files", set.smallFiles), tree, treeBytes, func(p string) error { return checkTree(p, set.smallFiles, treeBytes) }},
		{fmt.Sprintf("one %d MiB file", set.largeBytes>>20), large, set.largeBytes, func(p string) error { return checkSum(p, largeSum) }},
	} {
		in, out, err := b.measure(m.local, m.check)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		for _, dir := range []struct {
			what       string
			ours, base []time.Duration
		}{{"into the sandbox", in[0], in[1]}, {"out of the sandbox", out[0], out[1]}} {
			ours, base := benchkit.Median(dir.ours), benchkit.Median(dir.base)
			rows = append(rows, report.Row{
				Name: m.name + ", " + dir.what, Unit: "s",
				Value: ours.Seconds(), Baseline: base.Seconds(), BaseName: "docker cp",
				Ratio: base.Seconds() / ours.Seconds(),
				Note:  fmt.Sprintf("%.0f MB/s vs %.0f MB/s", float64(m.bytes)/ours.Seconds()/1e6, float64(m.bytes)/base.Seconds()/1e6),
			})
			fmt.Fprintf(os.Stderr, "  %s, %s: osb cp %v, docker cp %v\n", m.name, dir.what, ours.Round(time.Millisecond), base.Round(time.Millisecond))
		}
		// The same upload, waiting until the data is on the sandbox's
		// disk, which docker cp never does.
		synced, err := b.measureSynced(m.local)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		base := benchkit.Median(in[1])
		rows = append(rows, report.Row{
			Name: m.name + ", into the sandbox, osb cp --sync", Unit: "s",
			Value: synced.Seconds(), Baseline: base.Seconds(), BaseName: "docker cp (no sync)",
			Ratio: base.Seconds() / synced.Seconds(),
			Note:  fmt.Sprintf("%.0f MB/s, on disk when it returns", float64(m.bytes)/synced.Seconds()/1e6),
		})
	}
	return rows, nil
}

// measureSynced times osb cp --sync of src into the sandbox.
func (b *bench) measureSynced(src string) (time.Duration, error) {
	var ds []time.Duration
	for i := range b.set.runs {
		remote := fmt.Sprintf("/tmp/cp-sync-%d", i)
		d, err := b.timed([]string{b.osb, "cp", "-q", "--sync", src, b.sb.ID + ":" + remote})
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
		ctx := context.Background()
		if err := b.sb.RemoveDir(ctx, remote); err != nil {
			b.sb.Remove(ctx, remote)
		}
	}
	return benchkit.Median(ds), nil
}

// measure copies src into the sandbox and back out with both tools, runs
// times each, alternating, and checks every copy that comes out. It
// returns the times in, then out; [0] for osb cp, [1] for docker cp.
func (b *bench) measure(src string, check func(string) error) (in, out [2][]time.Duration, err error) {
	ctx := context.Background()
	for i := range b.set.runs {
		for tool := range 2 {
			remote := fmt.Sprintf("/tmp/cp-%d-%d", tool, i)
			local := filepath.Join(b.local, fmt.Sprintf("back-%d-%d", tool, i))
			var up, down []string
			if tool == 0 {
				up = []string{b.osb, "cp", "-q", src, b.sb.ID + ":" + remote}
				down = []string{b.osb, "cp", "-q", b.sb.ID + ":" + remote, local}
			} else {
				up = []string{"docker", "cp", "-q", src, b.container + ":" + remote}
				down = []string{"docker", "cp", "-q", b.container + ":" + remote, local}
			}
			d, err := b.timed(up)
			if err != nil {
				return in, out, err
			}
			in[tool] = append(in[tool], d)
			if d, err = b.timed(down); err != nil {
				return in, out, err
			}
			out[tool] = append(out[tool], d)
			if err := check(local); err != nil {
				return in, out, fmt.Errorf("%s: %w", strings.Join(down[:2], " "), err)
			}
			os.RemoveAll(local)
			if err := b.sb.RemoveDir(ctx, remote); err != nil {
				b.sb.Remove(ctx, remote)
			}
		}
	}
	return in, out, nil
}

// timed runs argv and returns how long it took. The host's dirty pages
// are written out first, so that no copy pays for the one before it.
func (b *bench) timed(argv []string) (time.Duration, error) {
	syscall.Sync()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = b.env
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
	return d, nil
}

// writeTree writes n files of 1 to 4 KiB in 20 directories and returns
// their total size.
func writeTree(dir string, n int) (int64, error) {
	var total int64
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("d%02d", i%20), fmt.Sprintf("f%04d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return 0, err
		}
		data := make([]byte, 1024+i*3%3072)
		rand.Read(data)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return 0, err
		}
		total += int64(len(data))
	}
	return total, nil
}

func checkTree(dir string, files int, bytes int64) error {
	var n int
	var total int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n++
			total += fi.Size()
		}
		return err
	})
	if err == nil && (n != files || total != bytes) {
		err = fmt.Errorf("copied tree has %d files, %d bytes; want %d, %d", n, total, files, bytes)
	}
	return err
}

func writeLarge(path string, n int64) ([32]byte, error) {
	f, err := os.Create(path)
	if err != nil {
		return [32]byte{}, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, n); err != nil {
		return [32]byte{}, err
	}
	return [32]byte(h.Sum(nil)), nil
}

func checkSum(path string, want [32]byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if [32]byte(h.Sum(nil)) != want {
		return fmt.Errorf("the copy of %s differs from the original", path)
	}
	return nil
}

// docker runs the docker CLI (see benchkit.Docker).
func docker(args ...string) (string, error) {
	return benchkit.Docker(context.Background(), 10*time.Minute, args...)
}
