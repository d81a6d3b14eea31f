package execd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/fsops"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

// idNames turns numeric owners into names for one request, asking the
// user database once per id.
type idNames struct {
	users  map[uint32]string
	groups map[uint32]string
}

func newIDNames() *idNames {
	return &idNames{users: make(map[uint32]string), groups: make(map[uint32]string)}
}

func (n *idNames) user(uid uint32) string {
	name, ok := n.users[uid]
	if !ok {
		name = strconv.FormatUint(uint64(uid), 10)
		if u, err := user.LookupId(name); err == nil {
			name = u.Username
		}
		n.users[uid] = name
	}
	return name
}

func (n *idNames) group(gid uint32) string {
	name, ok := n.groups[gid]
	if !ok {
		name = strconv.FormatUint(uint64(gid), 10)
		if g, err := user.LookupGroupId(name); err == nil {
			name = g.Name
		}
		n.groups[gid] = name
	}
	return name
}

// fileInfo describes the entry at path, whose lstat result is fi.
func (n *idNames) fileInfo(path string, fi fs.FileInfo) api.FileInfo {
	info := api.FileInfo{
		Path:       path,
		Type:       fileType(fi.Mode()),
		Size:       fi.Size(),
		ModifiedAt: fi.ModTime(),
		CreatedAt:  fi.ModTime(),
		Mode:       modeDigits(fi.Mode()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.CreatedAt = time.Unix(st.Ctim.Sec, st.Ctim.Nsec) // the reference daemon reports ctime
		info.Owner = n.user(st.Uid)
		info.Group = n.group(st.Gid)
	}
	return info
}

// fileType names the type of an lstat result the way FileInfo.Type does.
func fileType(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "file"
	case fs.ModeDir:
		return "directory"
	case fs.ModeSymlink:
		return "symlink"
	}
	return "other"
}

// modeDigits writes permission bits as octal digits read as a decimal
// number, the wire form of modes: 0o755 becomes 755. Setuid, setgid and
// sticky bits are not reported.
func modeDigits(m fs.FileMode) int {
	p := int(m.Perm())
	return (p>>6&7)*100 + (p>>3&7)*10 + p&7
}

// parseModeDigits reads the wire form of a mode: 755 means 0o755. Up to
// four digits are accepted, so 4755 sets the setuid bit. Digits 8 and 9
// and values over 7777 are errors.
func parseModeDigits(d int) (uint32, error) {
	if d < 0 || d > 7777 {
		return 0, fmt.Errorf("mode %d: want up to four octal digits such as 755", d)
	}
	var m uint32
	for shift, rest := 0, d; rest > 0; shift, rest = shift+3, rest/10 {
		digit := rest % 10
		if digit > 7 {
			return 0, fmt.Errorf("mode %d: %d is not an octal digit", d, digit)
		}
		m |= uint32(digit) << shift
	}
	return m, nil
}

// attrs is an owner, group and mode to apply, resolved from a Permission
// or FileMetadata. uid and gid are -1 when not to be changed.
type attrs struct {
	uid, gid int
	mode     uint32
	setMode  bool
}

// resolveAttrs resolves owner and group (names, or numeric ids) and
// checks mode. Unlike the reference daemon it only changes the owner or
// group when one is given, and an unknown name is an error rather than a
// silent fallback to execd's own ids.
func resolveAttrs(owner, group string, mode int) (attrs, error) {
	a := attrs{uid: -1, gid: -1}
	var err error
	if owner != "" {
		if a.uid, err = lookupUID(owner); err != nil {
			return a, err
		}
	}
	if group != "" {
		if a.gid, err = lookupGID(group); err != nil {
			return a, err
		}
	}
	if mode != 0 {
		if a.mode, err = parseModeDigits(mode); err != nil {
			return a, err
		}
		a.setMode = true
	}
	return a, nil
}

func lookupUID(name string) (int, error) {
	if u, err := user.Lookup(name); err == nil {
		if id, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
			return int(id), nil
		}
	}
	if id, err := strconv.ParseUint(name, 10, 32); err == nil && id != 1<<32-1 {
		return int(id), nil
	}
	if name == "root" {
		return 0, nil // an image without /etc/passwd still has root
	}
	return -1, fmt.Errorf("unknown owner %q", name)
}

func lookupGID(name string) (int, error) {
	if g, err := user.LookupGroup(name); err == nil {
		if id, err := strconv.ParseUint(g.Gid, 10, 32); err == nil {
			return int(id), nil
		}
	}
	if id, err := strconv.ParseUint(name, 10, 32); err == nil && id != 1<<32-1 {
		return int(id), nil
	}
	if name == "root" {
		return 0, nil
	}
	return -1, fmt.Errorf("unknown group %q", name)
}

// apply changes path (following symbolic links) as a says: owner and group
// first, since chown clears the setuid and setgid bits, then the mode.
func (a attrs) apply(path string) error {
	if a.uid >= 0 || a.gid >= 0 {
		if err := os.Chown(path, a.uid, a.gid); err != nil {
			return err
		}
	}
	if a.setMode {
		if err := unix.Fchmodat(unix.AT_FDCWD, path, a.mode, 0); err != nil {
			return &fs.PathError{Op: "chmod", Path: path, Err: err}
		}
	}
	return nil
}

// member is one name/value pair of a JSON object.
type member struct {
	key   string
	value json.RawMessage
}

// decodeObject reads a JSON object body and returns its members in the
// order the client wrote them, so that requests keyed by path are applied
// in a predictable order. A null body is an empty object.
func decodeObject(w http.ResponseWriter, r *http.Request) ([]member, error) {
	var raw json.RawMessage
	if err := httpx.DecodeJSON(w, r, &raw, 0, false); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "invalid JSON body: %w", err)
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "invalid JSON body: want an object keyed by path")
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "invalid JSON body: %w", err)
		}
		m := member{key: tok.(string)}
		if err := dec.Decode(&m.value); err != nil {
			return nil, httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, "invalid JSON body: %w", err)
		}
		out = append(out, m)
	}
	return out, nil
}

// badRequest is a 400 INVALID_REQUEST_BODY error.
func badRequest(format string, args ...any) error {
	return httpx.Errorf(http.StatusBadRequest, api.CodeInvalidRequestBody, format, args...)
}

// queryPath returns the resolved value of the required query parameter
// name: 400 MISSING_QUERY when absent or empty.
func (s *Server) queryPath(r *http.Request, name string) (string, error) {
	p := r.URL.Query().Get(name)
	if p == "" {
		return "", httpx.Errorf(http.StatusBadRequest, api.CodeMissingQuery, "missing query parameter '%s'", name)
	}
	return s.resolvePath(p)
}

// isNotFound reports whether a lookup failed because the path does not
// exist, including a path that goes through a regular file.
func isNotFound(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// fsError classifies a file system error for an answer: a missing path is
// a 404 FILE_NOT_FOUND, a name the kernel rejects (too long, too many
// links) a 400, a full file system a 507, a permission refused (EACCES,
// EPERM) a 403 PERMISSION_DENIED, anything else a 500.
func fsError(err error) error {
	var he *httpx.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &he):
		return err
	case isNotFound(err):
		return httpx.Errorf(http.StatusNotFound, api.CodeFileNotFound, "file not found: %w", err)
	case errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.ELOOP):
		return badRequest("%w", err)
	case fsops.IsNoSpace(err):
		return httpx.Errorf(http.StatusInsufficientStorage, api.CodeInsufficientStorage, "%w", err)
	case errors.Is(err, fs.ErrPermission):
		return httpx.Errorf(http.StatusForbidden, api.CodePermissionDenied, "%w", err)
	}
	return err
}
