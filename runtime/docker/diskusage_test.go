package docker

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// blocksOf is what du counts for the paths given: their allocated
// blocks, read with lstat one by one.
func blocksOf(t *testing.T, paths ...string) int64 {
	t.Helper()
	var n int64
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		n += st.Blocks * 512
	}
	return n
}

func writeFile(t *testing.T, path string, size int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestUsageCountsBlocksOnce(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	writeFile(t, filepath.Join(root, "a"), 100<<10)
	writeFile(t, filepath.Join(root, "d/e/f"), 1<<20)
	writeFile(t, filepath.Join(outside, "big"), 4<<20)
	// A hard link counts once; a symbolic link counts itself, never
	// what it leads to (a file outside the tree, or a directory).
	if err := os.Link(filepath.Join(root, "d/e/f"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "big"), filepath.Join(root, "sym")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "d/symdir")); err != nil {
		t.Fatal(err)
	}
	// A sparse file counts the blocks it holds, not its length.
	sparse, err := os.Create(filepath.Join(root, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sparse.WriteAt(make([]byte, 8192), 1<<30); err != nil {
		t.Fatal(err)
	}
	sparse.Close()

	want := blocksOf(t, root, filepath.Join(root, "a"), filepath.Join(root, "d"), filepath.Join(root, "d/e"),
		filepath.Join(root, "d/e/f"), filepath.Join(root, "sym"), filepath.Join(root, "d/symdir"), filepath.Join(root, "sparse"))
	var c usageCounter
	if err := c.addTree(root); err != nil {
		t.Fatal(err)
	}
	if c.total.Bytes != want || c.total.Files != 8 {
		t.Errorf("addTree = %d bytes in %d files, want %d in 8 (as du counts)", c.total.Bytes, c.total.Files, want)
	}
	if c.total.Bytes > 3<<20 {
		t.Errorf("addTree = %d bytes: a link was followed or the sparse file counted by length", c.total.Bytes)
	}

	// Measuring again from a reset counter gives the same; a file named
	// in two trees (hard-linked across them) counts once in all.
	c.reset()
	other := filepath.Join(t.TempDir(), "x")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "a"), filepath.Join(other, "a2")); err == nil {
		c.addTree(root)
		before := c.total.Bytes
		c.addTree(other)
		if got, dir := c.total.Bytes-before, blocksOf(t, other); got != dir {
			t.Errorf("a second tree added %d bytes, want only its directory's %d", got, dir)
		}
	}

	// A missing tree or file counts nothing and is no error: the sandbox
	// may have gone.
	c.reset()
	if err := c.addTree(filepath.Join(root, "nope")); err != nil || c.total.Bytes != 0 {
		t.Errorf("missing tree: %d, %v", c.total.Bytes, err)
	}
	if err := c.addFile(filepath.Join(root, "nope")); err != nil || c.total.Bytes != 0 {
		t.Errorf("missing file: %d, %v", c.total.Bytes, err)
	}
	if err := c.addFile(filepath.Join(root, "a")); err != nil || c.total.Bytes != blocksOf(t, filepath.Join(root, "a")) {
		t.Errorf("addFile = %d, %v", c.total.Bytes, err)
	}
}

func TestUsageRefusesTooDeepTree(t *testing.T) {
	root := t.TempDir()
	dir := root
	for range maxTreeDepth + 1 {
		dir = filepath.Join(dir, "d")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var c usageCounter
	if err := c.addTree(root); !errors.Is(err, errTooDeep) {
		t.Fatalf("addTree of a tree %d deep = %v, want errTooDeep", maxTreeDepth+1, err)
	}
	// One level less is measured.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	c.reset()
	if err := c.addTree(root); err != nil || c.total.Files != maxTreeDepth+1 {
		t.Fatalf("addTree of a tree %d deep = %d files, %v", maxTreeDepth, c.total.Files, err)
	}
}

// TestUsageStaysOnItsFileSystem: a file system mounted inside a tree is
// not part of it.
func TestUsageStaysOnItsFileSystem(t *testing.T) {
	testenv.MustHaveRoot(t)
	root := t.TempDir()
	mnt := filepath.Join(root, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	writeFile(t, filepath.Join(mnt, "f"), 4<<20)
	var c usageCounter
	if err := c.addTree(root); err != nil {
		t.Fatal(err)
	}
	if c.total.Bytes >= 4<<20 {
		t.Errorf("addTree counted %d bytes: it went into the mounted file system", c.total.Bytes)
	}
}

// TestUsageFindsDeletedOpenFiles: a file deleted while open keeps its
// blocks; the counter finds it through the processes that hold it, open
// or mapped shared, and leaves out memory files.
func TestUsageFindsDeletedOpenFiles(t *testing.T) {
	dir := t.TempDir()
	open := func(name string, size int) *os.File {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f.Name()); err != nil {
			t.Fatal(err)
		}
		return f
	}
	held := open("held", 3<<20)
	defer held.Close()

	mapped := open("mapped", 2<<20)
	mem, err := unix.Mmap(int(mapped.Fd()), 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	mapped.Close() // only the mapping holds it now

	memfd, err := unix.MemfdCreate("usage-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memfd)
	if _, err := unix.Write(memfd, make([]byte, 8<<20)); err != nil {
		t.Fatal(err)
	}

	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var c usageCounter
	if err := c.addUnlinked(procs); err != nil {
		t.Fatal(err)
	}
	if c.total.Hidden < 5<<20 || c.total.Hidden > 6<<20 || c.total.Hidden != c.total.Bytes {
		t.Errorf("addUnlinked = %+v, want the 3 MiB held open and the 2 MiB mapped (and not the 8 MiB memfd)", c.total)
	}
	// Counted once however often it is found.
	before := c.total
	c.addUnlinked(procs)
	if c.total != before {
		t.Errorf("a second pass counted again: %+v, then %+v", before, c.total)
	}
	if err := c.addUnlinked(filepath.Join(dir, "no-such-cgroup")); err == nil {
		t.Error("addUnlinked of a missing cgroup.procs: no error")
	}
}

func TestProcsFileFrom(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"pids/docker/abc", "docker/xyz"} {
		writeFile(t, filepath.Join(root, d, "cgroup.procs"), 0)
	}
	for _, c := range []struct{ name, text, want string }{
		// cgroup v1, as this engine (cgroupfs driver) places a container.
		{"v1", "12:cpuset:/docker/abc\n8:pids:/docker/abc\n1:name=systemd:/docker/abc\n", "pids/docker/abc/cgroup.procs"},
		{"v1 combined", "5:pids,devices:/docker/abc\n", "pids/docker/abc/cgroup.procs"},
		{"v2", "0::/docker/xyz\n", "docker/xyz/cgroup.procs"},
		{"hybrid", "8:pids:/docker/none\n0::/docker/xyz\n", "docker/xyz/cgroup.procs"},
		{"missing", "8:pids:/docker/none\n", ""},
		{"garbage", "garbage\n", ""},
	} {
		got, err := procsFileFrom(c.text, root)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: %q, want an error", c.name, got)
		case c.want != "" && got != filepath.Join(root, c.want):
			t.Errorf("%s: %q, %v; want %s", c.name, got, err, c.want)
		}
	}
	// This process's own: the file exists and lists it.
	self, err := cgroupProcsFile(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(os.Getpid())) {
		t.Errorf("%s does not list this process (%v)", self, err)
	}
}

// BenchmarkUsageTree measures a walk of a tree of 10,000 small files in
// 100 directories, the shape of an installed package set; it reports the
// cost per file.
func BenchmarkUsageTree(b *testing.B) {
	root := b.TempDir()
	const dirs, files = 100, 100
	for d := range dirs {
		dir := filepath.Join(root, "pkg"+strconv.Itoa(d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range files {
			if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(f)), []byte("x"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	var c usageCounter
	b.ReportAllocs()
	for b.Loop() {
		c.reset()
		if err := c.addTree(root); err != nil {
			b.Fatal(err)
		}
		if c.total.Files != dirs*files+dirs+1 {
			b.Fatalf("counted %d files", c.total.Files)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(dirs*files+dirs+1), "ns/file")
}

// TestUsageSurvivesDirectoriesRemovedMidWalk: a sandbox that makes and
// removes directories as fast as it can, beside the files it writes,
// cannot make a measurement fail (a directory removed after the walk
// opened it reads as gone), so it cannot buy time that way.
func TestUsageSurvivesDirectoriesRemovedMidWalk(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "data", "f"), 1<<20)
	stop := make(chan struct{})
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := filepath.Join(root, "churn"+strconv.Itoa(w)+"-"+strconv.Itoa(i%8))
				os.Mkdir(d, 0o755)
				os.Remove(d)
			}
		}()
	}
	defer func() {
		close(stop)
		for range 4 {
			<-done
		}
	}()
	var c usageCounter
	for i := range 3000 {
		c.reset()
		if err := c.addTree(root); err != nil {
			t.Fatalf("measurement %d failed while directories come and go: %v", i, err)
		}
		if c.total.Bytes < 1<<20 {
			t.Fatalf("measurement %d: %d bytes, the 1 MiB file is missing", i, c.total.Bytes)
		}
	}
}
