package fsops

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// RenameNoReplace renames src to dst, failing with an fs.ErrExist error
// when dst exists, whatever its type. The check and the rename are one
// atomic step where the file system supports RENAME_NOREPLACE; elsewhere
// a separate existence check comes first.
func RenameNoReplace(src, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if err == unix.EINVAL || err == unix.ENOSYS {
		// The file system may not support the flag (EINVAL is also the
		// answer for moving a directory into itself, which os.Rename
		// reports again below).
		if _, lerr := os.Lstat(dst); lerr == nil {
			return &os.LinkError{Op: "rename", Old: src, New: dst, Err: syscall.EEXIST}
		} else if !errors.Is(lerr, fs.ErrNotExist) {
			return lerr
		}
		return os.Rename(src, dst)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	return nil
}

// Move moves src to dst, which must not exist; dst's parent must. Within
// one file system it is a rename. Across file systems it copies src (a
// file, or a whole tree) next to dst under a temporary name, keeping
// modes, owners, times, symbolic and hard links, flushes the destination
// file system, renames the copy into place and only then removes src. A
// failed or cancelled copy removes the partial copy and leaves src as it
// was. ctx is checked between entries of a tree.
func Move(ctx context.Context, src, dst string) error {
	err := RenameNoReplace(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	if _, err := os.Lstat(dst); err == nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: syscall.EEXIST}
	}
	tmp := TempName(filepath.Dir(dst))
	if err := Copy(ctx, src, tmp); err != nil {
		return err
	}
	if err := syncFS(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := RenameNoReplace(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.RemoveAll(src); err != nil {
		return fmt.Errorf("copied %s to %s but could not remove the source: %w", src, dst, err)
	}
	return nil
}

// syncFS flushes the file system holding path, so that a copy is on disk
// before its source goes away.
func syncFS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return &fs.PathError{Op: "syncfs", Path: path, Err: err}
	}
	return nil
}

// Copy copies src (a file of any type, or a directory tree) to dst, which
// must not exist. It keeps permission bits (setuid, setgid and sticky
// included), owners when the process may set them, access and modification
// times, symbolic links as links, hard links inside the tree as hard
// links, and recreates devices, FIFOs and sockets with mknod. Extended
// attributes are not copied. On error, including ctx ending, everything
// it created is removed.
func Copy(ctx context.Context, src, dst string) (retErr error) {
	if _, err := os.Lstat(dst); err == nil {
		return &fs.PathError{Op: "copy", Path: dst, Err: syscall.EEXIST}
	}
	c := &copier{ctx: ctx, links: make(map[fileID]string), root: os.Geteuid() == 0}
	defer func() {
		if retErr != nil && c.created {
			os.RemoveAll(dst)
		}
	}()
	return c.copy(src, dst)
}

type fileID struct{ dev, ino uint64 }

type copier struct {
	ctx     context.Context
	links   map[fileID]string // first copy of each multiply linked file
	root    bool
	created bool // the top of dst exists and is ours to remove
}

func (c *copier) copy(src, dst string) error {
	if err := c.ctx.Err(); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch fi.Mode().Type() {
	case 0:
		id := fileID{uint64(st.Dev), st.Ino}
		if st.Nlink > 1 {
			if first, ok := c.links[id]; ok {
				if err := os.Link(first, dst); err != nil {
					return err
				}
				c.created = true
				return nil
			}
			c.links[id] = dst
		}
		if err := c.copyFile(src, dst); err != nil {
			return err
		}
	case fs.ModeDir:
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		c.created = true
		entries, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := c.copy(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
	case fs.ModeSymlink:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		c.created = true
	default:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return &fs.PathError{Op: "mknod", Path: dst, Err: err}
		}
		c.created = true
	}
	return c.copyAttrs(dst, fi, st)
}

func (c *copier) copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	c.created = true
	// ReadFrom uses copy_file_range where the kernel can, a plain copy
	// otherwise.
	if _, err := out.ReadFrom(in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return out.Close()
}

// copyAttrs gives dst the owner, mode and times of the source. Owner comes
// first because chown clears the setuid and setgid bits; times come last
// because the other changes would not touch mtime but a directory's
// children would.
func (c *copier) copyAttrs(dst string, fi fs.FileInfo, st *syscall.Stat_t) error {
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil && (c.root || !errors.Is(err, fs.ErrPermission)) {
		return err
	}
	if fi.Mode().Type() != fs.ModeSymlink {
		if err := unix.Fchmodat(unix.AT_FDCWD, dst, st.Mode&0o7777, 0); err != nil {
			return &fs.PathError{Op: "chmod", Path: dst, Err: err}
		}
	}
	ts := []unix.Timespec{{Sec: st.Atim.Sec, Nsec: st.Atim.Nsec}, {Sec: st.Mtim.Sec, Nsec: st.Mtim.Nsec}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}
