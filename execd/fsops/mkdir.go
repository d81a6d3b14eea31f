package fsops

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// MkdirAll makes path and any missing parents with permission perm
// (filtered by the umask) and returns the directories it created,
// outermost first, so that a caller can undo the work with RemoveCreated.
// A path component that exists and is not a directory is an ENOTDIR error.
// On error the directories created so far are returned with it.
func MkdirAll(path string, perm fs.FileMode) ([]string, error) {
	var missing []string
	for p := filepath.Clean(path); ; {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return nil, &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], perm)
		if err != nil {
			// Someone else made it meanwhile: fine, if it is a directory.
			if fi, serr := os.Stat(missing[i]); serr == nil && fi.IsDir() {
				continue
			}
			return created, err
		}
		created = append(created, missing[i])
	}
	return created, nil
}

// RemoveCreated removes the directories MkdirAll reported, innermost
// first, as long as they are empty. It is best effort: a directory that
// something else has filled meanwhile is left alone.
func RemoveCreated(created []string) {
	for i := len(created) - 1; i >= 0; i-- {
		os.Remove(created[i])
	}
}
