package execd

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// newFileServer starts a test server whose working directory (for
// relative paths) is a fresh directory, returned as root.
func newFileServer(t *testing.T, mod func(*Config)) (*Server, *testClient, string) {
	t.Helper()
	s, c := newTestServer(t, mod)
	root := t.TempDir()
	s.env.cwd = root
	return s, c, root
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustNotExist(t testing.TB, path string) {
	t.Helper()
	if _, err := os.Lstat(path); err == nil {
		t.Fatalf("%s exists, want it gone", path)
	}
}

func statT(t testing.TB, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

// mountTmpfs mounts a tmpfs of the given size (e.g. "1m") in a temporary
// directory and unmounts it when the test ends. It needs root.
func mountTmpfs(t testing.TB, size string) string {
	t.Helper()
	testenv.MustHaveRoot(t)
	dir, err := os.MkdirTemp("", "execd-tmpfs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		os.Remove(dir)
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir
}

// q builds a query string from name/value pairs.
func q(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return "?" + v.Encode()
}

func TestFileInfo(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	writeFile(t, filepath.Join(root, "a.txt"), "hello")
	os.Chmod(filepath.Join(root, "a.txt"), 0o640)
	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	os.Symlink("a.txt", filepath.Join(root, "link"))
	syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600)
	writeFile(t, filepath.Join(root, "dir", "日本語 ü.txt"), "x")
	writeFile(t, filepath.Join(root, "b"), "b")

	tests := []struct {
		name     string
		path     string
		wantPath string
		wantType string
		wantSize int64
		wantMode int
	}{
		{"file", filepath.Join(root, "a.txt"), filepath.Join(root, "a.txt"), "file", 5, 640},
		{"directory", filepath.Join(root, "dir"), filepath.Join(root, "dir"), "directory", -1, 755},
		{"symlink not followed", filepath.Join(root, "link"), filepath.Join(root, "link"), "symlink", 5, 777},
		{"fifo", filepath.Join(root, "fifo"), filepath.Join(root, "fifo"), "other", 0, 600},
		{"relative", "a.txt", filepath.Join(root, "a.txt"), "file", 5, 640},
		{"non-ASCII", filepath.Join(root, "dir", "日本語 ü.txt"), filepath.Join(root, "dir", "日本語 ü.txt"), "file", 1, 644},
		{"dot-dot cleaned", "dir/../b", filepath.Join(root, "b"), "file", 1, 644},
		{"dot-dot past root is literal", "../../../../../../../../.." + root + "/b", filepath.Join(root, "b"), "file", 1, 644},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got map[string]api.FileInfo
			c.call(http.MethodGet, "/files/info"+q("path", tt.path), nil, http.StatusOK, &got)
			fi, ok := got[tt.path]
			if !ok || len(got) != 1 {
				t.Fatalf("answer %v has no single key %q", got, tt.path)
			}
			if fi.Path != tt.wantPath || fi.Type != tt.wantType || fi.Mode != tt.wantMode || (tt.wantSize >= 0 && fi.Size != tt.wantSize) {
				t.Fatalf("got %+v, want path %s type %s size %d mode %d", fi, tt.wantPath, tt.wantType, tt.wantSize, tt.wantMode)
			}
			st := statT(t, tt.wantPath)
			if want := time.Unix(st.Mtim.Sec, st.Mtim.Nsec); !fi.ModifiedAt.Equal(want) {
				t.Errorf("modified_at %v, want %v", fi.ModifiedAt, want)
			}
			if want := time.Unix(st.Ctim.Sec, st.Ctim.Nsec); !fi.CreatedAt.Equal(want) {
				t.Errorf("created_at %v, want ctime %v", fi.CreatedAt, want)
			}
			if os.Geteuid() == 0 && (fi.Owner != "root" || fi.Group != "root") {
				t.Errorf("owner %q group %q, want root root", fi.Owner, fi.Group)
			}
		})
	}

	t.Run("several paths", func(t *testing.T) {
		var got map[string]api.FileInfo
		c.call(http.MethodGet, "/files/info"+q("path", "a.txt", "path", "dir"), nil, http.StatusOK, &got)
		if len(got) != 2 || got["a.txt"].Type != "file" || got["dir"].Type != "directory" {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("no path", func(t *testing.T) {
		body := c.call(http.MethodGet, "/files/info", nil, http.StatusOK, nil)
		if strings.TrimSpace(string(body)) != "{}" {
			t.Fatalf("body %s, want {}", body)
		}
	})
	t.Run("wire format", func(t *testing.T) {
		var got map[string]map[string]any
		c.call(http.MethodGet, "/files/info"+q("path", "a.txt"), nil, http.StatusOK, &got)
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range got["a.txt"] {
				if !yield(k) {
					return
				}
			}
		})
		want := []string{"created_at", "group", "mode", "modified_at", "owner", "path", "size", "type"}
		if !reflect.DeepEqual(keys, want) {
			t.Fatalf("keys %v, want %v", keys, want)
		}
		if _, err := time.Parse(time.RFC3339Nano, got["a.txt"]["modified_at"].(string)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("numeric owner when unknown", func(t *testing.T) {
		testenv.MustHaveRoot(t)
		p := filepath.Join(root, "odd")
		writeFile(t, p, "")
		if err := os.Chown(p, 54321, 54322); err != nil {
			t.Fatal(err)
		}
		var got map[string]api.FileInfo
		c.call(http.MethodGet, "/files/info"+q("path", p), nil, http.StatusOK, &got)
		if got[p].Owner != "54321" || got[p].Group != "54322" {
			t.Fatalf("owner %q group %q, want numeric ids", got[p].Owner, got[p].Group)
		}
	})

	errs := []struct {
		name, query string
		status      int
		code        string
	}{
		{"missing", q("path", "nope"), http.StatusNotFound, api.CodeFileNotFound},
		{"one of several missing", q("path", "a.txt", "path", "nope"), http.StatusNotFound, api.CodeFileNotFound},
		{"through a file", q("path", "a.txt/x"), http.StatusNotFound, api.CodeFileNotFound},
		{"NUL byte", q("path", "a\x00b"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"empty", q("path", ""), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"undefined variable", q("path", "$EXECD_TEST_UNDEFINED/x"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"name too long", q("path", strings.Repeat("n", 300)), http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodGet, "/files/info"+tt.query, nil, tt.status, tt.code)
		})
	}
}

func TestModeDigits(t *testing.T) {
	for _, tt := range []struct {
		mode os.FileMode
		want int
	}{{0o755, 755}, {0o644, 644}, {0o7, 7}, {0, 0}, {0o777 | os.ModeSetuid | os.ModeSticky, 777}} {
		if got := modeDigits(tt.mode); got != tt.want {
			t.Errorf("modeDigits(%o) = %d, want %d", tt.mode, got, tt.want)
		}
	}
	for _, tt := range []struct {
		digits int
		want   uint32
		ok     bool
	}{{755, 0o755, true}, {644, 0o644, true}, {4755, 0o4755, true}, {7, 0o7, true}, {0, 0, true},
		{8, 0, false}, {790, 0, false}, {-1, 0, false}, {17777, 0, false}} {
		got, err := parseModeDigits(tt.digits)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseModeDigits(%d) = %o, %v; want %o, ok %v", tt.digits, got, err, tt.want, tt.ok)
		}
	}
}

func TestDeleteFiles(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	writeFile(t, filepath.Join(root, "a"), "a")
	writeFile(t, filepath.Join(root, "b"), "b")
	writeFile(t, filepath.Join(root, "target"), "t")
	os.Symlink("target", filepath.Join(root, "link"))
	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	writeFile(t, filepath.Join(root, "ü ñ"), "x")

	c.call(http.MethodDelete, "/files"+q("path", "a", "path", "missing", "path", filepath.Join(root, "link"), "path", "dir/../ü ñ"), nil, http.StatusOK, nil)
	mustNotExist(t, filepath.Join(root, "a"))
	mustNotExist(t, filepath.Join(root, "link"))
	mustNotExist(t, filepath.Join(root, "ü ñ"))
	if readFile(t, filepath.Join(root, "target")) != "t" {
		t.Fatal("deleting a link touched its target")
	}

	c.call(http.MethodDelete, "/files", nil, http.StatusOK, nil)
	c.wantError(http.MethodDelete, "/files"+q("path", "dir"), nil, http.StatusInternalServerError, api.CodeRuntimeError)
	if _, err := os.Stat(filepath.Join(root, "dir")); err != nil {
		t.Fatal("directory removed")
	}
	c.wantError(http.MethodDelete, "/files"+q("path", "b", "path", "x\x00"), nil, http.StatusBadRequest, api.CodeInvalidRequestBody)
	if readFile(t, filepath.Join(root, "b")) != "b" {
		t.Fatal("a request with a bad path removed a file")
	}
}

func TestSetPermissions(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	writeFile(t, a, "a")
	writeFile(t, b, "b")
	mode := func(p string) os.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
	}

	t.Run("mode only", func(t *testing.T) {
		c.call(http.MethodPost, "/files/permissions", map[string]api.Permission{"a": {Mode: 600}, b: {Mode: 751}}, http.StatusOK, nil)
		if mode(a) != 0o600 || mode(b) != 0o751 {
			t.Fatalf("modes %o %o", mode(a), mode(b))
		}
	})
	t.Run("mode 0 leaves the mode", func(t *testing.T) {
		c.call(http.MethodPost, "/files/permissions", map[string]api.Permission{"a": {}}, http.StatusOK, nil)
		if mode(a) != 0o600 {
			t.Fatalf("mode %o", mode(a))
		}
	})
	t.Run("setuid digit", func(t *testing.T) {
		c.call(http.MethodPost, "/files/permissions", `{"a": {"mode": 4755}}`, http.StatusOK, nil)
		if mode(a) != 0o755|os.ModeSetuid {
			t.Fatalf("mode %v", mode(a))
		}
	})
	t.Run("owner and group", func(t *testing.T) {
		testenv.MustHaveRoot(t)
		os.Chown(a, 1234, 1235)
		// No owner or group: the owner is left alone (the reference
		// daemon would chown to itself).
		c.call(http.MethodPost, "/files/permissions", `{"a": {"mode": 640}}`, http.StatusOK, nil)
		if st := statT(t, a); st.Uid != 1234 || st.Gid != 1235 {
			t.Fatalf("owner changed to %d:%d", st.Uid, st.Gid)
		}
		c.call(http.MethodPost, "/files/permissions", `{"a": {"owner": "root"}}`, http.StatusOK, nil)
		if st := statT(t, a); st.Uid != 0 || st.Gid != 1235 {
			t.Fatalf("owner %d:%d, want 0:1235", st.Uid, st.Gid)
		}
		c.call(http.MethodPost, "/files/permissions", `{"a": {"group": "4321"}}`, http.StatusOK, nil)
		if st := statT(t, a); st.Uid != 0 || st.Gid != 4321 {
			t.Fatalf("owner %d:%d, want 0:4321", st.Uid, st.Gid)
		}
		c.call(http.MethodPost, "/files/permissions", `{"a": {"owner": "777", "group": "root", "mode": 2750}}`, http.StatusOK, nil)
		if st := statT(t, a); st.Uid != 777 || st.Gid != 0 || mode(a) != 0o750|os.ModeSetgid {
			t.Fatalf("owner %d:%d mode %v", st.Uid, st.Gid, mode(a))
		}
	})
	t.Run("in request order", func(t *testing.T) {
		c.call(http.MethodPost, "/files/permissions", `{"a": {"mode": 700}, "a": {"mode": 644}}`, http.StatusOK, nil)
		if mode(a) != 0o644 {
			t.Fatalf("mode %o, want the last entry's 644", mode(a))
		}
	})

	errs := []struct {
		name   string
		body   string
		status int
		code   string
		in     string // text the message must contain
	}{
		{"unknown owner", `{"b": {"mode": 700}, "a": {"owner": "no-such-user-xyz"}}`, http.StatusBadRequest, api.CodeInvalidRequestBody, "no-such-user-xyz"},
		{"unknown group", `{"b": {"mode": 700}, "a": {"group": "no-such-group-xyz"}}`, http.StatusBadRequest, api.CodeInvalidRequestBody, "no-such-group-xyz"},
		{"missing path", `{"b": {"mode": 700}, "nope": {"mode": 700}}`, http.StatusNotFound, api.CodeFileNotFound, "nope"},
		{"bad mode", `{"b": {"mode": 700}, "a": {"mode": 789}}`, http.StatusBadRequest, api.CodeInvalidRequestBody, "789"},
		{"bad JSON", `{"b": `, http.StatusBadRequest, api.CodeInvalidRequestBody, ""},
		{"not an object", `[1]`, http.StatusBadRequest, api.CodeInvalidRequestBody, ""},
		{"bad entry", `{"b": 5}`, http.StatusBadRequest, api.CodeInvalidRequestBody, ""},
		{"NUL in path", `{"b": {"mode": 700}, "a\u0000": {"mode": 700}}`, http.StatusBadRequest, api.CodeInvalidRequestBody, ""},
		{"empty body", ``, http.StatusBadRequest, api.CodeInvalidRequestBody, ""},
	}
	os.Chmod(b, 0o644)
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			e := c.wantError(http.MethodPost, "/files/permissions", tt.body, tt.status, tt.code)
			if !strings.Contains(e.Message, tt.in) {
				t.Errorf("message %q does not name %q", e.Message, tt.in)
			}
			if mode(b) != 0o644 {
				t.Fatalf("a failed request changed b to %o", mode(b))
			}
		})
	}
	c.call(http.MethodPost, "/files/permissions", `null`, http.StatusOK, nil)
	c.call(http.MethodPost, "/files/permissions", `{}`, http.StatusOK, nil)
}

func TestMoveFiles(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	p := func(name string) string { return filepath.Join(root, name) }
	writeFile(t, p("a"), "a")
	writeFile(t, p("tree/x/y"), "y")
	writeFile(t, p("existing"), "e")

	c.call(http.MethodPost, "/files/mv", []api.RenameFileItem{
		{Src: "a", Dest: "new/parents/a2"},      // parents created
		{Src: "new/parents/a2", Dest: "a3"},     // in order
		{Src: "tree", Dest: "moved/../tree2"},   // directories; ".." cleaned
		{Src: p("tree2/x/y"), Dest: "日本/ü.txt"}, // non-ASCII
	}, http.StatusOK, nil)
	mustNotExist(t, p("a"))
	mustNotExist(t, p("new/parents/a2"))
	if readFile(t, p("a3")) != "a" || readFile(t, p("日本/ü.txt")) != "y" {
		t.Fatal("moved content differs")
	}
	if fi, err := os.Stat(p("tree2/x")); err != nil || !fi.IsDir() {
		t.Fatalf("tree2/x: %v", err)
	}
	mustNotExist(t, p("moved"))

	errs := []struct {
		name   string
		items  any
		status int
		code   string
	}{
		{"existing destination", []api.RenameFileItem{{Src: "a3", Dest: "existing"}}, http.StatusInternalServerError, api.CodeRuntimeError},
		{"existing directory destination", []api.RenameFileItem{{Src: "a3", Dest: "tree2"}}, http.StatusInternalServerError, api.CodeRuntimeError},
		{"missing source", []api.RenameFileItem{{Src: "nope", Dest: "z"}}, http.StatusNotFound, api.CodeFileNotFound},
		{"into itself", []api.RenameFileItem{{Src: "tree2", Dest: "tree2/x/inner"}}, http.StatusInternalServerError, api.CodeRuntimeError},
		{"empty source", []api.RenameFileItem{{Src: "", Dest: "z"}}, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"NUL", []api.RenameFileItem{{Src: "a3", Dest: "z\x00"}}, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"bad JSON", `{"src":"a3"}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodPost, "/files/mv", tt.items, tt.status, tt.code)
			if readFile(t, p("a3")) != "a" || readFile(t, p("existing")) != "e" {
				t.Fatal("a failed move changed files")
			}
		})
	}
	t.Run("stops at the first failure", func(t *testing.T) {
		c.wantError(http.MethodPost, "/files/mv", []api.RenameFileItem{{Src: "a3", Dest: "a4"}, {Src: "nope", Dest: "z"}, {Src: "existing", Dest: "e2"}},
			http.StatusNotFound, api.CodeFileNotFound)
		mustNotExist(t, p("a3"))
		if readFile(t, p("a4")) != "a" || readFile(t, p("existing")) != "e" {
			t.Fatal("moves before the failure should stay, after it never happen")
		}
	})
}

func TestMoveAcrossFileSystems(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	other := mountTmpfs(t, "16m")
	src := filepath.Join(root, "src")
	writeFile(t, filepath.Join(src, "file"), "content")
	writeFile(t, filepath.Join(src, "sub", "deep"), "deep")
	os.Chown(filepath.Join(src, "file"), 1234, 1235)
	unix.Chmod(filepath.Join(src, "file"), 0o4751)
	os.Symlink("../file", filepath.Join(src, "sub", "link"))
	os.Lchown(filepath.Join(src, "sub", "link"), 1236, 1237)
	os.Link(filepath.Join(src, "file"), filepath.Join(src, "hard"))
	syscall.Mkfifo(filepath.Join(src, "fifo"), 0o640)
	old := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	for _, n := range []string{"file", "sub/deep", "sub", "."} {
		os.Chtimes(filepath.Join(src, n), old, old)
	}
	ts := unix.NsecToTimespec(old.UnixNano())
	unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(src, "sub", "link"), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	os.Chmod(filepath.Join(src, "sub"), 0o750)
	os.Chtimes(filepath.Join(src, "sub"), old, old)
	writeFile(t, filepath.Join(root, "single"), "single")

	dst := filepath.Join(other, "nested", "dst")
	c.call(http.MethodPost, "/files/mv", []api.RenameFileItem{{Src: src, Dest: dst}, {Src: "single", Dest: filepath.Join(other, "single")}}, http.StatusOK, nil)
	mustNotExist(t, src)
	mustNotExist(t, filepath.Join(root, "single"))
	if readFile(t, filepath.Join(other, "single")) != "single" || readFile(t, filepath.Join(dst, "sub", "deep")) != "deep" {
		t.Fatal("content lost")
	}
	st := statT(t, filepath.Join(dst, "file"))
	if st.Mode&0o7777 != 0o4751 || st.Uid != 1234 || st.Gid != 1235 || time.Unix(st.Mtim.Sec, st.Mtim.Nsec) != old.Local() {
		t.Errorf("file: mode %o owner %d:%d mtime %v", st.Mode&0o7777, st.Uid, st.Gid, time.Unix(st.Mtim.Sec, st.Mtim.Nsec))
	}
	if hard := statT(t, filepath.Join(dst, "hard")); hard.Ino != st.Ino {
		t.Error("hard link became a copy")
	}
	if target, err := os.Readlink(filepath.Join(dst, "sub", "link")); err != nil || target != "../file" {
		t.Errorf("link: %q, %v", target, err)
	}
	if l := statT(t, filepath.Join(dst, "sub", "link")); l.Uid != 1236 || time.Unix(l.Mtim.Sec, l.Mtim.Nsec) != old.Local() {
		t.Errorf("link owner %d mtime %v", l.Uid, time.Unix(l.Mtim.Sec, l.Mtim.Nsec))
	}
	if sub := statT(t, filepath.Join(dst, "sub")); sub.Mode&0o777 != 0o750 || time.Unix(sub.Mtim.Sec, sub.Mtim.Nsec) != old.Local() {
		t.Errorf("sub: mode %o mtime %v", sub.Mode&0o777, time.Unix(sub.Mtim.Sec, sub.Mtim.Nsec))
	}
	if f := statT(t, filepath.Join(dst, "fifo")); f.Mode&syscall.S_IFMT != syscall.S_IFIFO || f.Mode&0o777 != 0o640 {
		t.Errorf("fifo mode %o", f.Mode)
	}
	if got := leftovers(t, other, root); len(got) > 0 {
		t.Errorf("temporary files left: %v", got)
	}

	t.Run("existing destination", func(t *testing.T) {
		writeFile(t, filepath.Join(root, "x"), "x")
		writeFile(t, filepath.Join(other, "x"), "other")
		c.wantError(http.MethodPost, "/files/mv", []api.RenameFileItem{{Src: "x", Dest: filepath.Join(other, "x")}}, http.StatusInternalServerError, api.CodeRuntimeError)
		if readFile(t, filepath.Join(root, "x")) != "x" || readFile(t, filepath.Join(other, "x")) != "other" {
			t.Fatal("files changed")
		}
	})
}

func TestMoveAcrossFileSystemsFailure(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	small := mountTmpfs(t, "256k")
	src := filepath.Join(root, "src")
	writeFile(t, filepath.Join(src, "a"), "small")
	writeFile(t, filepath.Join(src, "b"), strings.Repeat("x", 1<<20))
	e := c.call(http.MethodPost, "/files/mv", []api.RenameFileItem{{Src: src, Dest: filepath.Join(small, "dst")}}, http.StatusInsufficientStorage, nil)
	var er api.ErrorResponse
	json.Unmarshal(e, &er)
	if er.Code != api.CodeInsufficientStorage {
		t.Fatalf("answer %s", e)
	}
	if readFile(t, filepath.Join(src, "a")) != "small" || len(readFile(t, filepath.Join(src, "b"))) != 1<<20 {
		t.Fatal("source damaged")
	}
	entries, _ := os.ReadDir(small)
	if len(entries) != 0 {
		t.Fatalf("partial copy left: %v", entries)
	}
}

func TestSearchFiles(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	for _, f := range []string{"main.go", "README.md", "src/a.go", "src/b.py", "src/pkg/c.go", "src/pkg/d.py", "cmd/tool/main.go", "cmd/main.go", "日本/ü.py"} {
		writeFile(t, filepath.Join(root, "tree", f), f)
	}
	os.Symlink(filepath.Join(root, "tree", "src"), filepath.Join(root, "tree", "srclink"))
	os.Symlink(filepath.Join(root, "tree"), filepath.Join(root, "treelink"))

	search := func(t *testing.T, path, pattern string) []string {
		t.Helper()
		var got []api.FileInfo
		query := q("path", path)
		if pattern != "" {
			query = q("path", path, "pattern", pattern)
		}
		c.call(http.MethodGet, "/files/search"+query, nil, http.StatusOK, &got)
		names := []string{}
		base := filepath.Join(root, strings.TrimPrefix(path, root))
		for _, fi := range got {
			if fi.Type == "directory" {
				t.Errorf("directory %s in results", fi.Path)
			}
			rel, err := filepath.Rel(base, fi.Path)
			if err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("result %s is outside %s", fi.Path, base)
			}
			names = append(names, rel)
		}
		return names
	}
	tests := []struct {
		name, path, pattern string
		want                []string
	}{
		{"default matches all", "tree", "", []string{"README.md", "cmd/main.go", "cmd/tool/main.go", "main.go", "src/a.go", "src/b.py", "src/pkg/c.go", "src/pkg/d.py", "srclink", "日本/ü.py"}},
		{"base name at any depth", "tree", "*.py", []string{"src/b.py", "src/pkg/d.py", "日本/ü.py"}},
		{"base name exact", "tree", "main.go", []string{"cmd/main.go", "cmd/tool/main.go", "main.go"}},
		{"braces", "tree", "*.{md,py}", []string{"README.md", "src/b.py", "src/pkg/d.py", "日本/ü.py"}},
		{"relative with doublestar", "tree", "src/**/*.go", []string{"src/a.go", "src/pkg/c.go"}},
		{"relative one level", "tree", "*/main.go", []string{"cmd/main.go"}},
		{"relative any depth", "tree", "**/main.go", []string{"cmd/main.go", "cmd/tool/main.go", "main.go"}},
		{"link not followed", "tree", "srclink/*", nil},
		{"link reported", "tree", "srclink", []string{"srclink"}},
		{"root link followed", filepath.Join(root, "treelink"), "*.md", []string{"README.md"}},
		{"no match", "tree", "*.rs", nil},
		{"dot-dot cleaned", "tree/src/../cmd", "*.go", []string{"main.go", "tool/main.go"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := search(t, tt.path, tt.pattern)
			if tt.want == nil {
				tt.want = []string{}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("search %s %q = %q, want %q", tt.path, tt.pattern, got, tt.want)
			}
		})
	}
	t.Run("empty answer is a list", func(t *testing.T) {
		body := c.call(http.MethodGet, "/files/search"+q("path", "tree", "pattern", "*.none"), nil, http.StatusOK, nil)
		if strings.TrimSpace(string(body)) != "[]" {
			t.Fatalf("body %s", body)
		}
	})
	errs := []struct {
		name, query string
		status      int
		code        string
	}{
		{"no path", q("pattern", "*"), http.StatusBadRequest, api.CodeMissingQuery},
		{"missing", q("path", "nope"), http.StatusNotFound, api.CodeFileNotFound},
		{"bad pattern", q("path", "tree", "pattern", "[a-"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"NUL", q("path", "tree\x00"), http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodGet, "/files/search"+tt.query, nil, tt.status, tt.code)
		})
	}
}

func TestReplaceInFiles(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	p := func(name string) string { return filepath.Join(root, name) }
	writeFile(t, p("a"), "foo bar foo")
	writeFile(t, p("b"), "nothing here")
	writeFile(t, p("real"), "via link foo")
	os.Symlink("real", p("link"))
	writeFile(t, p("hard1"), "hard foo")
	os.Link(p("hard1"), p("hard2"))
	unix.Chmod(p("a"), 0o4751)
	bBefore := statT(t, p("b"))

	var got map[string]api.ReplaceResult
	c.call(http.MethodPost, "/files/replace?verbose=true",
		`{"a": {"old": "foo", "new": "ü"}, "b": {"old": "zzz", "new": "y"}, "link": {"old": "foo", "new": "bar"}, "hard1": {"old": "foo", "new": "baz"}}`,
		http.StatusOK, &got)
	want := map[string]api.ReplaceResult{"a": {ReplacedCount: 2}, "b": {ReplacedCount: 0}, "link": {ReplacedCount: 1}, "hard1": {ReplacedCount: 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	if readFile(t, p("a")) != "ü bar ü" || readFile(t, p("real")) != "via link bar" || readFile(t, p("hard2")) != "hard baz" {
		t.Fatal("content not replaced")
	}
	if fi, _ := os.Lstat(p("link")); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("the link was replaced by a file")
	}
	if st := statT(t, p("a")); st.Mode&0o7777 != 0o4751 {
		t.Fatalf("mode %o not kept", st.Mode&0o7777)
	}
	if st := statT(t, p("b")); st.Mtim != bBefore.Mtim || st.Ino != bBefore.Ino {
		t.Fatal("a file without matches was rewritten")
	}
	if statT(t, p("hard1")).Ino != statT(t, p("hard2")).Ino {
		t.Fatal("hard link broken")
	}
	body := c.call(http.MethodPost, "/files/replace", `{"a": {"old": "bar", "new": "qux"}}`, http.StatusOK, nil)
	if len(body) != 0 || readFile(t, p("a")) != "ü qux ü" {
		t.Fatalf("body %q content %q", body, readFile(t, p("a")))
	}
	if got := leftovers(t, root); len(got) > 0 {
		t.Fatalf("temporary files left: %v", got)
	}

	t.Run("owner kept", func(t *testing.T) {
		testenv.MustHaveRoot(t)
		os.Chown(p("b"), 1234, 1235)
		c.call(http.MethodPost, "/files/replace", `{"b": {"old": "here", "new": "there"}}`, http.StatusOK, nil)
		if st := statT(t, p("b")); st.Uid != 1234 || st.Gid != 1235 || readFile(t, p("b")) != "nothing there" {
			t.Fatalf("owner %d:%d", st.Uid, st.Gid)
		}
	})

	os.Mkdir(p("dir"), 0o755)
	errs := []struct {
		name, body string
		status     int
		code       string
	}{
		{"empty old", `{"a": {"old": "ü", "new": "x"}, "b": {"old": "", "new": "x"}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"missing file", `{"a": {"old": "ü", "new": "x"}, "nope": {"old": "a", "new": "x"}}`, http.StatusNotFound, api.CodeFileNotFound},
		{"directory", `{"a": {"old": "ü", "new": "x"}, "dir": {"old": "a", "new": "x"}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"NUL path", `{"a": {"old": "ü", "new": "x"}, "a\u0000": {"old": "a", "new": "x"}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"bad JSON", `{"a": {"old": 1}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodPost, "/files/replace", tt.body, tt.status, tt.code)
			if readFile(t, p("a")) != "ü qux ü" {
				t.Fatal("a failed request changed a file")
			}
		})
	}
}

func TestListDirectory(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	for _, f := range []string{"b/z", "b/a/deep/x", "a", "c/日本"} {
		writeFile(t, filepath.Join(root, "d", f), "")
	}
	os.Symlink(filepath.Join(root, "d", "b"), filepath.Join(root, "d", "blink"))
	os.Symlink(filepath.Join(root, "d"), filepath.Join(root, "dlink"))
	list := func(t *testing.T, query string) []string {
		t.Helper()
		var got []api.FileInfo
		c.call(http.MethodGet, "/directories/list"+query, nil, http.StatusOK, &got)
		out := []string{}
		for _, fi := range got {
			rel, _ := filepath.Rel(filepath.Join(root, "d"), fi.Path)
			out = append(out, rel+":"+fi.Type)
		}
		return out
	}
	tests := []struct {
		name, query string
		want        []string
	}{
		{"default depth", q("path", "d"), []string{"a:file", "b:directory", "blink:symlink", "c:directory"}},
		{"depth 2", q("path", "d", "depth", "2"), []string{"a:file", "b:directory", "b/a:directory", "b/z:file", "blink:symlink", "c:directory", "c/日本:file"}},
		{"deep", q("path", filepath.Join(root, "d"), "depth", "100"), []string{"a:file", "b:directory", "b/a:directory", "b/a/deep:directory", "b/a/deep/x:file", "b/z:file", "blink:symlink", "c:directory", "c/日本:file"}},
		{"depth 0", q("path", "d", "depth", "0"), []string{}},
		{"dot-dot cleaned", q("path", "d/c/../b"), []string{"b/a:directory", "b/z:file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := list(t, tt.query); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("list %s = %q, want %q", tt.query, got, tt.want)
			}
		})
	}
	errs := []struct {
		name, query string
		status      int
		code        string
	}{
		{"no path", q("depth", "1"), http.StatusBadRequest, api.CodeMissingQuery},
		{"missing", q("path", "nope"), http.StatusNotFound, api.CodeFileNotFound},
		{"file", q("path", "d/a"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"symlink", q("path", "dlink"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"bad depth", q("path", "d", "depth", "x"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"negative depth", q("path", "d", "depth", "-1"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"NUL", q("path", "d\x00"), http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodGet, "/directories/list"+tt.query, nil, tt.status, tt.code)
		})
	}
}

func TestMakeDirectories(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	writeFile(t, filepath.Join(root, "file"), "f")
	c.call(http.MethodPost, "/directories", `{"x/y/z": {"mode": 700}, "日本/ü": {}, "x/y": {"mode": 750}}`, http.StatusOK, nil)
	if st := statT(t, filepath.Join(root, "x/y/z")); st.Mode&0o777 != 0o700 {
		t.Fatalf("mode %o", st.Mode&0o777)
	}
	if st := statT(t, filepath.Join(root, "x/y")); st.Mode&0o777 != 0o750 {
		t.Fatalf("existing directory: mode %o", st.Mode&0o777)
	}
	if fi, err := os.Stat(filepath.Join(root, "日本/ü")); err != nil || !fi.IsDir() {
		t.Fatal(err)
	}
	t.Run("owner", func(t *testing.T) {
		testenv.MustHaveRoot(t)
		c.call(http.MethodPost, "/directories", `{"owned": {"owner": "1234", "group": "1235", "mode": 755}}`, http.StatusOK, nil)
		if st := statT(t, filepath.Join(root, "owned")); st.Uid != 1234 || st.Gid != 1235 {
			t.Fatalf("owner %d:%d", st.Uid, st.Gid)
		}
	})
	errs := []struct {
		name, body string
		status     int
		code       string
	}{
		{"through a file", `{"file/sub": {}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"is a file", `{"file": {}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"unknown owner", `{"new1": {"owner": "no-such-user-xyz"}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"NUL", `{"new2\u0000": {}}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"bad JSON", `{"new3": []}`, http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodPost, "/directories", tt.body, tt.status, tt.code)
		})
	}
	mustNotExist(t, filepath.Join(root, "new1"))
}

func TestRemoveDirectories(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	writeFile(t, filepath.Join(root, "d/a/b/c"), "c")
	writeFile(t, filepath.Join(root, "keep/f"), "f")
	os.Symlink(filepath.Join(root, "keep"), filepath.Join(root, "d", "link"))
	os.Symlink(filepath.Join(root, "keep"), filepath.Join(root, "klink"))
	writeFile(t, filepath.Join(root, "file"), "f")
	c.call(http.MethodDelete, "/directories"+q("path", "d", "path", "missing"), nil, http.StatusOK, nil)
	mustNotExist(t, filepath.Join(root, "d"))
	if readFile(t, filepath.Join(root, "keep/f")) != "f" {
		t.Fatal("removal followed a link")
	}
	c.call(http.MethodDelete, "/directories", nil, http.StatusOK, nil)
	for _, tt := range []struct{ name, query string }{
		{"file", q("path", "keep", "path", "file")},
		{"link to directory", q("path", "keep", "path", "klink")},
		{"root", q("path", "keep", "path", "/")},
		{"NUL", q("path", "keep", "path", "x\x00")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c.wantError(http.MethodDelete, "/directories"+tt.query, nil, http.StatusBadRequest, api.CodeInvalidRequestBody)
			if readFile(t, filepath.Join(root, "keep/f")) != "f" {
				t.Fatal("a failed request removed a directory")
			}
		})
	}
}
