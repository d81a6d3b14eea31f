package cgroup

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Membership is one line of /proc/<pid>/cgroup: the cgroup the process
// belongs to in one hierarchy.
type Membership struct {
	// HierarchyID is 0 for the cgroup v2 hierarchy, positive for v1.
	HierarchyID int
	// Controllers lists the v1 controllers bound to the hierarchy ("cpu",
	// "memory", "name=systemd", ...); it is empty for v2.
	Controllers []string
	// Path is the cgroup's path relative to the hierarchy root as seen from
	// the process's cgroup namespace; it always starts with "/" and may
	// start with "/.." for a cgroup outside the namespace.
	Path string
}

// has reports whether the membership's hierarchy carries controller.
func (m Membership) has(controller string) bool { return slices.Contains(m.Controllers, controller) }

// ParseMemberships parses the content of /proc/<pid>/cgroup, whose lines
// read "hierarchy-ID:controller-list:cgroup-path". Empty lines are skipped;
// any other malformed line is an error naming it.
func ParseMemberships(data string) ([]Membership, error) {
	var ms []Membership
	n := 0
	for line := range strings.Lines(data) {
		n++
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		m, err := parseMembership(line)
		if err != nil {
			return nil, fmt.Errorf("cgroup line %d %q: %w", n, line, err)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// parseMembership parses one non-empty line of /proc/<pid>/cgroup.
func parseMembership(line string) (Membership, error) {
	id, rest, ok := strings.Cut(line, ":")
	if !ok {
		return Membership{}, errors.New("no controller list")
	}
	list, path, ok := strings.Cut(rest, ":") // the path itself may hold ':'
	if !ok {
		return Membership{}, errors.New("no path")
	}
	h, err := strconv.Atoi(id)
	if err != nil || h < 0 || !isDigits(id) {
		return Membership{}, fmt.Errorf("bad hierarchy id %q", id)
	}
	if !strings.HasPrefix(path, "/") {
		return Membership{}, fmt.Errorf("path %q is not absolute", path)
	}
	m := Membership{HierarchyID: h, Path: path}
	if list != "" {
		m.Controllers = strings.Split(list, ",")
	}
	if h == 0 && len(m.Controllers) > 0 {
		return Membership{}, errors.New("v2 hierarchy with controllers")
	}
	return m, nil
}

// Mount is a cgroup file system from /proc/<pid>/mountinfo.
type Mount struct {
	// Root is the directory of the hierarchy that is mounted, e.g. "/" or
	// "/docker/<id>" in a container without a cgroup namespace.
	Root string
	// Point is where it is mounted, relative to the process's root.
	Point string
	// FSType is "cgroup" (v1) or "cgroup2".
	FSType string
	// SuperOptions are the per-superblock options; for v1 they name the
	// hierarchy's controllers ("rw,cpu,cpuacct").
	SuperOptions []string
}

// version returns the hierarchy version of the mount.
func (m Mount) version() Version {
	if m.FSType == "cgroup2" {
		return V2
	}
	return V1
}

// has reports whether a v1 mount carries controller.
func (m Mount) has(controller string) bool { return slices.Contains(m.SuperOptions, controller) }

// ParseMountInfo returns the cgroup and cgroup2 mounts listed in the
// content of /proc/<pid>/mountinfo, in file order. A malformed cgroup line
// is an error naming it, as is a line without the separator; lines of
// other file systems are skipped unread, since some (nsfs mounts of
// network namespaces, "net:[4026532184]") have roots that are not paths.
func ParseMountInfo(data string) ([]Mount, error) {
	var ms []Mount
	n := 0
	for line := range strings.Lines(data) {
		n++
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		if fs := mountFSType(line); fs != "" && fs != "cgroup" && fs != "cgroup2" {
			continue
		}
		m, err := ParseMountInfoLine(line)
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			ms = append(ms, m)
		}
	}
	return ms, nil
}

// mountFSType returns the file system type of a mountinfo line, the field
// after the " - " separator, or "" when there is none.
func mountFSType(line string) string {
	_, rest, ok := strings.Cut(line, " - ")
	if !ok {
		return ""
	}
	fs, _, _ := strings.Cut(rest, " ")
	return fs
}

// ParseMountInfoLine parses one line of /proc/<pid>/mountinfo (see
// proc_pid_mountinfo(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//	(1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)
//
// It returns the root (4) and mount point (5) with the kernel's octal
// escapes (\040 for a space, ...) undone, the file system type (9) and the
// super options (11).
func ParseMountInfoLine(line string) (Mount, error) {
	// Fields are separated by single spaces; paths have theirs escaped.
	fields := strings.Split(line, " ")
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 {
		return Mount{}, fmt.Errorf("no optional-field separator in %q", line)
	}
	if len(fields) < sep+4 || fields[sep+1] == "" {
		return Mount{}, fmt.Errorf("want a file system type, source and options after the separator in %q", line)
	}
	for i, f := range fields[:6] {
		if f == "" {
			return Mount{}, fmt.Errorf("empty field %d in %q", i+1, line)
		}
	}
	root, err := unescapeMountPath(fields[3])
	if err != nil {
		return Mount{}, fmt.Errorf("root %q: %w", fields[3], err)
	}
	point, err := unescapeMountPath(fields[4])
	if err != nil {
		return Mount{}, fmt.Errorf("mount point %q: %w", fields[4], err)
	}
	if !strings.HasPrefix(root, "/") || !strings.HasPrefix(point, "/") {
		return Mount{}, fmt.Errorf("relative path in %q", line)
	}
	return Mount{
		Root:         root,
		Point:        point,
		FSType:       fields[sep+1],
		SuperOptions: strings.Split(strings.Join(fields[sep+3:], " "), ","),
	}, nil
}

// unescapeMountPath undoes the kernel's escaping of mountinfo paths: a
// backslash and three octal digits stand for one byte.
func unescapeMountPath(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", errors.New("truncated escape")
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("bad escape %q", s[i:i+4])
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}

// isDigits reports whether s is a non-empty run of ASCII digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseUint parses a file holding one unsigned decimal number.
func parseUint(data string) (uint64, error) {
	s := strings.TrimSpace(data)
	if !isDigits(s) {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	return strconv.ParseUint(s, 10, 64)
}

// parseInt parses a file holding one signed decimal number (v1
// cpu.cfs_quota_us is -1 when unlimited).
func parseInt(data string) (int64, error) {
	s := strings.TrimSpace(data)
	if !isDigits(strings.TrimPrefix(s, "-")) {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	return strconv.ParseInt(s, 10, 64)
}

// parseCPUMax parses v2 cpu.max, "$QUOTA $PERIOD" in microseconds with
// QUOTA "max" for no limit. It returns the limit in CPUs, or 0 for none.
func parseCPUMax(data string) (float64, error) {
	s := strings.TrimSpace(data)
	quota, period, ok := strings.Cut(s, " ")
	if !ok {
		return 0, fmt.Errorf("want \"$QUOTA $PERIOD\", have %q", s)
	}
	p, err := parseUint(period)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("bad period in %q", s)
	}
	if quota == "max" {
		return 0, nil
	}
	q, err := parseUint(quota)
	if err != nil {
		return 0, fmt.Errorf("bad quota in %q", s)
	}
	return float64(q) / float64(p), nil
}

// parseCPUList counts the CPUs of a cpuset list such as "0-3,8,10-11".
// An empty list counts 0.
func parseCPUList(data string) (int, error) {
	s := strings.TrimSpace(data)
	if s == "" {
		return 0, nil
	}
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := parseUint(lo)
		b, err2 := parseUint(hi)
		if err1 != nil || err2 != nil || b < a || b-a >= math.MaxInt32 {
			return 0, fmt.Errorf("cpu list %q: bad item %q", s, part)
		}
		n += int(b-a) + 1
		if n > math.MaxInt32 {
			return 0, fmt.Errorf("cpu list %q: too many CPUs", s)
		}
	}
	return n, nil
}

// statValue returns the value of key in a "key value" per line file such
// as memory.stat or cpu.stat.
func statValue(data, key string) (uint64, bool, error) {
	for line := range strings.Lines(data) {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		if ok && k == key {
			n, err := parseUint(v)
			if err != nil {
				return 0, true, fmt.Errorf("%s: %w", key, err)
			}
			return n, true, nil
		}
	}
	return 0, false, nil
}

// meminfoValue returns the value of key in /proc/meminfo, in bytes
// ("MemTotal:       24684084 kB").
func meminfoValue(data, key string) (uint64, bool, error) {
	for line := range strings.Lines(data) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != key {
			continue
		}
		v = strings.TrimSpace(v)
		unit := uint64(1)
		if num, ok := strings.CutSuffix(v, " kB"); ok {
			v, unit = strings.TrimSpace(num), 1024
		}
		n, err := parseUint(v)
		if err != nil || n > math.MaxUint64/unit {
			return 0, true, fmt.Errorf("meminfo %s: bad value %q", key, v)
		}
		return n * unit, true, nil
	}
	return 0, false, nil
}
