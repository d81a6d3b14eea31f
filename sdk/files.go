package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// Permission is an owner, group and mode to give a file or directory.
// Empty Owner and Group and a zero Mode leave those alone.
type Permission struct {
	Owner, Group string // names or numeric ids
	Mode         fs.FileMode
}

func (p Permission) wire() api.Permission {
	return api.Permission{Owner: p.Owner, Group: p.Group, Mode: ModeDigits(p.Mode)}
}

// ModeDigits encodes a mode the way the execd API carries it: the octal
// digits read as a decimal number, so 0o755 travels as 755 and a setuid
// 0o4755 as 4755.
func ModeDigits(m fs.FileMode) int {
	bits := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		bits |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	n, _ := strconv.Atoi(strconv.FormatUint(uint64(bits), 8))
	return n
}

// ParseModeDigits is the inverse of ModeDigits: 755 is 0o755. Digits 8
// and 9 and values above 7777 are errors.
func ParseModeDigits(n int) (fs.FileMode, error) {
	if n < 0 || n > 7777 {
		return 0, fmt.Errorf("mode %d: want octal digits such as 644 or 4755", n)
	}
	v, err := strconv.ParseUint(strconv.Itoa(n), 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %d: want octal digits such as 644 or 4755", n)
	}
	m := fs.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, nil
}

// FileReader is the content of a file in the sandbox, read as it
// downloads. Close it.
type FileReader struct {
	io.ReadCloser
	// Size is the byte count to expect (of the range, for a range).
	Size int64
	// ModTime is the file's modification time as the sandbox reports it.
	ModTime time.Time
}

// Download opens a file of the sandbox for reading as a stream.
func (s *Sandbox) Download(ctx context.Context, path string) (*FileReader, error) {
	return s.download(ctx, path, "")
}

// DownloadRange opens length bytes of a file from offset; length < 0
// means to the end.
func (s *Sandbox) DownloadRange(ctx context.Context, path string, offset, length int64) (*FileReader, error) {
	if offset < 0 {
		return nil, fmt.Errorf("download %s: negative offset", path)
	}
	rng := fmt.Sprintf("bytes=%d-", offset)
	if length >= 0 {
		if length == 0 {
			return &FileReader{ReadCloser: io.NopCloser(bytes.NewReader(nil))}, nil
		}
		rng += strconv.FormatInt(offset+length-1, 10)
	}
	return s.download(ctx, path, rng)
}

// DownloadLines opens limit lines of a text file from line offset
// (1-based) as a stream, byte for byte: "\r\n" and a last line without a
// newline come as they are in the file. offset 0 means from line 1 and
// limit 0 to the end; a window past the end of the file reads nothing.
// Size is -1: the length is known only at the end.
func (s *Sandbox) DownloadLines(ctx context.Context, path string, offset, limit int64) (*FileReader, error) {
	if offset < 0 || limit < 0 {
		return nil, fmt.Errorf("read lines of %s: %w: offset and limit must not be negative", path, ErrInvalid)
	}
	q := url.Values{"path": {path}}
	q.Set("offset", strconv.FormatInt(max(offset, 1), 10))
	if limit > 0 {
		q.Set("limit", strconv.FormatInt(limit, 10))
	}
	return s.get(ctx, "read lines of "+path, q, "")
}

// ReadLines returns limit lines of a text file from line offset
// (1-based), each with its line ending; see DownloadLines.
func (s *Sandbox) ReadLines(ctx context.Context, path string, offset, limit int64) (string, error) {
	fr, err := s.DownloadLines(ctx, path, offset, limit)
	if err != nil {
		return "", err
	}
	defer fr.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, fr); err != nil {
		return "", fmt.Errorf("read lines of %s: %w", path, err)
	}
	return b.String(), nil
}

func (s *Sandbox) download(ctx context.Context, path, rng string) (*FileReader, error) {
	return s.get(ctx, "download "+path, url.Values{"path": {path}}, rng)
}

// get opens GET /files/download with query q and, when rng is not "",
// a Range header.
func (s *Sandbox) get(ctx context.Context, op string, q url.Values, rng string) (*FileReader, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req(op, http.MethodGet, "/files/download", q)
	r.idempotent, r.streaming = true, true
	if rng != "" {
		r.header.Set("Range", rng)
	}
	resp, err := s.c.t.do(ctx, r)
	if err != nil {
		return nil, err
	}
	fr := &FileReader{ReadCloser: resp.Body, Size: resp.ContentLength}
	if t, err := http.ParseTime(resp.Header.Get("Last-Modified")); err == nil {
		fr.ModTime = t
	}
	return fr, nil
}

// ReadFile returns the whole content of a file of the sandbox.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	fr, err := s.Download(ctx, path)
	if err != nil {
		return nil, err
	}
	defer fr.Close()
	var buf bytes.Buffer
	if fr.Size > 0 {
		buf.Grow(int(min(fr.Size, 64<<20)))
	}
	if _, err := buf.ReadFrom(fr); err != nil {
		return nil, fmt.Errorf("download %s: %w", path, err)
	}
	return buf.Bytes(), nil
}

// UploadFile is one file of an Upload.
type UploadFile struct {
	// Path is where the file goes in the sandbox; missing parent
	// directories are created.
	Path string
	// Content is read to its end as the upload streams.
	Content io.Reader
	// Mode, Owner and Group are given to the file; zero values give a new
	// file 0777 less the umask and let a replaced file keep its own.
	Mode         fs.FileMode
	Owner, Group string
}

// WriteFile writes data to a file of the sandbox, replacing it
// atomically (a reader sees the old content or the new, never a mix).
// perm zero keeps an existing file's mode.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, perm fs.FileMode) error {
	return s.Upload(ctx, UploadFile{Path: path, Content: bytes.NewReader(data), Mode: perm})
}

// Upload streams files into the sandbox in one request, never holding a
// whole file in memory. The sandbox writes each under a temporary name
// and renames them into place only once all arrived, so a failed upload
// changes nothing.
func (s *Sandbox) Upload(ctx context.Context, files ...UploadFile) error {
	if len(files) == 0 {
		return nil
	}
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		pw.CloseWithError(writeUpload(mw, files))
	}()
	op := "upload " + files[0].Path
	if len(files) > 1 {
		op = fmt.Sprintf("upload %d files", len(files))
	}
	r := tg.req(op, http.MethodPost, "/files/upload", nil)
	r.stream, r.contentType = pr, mw.FormDataContentType()
	err = s.c.t.call(ctx, r, nil)
	pr.CloseWithError(io.ErrClosedPipe) // stop the writer if the request ended early
	return err
}

// writeUpload writes the multipart body: a metadata part then a file
// part for each file.
func writeUpload(mw *multipart.Writer, files []UploadFile) error {
	for _, f := range files {
		meta, err := json.Marshal(api.FileMetadata{Path: f.Path, Owner: f.Owner, Group: f.Group, Mode: ModeDigits(f.Mode)})
		if err != nil {
			return err
		}
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
		h.Set("Content-Type", "application/json")
		w, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		if _, err := w.Write(meta); err != nil {
			return err
		}
		w, err = mw.CreateFormFile("file", "file")
		if err != nil {
			return err
		}
		if f.Content != nil {
			if _, err := io.Copy(w, f.Content); err != nil {
				return fmt.Errorf("read %s: %w", f.Path, err)
			}
		}
	}
	return mw.Close()
}

// Stat describes files of the sandbox, keyed by the paths as given.
// Symbolic links are described, not followed. A missing path fails the
// whole call with ErrNotFound.
func (s *Sandbox) Stat(ctx context.Context, paths ...string) (map[string]api.FileInfo, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("stat files", http.MethodGet, "/files/info", url.Values{"path": paths})
	r.idempotent = true
	out := map[string]api.FileInfo{}
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// ListDir lists a directory down to depth levels (1: its entries only),
// in lexical order, each directory's entries after it.
func (s *Sandbox) ListDir(ctx context.Context, path string, depth int) ([]api.FileInfo, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	q := url.Values{"path": {path}, "depth": {strconv.Itoa(depth)}}
	r := tg.req("list "+path, http.MethodGet, "/directories/list", q)
	r.idempotent = true
	var out []api.FileInfo
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Search finds files under dir whose name (or, for a pattern with a
// "/", whose path relative to dir) matches a glob; "**" crosses
// directories.
func (s *Sandbox) Search(ctx context.Context, dir, pattern string) ([]api.FileInfo, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	r := tg.req("search "+dir, http.MethodGet, "/files/search", url.Values{"path": {dir}, "pattern": {pattern}})
	r.idempotent = true
	var out []api.FileInfo
	if err := s.c.t.call(ctx, r, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Move renames a file or directory, across file systems if needed.
func (s *Sandbox) Move(ctx context.Context, src, dst string) error {
	return s.MoveAll(ctx, api.RenameFileItem{Src: src, Dest: dst})
}

// MoveAll performs several moves in order.
func (s *Sandbox) MoveAll(ctx context.Context, moves ...api.RenameFileItem) error {
	return s.post(ctx, "move files", "/files/mv", nil, moves, nil)
}

// Chmod sets the owner, group and mode of a file or directory.
func (s *Sandbox) Chmod(ctx context.Context, path string, p Permission) error {
	return s.SetPermissions(ctx, map[string]Permission{path: p})
}

// SetPermissions sets owners, groups and modes of several paths; every
// path must exist before any changes.
func (s *Sandbox) SetPermissions(ctx context.Context, perms map[string]Permission) error {
	body := make(map[string]api.Permission, len(perms))
	for p, perm := range perms {
		body[p] = perm.wire()
	}
	return s.post(ctx, "set permissions", "/files/permissions", nil, body, nil)
}

// Replace replaces every occurrence of old with new in a file and
// returns how many there were.
func (s *Sandbox) Replace(ctx context.Context, path, old, new string) (int, error) {
	out, err := s.ReplaceAll(ctx, map[string]api.ReplaceFileContentItem{path: {Old: old, New: new}})
	if err != nil {
		return 0, err
	}
	return out[path].ReplacedCount, nil
}

// ReplaceAll performs replacements in several files; all are checked
// before any file changes.
func (s *Sandbox) ReplaceAll(ctx context.Context, items map[string]api.ReplaceFileContentItem) (map[string]api.ReplaceResult, error) {
	out := map[string]api.ReplaceResult{}
	err := s.post(ctx, "replace in files", "/files/replace", url.Values{"verbose": {"true"}}, items, &out)
	return out, err
}

// Remove deletes files (a symbolic link itself, not its target); missing
// files are ignored. Directories need RemoveDir.
func (s *Sandbox) Remove(ctx context.Context, paths ...string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("remove files", http.MethodDelete, "/files", url.Values{"path": paths})
	r.idempotent = true
	return s.c.t.call(ctx, r, nil)
}

// Mkdir creates directories with their parents (mkdir -p) and gives each
// the permission p.
func (s *Sandbox) Mkdir(ctx context.Context, p Permission, paths ...string) error {
	body := make(map[string]api.Permission, len(paths))
	for _, path := range paths {
		body[path] = p.wire()
	}
	return s.post(ctx, "create directories", "/directories", nil, body, nil)
}

// RemoveDir deletes directory trees (rm -rf); missing ones are ignored.
func (s *Sandbox) RemoveDir(ctx context.Context, paths ...string) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r := tg.req("remove directories", http.MethodDelete, "/directories", url.Values{"path": paths})
	r.idempotent = true
	return s.c.t.call(ctx, r, nil)
}

// post sends a JSON body to execd and decodes the answer into out.
func (s *Sandbox) post(ctx context.Context, op, path string, q url.Values, body, out any) error {
	tg, err := s.execd(ctx)
	if err != nil {
		return err
	}
	r, err := tg.jsonReq(op, http.MethodPost, path, q, body)
	if err != nil {
		return err
	}
	return s.c.t.call(ctx, r, out)
}
