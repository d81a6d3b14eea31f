package execd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/bmatcuk/doublestar/v4"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/fsops"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// fileInfo answers GET /files/info?path=...: a map from each path as given
// to its FileInfo (links are described, not followed). No path gives {};
// one missing path fails the whole request with 404.
func (s *Server) fileInfo(w http.ResponseWriter, r *http.Request) error {
	given := r.URL.Query()["path"]
	out := make(map[string]api.FileInfo, len(given))
	names := newIDNames()
	for _, p := range given {
		abs, err := s.resolvePath(p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(abs)
		if err != nil {
			return fsError(err)
		}
		out[p] = names.fileInfo(abs, fi)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

// deleteFiles answers DELETE /files?path=...: it removes each file (a
// symbolic link itself, not its target) in order. Missing paths are
// ignored; a directory is a 500, as in the reference daemon.
func (s *Server) deleteFiles(w http.ResponseWriter, r *http.Request) error {
	paths, err := s.resolveAll(r.URL.Query()["path"])
	if err != nil {
		return err
	}
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if isNotFound(err) {
			continue
		} else if err != nil {
			return fsError(err)
		}
		if fi.IsDir() {
			return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError,
				"remove %s: is a directory (use DELETE /directories)", p)
		}
		if err := os.Remove(p); err != nil && !isNotFound(err) {
			return fsError(err)
		}
	}
	return nil
}

// resolveAll resolves every path or fails on the first bad one, so that a
// request is checked in full before anything changes.
func (s *Server) resolveAll(given []string) ([]string, error) {
	out := make([]string, len(given))
	for i, p := range given {
		abs, err := s.resolvePath(p)
		if err != nil {
			return nil, err
		}
		out[i] = abs
	}
	return out, nil
}

// pathAttrs is one entry of a request keyed by path that sets owner,
// group and mode.
type pathAttrs struct {
	path string
	a    attrs
}

// decodePermissions reads a {path: Permission} body, resolving every path
// and every owner and group name before anything is changed.
func (s *Server) decodePermissions(w http.ResponseWriter, r *http.Request) ([]pathAttrs, error) {
	members, err := decodeObject(w, r)
	if err != nil {
		return nil, err
	}
	out := make([]pathAttrs, 0, len(members))
	for _, m := range members {
		var p api.Permission
		if err := json.Unmarshal(m.value, &p); err != nil {
			return nil, badRequest("%s: invalid permission: %v", m.key, err)
		}
		abs, err := s.resolvePath(m.key)
		if err != nil {
			return nil, err
		}
		a, err := resolveAttrs(p.Owner, p.Group, p.Mode)
		if err != nil {
			return nil, badRequest("%s: %v", m.key, err)
		}
		out = append(out, pathAttrs{abs, a})
	}
	return out, nil
}

// setPermissions answers POST /files/permissions {path: Permission}: for
// each path in order, chown when an owner or group is given, then chmod
// when mode is not 0. Every path must exist (404 otherwise) before any is
// changed.
func (s *Server) setPermissions(w http.ResponseWriter, r *http.Request) error {
	items, err := s.decodePermissions(w, r)
	if err != nil {
		return err
	}
	for _, it := range items {
		if _, err := os.Stat(it.path); err != nil {
			return fsError(err)
		}
	}
	for _, it := range items {
		if err := it.a.apply(it.path); err != nil {
			return fsError(err)
		}
	}
	return nil
}

// moveFiles answers POST /files/mv [{src, dest}]: moves applied in order,
// creating the destination's parent directories. A move never replaces an
// existing destination (500, as in the reference daemon); a missing source
// is a 404. Moves across file systems copy and then remove the source.
func (s *Server) moveFiles(w http.ResponseWriter, r *http.Request) error {
	var items []api.RenameFileItem
	if err := httpx.DecodeJSON(w, r, &items, 0, false); err != nil {
		return err
	}
	type move struct{ src, dst string }
	moves := make([]move, len(items))
	for i, it := range items {
		var err error
		if moves[i].src, err = s.resolvePath(it.Src); err != nil {
			return err
		}
		if moves[i].dst, err = s.resolvePath(it.Dest); err != nil {
			return err
		}
	}
	for _, m := range moves {
		if _, err := os.Lstat(m.src); err != nil {
			return fsError(err)
		}
		if _, err := fsops.MkdirAll(filepath.Dir(m.dst), 0o777); err != nil {
			return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "create parent of %s: %w", m.dst, err)
		}
		err := fsops.Move(r.Context(), m.src, m.dst)
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrExist):
			return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "move %s to %s: destination exists", m.src, m.dst)
		case errors.Is(err, syscall.EINVAL):
			return httpx.Errorf(http.StatusInternalServerError, api.CodeRuntimeError, "move %s into itself (%s): %w", m.src, m.dst, err)
		default:
			return fsError(err)
		}
	}
	return nil
}

// searchFiles answers GET /files/search?path=&pattern=: FileInfo of every
// entry under path that is not a directory and matches pattern (default
// "**"), in lexical walk order. Links inside the tree are reported, never
// followed; a path that is itself a link to a directory is searched.
//
// A pattern without '/' is matched against each entry's base name, so
// "*.py" finds Python files at any depth, as in the reference daemon. A
// pattern with '/' is matched against the path relative to path, so
// "src/**/*.go" and "*/main.go" mean what they say.
func (s *Server) searchFiles(w http.ResponseWriter, r *http.Request) error {
	root, err := s.queryPath(r, "path")
	if err != nil {
		return err
	}
	pattern := r.URL.Query().Get("pattern")
	if pattern == "" {
		pattern = "**"
	}
	if !doublestar.ValidatePattern(pattern) {
		return badRequest("invalid pattern %q", pattern)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return fsError(err)
	}
	walkRoot := root
	if fi.IsDir() {
		if real, err := filepath.EvalSymlinks(root); err == nil {
			walkRoot = real
		}
	}
	byPath := strings.Contains(pattern, "/")
	ctx := r.Context()
	names := newIDNames()
	out := []api.FileInfo{}
	err = filepath.WalkDir(walkRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != walkRoot && (isNotFound(err) || errors.Is(err, fs.ErrPermission)) {
				return nil // vanished meanwhile, or unreadable: skip it
			}
			return err
		}
		if d.IsDir() {
			return ctx.Err()
		}
		rel := "."
		if p != walkRoot {
			rel = strings.TrimPrefix(p[len(walkRoot):], "/")
		}
		subject := d.Name()
		if byPath && rel != "." {
			subject = rel
		}
		if !doublestar.MatchUnvalidated(pattern, subject) {
			return nil
		}
		info, err := d.Info()
		if isNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		out = append(out, names.fileInfo(filepath.Join(root, rel), info))
		return nil
	})
	if err != nil {
		return fsError(fmt.Errorf("search %s: %w", root, err))
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

// replaceInFiles answers POST /files/replace[?verbose=true]
// {path: {old, new}}: every occurrence of old is replaced, file by file in
// request order, each file rewritten atomically with its mode and owner
// kept. Every entry is checked (old not empty, path a regular file) before
// any file changes. verbose=true answers {path: {replacedCount}}.
func (s *Server) replaceInFiles(w http.ResponseWriter, r *http.Request) error {
	members, err := decodeObject(w, r)
	if err != nil {
		return err
	}
	type job struct {
		given, path string
		old, new    []byte
	}
	jobs := make([]job, 0, len(members))
	for _, m := range members {
		var it api.ReplaceFileContentItem
		if err := json.Unmarshal(m.value, &it); err != nil {
			return badRequest("%s: invalid replacement: %v", m.key, err)
		}
		if it.Old == "" {
			return badRequest("%s: old content must not be empty", m.key)
		}
		abs, err := s.resolvePath(m.key)
		if err != nil {
			return err
		}
		jobs = append(jobs, job{m.key, abs, []byte(it.Old), []byte(it.New)})
	}
	for _, j := range jobs {
		fi, err := os.Stat(j.path)
		if err != nil {
			return fsError(err)
		}
		if !fi.Mode().IsRegular() {
			return badRequest("%s is not a regular file", j.path)
		}
	}
	verbose, _ := strconv.ParseBool(r.URL.Query().Get("verbose"))
	results := make(map[string]api.ReplaceResult, len(jobs))
	for _, j := range jobs {
		n, err := fsops.ReplaceAll(j.path, j.old, j.new)
		if err != nil {
			return fsError(fmt.Errorf("replace in %s: %w", j.path, err))
		}
		results[j.given] = api.ReplaceResult{ReplacedCount: results[j.given].ReplacedCount + n}
	}
	if verbose {
		httpx.WriteJSON(w, http.StatusOK, results)
	}
	return nil
}

// listDirectory answers GET /directories/list?path=&depth=: FileInfo of
// the entries under path down to depth levels (default 1; 0 gives []),
// depth first with each directory's entries in lexical order right after
// it. Links are reported and never followed. path itself must be a
// directory and not a link to one (400).
func (s *Server) listDirectory(w http.ResponseWriter, r *http.Request) error {
	root, err := s.queryPath(r, "path")
	if err != nil {
		return err
	}
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 0 {
			return badRequest("depth %q: want an integer >= 0", d)
		}
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return fsError(err)
	}
	switch {
	case fi.Mode().Type() == fs.ModeSymlink:
		return badRequest("%s is a symbolic link, not a directory", root)
	case !fi.IsDir():
		return badRequest("%s is not a directory", root)
	}
	l := lister{names: newIDNames(), out: []api.FileInfo{}}
	if depth > 0 {
		entries, err := os.ReadDir(root)
		if err != nil {
			return fsError(err)
		}
		if err := l.add(r, root, entries, depth); err != nil {
			return err
		}
	}
	httpx.WriteJSON(w, http.StatusOK, l.out)
	return nil
}

// lister collects a depth-first directory listing.
type lister struct {
	names *idNames
	out   []api.FileInfo
}

// add appends the entries of dir and, while levels remain, the contents
// of its subdirectories right after each one. Entries that vanish and
// subdirectories that cannot be read are skipped.
func (l *lister) add(r *http.Request, dir string, entries []os.DirEntry, levels int) error {
	if err := r.Context().Err(); err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if isNotFound(err) {
			continue
		} else if err != nil {
			return fsError(err)
		}
		l.out = append(l.out, l.names.fileInfo(p, info))
		if levels > 1 && e.IsDir() {
			sub, err := os.ReadDir(p)
			if err != nil {
				continue
			}
			if err := l.add(r, p, sub, levels-1); err != nil {
				return err
			}
		}
	}
	return nil
}

// makeDirectories answers POST /directories {dir: Permission}: mkdir -p
// for each directory in order, then chown and chmod of the directory
// itself as setPermissions does (new parents get 0777 less the umask).
func (s *Server) makeDirectories(w http.ResponseWriter, r *http.Request) error {
	items, err := s.decodePermissions(w, r)
	if err != nil {
		return err
	}
	for _, it := range items {
		if _, err := fsops.MkdirAll(it.path, 0o777); err != nil {
			if errors.Is(err, syscall.ENOTDIR) {
				return badRequest("create directory %s: %v", it.path, err)
			}
			return fsError(err)
		}
		if err := it.a.apply(it.path); err != nil {
			return fsError(err)
		}
	}
	return nil
}

// removeDirectories answers DELETE /directories?path=...: rm -rf of each
// directory in order. Missing paths are ignored; a path that is not a
// directory (a link to one included) is a 400, and so is "/".
func (s *Server) removeDirectories(w http.ResponseWriter, r *http.Request) error {
	paths, err := s.resolveAll(r.URL.Query()["path"])
	if err != nil {
		return err
	}
	for _, p := range paths {
		if p == "/" {
			return badRequest("refusing to remove /")
		}
		fi, err := os.Lstat(p)
		if isNotFound(err) {
			continue
		} else if err != nil {
			return fsError(err)
		}
		if !fi.IsDir() {
			return badRequest("%s is not a directory (use DELETE /files)", p)
		}
	}
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			return fsError(err)
		}
	}
	return nil
}
