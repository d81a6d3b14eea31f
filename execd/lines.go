package execd

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// lineWindow is the part of a file a line read asks for: count lines from
// line start (1-based). count < 0 means to the end of the file.
type lineWindow struct {
	start, count int64
}

// parseLineWindow reads the offset and limit query parameters of
// GET /files/download. ok is false when neither is given (a plain
// download). Each must appear at most once and be a decimal integer from
// 1 to 2^63-1; offset alone reads to the end, limit alone from line 1.
func parseLineWindow(q url.Values) (w lineWindow, ok bool, err error) {
	w = lineWindow{start: 1, count: -1}
	for _, p := range []struct {
		name string
		dst  *int64
	}{{"offset", &w.start}, {"limit", &w.count}} {
		vals, present := q[p.name]
		if !present {
			continue
		}
		ok = true
		if len(vals) > 1 {
			return w, ok, badRequest("query parameter '%s' is given %d times; give it once", p.name, len(vals))
		}
		n, perr := parseLineNumber(vals[0])
		if perr != nil {
			return w, ok, badRequest("query parameter '%s' %q: %v", p.name, vals[0], perr)
		}
		*p.dst = n
	}
	// A window reaching past the last representable line is a window to
	// the end.
	if w.count > math.MaxInt64-w.start {
		w.count = -1
	}
	return w, ok, nil
}

// parseLineNumber reads a positive decimal integer made of digits only
// (no sign, no spaces).
func parseLineNumber(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("want an integer >= 1, got nothing")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("want an integer >= 1 written in digits")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, errors.New("too large (at most 9223372036854775807)")
	}
	if n < 1 {
		return 0, errors.New("want an integer >= 1 (lines are numbered from 1)")
	}
	return n, nil
}

// lineBufSize is the read size of a line read: whatever the length of the
// lines, a read holds no more than this.
const lineBufSize = 64 << 10

var lineBufs = sync.Pool{New: func() any { return new([lineBufSize]byte) }}

// copyLines writes the lines of w read from src to dst, byte for byte: a
// line ends just after '\n' (so "\r\n" stays as it is), and a last line
// without '\n' is sent without one. buf is the read buffer; no line is
// ever held whole.
func copyLines(dst io.Writer, src io.Reader, w lineWindow, buf []byte) (int64, error) {
	line := int64(1) // the number of the line the next byte belongs to
	var written int64
	for {
		n, rerr := src.Read(buf)
		chunk := buf[:n]
		// Skip the lines before the window.
		for line < w.start && len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				chunk = nil
				break
			}
			chunk = chunk[i+1:]
			line++
		}
		if len(chunk) > 0 {
			keep := len(chunk)
			if w.count >= 0 {
				end := w.start + w.count // the first line not wanted
				keep = 0
				for line < end && keep < len(chunk) {
					i := bytes.IndexByte(chunk[keep:], '\n')
					if i < 0 {
						keep = len(chunk)
						break
					}
					keep += i + 1
					line++
				}
			}
			m, werr := dst.Write(chunk[:keep])
			written += int64(m)
			if werr != nil {
				return written, werr
			}
			if w.count >= 0 && line >= w.start+w.count {
				return written, nil
			}
		}
		switch {
		case rerr == io.EOF:
			return written, nil
		case rerr != nil:
			return written, rerr
		}
	}
}

// serveLines answers a line read of GET /files/download: the lines of w
// as text/plain, streamed from f as they are read. The answer has no
// Content-Length (it is known only at the end); a window past the end of
// the file is an empty 200. A read error part way cuts the connection, so
// the client sees an incomplete answer rather than fewer lines.
func (s *Server) serveLines(rw http.ResponseWriter, r *http.Request, f *os.File, path string, fi fs.FileInfo, w lineWindow) error {
	h := rw.Header()
	h.Set("Content-Type", "text/plain")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", contentDisposition(filepath.Base(path)))
	h.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	rw.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	buf := lineBufs.Get().(*[lineBufSize]byte)
	defer lineBufs.Put(buf)
	if _, err := copyLines(rw, f, w, buf[:]); err != nil {
		s.log.Debug("line read cut", "path", path, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}
