package fsops

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// TempPrefix starts the name of every temporary file and directory this
// package creates. A name with this prefix left in a directory is debris
// of an interrupted operation and is safe to delete.
const TempPrefix = ".execd-tmp-"

// IsTemp reports whether name (a base name) is one of this package's
// temporary names.
func IsTemp(name string) bool { return strings.HasPrefix(name, TempPrefix) }

// TempName returns a fresh hidden name in dir. Nothing is created.
func TempName(dir string) string {
	var b [8]byte
	rand.Read(b[:])
	return filepath.Join(dir, TempPrefix+hex.EncodeToString(b[:]))
}

// CreateTemp creates a new hidden file in dir for reading and writing,
// readable by its owner only: what is written into it stays private until
// the caller gives it its final mode (see NewFileMode) and name.
func CreateTemp(dir string) (*os.File, error) {
	for range 10000 {
		f, err := os.OpenFile(TempName(dir), os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_CLOEXEC, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, &fs.PathError{Op: "createtemp", Path: dir, Err: fs.ErrExist}
}

// umask is the process's file mode creation mask, read once before any
// goroutine could create a file while it is briefly cleared.
var umask = func() uint32 {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return uint32(m)
}()

// NewFileMode is the mode a plain create with 0777 would give a new file:
// 0777 less the umask.
func NewFileMode() uint32 { return 0o777 &^ umask }

// IsNoSpace reports whether err says the file system is full or the
// user's quota is exhausted.
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
