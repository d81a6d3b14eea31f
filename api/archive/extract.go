package archive

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// ErrUnsafeName is wrapped by the error for an entry whose name is
// absolute, holds a NUL byte or a ".." component: such an entry could
// write outside the destination and is refused, as is a hard link to one.
var ErrUnsafeName = errors.New("unsafe entry name")

// ErrReplaceDir is wrapped by the error for an entry that would replace an
// existing directory with something that is not one.
var ErrReplaceDir = errors.New("would replace a directory")

// ErrNotDir is wrapped by the error for an entry that needs a directory
// where something else exists.
var ErrNotDir = errors.New("exists and is not a directory")

// ErrSparse is returned for a sparse file entry. Pack never writes one,
// and a few bytes of sparse map can stand for terabytes of zeros.
var ErrSparse = errors.New("sparse files are not supported")

// Ownership says who owns what Extract creates.
type Ownership int

const (
	// OwnerCaller leaves new entries owned by the extracting process.
	OwnerCaller Ownership = iota
	// OwnerFixed gives new entries ExtractOptions.UID and GID.
	OwnerFixed
	// OwnerArchive gives each entry the owner the archive records.
	OwnerArchive
)

// ExtractOptions adjusts Extract.
type ExtractOptions struct {
	Owner    Ownership
	UID, GID int // the owner with OwnerFixed

	// Rename maps each entry's cleaned name ("a/b", never "" or
	// absolute) to the name it is written as; "" leaves the entry out,
	// and an error fails the extraction (an entry the caller did not
	// expect). Hard link targets are mapped too. Nil keeps every name.
	Rename func(name string) (string, error)

	// SafeModes gives extracted files and directories the modes a plain
	// create would: the archive's permissions less the process's umask,
	// and never setuid or setgid. For streams from a party that should
	// not choose who may run or change what it writes.
	SafeModes bool

	// Progress, when set, is called with the bytes of file content
	// written so far, after each chunk.
	Progress func(done int64)
}

// TempPrefix starts the name of a file Extract is writing. Such a name
// left behind is debris of an interrupted extraction.
const TempPrefix = ".osb-tmp-"

// Extract writes the tar stream r into root. Directories are created as
// needed; a directory that exists keeps its mode, one created gets the
// archive's mode and time once its contents are written. Regular files,
// symbolic links and hard links replace what has their name, atomically
// one by one; FIFOs and devices are counted as skipped. Entries named "."
// describe root itself and only count.
//
// root bounds every operation: an entry or a symbolic link that leads
// outside it fails the extraction (wrapping ErrUnsafeName or an os.Root
// error), and nothing outside root is touched. On error, what was already
// renamed into place stays; the file being written is removed. Nothing is
// synced to disk: a caller that needs durability syncs the file system
// once when Extract returns, which costs far less than a sync per file.
func Extract(ctx context.Context, r io.Reader, root *os.Root, opts ExtractOptions) (Stats, error) {
	x := extractor{ctx: ctx, root: root, opts: opts, made: make(map[string]bool)}
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	x.buf = *bp
	err := x.run(tar.NewReader(r))
	x.closeCached()
	if err == nil {
		err = x.finishDirs()
	}
	return x.stats, err
}

type extractor struct {
	ctx   context.Context
	root  *os.Root
	opts  ExtractOptions
	buf   []byte
	stats Stats
	made  map[string]bool // directories this extraction created
	dirs  []*tar.Header   // their headers, applied when the stream ends

	cached    *os.Root // the directory of the last entry placed
	cachedDir string
}

func (x *extractor) run(tr *tar.Reader) error {
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read archive: %w", err)
		}
		if cleanName(hdr.Name) == "" {
			continue // root itself
		}
		name, err := x.name(hdr.Name)
		if err != nil {
			return err
		}
		if name == "" {
			continue // renamed away
		}
		if err := x.entry(tr, hdr, name); err != nil {
			if isEscape(err) {
				err = fmt.Errorf("%w: %w", ErrUnsafeName, err)
			}
			return fmt.Errorf("extract %s: %w", hdr.Name, err)
		}
	}
}

// cleanName is the checked, cleaned form of an archive name; "" for the
// root itself and "\x00" for an unsafe one.
func cleanName(n string) string {
	if n == "" || strings.IndexByte(n, 0) >= 0 || strings.HasPrefix(n, "/") {
		return "\x00"
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "\x00"
		}
	}
	n = path.Clean(n)
	if n == "." {
		return ""
	}
	return n
}

// name checks an archive name and maps it through opts.Rename.
func (x *extractor) name(n string) (string, error) {
	c := cleanName(n)
	if c == "\x00" {
		return "", fmt.Errorf("%w: %q", ErrUnsafeName, n)
	}
	if c == "" || x.opts.Rename == nil {
		return c, nil
	}
	mapped, err := x.opts.Rename(c)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrUnsafeName, err)
	}
	if mapped == "" {
		return "", nil
	}
	if m := cleanName(mapped); m == "\x00" || m == "" {
		return "", fmt.Errorf("%w: %q renamed to %q", ErrUnsafeName, n, mapped)
	}
	return path.Clean(mapped), nil
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header, name string) error {
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(hdr, name)
	case tar.TypeReg: // tar.Reader reports legacy '\x00' entries as TypeReg or TypeDir
		if isSparse(hdr) {
			return ErrSparse
		}
		if err := x.parent(name); err != nil {
			return err
		}
		return x.file(tr, hdr, name)
	case tar.TypeSymlink:
		if err := x.parent(name); err != nil {
			return err
		}
		return x.place(name, hdr, func(dir *os.Root, tmp string) error { return dir.Symlink(hdr.Linkname, tmp) })
	case tar.TypeLink:
		target, err := x.name(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("%w: hard link to %q", ErrUnsafeName, hdr.Linkname)
		}
		if err := x.parent(name); err != nil {
			return err
		}
		return x.place(name, hdr, func(_ *os.Root, tmp string) error {
			return x.root.Link(target, path.Join(path.Dir(name), tmp))
		})
	case tar.TypeGNUSparse:
		return ErrSparse
	default:
		x.stats.Skipped++
		return nil
	}
}

// isSparse reports whether a regular file entry is stored in one of the
// PAX sparse formats.
func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// dir creates the directory name unless it exists; its mode, owner and
// time are set once the stream ends, so that a read-only directory can be
// filled first.
func (x *extractor) dir(hdr *tar.Header, name string) error {
	fi, err := x.root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
		x.stats.Dirs++
		return nil
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		// A link to a directory inside root serves as one.
		if fi, err := x.root.Stat(name); err == nil && fi.IsDir() {
			x.stats.Dirs++
			return nil
		}
		return fmt.Errorf("%s %w", name, ErrNotDir)
	case err == nil:
		return fmt.Errorf("%s %w", name, ErrNotDir)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if err := x.parent(name); err != nil {
		return err
	}
	if err := x.root.Mkdir(name, 0o700); err != nil {
		return err
	}
	x.made[name] = true
	x.dirs = append(x.dirs, hdr)
	hdr.Name = name
	x.stats.Dirs++
	return nil
}

// parent makes sure the directory holding name exists, creating missing
// ones with the default mode.
func (x *extractor) parent(name string) error {
	dir := path.Dir(name)
	if dir == "." || x.made[dir] {
		return nil
	}
	if fi, err := x.root.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s %w", dir, ErrNotDir)
		}
		return nil
	}
	// Create each missing level so that each can be given its owner.
	var missing []string
	for d := dir; d != "."; d = path.Dir(d) {
		if _, err := x.root.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	slices.Reverse(missing)
	for _, d := range missing {
		if err := x.root.Mkdir(d, 0o777); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		x.made[d] = true
		if err := x.chown(d, -1, -1); err != nil {
			return err
		}
	}
	return nil
}

// file writes a regular file under a temporary name and renames it into
// place. Owner, mode and times are set through the open file.
func (x *extractor) file(tr *tar.Reader, hdr *tar.Header, name string) error {
	return x.place(name, hdr, func(dir *os.Root, tmp string) error {
		f, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		var dst io.Writer = f
		if x.opts.Progress != nil {
			dst = &progressWriter{w: f, base: x.stats.Bytes, report: x.opts.Progress}
		}
		n, err := io.CopyBuffer(dst, io.LimitReader(tr, hdr.Size), x.buf)
		x.stats.Bytes += n
		if err == nil && n < hdr.Size {
			err = fmt.Errorf("read archive: %w", io.ErrUnexpectedEOF)
		}
		if err == nil {
			if uid, gid, ok := x.owner(hdr.Uid, hdr.Gid); ok {
				err = f.Chown(uid, gid)
			}
		}
		if err == nil {
			// After the owner: a change of owner clears setuid and setgid.
			err = f.Chmod(x.mode(hdr.Mode))
		}
		if err == nil {
			err = setFileTimes(f, hdr.ModTime)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// mode is the mode an entry with tar mode m gets: as recorded, or with
// SafeModes less the umask and without setuid and setgid.
func (x *extractor) mode(m int64) fs.FileMode {
	fm := mode(m)
	if x.opts.SafeModes {
		fm &^= fs.FileMode(umask) | fs.ModeSetuid | fs.ModeSetgid
	}
	return fm
}

// mode turns a tar mode into an fs.FileMode: permissions and the
// setuid, setgid and sticky bits.
func mode(mode int64) fs.FileMode {
	m := fs.FileMode(mode).Perm()
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// dirRoot returns the directory holding name, opened as a root inside
// x.root, and name's base. The last directory stays open for the next
// entry, which in a packed tree is most often beside this one: opening
// each directory once, rather than walking the whole path for every
// operation, is what makes many small files fast.
func (x *extractor) dirRoot(name string) (*os.Root, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		return x.root, base, nil
	}
	if x.cached != nil && x.cachedDir == dir {
		return x.cached, base, nil
	}
	x.closeCached()
	r, err := x.root.OpenRoot(dir)
	if err != nil {
		return nil, "", err
	}
	x.cached, x.cachedDir = r, dir
	return r, base, nil
}

func (x *extractor) closeCached() {
	if x.cached != nil {
		x.cached.Close()
		x.cached, x.cachedDir = nil, ""
	}
}

// place makes the entry under a fresh temporary name next to name with
// create and renames it over name. A regular file gets its owner, mode
// and times in create; a symbolic link gets its owner here.
func (x *extractor) place(name string, hdr *tar.Header, create func(dir *os.Root, tmp string) error) (retErr error) {
	dir, base, err := x.dirRoot(name)
	if err != nil {
		return err
	}
	if fi, err := dir.Lstat(base); err == nil && fi.IsDir() {
		return fmt.Errorf("%w: %s", ErrReplaceDir, name)
	}
	tmp := tempName()
	defer func() {
		if retErr != nil {
			dir.Remove(tmp)
		}
	}()
	if err := create(dir, tmp); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeSymlink:
		x.stats.Links++
		if uid, gid, ok := x.owner(hdr.Uid, hdr.Gid); ok {
			if err := dir.Lchown(tmp, uid, gid); err != nil {
				return err
			}
		}
	case tar.TypeLink:
		x.stats.Links++ // shares its target's owner, mode and time
	default:
		x.stats.Files++
	}
	return dir.Rename(tmp, base)
}

// owner is the owner opts call for, given the archive's uid and gid
// (negative for a directory the archive only implies); ok is false when
// the owner is to be left as it is.
func (x *extractor) owner(uid, gid int) (int, int, bool) {
	switch x.opts.Owner {
	case OwnerFixed:
		return x.opts.UID, x.opts.GID, true
	case OwnerArchive:
		return uid, gid, uid >= 0
	}
	return 0, 0, false
}

// chown gives the directory name the owner opts call for.
func (x *extractor) chown(name string, uid, gid int) error {
	if uid, gid, ok := x.owner(uid, gid); ok {
		return x.root.Chown(name, uid, gid)
	}
	return nil
}

// finishDirs gives the directories this extraction created their mode,
// owner and time, deepest first so that setting a time is not undone by
// a change inside.
func (x *extractor) finishDirs() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		hdr := x.dirs[i]
		if err := x.chown(hdr.Name, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("extract %s: %w", hdr.Name, err)
		}
		if err := x.root.Chmod(hdr.Name, x.mode(hdr.Mode)); err != nil {
			return fmt.Errorf("extract %s: %w", hdr.Name, err)
		}
		if err := x.root.Chtimes(hdr.Name, hdr.ModTime, hdr.ModTime); err != nil {
			return fmt.Errorf("extract %s: %w", hdr.Name, err)
		}
	}
	return nil
}

// tempName is a fresh hidden base name.
func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return TempPrefix + hex.EncodeToString(b[:])
}

// isEscape reports whether err is os.Root refusing a name that leads
// outside the root, through ".." or a symbolic link. The os package does
// not export that error, so its text is matched.
func isEscape(err error) bool {
	return strings.Contains(err.Error(), "path escapes from parent")
}
