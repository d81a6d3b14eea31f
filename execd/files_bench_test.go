package execd

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Benchmarks move files through real HTTP on loopback. EXECD_BENCH_MIB sets
// the file size (default 256) and EXECD_BENCH_DIR where files go (default
// a temporary directory; point it at a tmpfs to leave the disk out).

// patternReader yields n bytes of a fixed pseudo-random 64 KiB block,
// repeated, without allocating them: data that looks like a real binary
// file to the multipart parser.
type patternReader struct{ n, off int64 }

var pattern = func() []byte {
	b := make([]byte, 64<<10)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}()

func (z *patternReader) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	n := 0
	for n < len(p) {
		m := copy(p[n:], pattern[z.off%int64(len(pattern)):])
		n += m
		z.off += int64(m)
	}
	z.n -= int64(n)
	return n, nil
}

func benchSize(b *testing.B) int64 {
	if v := os.Getenv("EXECD_BENCH_MIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("EXECD_BENCH_MIB=%q: %v", v, err)
		}
		return n << 20
	}
	return 256 << 20
}

func benchDir(b *testing.B) string {
	if d := os.Getenv("EXECD_BENCH_DIR"); d != "" {
		d, err := os.MkdirTemp(d, "bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return b.TempDir()
}

// newBenchServer starts an execd server without a token on loopback for a
// benchmark and returns its base URL.
func newBenchServer(b *testing.B) string {
	_, c := newTestServer(b, func(cfg *Config) { cfg.AccessToken, cfg.Insecure = "", true })
	return c.base
}

func BenchmarkUpload(b *testing.B) {
	size := benchSize(b)
	base := newBenchServer(b)
	target := filepath.Join(benchDir(b), "big.bin")
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		body, ct := streamBody(metaPart(fmt.Sprintf(`{"path":%q}`, target)), mpart{name: "file", filename: "f", reader: &patternReader{n: size}})
		resp, err := http.Post(base+"/files/upload", ct, body)
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d: %s", resp.StatusCode, data)
		}
	}
	b.StopTimer()
	if fi, err := os.Stat(target); err != nil || fi.Size() != size {
		b.Fatalf("uploaded file: %v, %v", fi, err)
	}
}

func BenchmarkDownload(b *testing.B) {
	size := benchSize(b)
	base := newBenchServer(b)
	target := filepath.Join(benchDir(b), "big.bin")
	f, err := os.Create(target)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(f, &patternReader{n: size}); err != nil {
		b.Fatal(err)
	}
	f.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := http.Get(base + "/files/download?path=" + target)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil || n != size || resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d, %d bytes, %v", resp.StatusCode, n, err)
		}
	}
}
