package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// makeTree writes a tree of many small files, one large file, empty
// files and directories, and symbolic links under dir.
func makeTree(t *testing.T, dir string, small int, large int64) {
	t.Helper()
	for i := range small {
		p := filepath.Join(dir, "src", fmt.Sprintf("pkg%02d", i%17), fmt.Sprintf("file%04d.txt", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		data := make([]byte, i%3000)
		rand.Read(data)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	big, err := os.Create(filepath.Join(dir, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(big, rand.Reader, large); err != nil {
		t.Fatal(err)
	}
	big.Close()
	os.MkdirAll(filepath.Join(dir, "empty", "dir"), 0o700)
	os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	os.Symlink("src/pkg00/file0000.txt", filepath.Join(dir, "link"))
	os.Symlink("/etc/hostname", filepath.Join(dir, "abs-link"))
}

// treeDigest describes a tree: every path with its type, mode, size and
// content hash, or link target, one per line in walk order.
func treeDigest(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, "%s link %s\n", rel, target)
		case fi.IsDir():
			fmt.Fprintf(&b, "%s dir %v\n", rel, fi.Mode().Perm())
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "%s file %v %d %x\n", rel, fi.Mode().Perm(), len(data), sha256.Sum256(data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestOSBCopy copies a tree of many small files and one large file into
// a sandbox and back, and compares every byte, mode and link.
func TestOSBCopy(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "-o", "json").json(t, &c)
	id := c.ID

	local := t.TempDir()
	tree := filepath.Join(local, "tree")
	makeTree(t, tree, 1000, 64<<20)
	want := treeDigest(t, tree)

	var stats struct {
		Files, Links int
		Bytes        int64
	}
	s.osb("cp", tree, id+":/tmp", "-o", "json").json(t, &stats)
	if stats.Files != 1002 || stats.Links != 2 || stats.Bytes < 64<<20 {
		t.Errorf("copy in: %+v", stats)
	}
	// The sandbox sees the same tree.
	remote := s.execd(id).mustRun("cd /tmp/tree && find . -type f | wc -l && wc -c < big.bin && readlink link")
	if remote != fmt.Sprintf("1002\n%d\nsrc/pkg00/file0000.txt", 64<<20) {
		t.Errorf("in the sandbox: %q", remote)
	}

	back := filepath.Join(local, "back")
	s.osb("cp", id+":/tmp/tree", back).ok(t)
	if got := treeDigest(t, back); got != want {
		t.Errorf("the tree changed on its way in and out:\n%s", firstDiff(want, got))
	}

	// Out of the sandbox, contents only: no warning about skipped files.
	r := s.osb("cp", id+":/tmp/tree/src/.", filepath.Join(local, "contents"))
	if r.ok(t); strings.Contains(r.err, "not copied") {
		t.Errorf("contents copy warned: %q", r.err)
	}
	if _, err := os.Stat(filepath.Join(local, "contents", "pkg00")); err != nil {
		t.Error(err)
	}

	// Into an existing directory the source keeps its name.
	into := filepath.Join(local, "into")
	os.Mkdir(into, 0o755)
	s.osb("cp", id+":/tmp/tree/src", into).ok(t)
	if _, err := os.Stat(filepath.Join(into, "src", "pkg01", "file0001.txt")); err != nil {
		t.Error(err)
	}
	// "dir/." copies the contents: into a new directory, or an existing one.
	s.osb("cp", tree+"/src/.", id+":/tmp/flat").ok(t)
	s.execd(id).mustRun("mkdir /tmp/flat2")
	s.osb("cp", tree+"/src/.", id+":/tmp/flat2").ok(t)
	if out := s.execd(id).mustRun("ls /tmp/flat | head -2; ls /tmp/flat2 | head -2"); out != "pkg00\npkg01\npkg00\npkg01" {
		t.Errorf("contents copy: %q", out)
	}
	// A file onto a file replaces it; onto a new name takes the name.
	s.osb("cp", filepath.Join(tree, "run.sh"), id+":/tmp/tree/big.bin").ok(t)
	s.osb("cp", id+":/tmp/tree/big.bin", filepath.Join(local, "renamed.sh")).ok(t)
	if data, _ := os.ReadFile(filepath.Join(local, "renamed.sh")); string(data) != "#!/bin/sh\necho hi\n" {
		t.Errorf("file onto file: %q", data)
	}
	if fi, _ := os.Stat(filepath.Join(local, "renamed.sh")); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v", fi.Mode())
	}
}

// firstDiff shows the first line where two digests differ.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  want %s\n  got  %s", i, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(al), len(bl))
}

// TestOSBCopyStreamsAndBadInput covers tar streams on stdin and stdout
// and the errors of osb cp.
func TestOSBCopyStreamsAndBadInput(t *testing.T) {
	s := startServer(t, serverOptions{})
	var c struct{ ID string }
	s.osb("sandbox", "create", "-i", busyboxImage, "-o", "json").json(t, &c)
	id := c.ID

	// A tar on stdin lands in the directory.
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	tw.WriteHeader(&tar.Header{Name: "streamed/hello.txt", Mode: 0o600, Size: 5, Typeflag: tar.TypeReg})
	tw.Write([]byte("hello"))
	tw.Close()
	s.osbIn(bytes.NewReader(in.Bytes()), "", "cp", "-", id+":/tmp").ok(t)
	if out := s.execd(id).mustRun("cat /tmp/streamed/hello.txt; stat -c %a /tmp/streamed/hello.txt"); out != "hello600" {
		t.Errorf("streamed in: %q", out)
	}
	// A tar on stdout holds the tree.
	r := s.osb("cp", id+":/tmp/streamed", "-")
	r.ok(t)
	tr := tar.NewReader(strings.NewReader(r.out))
	var names []string
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
	}
	if strings.Join(names, ",") != "streamed/,streamed/hello.txt" {
		t.Errorf("streamed out: %v", names)
	}

	// An archive that reaches outside its directory is refused whole.
	in.Reset()
	tw = tar.NewWriter(&in)
	tw.WriteHeader(&tar.Header{Name: "../../etc/evil", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	s.osbIn(bytes.NewReader(in.Bytes()), "", "cp", "-", id+":/tmp").fails(t, 1, "unsafe entry name")
	if out := s.execd(id).mustRun("ls /etc/evil 2>&1 || true"); !strings.Contains(out, "No such file") {
		t.Errorf("evil entry written: %q", out)
	}

	local := t.TempDir()
	s.osb("cp", filepath.Join(local, "missing"), id+":/tmp").fails(t, 1, "no such file")
	s.osb("cp", id+":/tmp/missing", local).fails(t, 1, "FILE_NOT_FOUND")
	s.osb("cp", local, local).fails(t, 2, "must be a sandbox path")
	s.osb("cp", id+":/a", id+":/b").fails(t, 2, "between two sandboxes")
	s.osb("cp", local, "no-such-sandbox:/tmp").fails(t, 1, "not found")
	s.osb("cp", local, id+":/no/such/dir/").fails(t, 1, "no such directory")
	os.WriteFile(filepath.Join(local, "f"), []byte("x"), 0o644)
	s.osb("cp", id+":/tmp/streamed", filepath.Join(local, "f")).fails(t, 1, "cannot copy a directory onto a file")
}
