package execd

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/fsops"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// mpart is one part of a multipart upload body built by tests.
type mpart struct {
	name     string // form name: "metadata", "file" or anything else
	filename string // "" sends no filename
	data     []byte
	reader   io.Reader // content streamed instead of data when set
}

func metaPart(json string) mpart {
	return mpart{name: "metadata", filename: "metadata", data: []byte(json)}
}
func filePart(content []byte) mpart {
	return mpart{name: "file", filename: "blob", data: content}
}

// writeParts writes parts as a multipart/form-data body to w and closes it.
func writeParts(mw *multipart.Writer, parts []mpart) error {
	for _, p := range parts {
		h := make(textproto.MIMEHeader)
		cd := fmt.Sprintf(`form-data; name=%q`, p.name)
		if p.filename != "" {
			cd += fmt.Sprintf(`; filename=%q`, p.filename)
		}
		h.Set("Content-Disposition", cd)
		if p.name == "metadata" {
			h.Set("Content-Type", "application/json")
		} else {
			h.Set("Content-Type", "application/octet-stream")
		}
		pw, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		src := p.reader
		if src == nil {
			src = bytes.NewReader(p.data)
		}
		if _, err := io.Copy(pw, src); err != nil {
			return err
		}
	}
	return mw.Close()
}

// buildMultipart builds a whole upload body in memory.
func buildMultipart(t testing.TB, parts ...mpart) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := writeParts(mw, parts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), mw.FormDataContentType()
}

// streamBody returns a body that is written while it is read, so that
// huge uploads need no memory on the client side.
func streamBody(parts ...mpart) (io.ReadCloser, string) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() { pw.CloseWithError(writeParts(mw, parts)) }()
	return pr, mw.FormDataContentType()
}

// upload posts parts to /files/upload and returns the response.
func (c *testClient) upload(parts ...mpart) (*http.Response, []byte) {
	c.t.Helper()
	body, ct := buildMultipart(c.t, parts...)
	req := c.request(http.MethodPost, "/files/upload", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	return c.do(req)
}

// leftovers lists temporary upload files under the given directories.
func leftovers(t testing.TB, dirs ...string) []string {
	t.Helper()
	var found []string
	for _, dir := range dirs {
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && fsops.IsTemp(d.Name()) {
				found = append(found, p)
			}
			return nil
		})
	}
	return found
}

// meta builds a metadata JSON object.
func meta(path string, extra ...string) string {
	s := fmt.Sprintf(`{"path":%q`, path)
	for _, e := range extra {
		s += "," + e
	}
	return s + "}"
}

func umask() os.FileMode {
	old := syscall.Umask(0)
	syscall.Umask(old)
	return os.FileMode(old)
}

func TestUpload(t *testing.T) {
	s, c, root := newFileServer(t, nil)
	p := func(name string) string { return filepath.Join(root, name) }
	perm := func(path string) os.FileMode {
		return os.FileMode(statT(t, path).Mode & 0o7777)
	}
	writeFile(t, p("existing"), "old content")
	os.Chmod(p("existing"), 0o600)
	writeFile(t, p("real"), "real")
	os.Symlink("real", p("link"))

	tests := []struct {
		name  string
		parts []mpart
		want  map[string]string // file -> content
		check func(t *testing.T)
	}{
		{"one file", []mpart{metaPart(meta(p("one"))), filePart([]byte("hello"))},
			map[string]string{"one": "hello"}, func(t *testing.T) {
				if got, want := perm(p("one")), 0o777&^umask(); got != want {
					t.Errorf("new file mode %o, want 0777 &^ umask = %o", got, want)
				}
			}},
		{"several files, parents created", []mpart{
			metaPart(meta(p("a/b/c.txt"), `"mode":640`)), filePart([]byte("c")),
			metaPart(meta("rel/d.txt")), filePart([]byte("d")),
		}, map[string]string{"a/b/c.txt": "c", "rel/d.txt": "d"}, func(t *testing.T) {
			if perm(p("a/b/c.txt")) != 0o640 {
				t.Errorf("mode %o", perm(p("a/b/c.txt")))
			}
		}},
		{"metadata without filename", []mpart{{name: "metadata", data: []byte(meta(p("nofn")))}, filePart([]byte("x"))},
			map[string]string{"nofn": "x"}, nil},
		{"file before its metadata", []mpart{filePart([]byte("first")), metaPart(meta(p("ff")))},
			map[string]string{"ff": "first"}, nil},
		{"files before all metadata", []mpart{
			filePart([]byte("1")), filePart([]byte("2")), metaPart(meta(p("m1"))), metaPart(meta(p("m2"))),
		}, map[string]string{"m1": "1", "m2": "2"}, nil},
		{"interleaved", []mpart{
			metaPart(meta(p("i1"))), filePart([]byte("1")), filePart([]byte("2")), {name: "other", data: []byte("ignored")}, metaPart(meta(p("i2"), `"mode":600`)),
		}, map[string]string{"i1": "1", "i2": "2"}, func(t *testing.T) {
			if perm(p("i2")) != 0o600 {
				t.Errorf("staged file mode %o", perm(p("i2")))
			}
		}},
		{"overwrite keeps mode", []mpart{metaPart(meta(p("existing"))), filePart([]byte("new"))},
			map[string]string{"existing": "new"}, func(t *testing.T) {
				if perm(p("existing")) != 0o600 {
					t.Errorf("mode %o, want the old 600", perm(p("existing")))
				}
			}},
		{"overwrite with mode", []mpart{metaPart(meta(p("existing"), `"mode":4755`)), filePart([]byte("newer"))},
			map[string]string{"existing": "newer"}, func(t *testing.T) {
				if perm(p("existing")) != 0o4755 {
					t.Errorf("mode %o", perm(p("existing")))
				}
			}},
		{"through a link", []mpart{metaPart(meta(p("link"))), filePart([]byte("linked"))},
			map[string]string{"real": "linked"}, func(t *testing.T) {
				if fi, err := os.Lstat(p("link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
					t.Error("link replaced")
				}
			}},
		{"empty file", []mpart{metaPart(meta(p("empty"))), filePart(nil)}, map[string]string{"empty": ""}, nil},
		{"non-ASCII and dot-dot", []mpart{metaPart(meta(p("x/../日本 ü.txt"))), filePart([]byte("ja"))},
			map[string]string{"日本 ü.txt": "ja"}, nil},
		{"same target twice", []mpart{metaPart(meta(p("twice"))), filePart([]byte("1")), metaPart(meta(p("twice"))), filePart([]byte("2"))},
			map[string]string{"twice": "2"}, nil},
		{"binary content", []mpart{metaPart(meta(p("bin"))), filePart([]byte("\r\n--boundary\r\n\x00\xff"))},
			map[string]string{"bin": "\r\n--boundary\r\n\x00\xff"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := c.upload(tt.parts...)
			if resp.StatusCode != http.StatusOK || len(body) != 0 {
				t.Fatalf("status %d body %s", resp.StatusCode, body)
			}
			for name, want := range tt.want {
				if got := readFile(t, p(name)); got != want {
					t.Errorf("%s = %q, want %q", name, got, want)
				}
			}
			if tt.check != nil {
				tt.check(t)
			}
			if got := leftovers(t, root, s.priv); len(got) > 0 {
				t.Errorf("temporary files left: %v", got)
			}
		})
	}

	t.Run("owner", func(t *testing.T) {
		testenv.MustHaveRoot(t)
		resp, body := c.upload(metaPart(meta(p("owned"), `"owner":"1234","group":"root","mode":640`)), filePart([]byte("o")))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
		if st := statT(t, p("owned")); st.Uid != 1234 || st.Gid != 0 || st.Mode&0o777 != 0o640 {
			t.Fatalf("owner %d:%d mode %o", st.Uid, st.Gid, st.Mode&0o777)
		}
		// Overwriting without owner keeps it.
		resp, body = c.upload(metaPart(meta(p("owned"))), filePart([]byte("o2")))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
		if st := statT(t, p("owned")); st.Uid != 1234 || st.Gid != 0 || st.Mode&0o777 != 0o640 {
			t.Fatalf("after overwrite: owner %d:%d mode %o", st.Uid, st.Gid, st.Mode&0o777)
		}
	})
}

func TestUploadErrors(t *testing.T) {
	s, c, root := newFileServer(t, nil)
	p := func(name string) string { return filepath.Join(root, name) }
	writeFile(t, p("existing"), "old")
	writeFile(t, p("afile"), "f")
	os.Mkdir(p("adir"), 0o755)
	syscall.Mkfifo(p("fifo"), 0o644)
	good := func(name string) []mpart { return []mpart{metaPart(meta(p(name))), filePart([]byte("new"))} }
	with := func(parts ...[]mpart) []mpart { return slices.Concat(parts...) }

	tests := []struct {
		name   string
		parts  []mpart
		status int
		code   string
	}{
		{"no parts", nil, http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"no metadata", []mpart{filePart([]byte("x"))}, http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"no file", []mpart{metaPart(meta(p("existing")))}, http.StatusBadRequest, api.CodeInvalidFileContent},
		{"count mismatch", with(good("existing"), []mpart{metaPart(meta(p("new1")))}), http.StatusBadRequest, api.CodeInvalidFile},
		{"more files", with(good("existing"), []mpart{filePart([]byte("x"))}), http.StatusBadRequest, api.CodeInvalidFile},
		{"bad JSON", with(good("existing"), []mpart{metaPart(`{"path":`), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"JSON not an object", with(good("existing"), []mpart{metaPart(`"x"`), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"empty path", with(good("existing"), []mpart{metaPart(`{"path":""}`), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"NUL in path", with(good("existing"), []mpart{metaPart(`{"path":"a\u0000b"}`), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"undefined variable", with(good("existing"), []mpart{metaPart(`{"path":"$EXECD_NOPE_X/a"}`), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"target is a directory", with(good("existing"), []mpart{metaPart(meta(p("adir"))), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"target is a FIFO", with(good("existing"), []mpart{metaPart(meta(p("fifo"))), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"parent is a file", with(good("existing"), []mpart{metaPart(meta(p("afile/sub/x"))), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"name too long", with(good("existing"), []mpart{metaPart(meta(p(strings.Repeat("n", 300)))), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"unknown owner", with(good("existing"), []mpart{metaPart(meta(p("new2"), `"owner":"no-such-user-xyz"`)), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"unknown group", with(good("existing"), []mpart{metaPart(meta(p("new2"), `"group":"no-such-group-xyz"`)), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"bad mode", with(good("existing"), []mpart{metaPart(meta(p("new2"), `"mode":999`)), filePart(nil)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"error after staged file", []mpart{filePart([]byte("staged")), metaPart(meta(p("new3/x"))), filePart([]byte("y")), metaPart(`{}`)}, http.StatusBadRequest, api.CodeInvalidFileMetadata},
		{"new directories removed", with([]mpart{metaPart(meta(p("n1/n2/n3/f")))}, []mpart{filePart([]byte("x"))}, []mpart{metaPart(`bad`)}), http.StatusBadRequest, api.CodeInvalidFileMetadata},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := c.upload(tt.parts...)
			checkUploadError(t, resp, body, tt.status, tt.code)
			checkUntouched(t, s, root)
		})
	}

	raw := []struct {
		name        string
		contentType string
		body        string
		status      int
		code        string
	}{
		{"not multipart", "application/json", `{"path":"x"}`, http.StatusBadRequest, api.CodeInvalidFile},
		{"no content type", "", "x", http.StatusBadRequest, api.CodeInvalidFile},
		{"no boundary", "multipart/form-data", "x", http.StatusBadRequest, api.CodeInvalidFile},
		{"empty body", "multipart/form-data; boundary=B", "", http.StatusBadRequest, api.CodeInvalidFile},
		{"garbage", "multipart/form-data; boundary=B", "garbage", http.StatusBadRequest, api.CodeInvalidFile},
		{"truncated in a file", "multipart/form-data; boundary=B",
			"--B\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n" + meta(p("existing")) + "\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nhalf a fi",
			http.StatusBadRequest, api.CodeInvalidFile},
		{"truncated in headers", "multipart/form-data; boundary=B",
			"--B\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n" + meta(p("existing")) + "\r\n--B\r\nContent-Disposition: form-da",
			http.StatusBadRequest, api.CodeInvalidFile},
		{"truncated in headers after a whole pair", "multipart/form-data; boundary=B",
			"--B\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n" + meta(p("existing")) + "\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nall\r\n--B\r\nContent-Disposition: form-da",
			http.StatusBadRequest, api.CodeInvalidFile},
		{"truncated after a delimiter", "multipart/form-data; boundary=B",
			"--B\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n" + meta(p("existing")) + "\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nall\r\n--B\r\n",
			http.StatusBadRequest, api.CodeInvalidFile},
		{"no closing boundary", "multipart/form-data; boundary=B",
			"--B\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n" + meta(p("existing")) + "\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nall\r\n",
			http.StatusBadRequest, api.CodeInvalidFile},
	}
	for _, tt := range raw {
		t.Run(tt.name, func(t *testing.T) {
			req := c.request(http.MethodPost, "/files/upload", strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, body := c.do(req)
			checkUploadError(t, resp, body, tt.status, tt.code)
			checkUntouched(t, s, root)
		})
	}
}

func checkUploadError(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	var e api.ErrorResponse
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != status || e.Code != code {
		t.Fatalf("status %d body %s; want %d %s", resp.StatusCode, body, status, code)
	}
}

// checkUntouched checks that a failed upload left the fixture of
// TestUploadErrors as it was.
func checkUntouched(t *testing.T, s *Server, root string) {
	t.Helper()
	if got := readFile(t, filepath.Join(root, "existing")); got != "old" {
		t.Errorf("existing target changed to %q", got)
	}
	entries, _ := os.ReadDir(root)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"adir", "afile", "existing", "fifo"}; !slices.Equal(names, want) {
		t.Errorf("root holds %v, want %v", names, want)
	}
	if got := leftovers(t, root, s.priv); len(got) > 0 {
		t.Errorf("temporary files left: %v", got)
	}
}

func TestUploadTooLarge(t *testing.T) {
	const limit = 1 << 20
	s, c, root := newFileServer(t, func(cfg *Config) { cfg.MaxUploadBytes = limit })
	target := filepath.Join(root, "big")
	writeFile(t, target, "old")
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("length known %v", known), func(t *testing.T) {
			body, ct := buildMultipart(t, metaPart(meta(target)), filePart(bytes.Repeat([]byte("x"), 2*limit)))
			var rd io.Reader = bytes.NewReader(body)
			if !known {
				rd = io.MultiReader(rd) // hides the length: chunked
			}
			req := c.request(http.MethodPost, "/files/upload", rd)
			req.Header.Set("Content-Type", ct)
			resp, data := c.do(req)
			checkUploadError(t, resp, data, http.StatusRequestEntityTooLarge, api.CodeRequestTooLarge)
			if readFile(t, target) != "old" {
				t.Fatal("target changed")
			}
			if got := leftovers(t, root, s.priv); len(got) > 0 {
				t.Fatalf("temporary files left: %v", got)
			}
		})
	}
	t.Run("under the limit", func(t *testing.T) {
		resp, data := c.upload(metaPart(meta(target)), filePart(bytes.Repeat([]byte("y"), limit/2)))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
	})
}

func TestUploadNoSpace(t *testing.T) {
	s, c, _ := newFileServer(t, nil)
	small := mountTmpfs(t, "1m")
	target := filepath.Join(small, "target")
	writeFile(t, target, "old content")
	for _, tt := range []struct {
		name  string
		parts []mpart
	}{
		{"direct", []mpart{metaPart(meta(target)), filePart(bytes.Repeat([]byte("x"), 4<<20))}},
		{"second file", []mpart{metaPart(meta(filepath.Join(small, "new"))), filePart([]byte("fits")), metaPart(meta(target)), filePart(bytes.Repeat([]byte("x"), 4<<20))}},
		{"staged", []mpart{filePart(bytes.Repeat([]byte("x"), 4<<20)), metaPart(meta(target))}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, data := c.upload(tt.parts...)
			checkUploadError(t, resp, data, http.StatusInsufficientStorage, api.CodeInsufficientStorage)
			if got := readFile(t, target); got != "old content" {
				t.Fatalf("target holds %d bytes, want its old content", len(got))
			}
			if got := leftovers(t, small, s.priv); len(got) > 0 {
				t.Fatalf("temporary files left: %v", got)
			}
			mustNotExist(t, filepath.Join(small, "new"))
		})
	}
}

func TestUploadStagedAcrossFileSystems(t *testing.T) {
	s, c, _ := newFileServer(t, nil)
	other := mountTmpfs(t, "8m")
	target := filepath.Join(other, "sub", "f")
	content := bytes.Repeat([]byte("0123456789"), 100_000)
	resp, data := c.upload(filePart(content), metaPart(meta(target, `"mode":604`)))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if got := readFile(t, target); got != string(content) {
		t.Fatalf("content differs (%d bytes)", len(got))
	}
	if st := statT(t, target); st.Mode&0o777 != 0o604 {
		t.Fatalf("mode %o", st.Mode&0o777)
	}
	if got := leftovers(t, other, s.priv); len(got) > 0 {
		t.Fatalf("temporary files left: %v", got)
	}
}

// TestUploadStreams uploads a file much larger than what the handler may
// allocate, so buffering it would fail the test.
func TestUploadStreams(t *testing.T) {
	s, c, root := newFileServer(t, nil)
	const size = 256 << 20
	target := filepath.Join(root, "huge")
	body, ct := streamBody(metaPart(meta(target)), mpart{name: "file", filename: "huge", reader: &patternReader{n: size}})
	req := c.request(http.MethodPost, "/files/upload", body)
	req.Header.Set("Content-Type", ct)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, data := c.do(req)
	runtime.ReadMemStats(&after)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/8 {
		t.Errorf("client and server allocated %d MiB for a %d MiB upload", alloc>>20, size>>20)
	}
	f, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := sha256.New()
	io.Copy(want, &patternReader{n: size})
	got := sha256.New()
	if n, err := io.Copy(got, f); err != nil || n != size {
		t.Fatalf("read back %d bytes: %v", n, err)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("content differs")
	}
	if got := leftovers(t, root, s.priv); len(got) > 0 {
		t.Fatalf("temporary files left: %v", got)
	}
}

// TestUploadRawBodies sends hand-written bodies in forms that clients
// produce but multipart.Writer does not.
func TestUploadRawBodies(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	target := filepath.Join(root, "f")
	pair := func(nl string) string {
		return "--B" + nl + "Content-Disposition: form-data; name=\"metadata\"" + nl + nl + meta(target) + nl +
			"--B" + nl + "Content-Disposition: form-data; name=\"file\"; filename=\"f\"" + nl + nl + "content" + nl
	}
	tests := []struct{ name, body string }{
		{"no CRLF after close delimiter", pair("\r\n") + "--B--"},
		{"preamble and epilogue", "preamble\r\n" + pair("\r\n") + "--B--\r\nepilogue\r\n--B\r\nnot a part"},
		{"LF line ends", pair("\n") + "--B--\n"},
		{"content looks like a boundary", "--B\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n" + meta(target) + "\r\n" +
			"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\ncontent\n--B--\r\n--B--\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(target)
			req := c.request(http.MethodPost, "/files/upload", strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "multipart/form-data; boundary=B")
			resp, body := c.do(req)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := readFile(t, target); !strings.HasPrefix(got, "content") {
				t.Fatalf("content %q", got)
			}
		})
	}
}
