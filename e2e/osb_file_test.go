package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// fileDoc is an entry of osb file info and osb file search.
type fileDoc struct {
	Path       string
	Type       string
	Size       int64
	Mode       int
	Owner      string
	Group      string
	CreatedAt  time.Time `json:"created_at"`
	ModifiedAt time.Time `json:"modified_at"`
}

// statusMsg is a status message document.
type statusMsg struct{ Status, Message string }

// TestOSBFileContent covers cat, write, upload and download: bytes kept
// exactly, big files streamed, partial downloads never left behind.
func TestOSBFileContent(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := createRunning(t, s)
	dir := t.TempDir()

	// write -c and cat: no newline added, an empty -c is an empty file.
	if out := s.osb("file", "write", id, "/tmp/a/hello.txt", "-c", "hello world").ok(t); !strings.Contains(out, "Written: /tmp/a/hello.txt") {
		t.Errorf("write (table): %q", out)
	}
	s.osb("file", "cat", id, "/tmp/a/hello.txt").exits(t, 0, "hello world", "")
	var msg statusMsg
	s.osb("file", "write", id, "/tmp/empty", "-c", "", "-o", "json").json(t, &msg)
	if msg != (statusMsg{"ok", "Written: /tmp/empty"}) {
		t.Errorf("write (json): %+v", msg)
	}
	s.osb("file", "cat", id, "/tmp/empty").exits(t, 0, "", "")

	// stdin → write → cat, binary, with a mode.
	bin := make([]byte, 1<<20)
	rand.Read(bin)
	bin = append(bin, []byte("\r\n\x00\xff")...)
	s.osbIn(bytes.NewReader(bin), "", "file", "write", id, "/tmp/bin", "--mode", "0640", "-o", "yaml").exits(t, 0, "message: 'Written: /tmp/bin'\nstatus: ok\n", "")
	if r := s.osb("file", "cat", id, "/tmp/bin"); r.code != 0 || r.out != string(bin) {
		t.Errorf("cat of a binary file: exit %d, %d bytes, equal %v", r.code, len(r.out), r.out == string(bin))
	}

	// 20 MiB through upload and download, to a directory that does not
	// exist yet; the upload keeps the local mode.
	big := make([]byte, 20<<20)
	rand.Read(big)
	sum := sha256.Sum256(big)
	local := filepath.Join(dir, "big.bin")
	os.WriteFile(local, big, 0o600)
	os.Chmod(local, 0o600)
	if out := s.osb("file", "upload", id, local, "/tmp/big.bin").ok(t); !strings.Contains(out, "Uploaded: "+local+" → /tmp/big.bin") {
		t.Errorf("upload: %q", out)
	}
	if got := s.execd(id).mustRun("sha256sum /tmp/big.bin; stat -c %a /tmp/big.bin"); strings.TrimSpace(got) != hex.EncodeToString(sum[:])+"  /tmp/big.bin\n600" {
		t.Errorf("uploaded file: %q", got)
	}
	back := filepath.Join(dir, "new", "deeper", "big.bin")
	s.osb("file", "download", id, "/tmp/big.bin", back, "-o", "json").json(t, &msg)
	if msg.Message != "Downloaded: /tmp/big.bin → "+back {
		t.Errorf("download (json): %+v", msg)
	}
	if got, _ := os.ReadFile(back); sha256.Sum256(got) != sum {
		t.Errorf("downloaded %d bytes, not the uploaded ones", len(got))
	}
	if entries, _ := os.ReadDir(filepath.Dir(back)); len(entries) != 1 {
		t.Errorf("download left %d entries beside the file", len(entries))
	}

	// To stdout: "-" and /dev/stdout print the bytes and nothing else.
	s.osb("file", "download", id, "/tmp/a/hello.txt", "-").exits(t, 0, "hello world", "")
	s.osb("file", "download", id, "/tmp/bin", "/dev/stdout", "-o", "json").exits(t, 0, string(bin), "")
	s.osb("file", "download", id, "/tmp/a/hello.txt", "/dev/null").ok(t)
	// Through /dev/stdout into a file opened for appending: appended.
	appended := filepath.Join(dir, "appended.txt")
	os.WriteFile(appended, []byte("before:"), 0o644)
	out, _ := os.OpenFile(appended, os.O_WRONLY|os.O_APPEND, 0)
	cmd := s.osbCmd("", "file", "download", id, "/tmp/a/hello.txt", "/dev/stdout")
	cmd.Stdout = out
	err := cmd.Run()
	out.Close()
	if got, _ := os.ReadFile(appended); err != nil || string(got) != "before:hello world" {
		t.Errorf("download to /dev/stdout appending to a file: %v, file holds %q", err, got)
	}

	// An existing file: replaced whole, its mode kept.
	existing := filepath.Join(dir, "existing.txt")
	os.WriteFile(existing, []byte("old content that is longer"), 0o600)
	s.osb("file", "download", id, "/tmp/a/hello.txt", existing).ok(t)
	if got, _ := os.ReadFile(existing); string(got) != "hello world" {
		t.Errorf("replaced file holds %q", got)
	}
	if fi, _ := os.Stat(existing); fi.Mode().Perm() != 0o600 {
		t.Errorf("replaced file has mode %v", fi.Mode())
	}

	// A failed download leaves nothing: no file, no directory, no temp,
	// and an existing file untouched.
	s.osb("file", "download", id, "/tmp/missing", filepath.Join(dir, "nodir", "x")).fails(t, 1, "FILE_NOT_FOUND")
	s.osb("file", "download", id, "/tmp/missing", existing).fails(t, 1, "not found")
	if got, _ := os.ReadFile(existing); string(got) != "hello world" {
		t.Errorf("failed download changed the file to %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "nodir")); !os.IsNotExist(err) {
		t.Errorf("failed download created its directory: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".osb-download-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
	s.osb("file", "download", id, "/tmp/a/hello.txt", dir).fails(t, 1, "is a directory")

	// Bad input.
	s.osb("file", "upload", id, filepath.Join(dir, "nope.bin"), "/tmp/x").fails(t, 1, "nope.bin")
	s.osb("file", "upload", id, dir, "/tmp/x").fails(t, 1, "use osb cp")
	s.osb("file", "cat", id, "/tmp/missing").fails(t, 1, "not found")
	s.osb("file", "cat", id, "/tmp/a/hello.txt", "-o", "json").fails(t, 1, "does not offer -o json")
	s.osb("file", "write", id, "/tmp/x", "-c", "x", "--mode", "rw-r--r--").fails(t, 2, "invalid mode")
	s.osb("file", "write", id, "/tmp/x", "-c", "x", "--mode", "0988").fails(t, 2, "invalid mode")
	s.osb("file", "cat", id).fails(t, 2, "accepts 2 arg(s)")
	r := s.osb("file", "cat", "no-such-sandbox", "/etc/hostname")
	r.fails(t, 1, "SANDBOX_NOT_FOUND")
	r.fails(t, 1, "request_id=")
}

// TestOSBFileTree covers rm, mv, mkdir, rmdir, search, info, chmod and
// replace, in each output format.
func TestOSBFileTree(t *testing.T) {
	s := startServer(t, serverOptions{})
	id := createRunning(t, s)

	// mkdir: rows in each format; --mode applies to every path.
	var rows []struct{ Path, Status string }
	s.osb("file", "mkdir", id, "/w/a/b", "/w/c", "--mode", "750", "-o", "json").json(t, &rows)
	if len(rows) != 2 || rows[0].Path != "/w/a/b" || rows[1].Status != "created" {
		t.Errorf("mkdir (json): %+v", rows)
	}
	if out := s.osb("file", "mkdir", id, "/w/d").ok(t); !strings.Contains(out, "Created Directories") || !strings.Contains(out, "/w/d") {
		t.Errorf("mkdir (table): %q", out)
	}
	s.osb("file", "mkdir", id, "/w/e", "-o", "yaml").exits(t, 0, "- path: /w/e\n  status: created\n", "")

	for _, f := range []string{"/w/a/one.txt", "/w/a/b/two.txt", "/w/c/three.log"} {
		s.osb("file", "write", id, f, "-c", "alpha beta alpha\n", "--mode", "644").ok(t)
	}

	// info: in the order given, mode as octal digits.
	var infos []fileDoc
	s.osb("file", "info", id, "/w/a/one.txt", "/w/a/b", "-o", "json").json(t, &infos)
	if len(infos) != 2 || infos[0].Path != "/w/a/one.txt" || infos[0].Type != "file" || infos[0].Size != 17 || infos[0].Mode != 644 ||
		infos[0].Owner != "root" || infos[0].ModifiedAt.IsZero() || infos[1].Type != "directory" || infos[1].Mode != 750 {
		t.Errorf("info (json): %+v", infos)
	}
	out := s.osb("file", "info", id, "/w/a/one.txt").ok(t)
	for _, want := range []string{"Path Info", "PATH", "MODE", "MODIFIED_AT", "/w/a/one.txt", "644", "root"} {
		if !strings.Contains(out, want) {
			t.Errorf("info (table) lacks %q:\n%s", want, out)
		}
	}
	var y []map[string]any
	if err := yaml.Unmarshal([]byte(s.osb("file", "info", id, "/w/c", "-o", "yaml").ok(t)), &y); err != nil || len(y) != 1 || y[0]["mode"] != 750 || y[0]["type"] != "directory" {
		t.Errorf("info (yaml): %v %v", y, err)
	}
	s.osb("file", "info", id, "/w/a/one.txt", "/w/nothing").fails(t, 1, "not found")

	// search: entries at any depth; none is [] or a message.
	var found []fileDoc
	s.osb("file", "search", id, "/w", "-p", "*.txt", "-o", "json").json(t, &found)
	if len(found) != 2 || found[0].Mode != 644 || found[0].Size != 17 {
		t.Errorf("search (json): %+v", found)
	}
	out = s.osb("file", "search", id, "/w", "--pattern", "*.log").ok(t)
	for _, want := range []string{"Search Results", "SIZE", "OWNER", "/w/c/three.log"} {
		if !strings.Contains(out, want) {
			t.Errorf("search (table) lacks %q:\n%s", want, out)
		}
	}
	s.osb("file", "search", id, "/w", "-p", "*.none", "-o", "json").exits(t, 0, "[]\n", "")
	s.osb("file", "search", id, "/w", "-p", "*.none", "-o", "yaml").exits(t, 0, "[]\n", "")
	if out := s.osb("file", "search", id, "/w", "-p", "*.none").ok(t); !strings.Contains(out, "No files found.") {
		t.Errorf("empty search: %q", out)
	}

	// replace reports the count; chmod sets the mode.
	var rep struct {
		Status, Message, Path string
		ReplacedCount         int `json:"replaced_count"`
	}
	s.osb("file", "replace", id, "/w/a/one.txt", "--old", "alpha", "--new", "omega", "-o", "json").json(t, &rep)
	if rep.ReplacedCount != 2 || rep.Status != "ok" || rep.Message != "Replaced 2 occurrences in: /w/a/one.txt" {
		t.Errorf("replace (json): %+v", rep)
	}
	if out := s.osb("file", "replace", id, "/w/a/one.txt", "--old", "beta", "--new", "").ok(t); !strings.Contains(out, "Replaced 1 occurrence in: /w/a/one.txt") {
		t.Errorf("replace (table): %q", out)
	}
	s.osb("file", "cat", id, "/w/a/one.txt").exits(t, 0, "omega  omega\n", "")
	var msg0 statusMsg
	s.osb("file", "chmod", id, "/w/a/one.txt", "--mode", "0600", "-o", "json").json(t, &msg0)
	if msg0 != (statusMsg{"ok", "Permissions set: /w/a/one.txt"}) {
		t.Errorf("chmod (json): %+v", msg0)
	}
	if got := s.execd(id).mustRun("stat -c %a /w/a/one.txt"); strings.TrimSpace(got) != "600" {
		t.Errorf("mode after chmod: %q", got)
	}

	// mv, rm, rmdir.
	if out := s.osb("file", "mv", id, "/w/a/one.txt", "/w/moved/one.txt").ok(t); !strings.Contains(out, "Moved: /w/a/one.txt → /w/moved/one.txt") {
		t.Errorf("mv: %q", out)
	}
	s.osb("file", "cat", id, "/w/moved/one.txt").exits(t, 0, "omega  omega\n", "")
	s.osb("file", "rm", id, "/w/moved/one.txt", "/w/c/three.log", "-o", "json").json(t, &rows)
	if len(rows) != 2 || rows[1].Path != "/w/c/three.log" || rows[1].Status != "deleted" {
		t.Errorf("rm (json): %+v", rows)
	}
	if out := s.osb("file", "rm", id, "/w/a/b/two.txt").ok(t); !strings.Contains(out, "Deleted Files") {
		t.Errorf("rm (table): %q", out)
	}
	s.osb("file", "rmdir", id, "/w/a", "-o", "yaml").exits(t, 0, "- path: /w/a\n  status: removed\n", "")
	if out := s.osb("file", "rmdir", id, "/w").ok(t); !strings.Contains(out, "Removed Directories") {
		t.Errorf("rmdir (table): %q", out)
	}
	s.osb("file", "info", id, "/w").fails(t, 1, "not found")

	// Bad input: required flags and modes are usage errors.
	s.osb("file", "search", id, "/w").fails(t, 2, `required flag(s) "pattern" not set`)
	s.osb("file", "chmod", id, "/tmp").fails(t, 2, `required flag(s) "mode" not set`)
	s.osb("file", "chmod", id, "/tmp", "--mode", "8").fails(t, 2, "invalid mode")
	s.osb("file", "mkdir", id, "/tmp/x", "--mode", "abc").fails(t, 2, "invalid mode")
	s.osb("file", "replace", id, "/tmp/x", "--old", "a").fails(t, 2, `required flag(s) "new" not set`)
	s.osb("file", "replace", id, "/tmp/x", "--old", "", "--new", "b").fails(t, 2, "--old must not be empty")
	s.osb("file", "mv", id, "/tmp/none", "/tmp/other").fails(t, 1, "not found")
	s.osb("file", "rm", id).fails(t, 2, "requires at least 2 arg(s)")
}
