// Package hostpath compares and resolves paths of the host's file system
// as the server's checks of host volumes and its own directories need
// them. The server and its configuration loader import it.
package hostpath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Within reports whether clean absolute path p is dir or lies under it.
func Within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Resolve resolves the symbolic links of the longest part of clean
// absolute path p that exists, and appends the rest, which no link can
// redirect because it does not exist yet. A dangling link is an error: it
// would lead wherever its target is later made.
func Resolve(p string) (string, error) {
	cur, rest := p, ""
	for {
		r, err := filepath.EvalSymlinks(cur)
		if err == nil {
			return filepath.Join(r, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("cannot resolve: %v", err)
		}
		if _, lerr := os.Lstat(cur); lerr == nil {
			return "", fmt.Errorf("cannot resolve %s: a dangling symlink", cur)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}
