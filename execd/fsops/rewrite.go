package fsops

import (
	"bytes"
	"errors"
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
// is left untouched. See WriteFile for how the new content is written.
func ReplaceAll(path string, old, new []byte) (int, error) {
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
	data, err := os.ReadFile(real)
	if err != nil {
		return 0, err
	}
	n := bytes.Count(data, old)
	if n == 0 {
		return 0, nil
	}
	return n, WriteFile(real, bytes.ReplaceAll(data, old, new), fi)
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

// WriteFile replaces the content of the existing regular file path, whose
// current state is fi, with data. It writes a temporary file in the same
// directory, gives it fi's owner and mode, syncs it and renames it over
// path, so readers see the old or the new content and never a mix. When
// that is impossible without changing the file's identity (it has other
// hard links, the directory is not writable, or the owner cannot be
// kept) it rewrites the file in place instead.
func WriteFile(path string, data []byte, fi fs.FileInfo) (retErr error) {
	st := fi.Sys().(*syscall.Stat_t)
	if st.Nlink > 1 {
		return writeInPlace(path, data)
	}
	f, err := CreateTemp(filepath.Dir(path))
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		return writeInPlace(path, data)
	}
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chown(int(st.Uid), int(st.Gid)); err != nil {
		if !errors.Is(err, fs.ErrPermission) {
			return err
		}
		f.Close()
		os.Remove(f.Name())
		return writeInPlace(path, data)
	}
	if err := f.Chmod(fi.Mode()); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

func writeInPlace(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
