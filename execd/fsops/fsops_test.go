package fsops

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func stat(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func TestRenameNoReplace(t *testing.T) {
	dir := t.TempDir()
	a, b, d := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "d")
	write(t, a, "a")
	write(t, b, "b")
	os.Mkdir(d, 0o755)
	for _, dst := range []string{b, d} {
		if err := RenameNoReplace(a, dst); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("rename onto %s: %v, want ErrExist", dst, err)
		}
	}
	if read(t, a) != "a" || read(t, b) != "b" {
		t.Fatal("files changed")
	}
	if err := RenameNoReplace(a, filepath.Join(dir, "c")); err != nil {
		t.Fatal(err)
	}
	if read(t, filepath.Join(dir, "c")) != "a" {
		t.Fatal("content lost")
	}
	if err := RenameNoReplace(a, filepath.Join(dir, "e")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing source: %v", err)
	}
}

func TestCopy(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	write(t, filepath.Join(src, "f"), "f")
	write(t, filepath.Join(src, "sub", "g"), "g")
	os.Symlink("../f", filepath.Join(src, "sub", "link"))
	os.Link(filepath.Join(src, "f"), filepath.Join(src, "sub", "hard"))
	unix.Chmod(filepath.Join(src, "f"), 0o2750)
	os.Chmod(filepath.Join(src, "sub"), 0o700)
	old := time.Date(2000, 1, 2, 3, 4, 5, 6, time.UTC)
	os.Chtimes(filepath.Join(src, "f"), old, old)
	os.Chtimes(filepath.Join(src, "sub"), old, old)

	dst := filepath.Join(t.TempDir(), "dst")
	if err := Copy(t.Context(), src, dst); err != nil {
		t.Fatal(err)
	}
	if read(t, filepath.Join(dst, "sub", "g")) != "g" || read(t, filepath.Join(dst, "f")) != "f" {
		t.Fatal("content differs")
	}
	f := stat(t, filepath.Join(dst, "f"))
	if f.Mode&0o7777 != 0o2750 || f.Mtim != stat(t, filepath.Join(src, "f")).Mtim {
		t.Errorf("f: mode %o mtime %v", f.Mode&0o7777, f.Mtim)
	}
	if stat(t, filepath.Join(dst, "sub", "hard")).Ino != f.Ino {
		t.Error("hard link not kept")
	}
	if l, _ := os.Readlink(filepath.Join(dst, "sub", "link")); l != "../f" {
		t.Errorf("link %q", l)
	}
	if sub := stat(t, filepath.Join(dst, "sub")); sub.Mode&0o777 != 0o700 || sub.Mtim != stat(t, filepath.Join(src, "sub")).Mtim {
		t.Errorf("sub: mode %o mtime %v", sub.Mode&0o777, sub.Mtim)
	}

	t.Run("destination exists", func(t *testing.T) {
		if err := Copy(t.Context(), src, dst); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("err %v", err)
		}
		if read(t, filepath.Join(dst, "f")) != "f" {
			t.Fatal("existing destination damaged")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		dst2 := filepath.Join(t.TempDir(), "dst2")
		if err := Copy(ctx, src, dst2); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v", err)
		}
		if _, err := os.Lstat(dst2); !errors.Is(err, fs.ErrNotExist) {
			t.Fatal("partial copy left")
		}
		if read(t, filepath.Join(src, "f")) != "f" {
			t.Fatal("source damaged")
		}
	})
}

func TestMoveSameFileSystem(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a", "f"), "f")
	if err := Move(t.Context(), filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	if read(t, filepath.Join(dir, "b", "f")) != "f" {
		t.Fatal("content lost")
	}
	write(t, filepath.Join(dir, "c"), "c")
	if err := Move(t.Context(), filepath.Join(dir, "c"), filepath.Join(dir, "b")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("move onto a directory: %v", err)
	}
}

func TestReplaceAll(t *testing.T) {
	dir := t.TempDir()
	p := func(n string) string { return filepath.Join(dir, n) }
	write(t, p("f"), "a-b-a")
	unix.Chmod(p("f"), 0o4710)
	os.Symlink("f", p("link"))
	write(t, p("h"), "a")
	os.Link(p("h"), p("h2"))

	n, err := ReplaceAll(p("link"), []byte("a"), []byte("xyz"))
	if err != nil || n != 2 || read(t, p("f")) != "xyz-b-xyz" {
		t.Fatalf("n %d err %v content %q", n, err, read(t, p("f")))
	}
	if st := stat(t, p("f")); st.Mode&0o7777 != 0o4710 {
		t.Errorf("mode %o", st.Mode&0o7777)
	}
	if fi, _ := os.Lstat(p("link")); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("link replaced")
	}
	before := stat(t, p("f"))
	if n, err := ReplaceAll(p("f"), []byte("nope"), []byte("x")); n != 0 || err != nil || stat(t, p("f")).Ino != before.Ino {
		t.Fatalf("no match: n %d err %v, rewritten", n, err)
	}
	if n, err := ReplaceAll(p("h"), []byte("a"), []byte("b")); n != 1 || err != nil || read(t, p("h2")) != "b" {
		t.Fatalf("hard link: n %d err %v h2 %q", n, err, read(t, p("h2")))
	}
	os.Mkdir(p("d"), 0o755)
	if _, err := ReplaceAll(p("d"), []byte("a"), nil); !errors.Is(err, ErrIsDir) {
		t.Fatalf("directory: %v", err)
	}
	if _, err := ReplaceAll(p("nope"), []byte("a"), nil); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := ReplaceAll(p("f"), nil, nil); err == nil {
		t.Fatal("empty search string accepted")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if IsTemp(e.Name()) {
			t.Fatalf("temporary file %s left", e.Name())
		}
	}
}

func TestMkdirAll(t *testing.T) {
	dir := t.TempDir()
	created, err := MkdirAll(filepath.Join(dir, "a", "b", "c"), 0o755)
	want := []string{filepath.Join(dir, "a"), filepath.Join(dir, "a", "b"), filepath.Join(dir, "a", "b", "c")}
	if err != nil || !reflect.DeepEqual(created, want) {
		t.Fatalf("created %v, %v", created, err)
	}
	if created, err := MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil || len(created) != 0 {
		t.Fatalf("existing: %v, %v", created, err)
	}
	write(t, filepath.Join(dir, "file"), "")
	if _, err := MkdirAll(filepath.Join(dir, "file", "x"), 0o755); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("through a file: %v", err)
	}
	write(t, filepath.Join(dir, "a", "keep"), "")
	RemoveCreated(created)
	if _, err := os.Stat(filepath.Join(dir, "a", "b")); err == nil {
		t.Fatal("empty created directory kept")
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "keep")); err != nil {
		t.Fatal("RemoveCreated removed a directory that holds a file")
	}
}

func TestCreateTemp(t *testing.T) {
	dir := t.TempDir()
	f, err := CreateTemp(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !IsTemp(filepath.Base(f.Name())) || filepath.Dir(f.Name()) != dir {
		t.Fatalf("name %s", f.Name())
	}
	if st := stat(t, f.Name()); st.Mode&0o777 != 0o600 {
		t.Fatalf("mode %o, want 600: a temporary file is private while it fills", st.Mode&0o777)
	}
	old := syscall.Umask(0o027)
	syscall.Umask(old)
	if NewFileMode() != uint32(0o777&^old) {
		t.Fatalf("NewFileMode() = %o, want 0777 &^ umask %o", NewFileMode(), old)
	}
	if _, err := CreateTemp(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing directory: %v", err)
	}
	if !IsNoSpace(&fs.PathError{Err: syscall.ENOSPC}) || !IsNoSpace(syscall.EDQUOT) || IsNoSpace(syscall.EIO) {
		t.Fatal("IsNoSpace")
	}
}

// FuzzReplaceStream holds the streaming replace to bytes.ReplaceAll,
// with occurrences that straddle chunk boundaries.
func FuzzReplaceStream(f *testing.F) {
	f.Add([]byte("abcabcab"), []byte("ab"), []byte("X"), uint16(0))
	f.Add([]byte("aaaa"), []byte("aa"), []byte("a"), uint16(3))
	f.Fuzz(func(t *testing.T, data, old, new []byte, pad uint16) {
		if len(old) == 0 {
			return
		}
		// Put the data across the 1 MiB chunk boundary.
		data = append(bytes.Repeat([]byte{'.'}, 1<<20-int(pad%64)), data...)
		var out bytes.Buffer
		n, err := replaceStream(&out, bytes.NewReader(data), old, new)
		if err != nil {
			t.Fatal(err)
		}
		if want := bytes.ReplaceAll(data, old, new); !bytes.Equal(out.Bytes(), want) || n != bytes.Count(data, old) {
			t.Fatalf("replace %q by %q: %d replacements, output differs from bytes.ReplaceAll", old, new, n)
		}
	})
}
