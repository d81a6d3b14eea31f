//go:build !unix

package archive

import (
	"io/fs"
	"os"
	"time"
)

const openFlags = 0

type sysStat struct {
	dev, ino     uint64
	nlink        uint64
	uid, gid     uint32
	hasDev       bool
	major, minor int64
}

// statOf knows nothing of inodes here: owners are not recorded and hard
// links are packed as separate files.
func statOf(fs.FileInfo) (sysStat, bool) { return sysStat{}, false }

// setFileTimes sets the times of an open file by its name.
func setFileTimes(f *os.File, t time.Time) error { return os.Chtimes(f.Name(), t, t) }

// umask is not known here; SafeModes then only drops setuid and setgid.
const umask = 0
