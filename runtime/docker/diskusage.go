package docker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// diskUsage is what a sandbox occupies on the host's disk.
type diskUsage struct {
	// Bytes is the space allocated to its files: their blocks, each
	// inode counted once however many names it has.
	Bytes int64
	// Files counts the inodes.
	Files int64
	// Hidden is the part of Bytes held by files that have no name any
	// more but are still open or mapped by the sandbox's processes.
	Hidden int64
}

// maxTreeDepth is the deepest directory a measurement descends to. The
// walk holds one descriptor per level; a tree deeper than this cannot be
// measured, and its sandbox is treated as over its limit (no real
// program nests directories a thousand deep).
const maxTreeDepth = 1000

// errTooDeep is a tree deeper than maxTreeDepth.
var errTooDeep = fmt.Errorf("a directory tree deeper than %d levels", maxTreeDepth)

// inodeKey names an inode on the host.
type inodeKey struct{ dev, ino uint64 }

// usageCounter adds up the space files occupy, the way du does: the
// blocks allocated to each inode (so a sparse file counts what it holds,
// not its length), an inode with several hard links once, directories
// included, symbolic links never followed, and no descent into another
// file system. Reset it to measure again; it keeps its buffers.
type usageCounter struct {
	total diskUsage
	// seen holds the inodes counted that others may name again: files
	// with more than one link, and open files found without a name.
	seen map[inodeKey]struct{}
	// bufs are the directory-reading buffers, one per depth.
	bufs  [][]byte
	names []string
	// procBuf holds a file of /proc being read.
	procBuf []byte
}

func (c *usageCounter) reset() {
	c.total = diskUsage{}
	clear(c.seen)
}

// firstSight reports whether the file st describes is met for the first
// time in this measurement, and remembers it.
func (c *usageCounter) firstSight(st *unix.Stat_t) bool {
	k := inodeKey{uint64(st.Dev), st.Ino}
	if _, ok := c.seen[k]; ok {
		return false
	}
	if c.seen == nil {
		c.seen = map[inodeKey]struct{}{}
	}
	c.seen[k] = struct{}{}
	return true
}

// add counts a file's blocks, a file of several links once.
func (c *usageCounter) add(st *unix.Stat_t) {
	if st.Nlink > 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR && !c.firstSight(st) {
		return
	}
	c.total.Bytes += st.Blocks * 512
	c.total.Files++
}

// addFile counts one file (not following a symbolic link); a file that
// does not exist counts nothing.
func (c *usageCounter) addFile(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("measure %s: %w", path, err)
	}
	c.add(&st)
	return nil
}

// addTree counts the directory root and everything under it on the same
// file system. Entries that vanish while it walks are skipped: the
// sandbox keeps writing, and the next measurement sees what it did. The
// walk opens every directory relative to its parent without following
// symbolic links, so whatever the sandbox renames or swaps meanwhile, it
// never leaves the tree.
func (c *usageCounter) addTree(root string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("measure %s: %w", root, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("measure %s: %w", root, err)
	}
	c.add(&st)
	if err := c.walk(fd, uint64(st.Dev), 0); err != nil {
		return fmt.Errorf("measure %s: %w", root, err)
	}
	return nil
}

// walk counts the entries of the directory open as fd, descending into
// subdirectories on device dev.
func (c *usageCounter) walk(fd int, dev uint64, depth int) error {
	if depth > maxTreeDepth {
		return errTooDeep
	}
	for len(c.bufs) <= depth {
		c.bufs = append(c.bufs, make([]byte, 16<<10))
	}
	for {
		// The buffer of this depth is free again once the entries it
		// holds are parsed: deeper levels use their own.
		n, err := unix.Getdents(fd, c.bufs[depth])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOENT) {
			// Removed since it was opened: nothing left in it to count.
			// (Not an error: a sandbox removing directories as fast as it
			// can would otherwise make every measurement fail.)
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory: %w", err)
		}
		if n == 0 {
			return nil
		}
		start := len(c.names)
		_, _, c.names = unix.ParseDirent(c.bufs[depth][:n], -1, c.names)
		names := c.names[start:]
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // gone since it was listed
			}
			if uint64(st.Dev) != dev {
				continue // a mount point: another file system's business
			}
			c.add(&st)
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
					return fmt.Errorf("open directory: %w", err)
				}
				continue // gone, or swapped for a link, since it was listed
			}
			err = c.walk(sub, dev, depth+1)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
		clear(c.names[start:])
		c.names = c.names[:start]
	}
}

// Memory file systems: their files count toward the memory of the
// sandbox that holds them, not toward its disk.
const (
	tmpfsMagic     = 0x01021994
	ramfsMagic     = 0x858458f6
	hugetlbfsMagic = 0x958458f6
)

// addUnlinked counts the files that the processes listed in procsFile (a
// cgroup's cgroup.procs) hold open, or map shared and writable, but that
// no longer have a name: a file deleted while open keeps its blocks
// until the last holder lets go, and no walk of a directory finds it.
// Files of memory file systems are left out. Processes that exit
// meanwhile are skipped.
func (c *usageCounter) addUnlinked(procsFile string) error {
	procs, err := os.ReadFile(procsFile)
	if err != nil {
		return fmt.Errorf("list the sandbox's processes: %w", err)
	}
	for _, f := range strings.Fields(string(procs)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		c.addUnlinkedOf(pid)
	}
	return nil
}

func (c *usageCounter) addUnlinkedOf(pid int) {
	dir := "/proc/" + strconv.Itoa(pid)
	if fd, err := unix.Open(dir+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		c.addUnlinkedFds(fd, dir+"/fd/")
		unix.Close(fd)
	}
	maps, err := c.readProcFile(dir + "/maps")
	if err != nil {
		return
	}
	deleted := []byte(" (deleted)")
	for len(maps) > 0 {
		// "7f0c1e000000-7f0c1e400000 rw-s 00000000 fe:00 1234 /data/f (deleted)"
		line := maps
		if i := bytes.IndexByte(maps, '\n'); i >= 0 {
			line, maps = maps[:i], maps[i+1:]
		} else {
			maps = nil
		}
		if !bytes.HasSuffix(line, deleted) {
			continue
		}
		rng, rest, ok := bytes.Cut(line, []byte(" "))
		if !ok || len(rest) < 4 || rest[1] != 'w' || rest[3] != 's' {
			continue // only a shared writable mapping can grow a file
		}
		c.addUnlinkedFile(dir + "/map_files/" + string(rng))
	}
}

// addUnlinkedFds counts the unlinked files among the descriptors listed
// in the /proc/PID/fd directory open as dirfd, whose path is prefix.
func (c *usageCounter) addUnlinkedFds(dirfd int, prefix string) {
	if len(c.bufs) == 0 {
		c.bufs = append(c.bufs, make([]byte, 16<<10))
	}
	for {
		n, err := unix.Getdents(dirfd, c.bufs[0])
		if err != nil || n == 0 {
			return
		}
		start := len(c.names)
		_, _, c.names = unix.ParseDirent(c.bufs[0][:n], -1, c.names)
		for _, name := range c.names[start:] {
			var st unix.Stat_t
			// Following the magic link: the open file itself.
			if unix.Fstatat(dirfd, name, &st, 0) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 0 {
				c.addUnlinkedFile(prefix + name)
			}
		}
		clear(c.names[start:])
		c.names = c.names[:start]
	}
}

// readProcFile reads a file of /proc into the counter's buffer, which it
// grows as needed; the result is valid until the next call.
func (c *usageCounter) readProcFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if c.procBuf == nil {
		c.procBuf = make([]byte, 64<<10)
	}
	n := 0
	for {
		if n == len(c.procBuf) {
			c.procBuf = append(c.procBuf, make([]byte, len(c.procBuf))...)
		}
		m, err := unix.Read(fd, c.procBuf[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return c.procBuf[:n], nil
		}
		n += m
	}
}

// addUnlinkedFile counts the regular file that the magic link p of /proc
// leads to, if it has no name left and lives on a disk.
func (c *usageCounter) addUnlinkedFile(p string) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 0 {
		return
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err != nil {
		return
	}
	switch int64(fs.Type) {
	case tmpfsMagic, ramfsMagic, hugetlbfsMagic:
		return
	}
	if !c.firstSight(&st) {
		return
	}
	c.total.Bytes += st.Blocks * 512
	c.total.Hidden += st.Blocks * 512
	c.total.Files++
}

// cgroupProcsFile returns the cgroup.procs file of the cgroup process pid
// is in, read from /proc/PID/cgroup: the unified hierarchy's, or on
// cgroup v1 the pids controller's (which the engine always sets up, since
// it bounds the sandbox's processes).
func cgroupProcsFile(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("read the cgroup of process %d: %w", pid, err)
	}
	return procsFileFrom(string(b), "/sys/fs/cgroup")
}

// procsFileFrom finds the cgroup.procs file, under the cgroup file
// systems mounted at root, of the cgroup a /proc/PID/cgroup file's text
// names.
func procsFileFrom(text, root string) (string, error) {
	var v1, v2 string
	for line := range strings.Lines(text) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = root + parts[2]
		case strings.Contains(","+parts[1]+",", ",pids,"):
			v1 = root + "/pids" + parts[2]
		}
	}
	for _, dir := range []string{v1, v2} {
		if dir == "" {
			continue
		}
		f := strings.TrimSuffix(dir, "/") + "/cgroup.procs"
		if _, err := os.Stat(f); err == nil {
			return f, nil
		}
	}
	return "", errors.New("no cgroup.procs file found for the sandbox's cgroup")
}
