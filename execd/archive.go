package execd

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/api/archive"
)

// downloadArchive answers GET /files/archive?path=: the file or tree at
// path as an application/x-tar stream whose entries are named after
// path's base name, without following symbolic links (follow=true
// follows path itself when it is one). With measure=true the answer
// carries X-Archive-Content-Length, the bytes of file content to come.
//
// Failures found before the stream starts (path itself missing or
// unreadable) are ordinary error answers. One in the middle ends the
// stream inside an entry, and the X-Archive-Error trailer gives the
// reason: the response ends cleanly, and still no tar reader can take the
// archive for a whole one. A file or directory execd may not read fails
// between entries, and the stream ends with api.ArchiveIncompleteEntry; a
// file that shrinks while it is read has its entry cut short, and nothing
// follows it.
func (s *Server) downloadArchive(w http.ResponseWriter, r *http.Request) error {
	path, err := s.queryPath(r, "path")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	follow, err := boolQuery(q.Get("follow"), "follow")
	if err != nil {
		return err
	}
	measure, err := boolQuery(q.Get("measure"), "measure")
	if err != nil {
		return err
	}
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	fi, err := stat(path)
	if err != nil {
		return fsError(err)
	}
	if err := checkReadable(path, fi); err != nil {
		return fsError(err)
	}
	if measure {
		n, err := archive.Measure(path, follow)
		if err != nil {
			return fsError(err)
		}
		w.Header().Set(api.HeaderArchiveContentLength, strconv.FormatInt(n, 10))
	}
	name := filepath.Base(path)
	if path == "/" {
		name = "" // the root's contents
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("Content-Disposition", "attachment; filename="+strconv.Quote(filepath.Base(path)+".tar"))
	w.Header().Set("Trailer", api.HeaderArchiveError)
	cw := &countingWriter{w: w}
	_, err = archive.Pack(r.Context(), cw, path, name, archive.PackOptions{FollowTop: follow})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled) || r.Context().Err() != nil:
		return nil // the client has gone
	case cw.n == 0:
		w.Header().Del("Trailer")
		return fsError(err)
	}
	s.log.Warn("archive incomplete", "path", path, "err", err)
	// Clients refuse trailer lines over 4 KiB; the reason stays well
	// within that.
	reason := err.Error()
	if len(reason) > maxTrailer {
		// The middle of a long path goes; the cause is at the end.
		reason = strings.ToValidUTF8(reason[:maxTrailer/4]+"..."+reason[len(reason)-maxTrailer/2:], "")
	}
	if !errors.Is(err, archive.ErrCutShort) {
		w.Write(api.ArchiveIncompleteEntry(reason))
	}
	w.Header().Set(api.HeaderArchiveError, reason)
	return nil
}

// maxTrailer bounds the reason sent in the X-Archive-Error trailer.
const maxTrailer = 1 << 10

// checkReadable fails when the file or directory at path, described by
// fi, cannot be read: a directory that cannot be listed, a file that
// cannot be opened for reading.
func checkReadable(path string, fi fs.FileInfo) error {
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi.IsDir() {
		if _, err := f.Readdirnames(1); err != nil && err != io.EOF {
			return err
		}
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// uploadArchive answers POST /files/archive?path=DIR: the tar stream in
// the body is extracted into the existing directory DIR, which no entry
// or link may leave. New entries belong to DIR's owner, or with
// preserveOwner=true to the owners the archive records. Each file is
// written under a temporary name and renamed into place. Unless
// sync=false, the file system is synced once at the end, before the
// answer (an api.ArchiveStats), so that what was acknowledged survives a
// crash of the host.
//
// A stream that fails part way leaves the entries before the failure in
// place and no partial file; the answer is the error.
func (s *Server) uploadArchive(w http.ResponseWriter, r *http.Request) error {
	dir, err := s.queryPath(r, "path")
	if err != nil {
		return err
	}
	preserve, err := boolQuery(r.URL.Query().Get("preserveOwner"), "preserveOwner")
	if err != nil {
		return err
	}
	sync := true
	if v := r.URL.Query().Get("sync"); v != "" {
		if sync, err = boolQuery(v, "sync"); err != nil {
			return err
		}
	}
	if max := s.cfg.MaxUploadBytes; max > 0 {
		if r.ContentLength > max {
			return tooLarge(max)
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fsError(err)
	}
	if !fi.IsDir() {
		return badRequest("%s is not a directory", dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fsError(err)
	}
	defer root.Close()

	opts := archive.ExtractOptions{Owner: archive.OwnerCaller}
	switch st := fi.Sys().(*syscall.Stat_t); {
	case preserve:
		opts.Owner = archive.OwnerArchive
	case os.Geteuid() == 0:
		opts.Owner, opts.UID, opts.GID = archive.OwnerFixed, int(st.Uid), int(st.Gid)
	}
	stats, err := archive.Extract(r.Context(), r.Body, root, opts)
	if err != nil {
		return archiveError(err)
	}
	if sync {
		if err := syncFS(dir); err != nil {
			return fsError(err)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(api.ArchiveStats{
		Files: stats.Files, Dirs: stats.Dirs, Links: stats.Links,
		Skipped: stats.Skipped, Bytes: stats.Bytes,
	})
}

// archiveError classifies an extraction failure: a bad or truncated
// stream or an entry that may not be written is the client's 400, a body
// over the limit a 413, the rest as fsError says.
func archiveError(err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return tooLarge(mbe.Limit)
	case errors.Is(err, archive.ErrUnsafeName), errors.Is(err, archive.ErrReplaceDir),
		errors.Is(err, archive.ErrSparse), errors.Is(err, tar.ErrHeader),
		errors.Is(err, archive.ErrNotDir), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ENOTDIR):
		return badRequest("%v", err)
	}
	return fsError(err)
}

// syncFS makes everything written to the file system holding dir durable.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return &fs.PathError{Op: "syncfs", Path: dir, Err: err}
	}
	return nil
}

// boolQuery parses an optional boolean query parameter.
func boolQuery(v, name string) (bool, error) {
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest("query parameter %s=%q: want true or false", name, v)
	}
	return b, nil
}
