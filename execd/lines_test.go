package execd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"

	"github.com/opensandbox/opensandbox/api"
)

// TestDownloadLines drives line reads through the HTTP API: windows,
// line endings kept byte for byte, and every refusal, in one table.
func TestDownloadLines(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	writeFile(t, filepath.Join(root, "five"), "one\ntwo\nthree\nfour\nfive\n")
	writeFile(t, filepath.Join(root, "crlf"), "a\r\nb\r\nc")
	writeFile(t, filepath.Join(root, "nofinal"), "x\ny")
	writeFile(t, filepath.Join(root, "blank"), "\n\n\n")
	writeFile(t, filepath.Join(root, "empty"), "")
	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644)

	bad := http.StatusBadRequest
	tests := []struct {
		name   string
		query  []string // path, offset, limit as query pairs
		rng    string   // a Range header
		status int
		body   string // the body of a 200
		code   string // the error code otherwise
		names  string // a word the error message must hold
	}{
		{name: "window", query: []string{"path", "five", "offset", "2", "limit", "2"}, status: 200, body: "two\nthree\n"},
		{name: "first line", query: []string{"path", "five", "offset", "1", "limit", "1"}, status: 200, body: "one\n"},
		{name: "offset alone reads to the end", query: []string{"path", "five", "offset", "4"}, status: 200, body: "four\nfive\n"},
		{name: "limit alone reads from line 1", query: []string{"path", "five", "limit", "2"}, status: 200, body: "one\ntwo\n"},
		{name: "window longer than the file", query: []string{"path", "five", "offset", "5", "limit", "10"}, status: 200, body: "five\n"},
		{name: "window past the end", query: []string{"path", "five", "offset", "6"}, status: 200, body: ""},
		{name: "far past the end", query: []string{"path", "five", "offset", "9223372036854775807", "limit", "9223372036854775807"}, status: 200, body: ""},
		{name: "largest limit", query: []string{"path", "five", "offset", "3", "limit", "9223372036854775807"}, status: 200, body: "three\nfour\nfive\n"},
		{name: "leading zeros", query: []string{"path", "five", "offset", "002", "limit", "01"}, status: 200, body: "two\n"},
		{name: "CRLF kept", query: []string{"path", "crlf", "offset", "1", "limit", "2"}, status: 200, body: "a\r\nb\r\n"},
		{name: "no final newline kept", query: []string{"path", "crlf", "offset", "3"}, status: 200, body: "c"},
		{name: "last line without newline", query: []string{"path", "nofinal", "offset", "2", "limit", "5"}, status: 200, body: "y"},
		{name: "blank lines", query: []string{"path", "blank", "offset", "2", "limit", "1"}, status: 200, body: "\n"},
		{name: "past the last newline", query: []string{"path", "blank", "offset", "4"}, status: 200, body: ""},
		{name: "empty file", query: []string{"path", "empty", "offset", "1", "limit", "1"}, status: 200, body: ""},

		{name: "offset not digits", query: []string{"path", "five", "offset", "x"}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "offset signed", query: []string{"path", "five", "offset", "+1"}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "offset empty", query: []string{"path", "five", "offset", ""}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "offset zero", query: []string{"path", "five", "offset", "0"}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "offset negative", query: []string{"path", "five", "offset", "-3"}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "offset overflowing", query: []string{"path", "five", "offset", "9223372036854775808"}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "offset twice", query: []string{"path", "five", "offset", "1", "offset", "2"}, status: bad, code: api.CodeInvalidRequestBody, names: "'offset'"},
		{name: "limit zero", query: []string{"path", "five", "limit", "0"}, status: bad, code: api.CodeInvalidRequestBody, names: "'limit'"},
		{name: "limit fractional", query: []string{"path", "five", "offset", "1", "limit", "1.5"}, status: bad, code: api.CodeInvalidRequestBody, names: "'limit'"},
		{name: "limit with space", query: []string{"path", "five", "limit", " 2"}, status: bad, code: api.CodeInvalidRequestBody, names: "'limit'"},
		{name: "limit overflowing", query: []string{"path", "five", "limit", "99999999999999999999"}, status: bad, code: api.CodeInvalidRequestBody, names: "'limit'"},
		{name: "limit twice", query: []string{"path", "five", "limit", "1", "limit", "1"}, status: bad, code: api.CodeInvalidRequestBody, names: "'limit'"},
		{name: "with a Range header", query: []string{"path", "five", "offset", "1"}, rng: "bytes=0-3", status: bad, code: api.CodeInvalidRequestBody, names: "Range"},
		{name: "missing file", query: []string{"path", "nope", "offset", "1"}, status: http.StatusNotFound, code: api.CodeFileNotFound},
		{name: "directory", query: []string{"path", "dir", "limit", "1"}, status: bad, code: api.CodeInvalidRequestBody, names: "directory"},
		{name: "FIFO", query: []string{"path", "fifo", "limit", "1"}, status: bad, code: api.CodeInvalidRequestBody},
		{name: "no path", query: []string{"offset", "1", "limit", "1"}, status: bad, code: api.CodeMissingQuery},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := c.request(http.MethodGet, "/files/download"+q(tt.query...), nil)
			if tt.rng != "" {
				req.Header.Set("Range", tt.rng)
			}
			resp, body := c.do(req)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d body %q, want %d", resp.StatusCode, body, tt.status)
			}
			if tt.status == http.StatusOK {
				if string(body) != tt.body {
					t.Errorf("body %q, want %q", body, tt.body)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "text/plain" {
					t.Errorf("Content-Type %q", ct)
				}
				if resp.Header.Get("Accept-Ranges") != "" || resp.Header.Get("Content-Range") != "" {
					t.Errorf("a line read has byte-range headers: %v", resp.Header)
				}
				return
			}
			var e api.ErrorResponse
			if err := json.Unmarshal(body, &e); err != nil || e.Code != tt.code {
				t.Fatalf("body %s, want code %s", body, tt.code)
			}
			if !strings.Contains(e.Message, tt.names) {
				t.Errorf("message %q does not name %s", e.Message, tt.names)
			}
		})
	}
}

// TestDownloadLinesPseudoFile reads lines of a kernel file, which reports
// no size and is served as a stream.
func TestDownloadLinesPseudoFile(t *testing.T) {
	_, c, _ := newFileServer(t, nil)
	resp, body := c.do(c.request(http.MethodGet, "/files/download"+q("path", "/proc/self/status", "limit", "1"), nil))
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "Name:") || strings.Count(string(body), "\n") != 1 || !strings.HasSuffix(string(body), "\n") {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
}

// TestDownloadLinesLongLine streams a 256 MiB file made of one line
// (sparse, so it costs no disk): reading it whole and skipping it must
// both stay within a bound far below its size.
func TestDownloadLinesLongLine(t *testing.T) {
	_, c, root := newFileServer(t, nil)
	const size = 256 << 20
	path := filepath.Join(root, "long")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size - 1); err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("\n"), size-1)
	f.Close()
	writeFileAppend(t, path, "tail")

	for _, tt := range []struct {
		offset, limit string
		want          int64
	}{
		{"1", "1", size}, // the long line, whole
		{"2", "1", 4},    // skipped to the line after it
		{"3", "", 0},     // past the end
	} {
		t.Run(tt.offset, func(t *testing.T) {
			query := []string{"path", "long", "offset", tt.offset}
			if tt.limit != "" {
				query = append(query, "limit", tt.limit)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			req := c.request(http.MethodGet, "/files/download"+q(query...), nil)
			resp, err := c.hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&after)
			if err != nil || resp.StatusCode != http.StatusOK || n != tt.want {
				t.Fatalf("status %d, %d bytes (%v), want %d", resp.StatusCode, n, err, tt.want)
			}
			// Client and server together: buffers, not the line.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
				t.Errorf("%d bytes allocated for a %d-byte line", alloc, size)
			}
		})
	}
}

func writeFileAppend(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// TestCopyLinesAllocs: copying a window allocates nothing however many
// lines and bytes pass, the buffer being the caller's.
func TestCopyLinesAllocs(t *testing.T) {
	content := bytes.Repeat([]byte(strings.Repeat("x", 1000)+"\n"), 1000)
	buf := make([]byte, lineBufSize)
	r := bytes.NewReader(content)
	allocs := testing.AllocsPerRun(20, func() {
		r.Reset(content)
		if _, err := copyLines(io.Discard, r, lineWindow{start: 10, count: 900}, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per copy", allocs)
	}
}

// TestCopyLinesReadError: a failing read is reported, after what was
// read before it.
func TestCopyLinesReadError(t *testing.T) {
	boom := errors.New("boom")
	src := io.MultiReader(strings.NewReader("a\nb\n"), iotest.ErrReader(boom))
	var out bytes.Buffer
	if _, err := copyLines(&out, src, lineWindow{start: 2, count: -1}, make([]byte, 3)); !errors.Is(err, boom) || out.String() != "b\n" {
		t.Fatalf("err %v, out %q", err, out.String())
	}
}

// refLines is the line window by the definition: split after each '\n'.
func refLines(content []byte, w lineWindow) []byte {
	lines := bytes.SplitAfter(content, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	if w.start > int64(len(lines)) {
		return []byte{}
	}
	lines = lines[w.start-1:]
	if w.count >= 0 && w.count < int64(len(lines)) {
		lines = lines[:w.count]
	}
	return bytes.Join(lines, nil)
}

// refParse is the parameter grammar by the definition: 1 to 19 digits,
// leading zeros allowed, value 1..2^63-1.
func refParse(s string) (int64, bool) {
	t := strings.TrimLeft(s, "0")
	if s == "" || len(t) == 0 || len(t) > 19 || strings.Trim(t, "0123456789") != "" {
		return 0, false
	}
	if len(t) == 19 && t > "9223372036854775807" {
		return 0, false
	}
	n, _ := strconv.ParseInt(t, 10, 64)
	return n, true
}

// FuzzLines checks the parameter parsing against the grammar and the
// streamed window against a split of the whole content, with read sizes
// from 1 byte up so that lines straddle reads in every way.
func FuzzLines(f *testing.F) {
	f.Add([]byte("one\ntwo\nthree\n"), "2", "1", uint8(3), true, true)
	f.Add([]byte("a\r\nb\r\nc"), "3", "", uint8(1), true, false)
	f.Add([]byte("\n\n"), "", "5", uint8(0), false, true)
	f.Add([]byte("x"), "9223372036854775807", "9223372036854775807", uint8(7), true, true)
	f.Add([]byte("x\n"), "0", "-1", uint8(2), true, true)
	f.Fuzz(func(t *testing.T, content []byte, offset, limit string, bufSize uint8, hasOffset, hasLimit bool) {
		v := url.Values{}
		if hasOffset {
			v.Set("offset", offset)
		}
		if hasLimit {
			v.Set("limit", limit)
		}
		w, ok, err := parseLineWindow(v)
		if ok != (hasOffset || hasLimit) {
			t.Fatalf("ok %v for %v", ok, v)
		}
		wantStart, wantCount := int64(1), int64(-1)
		valid := true
		if hasOffset {
			n, good := refParse(offset)
			valid = valid && good
			wantStart = n
		}
		if hasLimit {
			n, good := refParse(limit)
			valid = valid && good
			wantCount = n
		}
		if valid != (err == nil) {
			t.Fatalf("offset %q limit %q: err %v, want valid %v", offset, limit, err, valid)
		}
		if !valid {
			return
		}
		if wantCount > math.MaxInt64-wantStart {
			wantCount = -1 // the window reaches past the last representable line
		}
		if w.start != wantStart || w.count != wantCount {
			t.Fatalf("offset %q limit %q: window %+v", offset, limit, w)
		}
		var out bytes.Buffer
		buf := make([]byte, int(bufSize)%64+1)
		n, err := copyLines(&out, iotest.HalfReader(bytes.NewReader(content)), w, buf)
		if err != nil || n != int64(out.Len()) {
			t.Fatalf("copy: %d bytes, %v", n, err)
		}
		if want := refLines(content, w); !bytes.Equal(out.Bytes(), want) {
			t.Fatalf("window %+v of %q: %q, want %q", w, content, out.Bytes(), want)
		}
	})
}

// BenchmarkCopyLines streams a window out of 64 MiB of short lines and
// out of one 64 MiB line; allocations stay at zero per operation.
func BenchmarkCopyLines(b *testing.B) {
	const size = 64 << 20
	short := bytes.Repeat([]byte(strings.Repeat("y", 79)+"\n"), size/80)
	long := append(bytes.Repeat([]byte("z"), size-1), '\n')
	buf := make([]byte, lineBufSize)
	for _, bc := range []struct {
		name    string
		content []byte
		w       lineWindow
	}{
		{"short lines, middle window", short, lineWindow{start: size / 160, count: 1000}},
		{"short lines, to the end", short, lineWindow{start: 2, count: -1}},
		{"one long line", long, lineWindow{start: 1, count: 1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := bytes.NewReader(bc.content)
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(bc.content)
				if _, err := copyLines(io.Discard, r, bc.w, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
