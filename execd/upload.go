package execd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/fsops"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// maxMetadataBytes bounds the JSON of one upload metadata part.
const maxMetadataBytes = 1 << 20

// copyBufferSize is the size of the buffer an upload streams through;
// large writes keep system calls few.
const copyBufferSize = 1 << 20

// readBufferSize is the size of the buffer an upload body is read into.
const readBufferSize = 256 << 10

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}

// upload answers POST /files/upload, a multipart/form-data body of parts
// named "metadata" (JSON FileMetadata, with or without a filename) and
// "file" (the content); the i-th metadata part describes the i-th file
// part, whichever comes first. Other parts are ignored.
//
// The body is streamed: each file goes to a hidden temporary file next to
// its target (or, when it comes before its metadata, to execd's private
// directory until the metadata says where it goes), is synced and given
// its owner and mode. Only when the whole body has been read and checked
// are the temporary files renamed over their targets, in order. On any
// error every temporary file and every directory the request created is
// removed and existing targets are left untouched.
//
// A new file without a mode gets 0777 less the umask; a file that replaces
// an existing one keeps that file's owner, group and mode unless the
// metadata sets them. A target that is a symbolic link to a file is
// written through the link.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) (retErr error) {
	if max := s.cfg.MaxUploadBytes; max > 0 {
		if r.ContentLength > max {
			return tooLarge(max)
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	body, err := newMultipartBody(r)
	if err != nil {
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidFile, "multipart form is empty: %w", err)
	}
	bufp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bufp)
	u := &uploadBatch{s: s, buf: *bufp, temps: make(map[string]bool)}
	defer func() {
		if retErr != nil {
			u.abort()
		}
	}()
	if err := u.read(body); err != nil {
		return uploadError(err)
	}
	if err := u.commit(); err != nil {
		return uploadError(err)
	}
	return nil
}

// multipartBody reads a multipart request body as r.MultipartReader
// would, and also tells a body that ended properly from one cut short.
type multipartBody struct {
	*multipart.Reader
	tail  *tailReader
	final []byte // "\n--boundary--", the start of the close delimiter
}

// newMultipartBody puts a large read buffer under the multipart parser,
// which itself reads in small pieces: the body then arrives in few large
// reads instead of one system call per 4 KiB.
func newMultipartBody(r *http.Request) (*multipartBody, error) {
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return nil, err
	}
	if mt != "multipart/form-data" && mt != "multipart/mixed" {
		return nil, http.ErrNotMultipart
	}
	boundary := params["boundary"]
	if boundary == "" {
		return nil, http.ErrMissingBoundary
	}
	tail := &tailReader{r: r.Body}
	return &multipartBody{
		Reader: multipart.NewReader(bufio.NewReaderSize(tail, readBufferSize), boundary),
		tail:   tail,
		final:  []byte("\n--" + boundary + "--"),
	}, nil
}

// complete reports whether the body holds its close delimiter, to be
// asked when NextPart returns io.EOF. NextPart returns a bare io.EOF both
// at the close delimiter and when the body ends inside a part's header,
// so io.EOF alone does not prove that the client sent everything. Part
// content cannot hold the delimiter (it would end the part), and only the
// epilogue may follow it, so when the body has ended its last bytes must
// contain it.
func (b *multipartBody) complete() bool {
	t := b.tail.bytes()
	if !b.tail.eof {
		return true // stopped at the close delimiter, before the end of the body
	}
	return bytes.Contains(t, b.final) || (b.tail.n == int64(len(t)) && bytes.HasPrefix(t, b.final[1:]))
}

// tailSize is how much of the end of an upload body is kept to check its
// close delimiter; an epilogue longer than this is taken for truncation.
const tailSize = 8 << 10

// tailReader remembers the last tailSize bytes read through it and
// whether the underlying reader has ended.
type tailReader struct {
	r    io.Reader
	buf  [tailSize]byte
	kept int   // bytes of buf in use
	n    int64 // bytes read in all
	eof  bool
}

func (t *tailReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.n += int64(n)
	if n >= tailSize {
		t.kept = copy(t.buf[:], p[n-tailSize:n])
	} else if n > 0 {
		keep := min(t.kept, tailSize-n)
		copy(t.buf[:], t.buf[t.kept-keep:t.kept])
		t.kept = keep + copy(t.buf[keep:], p[:n])
	}
	if err == io.EOF {
		t.eof = true
	}
	return n, err
}

func (t *tailReader) bytes() []byte { return t.buf[:t.kept] }

func tooLarge(max int64) error {
	return httpx.Errorf(http.StatusRequestEntityTooLarge, api.CodeRequestTooLarge, "request body larger than %d bytes", max)
}

// bodyError marks a failure to read the request body, as opposed to a
// failure to write a file.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "read request body: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// uploadTarget is what one metadata part asks for.
type uploadTarget struct {
	path string // where the file goes, links resolved
	a    attrs
}

// uploadBatch holds the state of one upload request.
type uploadBatch struct {
	s       *Server
	buf     []byte
	targets []uploadTarget  // by metadata part, in order
	files   []string        // temporary file of each file part, in order
	temps   map[string]bool // every temporary file still on disk
	created []string        // directories created for targets, outermost first
}

// uploadError turns an upload failure into its answer.
func uploadError(err error) error {
	var he *httpx.Error
	var mbe *http.MaxBytesError
	var be *bodyError
	switch {
	case errors.As(err, &he):
		return err
	case errors.As(err, &mbe):
		return tooLarge(mbe.Limit)
	case errors.As(err, &be):
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidFile, "%w", err)
	}
	return fsError(err)
}

// read consumes the whole body, writing file parts to temporary files.
func (u *uploadBatch) read(body *multipartBody) error {
	for {
		part, err := body.NextPart()
		if err == io.EOF {
			if !body.complete() {
				return &bodyError{io.ErrUnexpectedEOF}
			}
			break
		}
		if err != nil {
			return &bodyError{err}
		}
		switch part.FormName() {
		case "metadata":
			err = u.addMetadata(part)
		case "file":
			err = u.addFile(part)
		}
		part.Close()
		if err != nil {
			return err
		}
	}
	switch {
	case len(u.targets) == 0:
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidFileMetadata, "metadata part is missing")
	case len(u.files) == 0:
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidFileContent, "file part is missing")
	case len(u.targets) != len(u.files):
		return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidFile,
			"metadata and file count mismatch: %d vs %d", len(u.targets), len(u.files))
	}
	return nil
}

func badMetadata(format string, args ...any) error {
	return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidFileMetadata, format, args...)
}

// addMetadata reads and checks a metadata part, prepares its target's
// directory and, if its file part came first, moves that file there.
func (u *uploadBatch) addMetadata(part *multipart.Part) error {
	i := len(u.targets)
	data, err := io.ReadAll(io.LimitReader(part, maxMetadataBytes+1))
	if err != nil {
		return &bodyError{err}
	}
	if len(data) > maxMetadataBytes {
		return badMetadata("metadata part %d is larger than %d bytes", i, maxMetadataBytes)
	}
	var meta api.FileMetadata
	if err := json.Unmarshal(data, &meta); err != nil {
		return badMetadata("invalid metadata part %d: %v", i, err)
	}
	if meta.Path == "" {
		return badMetadata("metadata part %d: path is empty", i)
	}
	path, err := u.s.resolvePath(meta.Path)
	if err != nil {
		return badMetadata("metadata part %d: %v", i, err)
	}
	a, err := resolveAttrs(meta.Owner, meta.Group, meta.Mode)
	if err != nil {
		return badMetadata("metadata part %d: %v", i, err)
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return badMetadata("metadata part %d: %s is a directory", i, path)
		}
		if !fi.Mode().IsRegular() {
			return badMetadata("metadata part %d: %s is not a regular file", i, path)
		}
	} else if errors.Is(err, syscall.ENAMETOOLONG) {
		return badMetadata("metadata part %d: %v", i, err)
	}
	created, err := fsops.MkdirAll(filepath.Dir(path), 0o777)
	u.created = append(u.created, created...)
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ENAMETOOLONG) {
		return badMetadata("metadata part %d: %v", i, err)
	} else if err != nil {
		return err
	}
	u.targets = append(u.targets, uploadTarget{path: path, a: a})
	if i < len(u.files) {
		return u.place(i)
	}
	return nil
}

// addFile streams a file part to a temporary file: next to its target
// when its metadata has arrived, in the private directory otherwise.
func (u *uploadBatch) addFile(part *multipart.Part) (retErr error) {
	i := len(u.files)
	staged := i >= len(u.targets)
	dir := u.s.priv
	if !staged {
		dir = filepath.Dir(u.targets[i].path)
	}
	f, err := fsops.CreateTemp(dir)
	if err != nil {
		return err
	}
	u.temps[f.Name()] = true
	u.files = append(u.files, f.Name())
	defer func() {
		if retErr != nil {
			f.Close()
		}
	}()
	if err := copyPart(f, part, u.buf); err != nil {
		return err
	}
	if staged {
		return f.Close()
	}
	return u.finish(f, u.targets[i])
}

// place moves the staged file i next to its target and finishes it.
func (u *uploadBatch) place(i int) error {
	dir := filepath.Dir(u.targets[i].path)
	staged := u.files[i]
	tmp := fsops.TempName(dir)
	err := fsops.RenameNoReplace(staged, tmp)
	if errors.Is(err, syscall.EXDEV) {
		tmp, err = u.copyStaged(staged, dir)
	}
	if err != nil {
		return err
	}
	u.temps[tmp] = true
	delete(u.temps, staged)
	os.Remove(staged) // still there after a copy
	u.files[i] = tmp
	f, err := os.Open(tmp)
	if err != nil {
		return err
	}
	if err := u.finish(f, u.targets[i]); err != nil {
		f.Close()
		return err
	}
	return nil
}

// copyStaged copies a staged file into a new temporary file in dir, on
// another file system.
func (u *uploadBatch) copyStaged(staged, dir string) (string, error) {
	in, err := os.Open(staged)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := fsops.CreateTemp(dir)
	if err != nil {
		return "", err
	}
	u.temps[out.Name()] = true
	if _, err := io.CopyBuffer(out, in, u.buf); err != nil {
		out.Close()
		return "", err
	}
	return out.Name(), out.Close()
}

// finish gives the temporary file f the owner and mode its target should
// have, syncs it to disk and closes it.
func (u *uploadBatch) finish(f *os.File, t uploadTarget) error {
	uid, gid, mode, setMode := t.a.uid, t.a.gid, t.a.mode, t.a.setMode
	inherit := false
	if fi, err := os.Stat(t.path); err == nil && fi.Mode().IsRegular() {
		st := fi.Sys().(*syscall.Stat_t)
		if uid < 0 && gid < 0 {
			inherit = true
		}
		if uid < 0 {
			uid = int(st.Uid)
		}
		if gid < 0 {
			gid = int(st.Gid)
		}
		if !setMode {
			mode, setMode = st.Mode&0o7777, true
		}
	}
	if uid >= 0 || gid >= 0 {
		// Keeping an existing file's owner is best effort for an
		// unprivileged daemon; an owner asked for must be set.
		if err := f.Chown(uid, gid); err != nil && !(inherit && errors.Is(err, fs.ErrPermission)) {
			return err
		}
	}
	if !setMode {
		// The temporary file was private while it filled; a new file
		// without a mode gets what a plain create would give it.
		mode = fsops.NewFileMode()
	}
	if err := syscall.Fchmod(int(f.Fd()), mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: f.Name(), Err: err}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// commit renames every temporary file over its target, in request order,
// then syncs the directories so the new names are durable.
func (u *uploadBatch) commit() error {
	dirs := make(map[string]bool)
	for i, t := range u.targets {
		tmp := u.files[i]
		if err := os.Rename(tmp, t.path); err != nil {
			return fmt.Errorf("replace %s: %w", t.path, err)
		}
		delete(u.temps, tmp)
		dirs[filepath.Dir(t.path)] = true
	}
	u.created = nil // they hold the files now
	for dir := range dirs {
		if d, err := os.Open(dir); err == nil {
			if err := d.Sync(); err != nil {
				u.s.log.Debug("sync directory after upload", "dir", dir, "err", err)
			}
			d.Close()
		}
	}
	return nil
}

// abort removes every temporary file and every directory created for the
// request.
func (u *uploadBatch) abort() {
	for tmp := range u.temps {
		os.Remove(tmp)
	}
	fsops.RemoveCreated(u.created)
}

// writebackChunk is how much of an upload is written before the kernel is
// asked to start writing it to disk, so that the fsync at the end of the
// file finds little left to do.
const writebackChunk = 8 << 20

// copyPart copies a part to f in writes of len(buf) bytes, except for the
// last, starting write-back every writebackChunk bytes. Read errors are
// *bodyError.
func copyPart(f *os.File, part io.Reader, buf []byte) error {
	var written, flushed int64
	for {
		n, rerr := fill(part, buf)
		if n > 0 {
			if _, err := f.Write(buf[:n]); err != nil {
				return err
			}
			written += int64(n)
			if written-flushed >= writebackChunk {
				// Only a hint: file systems that do not support it
				// still sync at the end.
				unix.SyncFileRange(int(f.Fd()), flushed, written-flushed, unix.SYNC_FILE_RANGE_WRITE)
				flushed = written
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return &bodyError{rerr}
		}
	}
}

// fill reads from r until buf is full or r fails; io.EOF is returned as
// is, with whatever was read before it.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
