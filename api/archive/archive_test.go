//go:build linux

package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

func mustWrite(t *testing.T, path string, data []byte, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func openRoot(t *testing.T, dir string) *os.Root {
	t.Helper()
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// sampleTree builds a tree with every kind of entry Pack records.
func sampleTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	mustWrite(t, filepath.Join(src, "a.txt"), []byte("hello\n"), 0o644)
	mustWrite(t, filepath.Join(src, "bin", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	mustWrite(t, filepath.Join(src, "big.bin"), big, 0o600)
	mustWrite(t, filepath.Join(src, "empty"), nil, 0o644)
	long := strings.Repeat("d", 120) + "/" + strings.Repeat("f", 150)
	mustWrite(t, filepath.Join(src, long), []byte("long name"), 0o644)
	if err := os.Mkdir(filepath.Join(src, "emptydir"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nonexistent/target", filepath.Join(src, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "a.txt"), filepath.Join(src, "bin", "hard")); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(src, "ro", "inside"), []byte("x"), 0o444)
	if err := os.Chmod(filepath.Join(src, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "ro"), 0o755) })
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(src, "a.txt"), old, old); err != nil {
		t.Fatal(err)
	}
	return src
}

// compareTrees fails unless got holds what want holds: the same names,
// types, modes, contents, link targets and file times.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	seen := 0
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		q := filepath.Join(got, rel)
		wi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		gi, err := os.Lstat(q)
		if err != nil {
			t.Errorf("%s: missing: %v", rel, err)
			return nil
		}
		seen++
		if wi.Mode() != gi.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, gi.Mode(), wi.Mode())
		}
		switch {
		case wi.Mode().IsRegular():
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(q)
			if !bytes.Equal(a, b) {
				t.Errorf("%s: content differs (%d vs %d bytes)", rel, len(b), len(a))
			}
			if !gi.ModTime().Equal(wi.ModTime().Truncate(time.Second)) {
				t.Errorf("%s: mtime %v, want %v", rel, gi.ModTime(), wi.ModTime())
			}
		case wi.Mode()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(q)
			if a != b {
				t.Errorf("%s: link to %q, want %q", rel, b, a)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 2 {
		t.Fatalf("compared only %d entries", seen)
	}
	filepath.WalkDir(got, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), TempPrefix) {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

func packBytes(t *testing.T, src, name string) ([]byte, Stats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := Pack(context.Background(), &buf, src, name, PackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), st
}

func TestRoundTrip(t *testing.T) {
	src := sampleTree(t)
	data, ps := packBytes(t, src, "copy")
	if ps.Files != 6 || ps.Links != 3 || ps.Dirs != 5 {
		t.Errorf("pack stats %+v", ps)
	}
	measured, err := Measure(src, false)
	if err != nil || measured != ps.Bytes {
		t.Errorf("Measure = %d, %v; Pack wrote %d content bytes", measured, err, ps.Bytes)
	}

	dst := t.TempDir()
	xs, err := Extract(context.Background(), bytes.NewReader(data), openRoot(t, dst), ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if xs.Files != ps.Files || xs.Links != ps.Links || xs.Dirs != ps.Dirs || xs.Bytes != ps.Bytes {
		t.Errorf("extract stats %+v, pack stats %+v", xs, ps)
	}
	compareTrees(t, src, filepath.Join(dst, "copy"))
	defer os.Chmod(filepath.Join(dst, "copy", "ro"), 0o755)

	var a, b syscall.Stat_t
	syscall.Stat(filepath.Join(dst, "copy", "a.txt"), &a)
	syscall.Stat(filepath.Join(dst, "copy", "bin", "hard"), &b)
	if a.Ino != b.Ino {
		t.Error("hard link became a copy")
	}
}

func TestPackContentsAndSingleFile(t *testing.T) {
	src := sampleTree(t)
	defer os.Chmod(filepath.Join(src, "ro"), 0o755)

	// name "" packs a directory's contents.
	data, _ := packBytes(t, src, "")
	dst := t.TempDir()
	if _, err := Extract(context.Background(), bytes.NewReader(data), openRoot(t, dst), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(filepath.Join(dst, "ro"), 0o755)
	compareTrees(t, src, dst)

	// A single file takes its own base name, or the one given.
	data, st := packBytes(t, filepath.Join(src, "a.txt"), "")
	if st.Files != 1 {
		t.Errorf("stats %+v", st)
	}
	tr := tar.NewReader(bytes.NewReader(data))
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "a.txt" {
		t.Fatalf("first entry %v, %v", hdr, err)
	}
	data, _ = packBytes(t, filepath.Join(src, "a.txt"), "renamed.txt")
	if hdr, _ := tar.NewReader(bytes.NewReader(data)).Next(); hdr.Name != "renamed.txt" {
		t.Fatalf("entry named %q", hdr.Name)
	}

	// A link is packed as a link unless FollowTop.
	var buf bytes.Buffer
	if _, err := Pack(context.Background(), &buf, filepath.Join(src, "link"), "", PackOptions{FollowTop: true}); err != nil {
		t.Fatal(err)
	}
	hdr, _ = tar.NewReader(&buf).Next()
	if hdr.Typeflag != tar.TypeReg || hdr.Size != 6 {
		t.Errorf("followed link packed as %c, %d bytes", hdr.Typeflag, hdr.Size)
	}
}

func TestExtractRenameAndReplace(t *testing.T) {
	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "d", "f"), []byte("new"), 0o640)
	data, _ := packBytes(t, filepath.Join(src, "d"), "d")

	dst := t.TempDir()
	mustWrite(t, filepath.Join(dst, "target", "f"), []byte("old content"), 0o600)
	mustWrite(t, filepath.Join(dst, "target", "keep"), []byte("keep"), 0o600)
	rename := func(n string) (string, error) { return "target" + strings.TrimPrefix(n, "d"), nil }
	if _, err := Extract(context.Background(), bytes.NewReader(data), openRoot(t, dst), ExtractOptions{Rename: rename}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "target", "f")); string(b) != "new" {
		t.Errorf("f = %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "target", "f")); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", fi.Mode())
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "target", "keep")); string(b) != "keep" {
		t.Errorf("keep = %q", b)
	}
	// An existing directory keeps its mode.
	if fi, _ := os.Stat(filepath.Join(dst, "target")); fi.Mode().Perm() != 0o755 {
		t.Errorf("existing directory mode changed to %v", fi.Mode())
	}

	// A file never replaces a directory.
	mustWrite(t, filepath.Join(dst, "dir", "x"), []byte("x"), 0o644)
	data = tarOf(t, entry{name: "dir", body: "file"})
	_, err := Extract(context.Background(), bytes.NewReader(data), openRoot(t, dst), ExtractOptions{})
	if !errors.Is(err, ErrReplaceDir) {
		t.Errorf("file over directory: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "dir", "x")); string(b) != "x" {
		t.Error("directory content lost")
	}
}

type entry struct {
	name, body, link string
	typ              byte
	size             int64 // declared size when not len(body)
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		size := int64(len(e.body))
		if e.size > 0 {
			size = e.size
		}
		hdr := &tar.Header{Name: e.name, Typeflag: typ, Linkname: e.link, Mode: 0o644, ModTime: time.Now()}
		if typ == tar.TypeReg {
			hdr.Size = size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if len(entries) > 0 && entries[len(entries)-1].size > 0 {
		return buf.Bytes() // deliberately short
	}
	tw.Close()
	return buf.Bytes()
}

func TestExtractRefusesEscapes(t *testing.T) {
	cases := map[string][]entry{
		"dotdot":             {{name: "../escaped", body: "x"}},
		"nested dotdot":      {{name: "a/../../escaped", body: "x"}},
		"absolute":           {{name: "/tmp/escaped", body: "x"}},
		"hard link outside":  {{name: "h", typ: tar.TypeLink, link: "../outside/secret"}},
		"absolute hard link": {{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}},
		"through symlink": {
			{name: "l", typ: tar.TypeSymlink, link: "../outside"},
			{name: "l/escaped", body: "x"},
		},
		"through absolute symlink": {
			{name: "l", typ: tar.TypeSymlink, link: "/"},
			{name: "l/escaped", body: "x"},
		},
		"dir through symlink": {
			{name: "l", typ: tar.TypeSymlink, link: "../outside"},
			{name: "l/sub/", typ: tar.TypeDir},
		},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			mustWrite(t, filepath.Join(outside, "secret"), []byte("s"), 0o600)
			dst := filepath.Join(base, "dst")
			os.Mkdir(dst, 0o755)
			_, err := Extract(context.Background(), bytes.NewReader(tarOf(t, entries...)), openRoot(t, dst), ExtractOptions{})
			if !errors.Is(err, ErrUnsafeName) {
				t.Fatalf("err = %v, want ErrUnsafeName", err)
			}
			got, _ := os.ReadDir(outside)
			if len(got) != 1 {
				t.Errorf("outside now holds %d entries", len(got))
			}
			if _, err := os.Stat(filepath.Join(base, "escaped")); err == nil {
				t.Error("wrote outside the root")
			}
			if _, err := os.Stat("/tmp/escaped"); err == nil {
				t.Error("wrote an absolute path")
			}
		})
	}
}

func TestExtractTruncatedLeavesNoDebris(t *testing.T) {
	dst := t.TempDir()
	mustWrite(t, filepath.Join(dst, "f"), []byte("original"), 0o644)
	data := tarOf(t, entry{name: "ok", body: "fine"}, entry{name: "f", body: "partial", size: 1 << 20})
	_, err := Extract(context.Background(), bytes.NewReader(data), openRoot(t, dst), ExtractOptions{})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err = %v, want unexpected EOF", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "f")); string(b) != "original" {
		t.Errorf("f = %q after a failed replace", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "ok")); string(b) != "fine" {
		t.Errorf("ok = %q", b)
	}
	entries, _ := os.ReadDir(dst)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), TempPrefix) {
			t.Errorf("left %s", e.Name())
		}
	}
}

func TestExtractOwnership(t *testing.T) {
	testenv.MustHaveRoot(t) // to change owners
	hdrs := []*tar.Header{
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1234, Gid: 2345},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1234, Gid: 2345, Size: 1},
		{Name: "implied/f", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1234, Gid: 2345, Size: 1},
		{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "d/f", Uid: 1234, Gid: 2345},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	owner := func(p string) (uint32, uint32) {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid
	}

	dst := t.TempDir()
	if _, err := Extract(context.Background(), bytes.NewReader(buf.Bytes()), openRoot(t, dst), ExtractOptions{Owner: OwnerArchive}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f", "implied/f", "l"} {
		if u, g := owner(filepath.Join(dst, p)); u != 1234 || g != 2345 {
			t.Errorf("OwnerArchive: %s owned by %d:%d", p, u, g)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dst, "d", "f")); fi.Mode()&fs.ModeSetuid == 0 {
		t.Error("setuid bit lost to the change of owner")
	}

	dst = t.TempDir()
	if _, err := Extract(context.Background(), bytes.NewReader(buf.Bytes()), openRoot(t, dst), ExtractOptions{Owner: OwnerFixed, UID: 4321, GID: 5432}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f", "implied", "implied/f", "l"} {
		if u, g := owner(filepath.Join(dst, p)); u != 4321 || g != 5432 {
			t.Errorf("OwnerFixed: %s owned by %d:%d", p, u, g)
		}
	}
}

func TestPackCancelled(t *testing.T) {
	src := sampleTree(t)
	defer os.Chmod(filepath.Join(src, "ro"), 0o755)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Pack(ctx, io.Discard, src, "x", PackOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
	if _, err := Pack(context.Background(), io.Discard, filepath.Join(src, "missing"), "", PackOptions{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing source: %v", err)
	}
}

// FuzzExtract feeds arbitrary streams to Extract: it must never panic
// and never touch anything outside its root.
func FuzzExtract(f *testing.F) {
	f.Add(tarOf(&testing.T{}, entry{name: "a", body: "x"}, entry{name: "d/", typ: tar.TypeDir}))
	f.Add(tarOf(&testing.T{}, entry{name: "l", typ: tar.TypeSymlink, link: ".."}, entry{name: "l/x", body: "y"}))
	f.Add(tarOf(&testing.T{}, entry{name: "h", typ: tar.TypeLink, link: "../x"}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "dst")
		os.Mkdir(dst, 0o755)
		root, err := os.OpenRoot(dst)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		Extract(context.Background(), bytes.NewReader(data), root, ExtractOptions{})
		entries, _ := os.ReadDir(base)
		if len(entries) != 1 {
			t.Fatalf("extraction created %d entries beside its root", len(entries)-1)
		}
		filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755) // so TempDir can clean up
			}
			return nil
		})
	})
}

func TestExtractSafeModesAndRenameErrors(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o777})
	tw.WriteHeader(&tar.Header{Name: "out/suid", Typeflag: tar.TypeReg, Mode: 0o6777, Size: 1})
	tw.Write([]byte("x"))
	tw.WriteHeader(&tar.Header{Name: ".bashrc", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()

	// Safe modes: less the umask, no setuid or setgid.
	dst := t.TempDir()
	only := func(n string) (string, error) {
		if n == "out" || strings.HasPrefix(n, "out/") {
			return n, nil
		}
		return "", errors.New("unexpected entry")
	}
	_, err := Extract(context.Background(), bytes.NewReader(buf.Bytes()), openRoot(t, dst), ExtractOptions{SafeModes: true, Rename: only})
	if !errors.Is(err, ErrUnsafeName) {
		t.Fatalf("an entry the rename refuses: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dst, "out", "suid"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 || fi.Mode().Perm()&fs.FileMode(umask) != 0 {
		t.Errorf("safe mode of the file: %v (umask %o)", fi.Mode(), umask)
	}
	if _, err := os.Stat(filepath.Join(dst, ".bashrc")); err == nil {
		t.Error("an entry outside the expected tree was written")
	}
	// The directory's mode is applied at the end only when the stream is
	// whole; here it failed, so check a whole one.
	dst = t.TempDir()
	if _, err := Extract(context.Background(), bytes.NewReader(buf.Bytes()), openRoot(t, dst), ExtractOptions{SafeModes: true}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dst, "out")); fi.Mode().Perm()&fs.FileMode(umask) != 0 {
		t.Errorf("safe mode of the directory: %v", fi.Mode())
	}
}

// TestPackCutShort: a file that shrinks while it is packed fails inside
// its entry, as ErrCutShort says, and the bytes written up to there are
// no archive a tar reader takes for whole; a file that cannot be opened
// fails before its header, between entries.
func TestPackCutShort(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("x"), 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := Pack(context.Background(), pw, big, "big", PackOptions{})
		pw.CloseWithError(err)
		done <- err
	}()
	// Read the header and the first part of the content, then shrink
	// the file under the packer.
	if _, err := io.CopyN(&out, pr, 512+64<<10); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 1024); err != nil {
		t.Fatal(err)
	}
	io.Copy(&out, pr)
	err := <-done
	if !errors.Is(err, ErrCutShort) {
		t.Fatalf("Pack of a file that shrank: %v, want ErrCutShort", err)
	}
	tr := tar.NewReader(bytes.NewReader(out.Bytes()))
	if _, err := tr.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, tr); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading the cut entry: %v, want an unexpected end", err)
	}

	if os.Geteuid() == 0 {
		return // root opens anything; the attack suite tries it as another user
	}
	locked := filepath.Join(dir, "locked")
	os.WriteFile(locked, []byte("secret"), 0o000)
	if _, err := Pack(context.Background(), io.Discard, locked, "locked", PackOptions{}); err == nil || errors.Is(err, ErrCutShort) {
		t.Fatalf("Pack of an unreadable file: %v, want a failure before its entry", err)
	}
}

// legacyTar is tarOf with every header's type flag rewritten to the
// pre-POSIX '\x00' of old archivers (tar.Writer no longer writes it).
func legacyTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	data := tarOf(t, entries...)
	for off := 0; off+512 <= len(data); {
		hdr := data[off : off+512]
		if bytes.Equal(hdr, make([]byte, 512)) {
			break
		}
		size, err := strconv.ParseInt(strings.Trim(string(hdr[124:136]), " \x00"), 8, 64)
		if err != nil {
			t.Fatalf("size of %q: %v", hdr[:100], err)
		}
		hdr[156] = 0
		copy(hdr[148:156], "        ")
		sum := 0
		for _, b := range hdr {
			sum += int(b)
		}
		copy(hdr[148:156], fmt.Sprintf("%06o\x00 ", sum))
		off += 512 + int((size+511)/512*512)
	}
	return data
}

// TestExtractLegacyTypeFlag: entries of old archivers, whose type flag
// is '\x00', are regular files, or directories when the name ends in a
// slash.
func TestExtractLegacyTypeFlag(t *testing.T) {
	dst := t.TempDir()
	data := legacyTar(t, entry{name: "dir/", typ: tar.TypeDir}, entry{name: "dir/f", body: "old format"})
	if data[156] != 0 || data[512+156] != 0 {
		t.Fatalf("type flags %q and %q, want legacy NULs", data[156], data[512+156])
	}
	if _, err := Extract(context.Background(), bytes.NewReader(data), openRoot(t, dst), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "dir")); err != nil || !fi.IsDir() {
		t.Errorf("dir/: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "dir", "f")); string(b) != "old format" {
		t.Errorf("dir/f = %q, %v", b, err)
	}
}
