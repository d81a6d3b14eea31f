package execd

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

func writeTree(t *testing.T, root string, files map[string][]byte) {
	t.Helper()
	for name, data := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o640); err != nil {
			t.Fatal(err)
		}
	}
}

// readTar returns the regular files of a tar stream by name.
func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	out := make(map[string][]byte)
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[hdr.Name] = b
		} else {
			out[hdr.Name] = nil
		}
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	_, c := newTestServer(t, nil)
	src := filepath.Join(t.TempDir(), "tree")
	big := make([]byte, 5<<20+3)
	rand.Read(big)
	files := map[string][]byte{"a.txt": []byte("alpha"), "sub/b.txt": []byte("beta"), "sub/deep/big": big}
	writeTree(t, src, files)
	os.Symlink("a.txt", filepath.Join(src, "link"))

	resp, err := c.hc.Do(c.request(http.MethodGet, "/files/archive?measure=true&path="+url.QueryEscape(src), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if got := resp.Header.Get(api.HeaderArchiveContentLength); got != strconv.Itoa(5+4+len(big)) {
		t.Errorf("content length hint %q", got)
	}
	var stream bytes.Buffer
	got := readTar(t, io.TeeReader(resp.Body, &stream))
	for name, want := range files {
		if !bytes.Equal(got["tree/"+name], want) {
			t.Errorf("tree/%s: %d bytes, want %d", name, len(got["tree/"+name]), len(want))
		}
	}
	for _, name := range []string{"tree/", "tree/sub/", "tree/link"} {
		if _, ok := got[name]; !ok {
			t.Errorf("no entry %s in %v", name, keys(got))
		}
	}

	// Upload the same stream elsewhere and compare.
	dst := t.TempDir()
	var stats api.ArchiveStats
	c.call(http.MethodPost, "/files/archive?sync=false&path="+url.QueryEscape(dst), bytes.NewReader(stream.Bytes()), 200, &stats)
	if stats.Files != 3 || stats.Links != 1 || stats.Dirs != 3 || stats.Bytes != int64(9+len(big)) {
		t.Errorf("stats %+v", stats)
	}
	for name, want := range files {
		b, err := os.ReadFile(filepath.Join(dst, "tree", name))
		if err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s: %d bytes, %v", name, len(b), err)
		}
	}
	if target, _ := os.Readlink(filepath.Join(dst, "tree", "link")); target != "a.txt" {
		t.Errorf("link to %q", target)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestArchiveSingleFileAndRoot(t *testing.T) {
	_, c := newTestServer(t, nil)
	dir := t.TempDir()
	writeTree(t, dir, map[string][]byte{"one.txt": []byte("1")})
	resp, data := c.do(c.request(http.MethodGet, "/files/archive?path="+url.QueryEscape(filepath.Join(dir, "one.txt")), nil))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if got := readTar(t, bytes.NewReader(data)); len(got) != 1 || string(got["one.txt"]) != "1" {
		t.Errorf("archive of one file: %v", keys(got))
	}
	if !strings.Contains(resp.Header.Get("Content-Disposition"), `"one.txt.tar"`) {
		t.Errorf("disposition %q", resp.Header.Get("Content-Disposition"))
	}
}

func TestArchiveOwnership(t *testing.T) {
	testenv.MustHaveRoot(t) // to own files as someone else
	_, c := newTestServer(t, nil)
	dst := t.TempDir()
	os.Chown(dst, 1000, 1001)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, Uid: 42, Gid: 43})
	tw.Write([]byte("x"))
	tw.Close()

	owner := func(p string) (uint32, uint32) {
		var st syscall.Stat_t
		syscall.Stat(p, &st)
		return st.Uid, st.Gid
	}
	c.call(http.MethodPost, "/files/archive?path="+url.QueryEscape(dst), bytes.NewReader(buf.Bytes()), 200, nil)
	if u, g := owner(filepath.Join(dst, "f")); u != 1000 || g != 1001 {
		t.Errorf("default owner %d:%d, want the directory's 1000:1001", u, g)
	}
	c.call(http.MethodPost, "/files/archive?preserveOwner=true&path="+url.QueryEscape(dst), bytes.NewReader(buf.Bytes()), 200, nil)
	if u, g := owner(filepath.Join(dst, "f")); u != 42 || g != 43 {
		t.Errorf("preserved owner %d:%d, want 42:43", u, g)
	}
}

func TestArchiveBadInput(t *testing.T) {
	_, c := newTestServer(t, func(cfg *Config) { cfg.MaxUploadBytes = 64 << 10 })
	dir := t.TempDir()
	writeTree(t, dir, map[string][]byte{"file": []byte("x")})
	q := func(p string) string { return url.QueryEscape(filepath.Join(dir, p)) }

	c.wantError(http.MethodGet, "/files/archive", nil, 400, api.CodeMissingQuery)
	c.wantError(http.MethodGet, "/files/archive?path="+q("missing"), nil, 404, api.CodeFileNotFound)
	c.wantError(http.MethodGet, "/files/archive?follow=maybe&path="+q("file"), nil, 400, api.CodeInvalidRequestBody)
	c.wantError(http.MethodPost, "/files/archive?sync=maybe&path="+q(""), "", 400, api.CodeInvalidRequestBody)
	c.wantError(http.MethodPost, "/files/archive?path="+q("missing"), "", 404, api.CodeFileNotFound)
	c.wantError(http.MethodPost, "/files/archive?path="+q("file"), "", 400, api.CodeInvalidRequestBody)
	c.wantError(http.MethodPost, "/files/archive?path="+q(""), "this is not a tar stream, not at all, no......."+strings.Repeat(".", 600), 400, api.CodeInvalidRequestBody)
	c.wantError(http.MethodPost, "/files/archive?path="+q(""), bytes.NewReader(make([]byte, 128<<10)), 413, api.CodeRequestTooLarge)

	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	e := c.wantError(http.MethodPost, "/files/archive?path="+q(""), bytes.NewReader(evil.Bytes()), 400, api.CodeInvalidRequestBody)
	if !strings.Contains(e.Message, "unsafe") {
		t.Errorf("message %q", e.Message)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escape")); err == nil {
		t.Error("an entry escaped the directory")
	}

	// A truncated stream is refused and the file it was replacing stays.
	var short bytes.Buffer
	tw = tar.NewWriter(&short)
	tw.WriteHeader(&tar.Header{Name: "file", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10000})
	tw.Write([]byte("partial"))
	c.wantError(http.MethodPost, "/files/archive?path="+q(""), bytes.NewReader(short.Bytes()), 400, api.CodeInvalidRequestBody)
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "x" {
		t.Errorf("file = %q after a failed replace", b)
	}
}

// deepTree makes, under dir, a chain of directories whose full path is
// longer than the kernel takes (PATH_MAX), with a file at the bottom:
// packing it fails part way, after the first entries have gone out, which
// is what an unreadable directory deep in a tree does to an execd that
// runs as another user. It returns the top of the chain.
func deepTree(t *testing.T, dir string) string {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	os.WriteFile(filepath.Join(dir, "a-first"), []byte("before the failure"), 0o644)
	name := strings.Repeat("d", 250)
	rel := "deep"
	if err := root.Mkdir(rel, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 18 {
		rel += "/" + name
		if err := root.Mkdir(rel, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := root.WriteFile(rel+"/bottom", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestArchiveIncomplete: a failure part way through an archive ends the
// answer cleanly with the X-Archive-Error trailer, inside an entry that
// announces more than follows, so no tar reader takes the archive for a
// whole one; the entries before it are intact.
func TestArchiveIncomplete(t *testing.T) {
	_, c := newTestServer(t, nil)
	top := deepTree(t, t.TempDir())
	resp, err := c.hc.Do(c.request(http.MethodGet, "/files/archive?path="+url.QueryEscape(top), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the answer did not end cleanly: %v", err)
	}
	reason := resp.Trailer.Get(api.HeaderArchiveError)
	if !strings.Contains(reason, "file name too long") {
		t.Fatalf("trailer %s = %q", api.HeaderArchiveError, reason)
	}
	if !bytes.HasSuffix(body, api.ArchiveIncompleteEntry(reason)) {
		t.Fatal("the stream does not end with the incomplete-archive entry")
	}
	tarReadersFail(t, body)
	tr := tar.NewReader(bytes.NewReader(body))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("a tar reader took the archive as whole after %d entries", len(names))
		}
		if err != nil {
			break
		}
		names = append(names, hdr.Name)
		if hdr.Name == filepath.Base(top)+"/a-first" {
			if b, _ := io.ReadAll(tr); string(b) != "before the failure" {
				t.Errorf("the entry before the failure reads %q", b)
			}
		}
	}
	if len(names) < 2 {
		t.Fatalf("entries before the failure: %q", names)
	}
}

// TestArchiveUnreadableTop: a path that cannot be reached at all is an
// ordinary error answer, not a stream; a kernel file without a size packs
// as an empty file. (A directory execd may not list is an ordinary 403
// too: the attack suite shows it with an execd that is not root.)
func TestArchiveUnreadableTop(t *testing.T) {
	_, c := newTestServer(t, nil)
	resp, body := c.do(c.request(http.MethodGet, "/files/archive?path=/proc/self/mem", nil))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/proc/self/mem (size 0): %d %s", resp.StatusCode, body)
	}
	deep := deepTree(t, t.TempDir()) + "/deep"
	for len(deep) < 4200 {
		deep += "/" + strings.Repeat("d", 250)
	}
	var e api.ErrorResponse
	resp, body = c.do(c.request(http.MethodGet, "/files/archive?path="+url.QueryEscape(deep), nil))
	if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Message, "file name too long") {
		t.Fatalf("a path too long: %d %.200s", resp.StatusCode, body)
	}
}

// tarReadersFail checks that the tar readers people use all fail on an
// incomplete archive: Go's, GNU tar (listing and extracting), busybox
// tar extracting from a pipe, and Python's tarfile (from a file and as a
// stream). (busybox listing a file seeks over the last entry's content
// without reading it, and does not notice it is short.)
func tarReadersFail(t *testing.T, body []byte) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(body))
	var err error
	for err == nil {
		if _, err = tr.Next(); err == nil {
			_, err = io.Copy(io.Discard, tr)
		}
	}
	if err == io.EOF {
		t.Error("Go's archive/tar read the archive as whole")
	}
	file := filepath.Join(t.TempDir(), "incomplete.tar")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}
	readers := map[string][]string{
		"tar":           {"tar", "-tvf", file},
		"tar -x":        {"tar", "-xf", file, "-C", t.TempDir()},
		"busybox":       {"sh", "-c", "busybox tar -xf - -C \"$1\" < \"$2\"", "sh", t.TempDir(), file},
		"python":        {"python3", "-c", "import sys, tarfile; t = tarfile.open(sys.argv[1]); [t.extractfile(m) and t.extractfile(m).read() for m in t]; print(len(t.getmembers()))", file},
		"python stream": {"python3", "-c", "import sys, tarfile; t = tarfile.open(fileobj=open(sys.argv[1], 'rb'), mode='r|'); print([m.name for m in t])", file},
	}
	for name, argv := range readers {
		if _, err := exec.LookPath(argv[0]); err != nil {
			continue
		}
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err == nil {
			t.Errorf("%s read the incomplete archive without an error:\n%s", name, out)
		}
	}
}
