//go:build unix

package archive

import (
	"io/fs"
	"os"
	"runtime"
	"syscall"
	"time"
)

// openFlags open a file to pack: never through a link, and without
// blocking on a FIFO that took a file's place.
const openFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

// sysStat is what Pack needs from a file's inode.
type sysStat struct {
	dev, ino     uint64
	nlink        uint64
	uid, gid     uint32
	hasDev       bool
	major, minor int64
}

func statOf(fi fs.FileInfo) (sysStat, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return sysStat{}, false
	}
	s := sysStat{dev: uint64(st.Dev), ino: uint64(st.Ino), nlink: uint64(st.Nlink), uid: st.Uid, gid: st.Gid}
	rdev := uint64(st.Rdev)
	switch runtime.GOOS {
	case "linux":
		s.hasDev = true
		s.major = int64((rdev>>32)&0xfffff000 | (rdev>>8)&0xfff)
		s.minor = int64((rdev>>12)&0xffffff00 | rdev&0xff)
	case "darwin":
		s.hasDev = true
		s.major, s.minor = int64(rdev>>24&0xff), int64(rdev&0xffffff)
	}
	return s, true
}

// setFileTimes sets the access and modification times of an open file.
func setFileTimes(f *os.File, t time.Time) error {
	tv := syscall.NsecToTimeval(t.UnixNano())
	if err := syscall.Futimes(int(f.Fd()), []syscall.Timeval{tv, tv}); err != nil {
		return &fs.PathError{Op: "futimes", Path: f.Name(), Err: err}
	}
	return nil
}

// umask is the process's file mode creation mask, read once at start,
// before any goroutine could create a file while it is briefly changed.
var umask = func() uint32 {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return uint32(m)
}()
