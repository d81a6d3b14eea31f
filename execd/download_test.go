package execd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

func TestDownload(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	content := "0123456789abcdefghij"
	mtime := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, name := range []string{"plain.txt", "日本 ü.txt", `quo"te\.txt`, "tab\there"} {
		writeFile(t, filepath.Join(root, name), content)
		os.Chtimes(filepath.Join(root, name), mtime, mtime)
	}
	tests := []struct {
		name, path, disposition string
	}{
		{"ASCII", "plain.txt", `attachment; filename="plain.txt"`},
		{"absolute", filepath.Join(root, "plain.txt"), `attachment; filename="plain.txt"`},
		{"dot-dot cleaned", "x/../plain.txt", `attachment; filename="plain.txt"`},
		{"non-ASCII", "日本 ü.txt", `attachment; filename="%E6%97%A5%E6%9C%AC%20%C3%BC.txt"; filename*=UTF-8''%E6%97%A5%E6%9C%AC%20%C3%BC.txt`},
		{"quotes escaped", `quo"te\.txt`, `attachment; filename="quo\"te\\.txt"`},
		{"control character encoded", "tab\there", `attachment; filename="tab%09here"; filename*=UTF-8''tab%09here`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := c.do(c.request(http.MethodGet, "/files/download"+q("path", tt.path), nil))
			if resp.StatusCode != http.StatusOK || string(body) != content {
				t.Fatalf("status %d body %q", resp.StatusCode, body)
			}
			want := map[string]string{
				"Content-Type":        "application/octet-stream",
				"Content-Disposition": tt.disposition,
				"Content-Length":      strconv.Itoa(len(content)),
				"Last-Modified":       mtime.Format(http.TimeFormat),
				"Accept-Ranges":       "bytes",
			}
			for k, v := range want {
				if got := resp.Header.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
			if _, params, err := mime.ParseMediaType(resp.Header.Get("Content-Disposition")); err != nil || params["filename"] == "" {
				t.Errorf("Content-Disposition does not parse: %v %v", params, err)
			}
		})
	}
	t.Run("HEAD", func(t *testing.T) {
		resp, body := c.do(c.request(http.MethodHead, "/files/download"+q("path", "plain.txt"), nil))
		if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.ContentLength != int64(len(content)) {
			t.Fatalf("status %d length %d body %q", resp.StatusCode, resp.ContentLength, body)
		}
	})
	t.Run("If-Modified-Since", func(t *testing.T) {
		req := c.request(http.MethodGet, "/files/download"+q("path", "plain.txt"), nil)
		req.Header.Set("If-Modified-Since", mtime.Format(http.TimeFormat))
		if resp, _ := c.do(req); resp.StatusCode != http.StatusNotModified {
			t.Fatalf("status %d", resp.StatusCode)
		}
	})
	t.Run("empty file", func(t *testing.T) {
		writeFile(t, filepath.Join(root, "empty"), "")
		resp, body := c.do(c.request(http.MethodGet, "/files/download"+q("path", "empty"), nil))
		if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.Header.Get("Content-Length") != "0" {
			t.Fatalf("status %d body %q", resp.StatusCode, body)
		}
	})

	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644)
	errs := []struct {
		name, query string
		status      int
		code        string
	}{
		{"no path", "", http.StatusBadRequest, api.CodeMissingQuery},
		{"empty path", q("path", ""), http.StatusBadRequest, api.CodeMissingQuery},
		{"missing", q("path", "nope"), http.StatusNotFound, api.CodeFileNotFound},
		{"through a file", q("path", "plain.txt/x"), http.StatusNotFound, api.CodeFileNotFound},
		{"directory", q("path", "dir"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"FIFO does not block", q("path", "fifo"), http.StatusBadRequest, api.CodeInvalidRequestBody},
		{"NUL", q("path", "plain.txt\x00"), http.StatusBadRequest, api.CodeInvalidRequestBody},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := c.do(c.request(http.MethodGet, "/files/download"+tt.query, nil))
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if resp.Header.Get("Content-Disposition") != "" {
				t.Error("error answer has a Content-Disposition")
			}
			checkUploadError(t, resp, body, tt.status, tt.code)
		})
	}
}

func TestDownloadRanges(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	content := "0123456789abcdefghij" // 20 bytes
	path := filepath.Join(root, "f")
	writeFile(t, path, content)
	mtime := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	os.Chtimes(path, mtime, mtime)

	type part struct{ contentRange, body string }
	tests := []struct {
		name, rangeHeader, ifRange string
		status                     int
		contentRange               string // single part or 416
		body                       string // single part or whole
		parts                      []part // multipart/byteranges
	}{
		{name: "closed", rangeHeader: "bytes=2-5", status: 206, contentRange: "bytes 2-5/20", body: "2345"},
		{name: "open", rangeHeader: "bytes=15-", status: 206, contentRange: "bytes 15-19/20", body: "fghij"},
		{name: "suffix", rangeHeader: "bytes=-3", status: 206, contentRange: "bytes 17-19/20", body: "hij"},
		{name: "suffix longer than file", rangeHeader: "bytes=-100", status: 206, contentRange: "bytes 0-19/20", body: content},
		{name: "end clamped", rangeHeader: "bytes=18-1000", status: 206, contentRange: "bytes 18-19/20", body: "ij"},
		{name: "white space", rangeHeader: "bytes= 1-2 ,", status: 206, contentRange: "bytes 1-2/20", body: "12"},
		{name: "unit case", rangeHeader: "Bytes=0-0", status: 206, contentRange: "bytes 0-0/20", body: "0"},
		{name: "one of two satisfiable", rangeHeader: "bytes=50-60,3-3", status: 206, contentRange: "bytes 3-3/20", body: "3"},
		{name: "multiple", rangeHeader: "bytes=0-1,-2,5-6", status: 206, parts: []part{{"bytes 0-1/20", "01"}, {"bytes 18-19/20", "ij"}, {"bytes 5-6/20", "56"}}},
		{name: "too much overlap serves all", rangeHeader: "bytes=0-15,0-15", status: 200, body: content},
		{name: "past the end", rangeHeader: "bytes=20-", status: 416, contentRange: "bytes */20"},
		{name: "zero suffix", rangeHeader: "bytes=-0", status: 416, contentRange: "bytes */20"},
		{name: "huge start", rangeHeader: "bytes=99999999999999999999-", status: 416, contentRange: "bytes */20"},
		{name: "not bytes", rangeHeader: "lines=1-2", status: 416},
		{name: "reversed", rangeHeader: "bytes=5-2", status: 416},
		{name: "signed", rangeHeader: "bytes=+1-2", status: 416},
		{name: "garbage", rangeHeader: "bytes=a-b", status: 416},
		{name: "no dash", rangeHeader: "bytes=5", status: 416},
		{name: "only commas", rangeHeader: "bytes=,", status: 200, body: content},
		{name: "If-Range matches", rangeHeader: "bytes=0-0", ifRange: mtime.Format(http.TimeFormat), status: 206, contentRange: "bytes 0-0/20", body: "0"},
		{name: "If-Range stale", rangeHeader: "bytes=0-0", ifRange: mtime.Add(-time.Hour).Format(http.TimeFormat), status: 200, body: content},
		{name: "If-Range ETag", rangeHeader: "bytes=0-0", ifRange: `"etag"`, status: 200, body: content},
		{name: "If-Range stale skips a bad range", rangeHeader: "bytes=x", ifRange: `"etag"`, status: 200, body: content},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := c.request(http.MethodGet, "/files/download"+q("path", "f"), nil)
			req.Header.Set("Range", tt.rangeHeader)
			if tt.ifRange != "" {
				req.Header.Set("If-Range", tt.ifRange)
			}
			resp, body := c.do(req)
			if resp.StatusCode != tt.status {
				t.Fatalf("Range %q: status %d, want %d; body %s", tt.rangeHeader, resp.StatusCode, tt.status, body)
			}
			if got := resp.Header.Get("Content-Range"); got != tt.contentRange && tt.parts == nil {
				t.Errorf("Content-Range %q, want %q", got, tt.contentRange)
			}
			switch {
			case tt.status == 416:
				checkUploadError(t, resp, body, 416, api.CodeUnknown)
			case tt.parts != nil:
				mt, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
				if err != nil || mt != "multipart/byteranges" {
					t.Fatalf("Content-Type %q", resp.Header.Get("Content-Type"))
				}
				if cl, _ := strconv.Atoi(resp.Header.Get("Content-Length")); cl != len(body) {
					t.Errorf("Content-Length %d, body %d bytes", cl, len(body))
				}
				mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
				for i, want := range tt.parts {
					p, err := mr.NextPart()
					if err != nil {
						t.Fatalf("part %d: %v", i, err)
					}
					data, _ := io.ReadAll(p)
					if p.Header.Get("Content-Range") != want.contentRange || string(data) != want.body || p.Header.Get("Content-Type") != "application/octet-stream" {
						t.Errorf("part %d: %q %q %q, want %+v", i, p.Header.Get("Content-Type"), p.Header.Get("Content-Range"), data, want)
					}
				}
				if _, err := mr.NextPart(); err != io.EOF {
					t.Errorf("more parts than asked for: %v", err)
				}
			default:
				if string(body) != tt.body || resp.Header.Get("Content-Length") != strconv.Itoa(len(tt.body)) {
					t.Errorf("body %q (length header %s), want %q", body, resp.Header.Get("Content-Length"), tt.body)
				}
			}
		})
	}
	t.Run("empty file ignores the range", func(t *testing.T) {
		writeFile(t, filepath.Join(root, "empty"), "")
		req := c.request(http.MethodGet, "/files/download"+q("path", "empty"), nil)
		req.Header.Set("Range", "bytes=0-")
		if resp, body := c.do(req); resp.StatusCode != http.StatusOK || len(body) != 0 {
			t.Fatalf("status %d body %q", resp.StatusCode, body)
		}
	})
}

// TestDownloadStreams downloads a sparse file far larger than what the
// handler may allocate, whole and in a range.
func TestDownloadStreams(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	const size = 1 << 30
	path := filepath.Join(root, "sparse")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("end"), size-3)
	f.Close()
	for _, tt := range []struct {
		rangeHeader string
		want        int64
	}{{"", size}, {"bytes=1-", size - 1}} {
		req := c.request(http.MethodGet, "/files/download"+q("path", path), nil)
		if tt.rangeHeader != "" {
			req.Header.Set("Range", tt.rangeHeader)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		tail := &tailReader{r: resp.Body}
		n, err := io.CopyBuffer(io.Discard, tail, make([]byte, 1<<20))
		resp.Body.Close()
		runtime.ReadMemStats(&after)
		if err != nil || n != tt.want || !bytes.HasSuffix(tail.bytes(), []byte("end")) {
			t.Fatalf("range %q: %d bytes, %v", tt.rangeHeader, n, err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
			t.Errorf("range %q: %d MiB allocated for a 1 GiB download", tt.rangeHeader, alloc>>20)
		}
	}
}

// TestDownloadUnreadable: a file that opens but cannot be read gets the
// error envelope (500 for an I/O error) rather than a plain-text 500 or a
// cut answer; a kernel file without a size goes out whole as a stream.
func TestDownloadUnreadable(t *testing.T) {
	_, c := newTestServer(t, nil)
	var e api.ErrorResponse
	resp, body := c.do(c.request(http.MethodGet, "/files/download?path=/proc/self/mem", nil))
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Content-Type") != "application/json" ||
		json.Unmarshal(body, &e) != nil || e.Code != api.CodeRuntimeError || !strings.Contains(e.Message, "input/output error") {
		t.Fatalf("/proc/self/mem: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	want, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	resp, body = c.do(c.request(http.MethodGet, "/files/download?path=/proc/self/mountinfo", nil))
	// The answering process is the server itself: its mount table is ours.
	if resp.StatusCode != http.StatusOK || len(body) == 0 || !bytes.Equal(body, want) {
		t.Fatalf("/proc/self/mountinfo: %d, %d bytes, want %d", resp.StatusCode, len(body), len(want))
	}
}

// TestPermissionDeniedIs403: a file-system permission refusal is a 403
// PERMISSION_DENIED.
func TestPermissionDeniedIs403(t *testing.T) {
	err := fsError(&fs.PathError{Op: "open", Path: "/root/x", Err: syscall.EACCES})
	if httpx.StatusOf(err) != http.StatusForbidden {
		t.Fatalf("EACCES: status %d", httpx.StatusOf(err))
	}
	var he *httpx.Error
	if !errors.As(err, &he) || he.Code != api.CodePermissionDenied {
		t.Fatalf("EACCES: %v", err)
	}
	if httpx.StatusOf(fsError(&fs.PathError{Op: "chown", Path: "/x", Err: syscall.EPERM})) != http.StatusForbidden {
		t.Fatal("EPERM is not a 403")
	}
}
