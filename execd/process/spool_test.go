package process

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// newSpool makes a spool of a set of its own, of the given capacity and
// budget.
func newSpool(t testing.TB, dir string, capacity, budget int64) (*Spools, *Spool) {
	t.Helper()
	ss, err := NewSpools(dir, capacity, budget, 4)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ss.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return ss, s
}

func TestSpool(t *testing.T) {
	dir := t.TempDir()
	_, s := newSpool(t, dir, 1<<20, 1<<20)
	s.Write([]byte("hello "))
	s.Write([]byte("world"))
	var b bytes.Buffer
	if start, n, err := s.WriteRange(&b, 6, s.Size()); err != nil || start != 6 || n != 5 || b.String() != "world" {
		t.Fatalf("WriteRange(6, end) = %d, %d, %v, %q", start, n, err, b.String())
	}
	b.Reset()
	if _, n, _ := s.WriteRange(&b, -3, 100); n != 11 || b.String() != "hello world" {
		t.Fatalf("WriteRange(-3, 100) = %d, %q", n, b.String())
	}
	// The spool is anonymous: nothing shows up in its directory.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("spool left %d names in its directory", len(entries))
	}
	s.Close()
	if _, err := s.Write([]byte("x")); err == nil {
		t.Fatal("Write after Close succeeded")
	}
}

func TestSpoolFallsBackToMemory(t *testing.T) {
	ss, s := newSpool(t, "/nonexistent-directory", 1<<20, 1<<20)
	s.Write([]byte("in memory"))
	var b bytes.Buffer
	s.WriteRange(&b, 0, s.Size())
	if b.String() != "in memory" {
		t.Fatalf("got %q", b.String())
	}
	if !ss.InMemory() || !SpoolsInMemory("/nonexistent-directory") {
		t.Error("a memfd spool is not reported as in memory")
	}
	if SpoolsInMemory(t.TempDir()) && !onTmpfsPath(t, t.TempDir()) {
		t.Error("a spool on disk is reported as in memory")
	}
}

func onTmpfsPath(t *testing.T, dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Type == unix.TMPFS_MAGIC
}

// allocated returns the bytes of storage a spool's file takes.
func allocated(t *testing.T, s *Spool) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSpoolsBudget: spools hold no more than their budget together. The
// spool of a finished command gives way first; a spool being written then
// loses its own oldest bytes, down to SpoolFloor; the storage goes with
// the bytes.
func TestSpoolsBudget(t *testing.T) {
	const capacity, budget = 1 << 20, 1536 << 10
	ss, err := NewSpools(t.TempDir(), capacity, budget, 4)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	fill := func(s *Spool, n int) {
		for range n / len(chunk) {
			if _, err := s.Write(chunk); err != nil {
				t.Fatal(err)
			}
		}
	}
	old, _ := ss.New()
	defer old.Close()
	fill(old, capacity) // full: 1 MiB
	old.Done()
	if got := ss.Held(); got != capacity {
		t.Fatalf("held %d after one full spool, want %d", got, capacity)
	}

	live, _ := ss.New()
	defer live.Close()
	fill(live, capacity) // passes the budget by 512 KiB: the finished spool gives way
	if got := ss.Held(); got > budget {
		t.Fatalf("held %d, over the budget %d", got, budget)
	}
	if got := live.Size() - live.Oldest(); got != capacity {
		t.Fatalf("the live spool keeps %d bytes, want all %d while the finished one can give way", got, capacity)
	}
	if got := old.Size() - old.Oldest(); got != budget-capacity {
		t.Fatalf("the finished spool keeps %d bytes, want %d", got, budget-capacity)
	}
	if a := allocated(t, old); a > budget-capacity+8192 {
		t.Errorf("the finished spool still takes %d bytes of storage for %d kept", a, budget-capacity)
	}

	// Two more live spools: once the finished one is empty, each writer
	// pays for itself, but keeps at least SpoolFloor.
	a, _ := ss.New()
	defer a.Close()
	fill(a, capacity)
	if old.Size() != old.Oldest() {
		t.Fatal("the finished spool kept bytes while a live one lost its own")
	}
	if got := ss.Held(); got > budget {
		t.Fatalf("held %d, over the budget %d", got, budget)
	}
	b, _ := ss.New()
	defer b.Close()
	fill(b, capacity)
	if got := b.Size() - b.Oldest(); got < SpoolFloor {
		t.Fatalf("the last writer keeps %d bytes, less than the floor", got)
	}
	if got := ss.Held(); got > budget+3*SpoolFloor {
		t.Fatalf("held %d, over the budget and the floors", got)
	}
	// What is kept reads back as written.
	var out bytes.Buffer
	if _, _, err := b.WriteRange(&out, 0, b.Size()); err != nil {
		t.Fatal(err)
	}
	if out.Len() == 0 || !bytes.Equal(out.Bytes(), bytes.Repeat(chunk, out.Len()/len(chunk))) {
		t.Fatalf("read back %d bytes that are not the output", out.Len())
	}
	for _, s := range []*Spool{old, live, a, b} {
		s.Close()
	}
	if got := ss.Held(); got != 0 {
		t.Fatalf("held %d after every spool closed", got)
	}
}

// TestSpoolWriteRangeSeesOverwrite: bytes overwritten while being read are
// reported, never handed over in place of the ones asked for.
func TestSpoolWriteRangeSeesOverwrite(t *testing.T) {
	_, s := newSpool(t, t.TempDir(), 64<<10, 1<<20)
	s.Write(bytes.Repeat([]byte("a"), 64<<10))
	w := &overwriter{s: s}
	_, _, err := s.WriteRange(w, 0, s.Size())
	if !errors.Is(err, ErrOverwritten) {
		t.Fatalf("WriteRange with the ring overwritten meanwhile: %v", err)
	}
	if strings.Contains(w.got.String(), "b") {
		t.Fatal("overwritten bytes were handed over")
	}
}

// overwriter takes what WriteRange hands it, and after the first chunk
// wraps the ring over what is still to be read.
type overwriter struct {
	s   *Spool
	got bytes.Buffer
	n   int
}

func (o *overwriter) Write(p []byte) (int, error) {
	o.got.Write(p)
	if o.n++; o.n == 1 {
		o.s.write(bytes.Repeat([]byte("b"), 48<<10))
	}
	return len(p), nil
}

// FuzzSpool checks the bounded spool against a model that keeps
// everything: what it returns is always the tail of the stream it holds.
func FuzzSpool(f *testing.F) {
	f.Add([]byte("0123456789abcdefghij"), uint8(7), uint8(3), int64(2), int64(15))
	f.Fuzz(func(t *testing.T, data []byte, capacity, step uint8, from, to int64) {
		capN := int64(capacity%40) + 1
		n := int(step%20) + 1
		_, s := newSpool(t, t.TempDir(), capN, 1<<20)
		var all []byte
		for i := 0; i < len(data); i += n {
			chunk := data[i:min(i+n, len(data))]
			if m, err := s.Write(chunk); err != nil || m != len(chunk) {
				t.Fatalf("Write: %d, %v", m, err)
			}
			all = append(all, chunk...)
		}
		var b bytes.Buffer
		start, got, err := s.WriteRange(&b, from, to)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		size := int64(len(all))
		wantTo := min(to, size)
		wantFrom := max(from, size-capN, 0)
		if wantFrom >= wantTo {
			if got != 0 {
				t.Fatalf("WriteRange(%d, %d) returned %d bytes, want none", from, to, got)
			}
			return
		}
		if start != wantFrom || !bytes.Equal(b.Bytes(), all[wantFrom:wantTo]) {
			t.Fatalf("WriteRange(%d, %d) = %d, %q; want %d, %q", from, to, start, b.Bytes(), wantFrom, all[wantFrom:wantTo])
		}
	})
}
