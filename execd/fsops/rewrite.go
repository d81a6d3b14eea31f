package fsops

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrIsDir is returned when a regular file was expected and a directory
// was found.
var ErrIsDir = errors.New("is a directory")

// ErrNotRegular is returned when a regular file was expected and
// something else (a device, FIFO or socket) was found.
var ErrNotRegular = errors.New("not a regular file")

// ReplaceAll replaces every occurrence of old (which must not be empty) in
// the file at path and reports how many it replaced. A symbolic link is
// followed and the file it names is rewritten. A file with no occurrence
// is left untouched. The file is streamed, never held in memory whole;
// see commit for how the new content replaces the old.
func ReplaceAll(path string, old, new []byte) (n int, retErr error) {
	if len(old) == 0 {
		return 0, errors.New("empty search string")
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return 0, err
	}
	if err := wantRegular(real, fi); err != nil {
		return 0, err
	}
	src, err := os.Open(real)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	// The new content goes to a private file beside the target, or, where
	// the directory cannot take one, in the temporary directory, from
	// which it is copied back in place.
	inPlace := false
	tmp, err := CreateTemp(filepath.Dir(real))
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		inPlace = true
		tmp, err = CreateTemp(os.TempDir())
	}
	if err != nil {
		return 0, err
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	n, err = replaceStream(tmp, src, old, new)
	if err != nil || n == 0 {
		return 0, err
	}
	if err := commit(real, fi, tmp, inPlace); err != nil {
		return 0, err
	}
	tmp = nil // renamed, or copied and removed
	return n, nil
}

// replaceStream copies src to dst with every occurrence of old replaced by
// new, left to right without overlaps as bytes.ReplaceAll does, and
// returns the number of replacements. It keeps back the last len(old)-1
// bytes of each chunk, which could begin an occurrence that the next
// chunk completes.
func replaceStream(dst io.Writer, src io.Reader, old, new []byte) (int, error) {
	const chunk = 1 << 20
	buf := make([]byte, 0, chunk+len(old))
	n := 0
	for {
		m, rerr := io.ReadFull(src, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		final := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !final {
			return n, rerr
		}
		pos := 0
		for {
			i := bytes.Index(buf[pos:], old)
			if i < 0 {
				break
			}
			if _, err := dst.Write(buf[pos : pos+i]); err != nil {
				return n, err
			}
			if _, err := dst.Write(new); err != nil {
				return n, err
			}
			n++
			pos += i + len(old)
		}
		keep := 0
		if !final {
			keep = min(len(old)-1, len(buf)-pos)
		}
		if _, err := dst.Write(buf[pos : len(buf)-keep]); err != nil {
			return n, err
		}
		if final {
			return n, nil
		}
		buf = append(buf[:0], buf[len(buf)-keep:]...)
	}
}

func wantRegular(path string, fi fs.FileInfo) error {
	switch {
	case fi.IsDir():
		return &fs.PathError{Op: "open", Path: path, Err: ErrIsDir}
	case !fi.Mode().IsRegular():
		return &fs.PathError{Op: "open", Path: path, Err: ErrNotRegular}
	}
	return nil
}

// commit puts the content of tmp in place of the existing regular file
// path, whose state before the change is fi. Where it can, it gives tmp
// fi's owner and mode, syncs it and renames it over path, so readers see
// the old or the new content and never a mix. When that is impossible
// without changing the file's identity (it has other hard links, the
// directory is not writable, or the owner cannot be kept) it copies the
// content over the file in place instead. Either way tmp is gone after.
func commit(path string, fi fs.FileInfo, tmp *os.File, inPlace bool) error {
	st := fi.Sys().(*syscall.Stat_t)
	if !inPlace && st.Nlink == 1 {
		err := tmp.Chown(int(st.Uid), int(st.Gid))
		switch {
		case errors.Is(err, fs.ErrPermission):
			// An unprivileged daemon cannot keep another user's file: keep
			// the file and rewrite it.
		case err != nil:
			return err
		default:
			if err := tmp.Chmod(fi.Mode()); err != nil {
				return err
			}
			if err := tmp.Sync(); err != nil {
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), path); err != nil {
				os.Remove(tmp.Name())
				return err
			}
			return nil
		}
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, tmp); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
