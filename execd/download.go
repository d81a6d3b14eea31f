package execd

import (
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// download answers GET /files/download?path=: the file's bytes as
// application/octet-stream with Content-Disposition, Content-Length,
// Last-Modified and Accept-Ranges. A Range header gets 206 with one range
// or multipart/byteranges with several; a malformed one a 416 with code
// UNKNOWN; one that does not overlap the file a 416 with
// "Content-Range: bytes */size" (an empty file answers 200 instead, as
// net/http does). The body goes out with sendfile where the connection
// allows it; nothing is buffered.
//
// The Range header is parsed here and handed to http.ServeContent in
// canonical form, so what is served is exactly what parseRange accepted,
// and ServeContent adds conditional requests and multipart framing.
//
// offset and limit (1-based line numbers) make it a line read, answered by
// serveLines; they cannot be combined with a Range header.
func (s *Server) download(w http.ResponseWriter, r *http.Request) error {
	path, err := s.queryPath(r, "path")
	if err != nil {
		return err
	}
	window, byLines, err := parseLineWindow(r.URL.Query())
	if err != nil {
		return err
	}
	if byLines && r.Header.Get("Range") != "" {
		return badRequest("a Range header cannot be combined with the line parameters 'offset' and 'limit'")
	}
	// O_NONBLOCK keeps a FIFO from blocking the open; it changes nothing
	// for a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ENXIO) { // a FIFO with no writer, or a socket
			return badRequest("%s is not a regular file", path)
		}
		return fsError(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fsError(err)
	}
	switch {
	case fi.IsDir():
		return badRequest("%s is a directory", path)
	case !fi.Mode().IsRegular():
		return badRequest("%s is not a regular file", path)
	}
	// A file may open and still not read (/proc/1/mem, a file of a broken
	// disk): find out while an error can still be a proper answer.
	var probe [1]byte
	if _, err := f.ReadAt(probe[:], 0); err != nil && err != io.EOF {
		return fsError(&fs.PathError{Op: "read", Path: path, Err: unwrapPathError(err)})
	}
	if byLines {
		return s.serveLines(w, r, f, path, fi, window)
	}
	// Kernel files (/proc, /sys) report no size and cannot seek to their
	// end: they go out as a stream, whole, without ranges.
	if end, err := f.Seek(0, io.SeekEnd); err != nil || end == 0 && fi.Size() == 0 && isPseudoFile(f) {
		return s.streamFile(w, r, f, path, fi)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fsError(err)
	}
	size := fi.Size()

	rangeHeader := r.Header.Get("Range")
	if rangeHeader != "" && !ifRangeAllows(r.Header.Get("If-Range"), fi.ModTime()) {
		rangeHeader = ""
	}
	ranges, err := parseRange(rangeHeader, size)
	switch {
	case errors.Is(err, errRangeNotSatisfiable) && size == 0:
		ranges = nil
	case errors.Is(err, errRangeNotSatisfiable):
		w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		return httpx.Errorf(http.StatusRequestedRangeNotSatisfiable, api.CodeUnknown,
			"range %q does not overlap the %d bytes of %s", rangeHeader, size, path)
	case err != nil:
		return httpx.Errorf(http.StatusRequestedRangeNotSatisfiable, api.CodeUnknown, "%w", err)
	}

	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", contentDisposition(filepath.Base(path)))
	sr := r.Clone(r.Context())
	sr.Header.Del("If-Range") // decided above
	if len(ranges) == 0 {
		sr.Header.Del("Range")
	} else {
		sr.Header.Set("Range", formatRanges(ranges))
	}
	http.ServeContent(w, sr, "", fi.ModTime(), f)
	return nil
}

// streamFile sends a file that cannot be served by ranges (its size is
// unknown until it is read) as one stream, without Content-Length. A read
// error part way cuts the connection, so the client sees an incomplete
// answer rather than a short file.
func (s *Server) streamFile(w http.ResponseWriter, r *http.Request, f *os.File, path string, fi fs.FileInfo) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil && !errors.Is(err, syscall.ESPIPE) && !errors.Is(err, syscall.EINVAL) {
		return fsError(err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", contentDisposition(filepath.Base(path)))
	h.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	if _, err := io.Copy(w, f); err != nil {
		s.log.Debug("download stream cut", "path", path, "err", err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// isPseudoFile reports whether f lives on a file system whose files are
// made by the kernel as they are read (procfs, sysfs), and report size 0.
func isPseudoFile(f *os.File) bool {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	const procMagic, sysfsMagic = 0x9fa0, 0x62656572
	return st.Type == procMagic || st.Type == sysfsMagic
}

// unwrapPathError returns the error a *fs.PathError carries, or err.
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// ifRangeAllows reports whether a Range may be honoured under the
// If-Range value ir (RFC 9110, section 13.1.5). execd sends no ETag, so
// only a date equal to the file's modification time (to the second)
// allows it; net/http decides the same way.
func ifRangeAllows(ir string, modtime time.Time) bool {
	if ir == "" {
		return true
	}
	if strings.HasPrefix(ir, `"`) || strings.HasPrefix(ir, "W/") {
		return false
	}
	t, err := http.ParseTime(ir)
	if err != nil || modtime.IsZero() || modtime.Unix() == 0 {
		return false
	}
	return t.Unix() == modtime.Unix()
}

// contentDisposition is the header naming a download: a printable ASCII
// name travels quoted; any other name is percent-encoded both in filename
// (for old clients) and in the RFC 8187 filename* parameter.
func contentDisposition(name string) string {
	plain := true
	for i := 0; i < len(name); i++ {
		if name[i] < 0x20 || name[i] > 0x7e {
			plain = false
			break
		}
	}
	if plain {
		return `attachment; filename="` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(name) + `"`
	}
	enc := percentEncode(name)
	return `attachment; filename="` + enc + `"; filename*=UTF-8''` + enc
}

// percentEncode encodes every byte of s that is not an RFC 8187 attr-char.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isAttrChar(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func isAttrChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$&+-.^_`|~", c) >= 0
}
