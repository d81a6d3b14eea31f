// Package cgroup reads the CPU and memory figures of the control group that
// holds the current process, on cgroup v1, v2 and hybrid hosts. It finds the
// cgroup through /proc/self/cgroup and the mounts of /proc/self/mountinfo,
// so it resolves the same way inside a container (where the container's
// cgroup is mounted with a root such as /docker/<id>) and on a host (where
// the process sits deep in the hierarchy). It serves nothing over HTTP;
// execd imports it.
package cgroup

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Version is a cgroup hierarchy version.
type Version int

// The hierarchy versions; the zero Version means "not found".
const (
	V1 Version = 1
	V2 Version = 2
)

// String returns "v1", "v2" or "none".
func (v Version) String() string {
	switch v {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return "none"
}

// Dir is the directory of the process's cgroup in one hierarchy.
type Dir struct {
	// Path is the directory, "" when no mount shows the cgroup.
	Path string
	// Version is the hierarchy's version, 0 when Path is "".
	Version Version
}

// Dirs are the directories the figures are read from, one per controller.
// On a v2 host they are all the same directory.
type Dirs struct {
	CPU     Dir // the CPU limit: v1 cpu.cfs_quota_us, v2 cpu.max
	CPUAcct Dir // CPU time used: v1 cpuacct.usage, v2 cpu.stat
	CPUSet  Dir // the CPUs allowed: v1 cpuset.cpus, v2 cpuset.cpus.effective
	Memory  Dir // memory limit and use
}

// Resolve finds, for each controller, the directory of the cgroup that
// memberships (from /proc/self/cgroup) place the process in, under the
// first mount (from /proc/self/mountinfo) whose root contains that cgroup.
// root is prepended to mount points; "" means the real root.
//
// A controller bound to a v1 hierarchy is read only there: the kernel
// never binds one controller to both versions, so on a hybrid host (v1
// controllers beside a v2 hierarchy without them) the v1 figures win. A
// controller no v1 hierarchy carries is read from the v2 cgroup, where its
// files exist only if the controller is enabled. A cgroup no mount shows
// (outside the cgroup namespace, or not mounted) gets an empty Dir.
func Resolve(memberships []Membership, mounts []Mount, root string) Dirs {
	return Dirs{
		CPU:     resolve(memberships, mounts, root, "cpu"),
		CPUAcct: resolve(memberships, mounts, root, "cpuacct"),
		CPUSet:  resolve(memberships, mounts, root, "cpuset"),
		Memory:  resolve(memberships, mounts, root, "memory"),
	}
}

// resolve returns the directory of the process's cgroup for one controller.
func resolve(memberships []Membership, mounts []Mount, root, controller string) Dir {
	want := V2
	var cgroup string
	for _, m := range memberships {
		if m.HierarchyID != 0 && m.has(controller) {
			want, cgroup = V1, m.Path
			break
		}
		if m.HierarchyID == 0 && cgroup == "" {
			cgroup = m.Path
		}
	}
	if cgroup == "" {
		return Dir{}
	}
	for _, mt := range mounts {
		if mt.version() != want || (want == V1 && !mt.has(controller)) {
			continue
		}
		if rel, ok := relativeTo(mt.Root, cgroup); ok {
			return Dir{Path: filepath.Join(root, mt.Point, rel), Version: want}
		}
	}
	return Dir{}
}

// relativeTo returns the path of cgroup inside a mount of the hierarchy
// directory mountRoot, if the mount shows it.
func relativeTo(mountRoot, cgroup string) (string, bool) {
	var rel string
	switch {
	case mountRoot == "/":
		rel = cgroup
	case cgroup == mountRoot:
		rel = "/"
	case strings.HasPrefix(cgroup, mountRoot+"/"):
		rel = cgroup[len(mountRoot):]
	default:
		return "", false
	}
	// A cgroup outside the process's cgroup namespace reads "/../..";
	// no mount inside the namespace reaches it.
	for elem := range strings.SplitSeq(rel, "/") {
		if elem == ".." || elem == "." {
			return "", false
		}
	}
	return rel, true
}

// Config says where Open finds the process's view of the system. The zero
// value reads the real one.
type Config struct {
	// ProcDir is the proc file system: Open reads ProcDir/self/cgroup,
	// ProcDir/self/mountinfo and ProcDir/meminfo. Default "/proc".
	ProcDir string
	// Root is prepended to every mount point, so tests can run against a
	// fixture tree. Default "": mount points are used as they are.
	Root string
	// NumCPU bounds the CPU count and stands in for it when the cgroup sets
	// no CPU limit. Default runtime.NumCPU().
	NumCPU int
}

// Group reads the figures of the process's cgroup. It resolves the cgroup
// once, at Open; a process moved to another cgroup later keeps reading the
// first one. Its methods are safe for concurrent use.
type Group struct {
	dirs     Dirs
	meminfo  string // path of /proc/meminfo
	memTotal uint64 // the host's memory, bytes
	numCPU   int
}

// Open finds the cgroup of the current process. It fails if the proc
// files cannot be read or parsed, or if no mount shows the cgroup that
// accounts the process's CPU time or memory.
func Open(cfg Config) (*Group, error) {
	procDir := cmp.Or(cfg.ProcDir, "/proc")
	data, err := os.ReadFile(filepath.Join(procDir, "self", "cgroup"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup membership: %w", err)
	}
	memberships, err := ParseMemberships(string(data))
	if err != nil {
		return nil, err
	}
	data, err = os.ReadFile(filepath.Join(procDir, "self", "mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	mounts, err := ParseMountInfo(string(data))
	if err != nil {
		return nil, err
	}
	g := &Group{
		dirs:    Resolve(memberships, mounts, cfg.Root),
		meminfo: filepath.Join(procDir, "meminfo"),
		numCPU:  cmp.Or(cfg.NumCPU, runtime.NumCPU()),
	}
	if g.dirs.CPUAcct.Path == "" {
		return nil, fmt.Errorf("no mount shows the cgroup of controller cpuacct (memberships %v)", memberships)
	}
	if g.dirs.Memory.Path == "" {
		return nil, fmt.Errorf("no mount shows the cgroup of controller memory (memberships %v)", memberships)
	}
	data, err = os.ReadFile(g.meminfo)
	if err != nil {
		return nil, fmt.Errorf("read host memory: %w", err)
	}
	total, ok, err := meminfoValue(string(data), "MemTotal")
	if err != nil {
		return nil, err
	}
	if !ok || total == 0 {
		return nil, fmt.Errorf("%s: no MemTotal", g.meminfo)
	}
	g.memTotal = total
	return g, nil
}

// Dirs returns the directories the group reads.
func (g *Group) Dirs() Dirs { return g.dirs }

// Stats are the figures of one reading.
type Stats struct {
	// CPUs is the effective CPU limit: the smallest of the CFS quota over
	// its period, the size of the cpuset and the number of CPUs the
	// process may run on.
	CPUs float64
	// CPUUsage is the CPU time the cgroup has used since it was created.
	CPUUsage time.Duration
	// MemLimit is the memory limit in bytes, or the host's memory when the
	// cgroup has no lower limit.
	MemLimit uint64
	// MemUsed is the memory the cgroup uses in bytes, without the inactive
	// file cache the kernel reclaims first.
	MemUsed uint64
}

// Read takes one reading. A file a figure needs that is missing or
// malformed is an error naming it; a missing optional limit is not.
func (g *Group) Read() (Stats, error) {
	var st Stats
	var err error
	if st.CPUs, err = g.cpus(); err != nil {
		return Stats{}, err
	}
	if st.CPUUsage, err = g.cpuUsage(); err != nil {
		return Stats{}, err
	}
	if st.MemLimit, st.MemUsed, err = g.memory(); err != nil {
		return Stats{}, err
	}
	return st, nil
}

// CPUUsage returns the CPU time the cgroup has used, reading a single
// file.
func (g *Group) CPUUsage() (time.Duration, error) { return g.cpuUsage() }

// cpus returns the effective CPU limit: the smallest of the quota, the
// cpuset size and the CPUs the process may use.
func (g *Group) cpus() (float64, error) {
	cpus := float64(g.numCPU)
	quota, err := g.cpuQuota()
	if err != nil {
		return 0, err
	}
	if quota > 0 {
		cpus = min(cpus, quota)
	}
	set, err := g.cpuSetSize()
	if err != nil {
		return 0, err
	}
	if set > 0 {
		cpus = min(cpus, float64(set))
	}
	return cpus, nil
}

// cpuQuota returns the CFS bandwidth limit in CPUs, 0 for none.
func (g *Group) cpuQuota() (float64, error) {
	d := g.dirs.CPU
	switch d.Version {
	case V1:
		data, err := readFile(d.Path, "cpu.cfs_quota_us")
		if err != nil {
			return 0, ignoreMissing(err)
		}
		quota, err := parseInt(data)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, "cpu.cfs_quota_us"), err)
		}
		if quota <= 0 { // -1: no limit
			return 0, nil
		}
		data, err = readFile(d.Path, "cpu.cfs_period_us")
		if err != nil {
			return 0, err
		}
		period, err := parseUint(data)
		if err != nil || period == 0 {
			return 0, fmt.Errorf("%s: bad period %q", filepath.Join(d.Path, "cpu.cfs_period_us"), data)
		}
		return float64(quota) / float64(period), nil
	case V2:
		data, err := readFile(d.Path, "cpu.max")
		if err != nil {
			return 0, ignoreMissing(err) // absent in the root cgroup and without the cpu controller
		}
		quota, err := parseCPUMax(data)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, "cpu.max"), err)
		}
		return quota, nil
	}
	return 0, nil
}

// cpuSetSize returns the number of CPUs in the cgroup's cpuset, 0 if the
// cgroup has none.
func (g *Group) cpuSetSize() (int, error) {
	d := g.dirs.CPUSet
	name := "cpuset.cpus"
	switch d.Version {
	case V1:
	case V2:
		name = "cpuset.cpus.effective"
	default:
		return 0, nil
	}
	data, err := readFile(d.Path, name)
	if err != nil {
		return 0, ignoreMissing(err)
	}
	n, err := parseCPUList(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, name), err)
	}
	return n, nil
}

// cpuUsage returns the cgroup's cumulative CPU time: v1 cpuacct.usage
// (ns), v2 usage_usec of cpu.stat.
func (g *Group) cpuUsage() (time.Duration, error) {
	d := g.dirs.CPUAcct
	switch d.Version {
	case V1:
		data, err := readFile(d.Path, "cpuacct.usage")
		if err != nil {
			return 0, err
		}
		ns, err := parseUint(data)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, "cpuacct.usage"), err)
		}
		return time.Duration(ns), nil
	case V2:
		data, err := readFile(d.Path, "cpu.stat")
		if err != nil {
			return 0, err
		}
		us, ok, err := statValue(data, "usage_usec")
		if err == nil && !ok {
			err = errors.New("no usage_usec")
		}
		if err != nil {
			return 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, "cpu.stat"), err)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	return 0, errors.New("no cgroup accounts CPU time")
}

// unlimitedV1 is a v1 memory limit taken as "none": the kernel shows an
// unset limit as the largest page-aligned int64.
const unlimitedV1 = 1 << 62

// memory returns the cgroup's memory limit (capped at the host's memory)
// and its use less the inactive file cache, in bytes.
func (g *Group) memory() (limit, used uint64, err error) {
	d := g.dirs.Memory
	var usageFile, limitFile, inactiveKey string
	switch d.Version {
	case V1:
		usageFile, limitFile, inactiveKey = "memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file"
	case V2:
		usageFile, limitFile, inactiveKey = "memory.current", "memory.max", "inactive_file"
	default:
		return 0, 0, errors.New("no cgroup accounts memory")
	}
	data, err := readFile(d.Path, usageFile)
	if d.Version == V2 && errors.Is(err, fs.ErrNotExist) && g.isV2Root(d.Path) {
		return g.hostMemory()
	}
	if err != nil {
		return 0, 0, err
	}
	usage, err := parseUint(data)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, usageFile), err)
	}

	limit = g.memTotal
	data, err = readFile(d.Path, limitFile)
	if err != nil {
		return 0, 0, err
	}
	if s := strings.TrimSpace(data); s != "max" {
		n, err := parseUint(s)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, limitFile), err)
		}
		if n < unlimitedV1 {
			limit = min(limit, n)
		}
	}

	data, err = readFile(d.Path, "memory.stat")
	if err != nil {
		return 0, 0, err
	}
	inactive, ok, err := statValue(data, inactiveKey)
	if err == nil && !ok && d.Version == V1 {
		// Without hierarchical accounting only the local figure exists.
		inactive, ok, err = statValue(data, "inactive_file")
	}
	if err == nil && !ok {
		err = fmt.Errorf("no %s", inactiveKey)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", filepath.Join(d.Path, "memory.stat"), err)
	}
	if inactive < usage {
		used = usage - inactive
	}
	return limit, used, nil
}

// isV2Root reports whether dir is the root of a v2 hierarchy, which has
// neither memory.current nor cgroup.type: a process there is accounted to
// the whole machine.
func (g *Group) isV2Root(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.type"))
	return errors.Is(err, fs.ErrNotExist)
}

// hostMemory returns the machine's memory figures, those of the v2 root
// cgroup.
func (g *Group) hostMemory() (limit, used uint64, err error) {
	data, err := os.ReadFile(g.meminfo)
	if err != nil {
		return 0, 0, fmt.Errorf("read host memory: %w", err)
	}
	avail, ok, err := meminfoValue(string(data), "MemAvailable")
	if err == nil && !ok {
		err = errors.New("no MemAvailable")
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", g.meminfo, err)
	}
	if avail < g.memTotal {
		used = g.memTotal - avail
	}
	return g.memTotal, used, nil
}

// readFile returns the content of dir/name.
func readFile(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", err // *PathError names the file
	}
	return string(b), nil
}

// ignoreMissing drops a not-exist error: the file holds an optional limit.
func ignoreMissing(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
