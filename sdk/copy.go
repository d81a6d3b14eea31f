package sdk

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/api/archive"
)

// CopyOptions adjusts CopyTo and CopyFrom.
type CopyOptions struct {
	// FollowLinks copies what the source points to when the source itself
	// is a symbolic link. Links inside a copied tree are always copied as
	// links.
	FollowLinks bool
	// PreserveOwner gives copied files the owners they had at the source
	// (numeric ids), and with CopyFrom their exact modes. Without it,
	// files copied into the sandbox belong to the owner of the directory
	// they land in, and files copied out belong to the local user, with
	// modes less the umask and never setuid or setgid.
	PreserveOwner bool
	// Progress, when set, is called as file content moves with the bytes
	// moved so far and the total expected (-1 when unknown).
	Progress func(done, total int64)
	// Sync has CopyTo return only once the sandbox has flushed what it
	// wrote to disk, as a file upload does. Without it, as with cp and
	// docker cp, a crash of the host right after the copy can lose it.
	// CopyFrom never syncs.
	Sync bool
}

// ArchiveOptions adjusts UploadArchive.
type ArchiveOptions struct {
	// PreserveOwner keeps the archive's owners instead of giving new
	// entries to the owner of the directory they land in.
	PreserveOwner bool
	// Sync returns only once the sandbox has flushed what it wrote.
	Sync bool
}

// CopyStats counts what a copy moved.
type CopyStats struct {
	Files, Dirs, Links, Skipped int
	Bytes                       int64 // file content
}

// ArchiveReader is a tar stream of a file or tree of the sandbox.
//
// When the sandbox cannot finish the stream (a file or directory execd
// may not read), the stream ends inside an entry cut short, and
// Read returns an *ArchiveIncompleteError where it would return io.EOF;
// Err tells the reason after a tar reader has stopped there.
type ArchiveReader struct {
	io.ReadCloser
	// ContentLength is the file content the stream will carry, when
	// asked for with measure; -1 otherwise.
	ContentLength int64

	op   string
	resp *http.Response
}

// ArchiveIncompleteError reports an archive the sandbox could not finish.
type ArchiveIncompleteError struct {
	Path   string // what was being archived
	Reason string // as execd said, naming the entry it could not read
}

func (e *ArchiveIncompleteError) Error() string {
	return "archive of " + e.Path + " is incomplete: " + e.Reason
}

// Read reads the stream; at its end it returns an *ArchiveIncompleteError
// instead of io.EOF when the sandbox said the archive is incomplete.
func (ar *ArchiveReader) Read(p []byte) (int, error) {
	n, err := ar.ReadCloser.Read(p)
	if err == io.EOF {
		if ierr := ar.trailerError(); ierr != nil {
			return n, ierr
		}
	}
	return n, err
}

// Err returns the *ArchiveIncompleteError of an archive the sandbox could
// not finish, or nil. Call it after reading stopped: it reads what little
// is left of the stream (at most 64 KiB) to reach the sandbox's verdict,
// which comes after the last byte.
func (ar *ArchiveReader) Err() error {
	if ar.resp == nil {
		return nil
	}
	io.Copy(io.Discard, io.LimitReader(ar.ReadCloser, 64<<10))
	return ar.trailerError()
}

func (ar *ArchiveReader) trailerError() error {
	if ar.resp == nil {
		return nil
	}
	if reason := ar.resp.Trailer.Get(api.HeaderArchiveError); reason != "" {
		return &ArchiveIncompleteError{Path: ar.op, Reason: reason}
	}
	return nil
}

// DownloadArchive streams the file or tree at path as tar, its entries
// named after path's base name. follow packs what path points to when it
// is a symbolic link; measure asks for ContentLength first.
func (s *Sandbox) DownloadArchive(ctx context.Context, path string, follow, measure bool) (*ArchiveReader, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	q := url.Values{"path": {path}}
	if follow {
		q.Set("follow", "true")
	}
	if measure {
		q.Set("measure", "true")
	}
	r := tg.req("download archive of "+path, http.MethodGet, "/files/archive", q)
	r.idempotent, r.streaming = true, true
	resp, err := s.c.t.do(ctx, r)
	if err != nil {
		return nil, err
	}
	ar := &ArchiveReader{ReadCloser: resp.Body, ContentLength: -1, op: path, resp: resp}
	if n, err := strconv.ParseInt(resp.Header.Get(api.HeaderArchiveContentLength), 10, 64); err == nil {
		ar.ContentLength = n
	}
	return ar, nil
}

// UploadArchive extracts a tar stream into the existing directory dir of
// the sandbox. No entry may leave dir; each file lands atomically.
func (s *Sandbox) UploadArchive(ctx context.Context, dir string, tarStream io.Reader, opts *ArchiveOptions) (*CopyStats, error) {
	tg, err := s.execd(ctx)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &ArchiveOptions{}
	}
	q := url.Values{"path": {dir}, "sync": {strconv.FormatBool(opts.Sync)}}
	if opts.PreserveOwner {
		q.Set("preserveOwner", "true")
	}
	r := tg.req("upload archive to "+dir, http.MethodPost, "/files/archive", q)
	r.stream, r.contentType = tarStream, "application/x-tar"
	var st api.ArchiveStats
	if err := s.c.t.call(ctx, r, &st); err != nil {
		return nil, err
	}
	return &CopyStats{Files: st.Files, Dirs: st.Dirs, Links: st.Links, Skipped: st.Skipped, Bytes: st.Bytes}, nil
}

// contentsOnly reports whether p names a directory's contents ("dir/.").
func contentsOnly(p string) bool {
	return p == "." || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, string(filepath.Separator)+".")
}

// CopyTo copies the local file or tree src into the sandbox at dst, as
// cp -r and docker cp do: into dst when it is a directory, as dst when
// it does not exist (its parent must), over dst when both are files. A
// src ending in "/." copies a directory's contents rather than the
// directory. One tar stream carries everything.
func (s *Sandbox) CopyTo(ctx context.Context, src, dst string, opts *CopyOptions) (*CopyStats, error) {
	if opts == nil {
		opts = &CopyOptions{}
	}
	stat := os.Lstat
	if opts.FollowLinks {
		stat = os.Stat
	}
	fi, err := stat(src)
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", src, err)
	}
	contents := contentsOnly(src) && fi.IsDir()

	dir, name, err := s.placeRemote(ctx, dst, fi.IsDir(), filepath.Base(src), contents)
	if err != nil {
		return nil, err
	}
	total := int64(-1)
	if opts.Progress != nil {
		if n, err := archive.Measure(src, opts.FollowLinks); err == nil {
			total = n
		}
		opts.Progress(0, total)
	}
	popts := archive.PackOptions{FollowTop: opts.FollowLinks}
	if opts.Progress != nil {
		popts.Progress = func(n int64) { opts.Progress(n, total) }
	}
	body := &packBody{ctx: ctx, src: src, name: name, opts: popts}
	st, err := s.UploadArchive(ctx, dir, body, &ArchiveOptions{PreserveOwner: opts.PreserveOwner, Sync: opts.Sync})
	body.close()
	if err != nil {
		return nil, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return st, nil
}

// packBody is the tar stream of a local tree as a request body. The HTTP
// client copies a body with WriteTo when it has one: the tree is then
// packed straight into the connection's writer, in large writes, with no
// pipe and no extra copy. Read, for any other reader, packs through a
// pipe.
type packBody struct {
	ctx  context.Context
	src  string
	name string
	opts archive.PackOptions
	pr   *io.PipeReader
}

func (b *packBody) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	_, err := archive.Pack(b.ctx, cw, b.src, b.name, b.opts)
	return cw.n, err
}

func (b *packBody) Read(p []byte) (int, error) {
	if b.pr == nil {
		pr, pw := io.Pipe()
		b.pr = pr
		go func() {
			_, err := archive.Pack(b.ctx, pw, b.src, b.name, b.opts)
			pw.CloseWithError(err)
		}()
	}
	return b.pr.Read(p)
}

// close stops a packing goroutine that Read started.
func (b *packBody) close() {
	if b.pr != nil {
		b.pr.CloseWithError(io.ErrClosedPipe)
	}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// placeRemote decides where in the sandbox a copy of a source lands: the
// directory to extract into and the name the source takes there ("" for
// a directory's contents).
func (s *Sandbox) placeRemote(ctx context.Context, dst string, srcIsDir bool, srcBase string, contents bool) (dir, name string, err error) {
	info, err := s.Stat(ctx, dst)
	switch {
	case err == nil:
		fi := info[dst]
		if fi.Type == "directory" {
			if contents {
				return dst, "", nil
			}
			return dst, srcBase, nil
		}
		if srcIsDir {
			return "", "", fmt.Errorf("copy to %s: cannot copy a directory onto a file", dst)
		}
		return path.Dir(strings.TrimRight(dst, "/")), path.Base(dst), nil
	case errors.Is(err, ErrNotFound):
		if strings.HasSuffix(dst, "/") {
			return "", "", fmt.Errorf("copy to %s: no such directory", dst)
		}
		clean := path.Clean(dst)
		return path.Dir(clean), path.Base(clean), nil
	default:
		return "", "", err
	}
}

// CopyFrom copies the file or tree src of the sandbox to the local path
// dst, with the same rules as CopyTo. Nothing written can land outside
// dst's directory, whatever the sandbox sends; each file is written
// under a temporary name and renamed into place.
func (s *Sandbox) CopyFrom(ctx context.Context, src, dst string, opts *CopyOptions) (*CopyStats, error) {
	if opts == nil {
		opts = &CopyOptions{}
	}
	ar, err := s.DownloadArchive(ctx, src, opts.FollowLinks, opts.Progress != nil)
	if err != nil {
		return nil, err
	}
	defer ar.Close()
	// The first entry says whether the source is a directory, which
	// decides where the copy lands.
	var head bytes.Buffer
	first, err := tar.NewReader(io.TeeReader(ar, &head)).Next()
	if err != nil {
		if ierr := ar.Err(); ierr != nil {
			err = ierr
		}
		return nil, fmt.Errorf("copy %s: read archive: %w", src, err)
	}
	stream := io.MultiReader(&head, ar)
	srcIsDir := first.Typeflag == tar.TypeDir
	contents := contentsOnly(src) && srcIsDir
	srcBase := path.Base(path.Clean(src))
	if path.Clean(src) == "/" {
		contents, srcBase, srcIsDir = true, "", true
	}

	var dir, name string
	fi, err := os.Stat(dst)
	switch {
	case err == nil && fi.IsDir():
		dir, name = dst, srcBase
		if contents {
			name = ""
		}
	case err == nil:
		if srcIsDir {
			return nil, fmt.Errorf("copy to %s: cannot copy a directory onto a file", dst)
		}
		dir, name = filepath.Dir(dst), filepath.Base(dst)
	case errors.Is(err, fs.ErrNotExist):
		if strings.HasSuffix(dst, string(filepath.Separator)) {
			return nil, fmt.Errorf("copy to %s: no such directory", dst)
		}
		dir, name = filepath.Dir(filepath.Clean(dst)), filepath.Base(filepath.Clean(dst))
	default:
		return nil, fmt.Errorf("copy to %s: %w", dst, err)
	}

	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("copy to %s: %w", dst, err)
	}
	defer root.Close()

	xopts := archive.ExtractOptions{Rename: renameTop(srcBase, name), SafeModes: !opts.PreserveOwner}
	if opts.PreserveOwner {
		xopts.Owner = archive.OwnerArchive
	}
	if opts.Progress != nil {
		opts.Progress(0, ar.ContentLength)
		xopts.Progress = func(n int64) { opts.Progress(n, ar.ContentLength) }
	}
	st, err := archive.Extract(ctx, stream, root, xopts)
	if err != nil {
		// A tar reader stops at the block an incomplete archive ends
		// with; the sandbox's reason comes after it.
		if ierr := ar.Err(); ierr != nil {
			err = ierr
		}
		return nil, fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return &CopyStats{Files: st.Files, Dirs: st.Dirs, Links: st.Links, Skipped: st.Skipped, Bytes: st.Bytes}, nil
}

// renameTop maps archive names whose first component is from so that it
// becomes to; with to == "" the component is dropped (the contents land
// directly in the directory). from == "" means the archive has no top
// component. An entry that is not under from is an error: the sandbox
// sent something it was not asked for.
func renameTop(from, to string) func(string) (string, error) {
	if from == "" && to == "" {
		return nil
	}
	return func(n string) (string, error) {
		rest := n
		if from != "" {
			if n == from {
				return to, nil
			}
			var ok bool
			if rest, ok = strings.CutPrefix(n, from+"/"); !ok {
				return "", fmt.Errorf("entry %q is not under %q, the path that was asked for", n, from)
			}
		}
		if to == "" {
			return rest, nil
		}
		return to + "/" + rest, nil
	}
}
