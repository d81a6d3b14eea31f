package docker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host volumes, and sub paths of named volumes, reach the engine through
// pins. A sandbox that can write under an allowed host directory can
// swap any directory there for a symbolic link at any moment, so a path
// checked once and handed to the engine is resolved again, later, by the
// engine: a link swapped in between would be followed, out of the allowed
// directory. Instead the runtime opens the path itself, beneath the
// directory it must stay in, without following any link; bind-mounts the
// very directory it opened onto a staging path in its own data directory,
// which no sandbox can write; and hands the engine the staging path. What
// was checked is what is mounted, whatever happens to the path afterwards.

// openBeneath opens rel beneath the directory root, following no symbolic
// link on the way and never leaving root. root itself is the operator's
// (an allow-list entry, a volume's directory) and is opened as it is.
// The result is an O_PATH descriptor: it can be mounted, not read.
func openBeneath(root, rel string) (int, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: root, Err: err}
	}
	rel = strings.Trim(filepath.Clean("/"+rel), "/")
	if rel == "" {
		return rootFD, nil
	}
	defer unix.Close(rootFD)
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(rootFD, rel, how)
	for try := 0; errors.Is(err, unix.EAGAIN) && try < 8; try++ {
		// A rename somewhere on the system raced the lookup; openat2
		// asks to be called again rather than risk a wrong answer.
		fd, err = unix.Openat2(rootFD, rel, how)
	}
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// Kernels before 5.6, or a seccomp profile that does not know
		// openat2: the same walk, one component at a time.
		fd, err = walkBeneath(rootFD, rel)
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
	}
	return fd, nil
}

// walkBeneath does what openBeneath asks of openat2 one component at a
// time: each is opened relative to the one before, without following it,
// and a link or ".." is refused.
func walkBeneath(dirFD int, rel string) (int, error) {
	fd := dirFD
	for _, name := range strings.Split(rel, "/") {
		if name == ".." || name == "" {
			if fd != dirFD {
				unix.Close(fd)
			}
			return -1, unix.EXDEV
		}
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if fd != dirFD {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return -1, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			unix.Close(next)
			return -1, unix.ELOOP
		}
		fd = next
	}
	return fd, nil
}

// mkdirBeneath makes the directories of rel beneath root that are
// missing, one component at a time, following no link: a component a
// sandbox swapped for a link meanwhile makes it fail.
func mkdirBeneath(root, rel string) error {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer func() { unix.Close(fd) }()
	for _, name := range strings.Split(strings.Trim(filepath.Clean("/"+rel), "/"), "/") {
		if name == "" {
			continue
		}
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return &os.PathError{Op: "mkdir", Path: filepath.Join(root, rel), Err: err}
			}
			next, err = unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			return &os.PathError{Op: "open", Path: filepath.Join(root, rel), Err: err}
		}
		unix.Close(fd)
		fd = next
	}
	return nil
}

// pin bind-mounts rel beneath root onto target, which it makes (a
// directory, or an empty file for a file) if missing; a pin already at
// target is replaced.
func pin(root, rel, target string) error {
	fd, err := openBeneath(root, rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", filepath.Join(root, rel), err)
	}
	if err := unpin(target); err != nil {
		return err
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if err := makeTarget(target, isDir); err != nil {
		return err
	}
	// The descriptor's /proc link names exactly the object opened above,
	// whatever its path has become since.
	src := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", filepath.Join(root, rel), target, err)
	}
	return nil
}

// makeTarget makes the staging path a pin is mounted on: a directory, or
// an empty file. One of the other kind left by an earlier pin is removed.
func makeTarget(target string, isDir bool) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		return err
	}
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() != isDir {
		if err := os.Remove(target); err != nil {
			return err
		}
	}
	if isDir {
		if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		return nil
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// unpin unmounts whatever is mounted at target, however many times. A
// target that is no mount point, or does not exist, is left as it is.
func unpin(target string) error {
	for {
		err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // another may lie below
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
}

// removePins unmounts and removes every pin in dir, then dir. It never
// removes anything that is still a mount point: a failed unmount leaves
// the pin, and its host directory, untouched.
func removePins(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, ent := range entries {
		target := filepath.Join(dir, ent.Name())
		if err := unpin(target); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// canPin reports whether this process can make pins in dir: it needs to
// be root (CAP_SYS_ADMIN) in the engine's mount namespace.
func canPin(dir string) error {
	probe := filepath.Join(dir, ".probe")
	if err := os.MkdirAll(probe, 0o700); err != nil {
		return err
	}
	defer os.Remove(probe)
	if err := unix.Mount(dir, probe, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount in %s: %w", dir, err)
	}
	return unpin(probe)
}

// engineSeesPins says whether pins made by this process are seen by the
// engine: it must run on this machine, in this mount namespace. A pin the
// engine cannot see would hand sandboxes an empty staging directory in
// place of their volume. pidFile is where the engine writes its pid; one
// that cannot be read leaves the namespace unchecked.
func engineSeesPins(local bool, pidFile string) error {
	if !local {
		return errors.New("the engine is not on this machine (runtime.docker.host), where pins are made")
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return nil
	}
	engineNS, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
	if err != nil {
		return nil // not visible from here: another pid namespace
	}
	ownNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	if engineNS != ownNS {
		return fmt.Errorf("the engine (pid %d) runs in another mount namespace (%s) than this server (%s): run the server in the engine's", pid, engineNS, ownNS)
	}
	return nil
}
