package cgroup

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the want.json files of testdata")

// golden is the expected outcome of opening and reading one fixture tree.
type golden struct {
	// Dirs maps a controller to "<version> <path>", the path relative to
	// the fixture tree.
	Dirs  map[string]string `json:"dirs,omitempty"`
	Stats *goldenStats      `json:"stats,omitempty"`
	// Error is the error of Open or Read, the fixture's path as $ROOT.
	Error string `json:"error,omitempty"`
}

type goldenStats struct {
	CPUs     float64 `json:"cpus"`
	CPUUsage string  `json:"cpu_usage"`
	MemLimit uint64  `json:"mem_limit_bytes"`
	MemUsed  uint64  `json:"mem_used_bytes"`
}

// TestGolden opens every fixture tree in testdata (a proc directory and
// the cgroup files its mountinfo names) and compares the resolved
// directories and the figures read, or the error, with want.json. Run with
// -update to rewrite the want.json files after checking the diff.
func TestGolden(t *testing.T) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "fuzz" {
			continue
		}
		n++
		t.Run(e.Name(), func(t *testing.T) {
			root, err := filepath.Abs(filepath.Join("testdata", e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			got := openFixture(root)
			gotJSON, err := json.MarshalIndent(got, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			gotJSON = append(gotJSON, '\n')
			wantFile := filepath.Join(root, "want.json")
			if *update {
				if err := os.WriteFile(wantFile, gotJSON, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(wantFile)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(gotJSON, want) {
				t.Errorf("Open+Read of %s:\ngot  %s\nwant %s", e.Name(), gotJSON, want)
			}
		})
	}
	if n < 10 {
		t.Fatalf("found %d fixture trees, want at least 10", n)
	}
}

func openFixture(root string) golden {
	var out golden
	fail := func(err error) golden {
		out.Error = strings.ReplaceAll(err.Error(), root, "$ROOT")
		return out
	}
	g, err := Open(Config{ProcDir: filepath.Join(root, "proc"), Root: root, NumCPU: 64})
	if err != nil {
		return fail(err)
	}
	d := g.Dirs()
	out.Dirs = map[string]string{}
	for name, dir := range map[string]Dir{"cpu": d.CPU, "cpuacct": d.CPUAcct, "cpuset": d.CPUSet, "memory": d.Memory} {
		out.Dirs[name] = strings.TrimSpace(dir.Version.String() + " " + strings.TrimPrefix(dir.Path, root))
	}
	st, err := g.Read()
	if err != nil {
		return fail(err)
	}
	out.Stats = &goldenStats{CPUs: st.CPUs, CPUUsage: st.CPUUsage.String(), MemLimit: st.MemLimit, MemUsed: st.MemUsed}
	return out
}

func TestResolve(t *testing.T) {
	const (
		v1Mounts = `32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`
		v2Mount = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"
	)
	v1 := func(p string) Dir { return Dir{Path: p, Version: V1} }
	v2 := func(p string) Dir { return Dir{Path: p, Version: V2} }
	cases := []struct {
		name      string
		cgroup    string
		mountinfo string
		root      string
		want      Dirs
	}{
		{
			name:      "v1 host deep",
			cgroup:    "4:memory:/user.slice/u/s.scope\n3:cpuset:/\n2:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/u/s.scope\n",
			mountinfo: v1Mounts,
			want: Dirs{
				CPU:     v1("/sys/fs/cgroup/cpu,cpuacct/user.slice"),
				CPUAcct: v1("/sys/fs/cgroup/cpu,cpuacct/user.slice"),
				CPUSet:  v1("/sys/fs/cgroup/cpuset"),
				Memory:  v1("/sys/fs/cgroup/memory/user.slice/u/s.scope"),
			},
		},
		{
			name:   "v1 container mount root",
			cgroup: "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n",
			mountinfo: "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n" +
				"33 31 0:30 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			want: Dirs{
				CPU:     v1("/sys/fs/cgroup/cpu,cpuacct"),
				CPUAcct: v1("/sys/fs/cgroup/cpu,cpuacct"),
				Memory:  v1("/sys/fs/cgroup/memory"),
			},
		},
		{
			name:   "v1 mount root is an ancestor",
			cgroup: "4:memory:/docker/abc/sub\n",
			mountinfo: "33 31 0:30 /docker /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n" +
				"34 31 0:30 /docker/abc/sub/deeper /elsewhere ro - cgroup cgroup rw,memory\n",
			want: Dirs{Memory: v1("/sys/fs/cgroup/memory/abc/sub")},
		},
		{
			name:      "v1 mount root is a sibling with a common prefix",
			cgroup:    "4:memory:/docker/abc\n",
			mountinfo: "33 31 0:30 /docker/ab /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
			want:      Dirs{},
		},
		{
			name:      "first matching mount wins",
			cgroup:    "4:memory:/a\n",
			mountinfo: "33 31 0:30 / /first rw - cgroup cgroup rw,memory\n34 31 0:30 / /second rw - cgroup cgroup rw,memory\n",
			want:      Dirs{Memory: v1("/first/a")},
		},
		{
			name:      "v1 controller without a mount is not looked up in v2",
			cgroup:    "4:memory:/a\n0::/a\n",
			mountinfo: v2Mount,
			want: Dirs{
				CPU:     v2("/sys/fs/cgroup/a"),
				CPUAcct: v2("/sys/fs/cgroup/a"),
				CPUSet:  v2("/sys/fs/cgroup/a"),
			},
		},
		{
			name:      "hybrid prefers v1",
			cgroup:    "4:memory:/m\n3:cpuset:/\n2:cpu,cpuacct:/\n0::/\n",
			mountinfo: v1Mounts + "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
			want: Dirs{
				CPU:     v1("/sys/fs/cgroup/cpu,cpuacct"),
				CPUAcct: v1("/sys/fs/cgroup/cpu,cpuacct"),
				CPUSet:  v1("/sys/fs/cgroup/cpuset"),
				Memory:  v1("/sys/fs/cgroup/memory/m"),
			},
		},
		{
			name:      "hybrid with only some controllers on v1",
			cgroup:    "0::/svc\n4:memory:/m\n",
			mountinfo: v1Mounts + "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
			want: Dirs{
				CPU:     v2("/sys/fs/cgroup/unified/svc"),
				CPUAcct: v2("/sys/fs/cgroup/unified/svc"),
				CPUSet:  v2("/sys/fs/cgroup/unified/svc"),
				Memory:  v1("/sys/fs/cgroup/memory/m"),
			},
		},
		{
			name:      "v2 namespace root",
			cgroup:    "0::/\n",
			mountinfo: v2Mount,
			want: Dirs{
				CPU: v2("/sys/fs/cgroup"), CPUAcct: v2("/sys/fs/cgroup"),
				CPUSet: v2("/sys/fs/cgroup"), Memory: v2("/sys/fs/cgroup"),
			},
		},
		{
			name:      "v2 mount root equals the cgroup",
			cgroup:    "0::/system.slice/docker-abc.scope\n",
			mountinfo: "30 23 0:26 /system.slice/docker-abc.scope /sys/fs/cgroup ro - cgroup2 cgroup rw\n",
			want: Dirs{
				CPU: v2("/sys/fs/cgroup"), CPUAcct: v2("/sys/fs/cgroup"),
				CPUSet: v2("/sys/fs/cgroup"), Memory: v2("/sys/fs/cgroup"),
			},
		},
		{
			name:      "v2 outside the namespace",
			cgroup:    "0::/../../init.scope\n",
			mountinfo: v2Mount,
			want:      Dirs{},
		},
		{
			name:      "v2 dot-dot inside the path",
			cgroup:    "0::/a/../../../etc\n",
			mountinfo: v2Mount,
			want:      Dirs{},
		},
		{
			name:      "no cgroup mounts",
			cgroup:    "0::/\n",
			mountinfo: "22 1 0:21 / /proc rw - proc proc rw\n",
			want:      Dirs{},
		},
		{
			name:      "escaped mount point and root prefix",
			cgroup:    "0::/a b\n",
			mountinfo: `30 23 0:26 / /my\040cgroups rw - cgroup2 cgroup2 rw` + "\n",
			root:      "/fixture",
			want: Dirs{
				CPU: v2("/fixture/my cgroups/a b"), CPUAcct: v2("/fixture/my cgroups/a b"),
				CPUSet: v2("/fixture/my cgroups/a b"), Memory: v2("/fixture/my cgroups/a b"),
			},
		},
		{
			name:      "name= hierarchies are not controllers",
			cgroup:    "1:name=systemd:/x\n",
			mountinfo: v1Mounts,
			want:      Dirs{},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ms, err := ParseMemberships(c.cgroup)
			if err != nil {
				t.Fatal(err)
			}
			mounts, err := ParseMountInfo(c.mountinfo)
			if err != nil {
				t.Fatal(err)
			}
			if got := Resolve(ms, mounts, c.root); got != c.want {
				t.Errorf("Resolve(%q, %q, %q)\n got  %+v\n want %+v", c.cgroup, c.mountinfo, c.root, got, c.want)
			}
		})
	}
}

func TestParseMemberships(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    []Membership
		wantErr bool
	}{
		{name: "empty", in: "", want: nil},
		{name: "v2 only", in: "0::/\n", want: []Membership{{HierarchyID: 0, Path: "/"}}},
		{
			name: "v1 lines",
			in:   "12:cpu,cpuacct:/docker/abc\n1:name=systemd:/init.scope\n",
			want: []Membership{
				{HierarchyID: 12, Controllers: []string{"cpu", "cpuacct"}, Path: "/docker/abc"},
				{HierarchyID: 1, Controllers: []string{"name=systemd"}, Path: "/init.scope"},
			},
		},
		{name: "colon in path", in: "0::/a:b:c", want: []Membership{{Path: "/a:b:c"}}},
		{name: "outside namespace", in: "0::/../..", want: []Membership{{Path: "/../.."}}},
		{name: "blank lines", in: "\n0::/\n\n", want: []Membership{{Path: "/"}}},
		{name: "no colons", in: "garbage\n", wantErr: true},
		{name: "one colon", in: "0:/\n", wantErr: true},
		{name: "bad id", in: "x:cpu:/\n", wantErr: true},
		{name: "negative id", in: "-1:cpu:/\n", wantErr: true},
		{name: "signed id", in: "+1:cpu:/\n", wantErr: true},
		{name: "relative path", in: "0::a\n", wantErr: true},
		{name: "empty path", in: "0::\n", wantErr: true},
		{name: "v2 with controllers", in: "0:cpu:/\n", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseMemberships(c.in)
			if (err != nil) != c.wantErr {
				t.Fatalf("ParseMemberships(%q) error %v, want error %v", c.in, err, c.wantErr)
			}
			if !c.wantErr && !reflect.DeepEqual(got, c.want) {
				t.Errorf("ParseMemberships(%q) = %+v, want %+v", c.in, got, c.want)
			}
		})
	}
}

func TestParseMountInfoLine(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    Mount
		wantErr bool
	}{
		{
			name: "v1 with optional fields",
			in:   "703 701 0:31 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:16 shared:3 - cgroup cgroup rw,cpu,cpuacct",
			want: Mount{Root: "/docker/abc", Point: "/sys/fs/cgroup/cpu,cpuacct", FSType: "cgroup", SuperOptions: []string{"rw", "cpu", "cpuacct"}},
		},
		{
			name: "v2 without optional fields",
			in:   "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate",
			want: Mount{Root: "/", Point: "/sys/fs/cgroup", FSType: "cgroup2", SuperOptions: []string{"rw", "nsdelegate"}},
		},
		{
			name: "escapes",
			in:   `30 23 0:26 /a\040b /c\011d\012e\134f rw - cgroup2 none rw`,
			want: Mount{Root: "/a b", Point: "/c\td\ne\\f", FSType: "cgroup2", SuperOptions: []string{"rw"}},
		},
		{
			name: "unescaped space in super options",
			in:   "30 23 0:26 / /x rw - fuse.sshfs host:/p rw,user_id=0 extra",
			want: Mount{Root: "/", Point: "/x", FSType: "fuse.sshfs", SuperOptions: []string{"rw", "user_id=0 extra"}},
		},
		{
			name: "empty mount source",
			in:   "30 23 0:26 / /x rw - tmpfs  rw",
			want: Mount{Root: "/", Point: "/x", FSType: "tmpfs", SuperOptions: []string{"rw"}},
		},
		{name: "no separator", in: "30 23 0:26 / /x rw cgroup2 cgroup2 rw", wantErr: true},
		{name: "separator too early", in: "30 23 0:26 / - rw cgroup2 cgroup2 rw", wantErr: true},
		{name: "too few fields after separator", in: "30 23 0:26 / /x rw - cgroup2 cgroup2", wantErr: true},
		{name: "relative root", in: "30 23 0:26 a /x rw - cgroup2 cgroup2 rw", wantErr: true},
		{name: "relative mount point", in: "30 23 0:26 / x rw - cgroup2 cgroup2 rw", wantErr: true},
		{name: "truncated escape", in: `30 23 0:26 / /x\04 rw - cgroup2 cgroup2 rw`, wantErr: true},
		{name: "non-octal escape", in: `30 23 0:26 / /x\09a rw - cgroup2 cgroup2 rw`, wantErr: true},
		{name: "escape above a byte", in: `30 23 0:26 / /x\777 rw - cgroup2 cgroup2 rw`, wantErr: true},
		{name: "double space", in: "30  23 0:26 / /x rw - cgroup2 cgroup2 rw", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseMountInfoLine(c.in)
			if (err != nil) != c.wantErr {
				t.Fatalf("ParseMountInfoLine(%q) error %v, want error %v", c.in, err, c.wantErr)
			}
			if !c.wantErr && !reflect.DeepEqual(got, c.want) {
				t.Errorf("ParseMountInfoLine(%q) = %+v, want %+v", c.in, got, c.want)
			}
		})
	}
}

func TestParseMountInfoKeepsCgroupMounts(t *testing.T) {
	data, err := os.ReadFile("testdata/v1-container/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts, err := ParseMountInfo(string(data))
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, m := range mounts {
		points = append(points, m.Point)
	}
	want := []string{"/sys/fs/cgroup/systemd", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpuset"}
	if !reflect.DeepEqual(points, want) {
		t.Errorf("mount points %q, want %q", points, want)
	}
	if _, err := ParseMountInfo("22 1 0:21 / /proc rw - proc proc rw\n23 1 0:22 relative /x rw - cgroup cgroup rw,memory\n"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("malformed cgroup line: error %v, want one naming line 2", err)
	}
	// Other file systems' lines are not read: nsfs roots are not paths,
	// and the host shows them while containers run.
	other := "94 27 0:4 net:[4026532184] /run/docker/netns/101207927fb1 rw - nsfs nsfs rw\n" +
		"35 25 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
	if mounts, err := ParseMountInfo(other); err != nil || len(mounts) != 1 {
		t.Errorf("mountinfo with nsfs and odd lines: %v, %v", mounts, err)
	}
}

func TestParseValues(t *testing.T) {
	t.Run("cpu.max", func(t *testing.T) {
		for _, c := range []struct {
			in      string
			want    float64
			wantErr bool
		}{
			{in: "max 100000\n", want: 0},
			{in: "50000 100000\n", want: 0.5},
			{in: "250000 100000", want: 2.5},
			{in: "max 0", wantErr: true},
			{in: "max", wantErr: true},
			{in: "abc 100000", wantErr: true},
			{in: "-1 100000", wantErr: true},
			{in: "1 2 3", wantErr: true},
		} {
			got, err := parseCPUMax(c.in)
			if (err != nil) != c.wantErr || got != c.want {
				t.Errorf("parseCPUMax(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.wantErr)
			}
		}
	})
	t.Run("cpu list", func(t *testing.T) {
		for _, c := range []struct {
			in      string
			want    int
			wantErr bool
		}{
			{in: "\n", want: 0},
			{in: "0\n", want: 1},
			{in: "0-3\n", want: 4},
			{in: "0-5,8,10-11", want: 9},
			{in: "3-1", wantErr: true},
			{in: "0-", wantErr: true},
			{in: "a", wantErr: true},
			{in: "0,,1", wantErr: true},
			{in: "0-4294967295", wantErr: true},
		} {
			got, err := parseCPUList(c.in)
			if (err != nil) != c.wantErr || got != c.want {
				t.Errorf("parseCPUList(%q) = %v, %v; want %v, error %v", c.in, got, err, c.want, c.wantErr)
			}
		}
	})
	t.Run("numbers", func(t *testing.T) {
		if v, err := parseInt("-1\n"); err != nil || v != -1 {
			t.Errorf("parseInt(-1) = %v, %v", v, err)
		}
		if v, err := parseUint("18446744073709551615\n"); err != nil || v != 1<<64-1 {
			t.Errorf("parseUint(max) = %v, %v", v, err)
		}
		for _, bad := range []string{"", "-", "1.5", "+1", "18446744073709551616", "0x10"} {
			if _, err := parseUint(bad); err == nil {
				t.Errorf("parseUint(%q) succeeded", bad)
			}
		}
	})
	t.Run("stat", func(t *testing.T) {
		data := "inactive_file_x 1\ninactive_file 42\ntotal_inactive_file 7\n"
		if v, ok, err := statValue(data, "inactive_file"); v != 42 || !ok || err != nil {
			t.Errorf("statValue(inactive_file) = %v, %v, %v", v, ok, err)
		}
		if _, ok, _ := statValue(data, "active_file"); ok {
			t.Errorf("statValue(active_file) found a key that is not there")
		}
		if _, _, err := statValue("usage_usec x\n", "usage_usec"); err == nil {
			t.Errorf("statValue of a bad number succeeded")
		}
	})
	t.Run("meminfo", func(t *testing.T) {
		data := "MemTotal:       24684084 kB\nMemAvailable:   100 kB\nHugePages_Total:       0\n"
		if v, ok, err := meminfoValue(data, "MemTotal"); v != 24684084*1024 || !ok || err != nil {
			t.Errorf("meminfoValue(MemTotal) = %v, %v, %v", v, ok, err)
		}
		if v, ok, err := meminfoValue(data, "HugePages_Total"); v != 0 || !ok || err != nil {
			t.Errorf("meminfoValue(HugePages_Total) = %v, %v, %v", v, ok, err)
		}
		if _, ok, _ := meminfoValue(data, "Mem"); ok {
			t.Errorf("meminfoValue matched a key prefix")
		}
		if _, _, err := meminfoValue("MemTotal: 99999999999999999999 kB\n", "MemTotal"); err == nil {
			t.Errorf("meminfoValue accepted an overflowing value")
		}
	})
}

// TestRealSystem reads the cgroup of this test process on the machine it
// runs on. The figures must be plausible: CPU time grows while the test
// burns CPU, and memory is in use.
func TestRealSystem(t *testing.T) {
	g, err := Open(Config{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	d := g.Dirs()
	t.Logf("dirs: %+v", d)
	for name, dir := range map[string]Dir{"cpuacct": d.CPUAcct, "memory": d.Memory} {
		if fi, err := os.Stat(dir.Path); err != nil || !fi.IsDir() {
			t.Errorf("%s dir %q: %v", name, dir.Path, err)
		}
	}
	// On a hybrid host the v1 controllers must win.
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := ParseMemberships(string(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.has("memory") && d.Memory.Version != V1 {
			t.Errorf("memory is bound to v1 hierarchy %d, but resolved %+v", m.HierarchyID, d.Memory)
		}
	}

	before, err := g.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	t.Logf("stats: %+v", before)
	if before.CPUs <= 0 || before.CPUs > float64(runtime.NumCPU()) {
		t.Errorf("CPUs = %v, want in (0, %d]", before.CPUs, runtime.NumCPU())
	}
	if before.MemUsed == 0 || before.MemUsed > before.MemLimit {
		t.Errorf("memory used %d, limit %d: want 0 < used <= limit", before.MemUsed, before.MemLimit)
	}

	const burn = 200 * time.Millisecond
	spin(burn)
	after, err := g.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	// The test spun one CPU for 200 ms; the cgroup must have accounted a
	// good part of it (other processes of the cgroup only add to it).
	if grew := after.CPUUsage - before.CPUUsage; grew < burn/2 {
		t.Errorf("CPU usage grew by %v while spinning for %v", grew, burn)
	}
}

// spin keeps one CPU busy for d.
func spin(d time.Duration) {
	x := 0
	for start := time.Now(); time.Since(start) < d; {
		for i := range 10000 {
			x += i
		}
	}
	runtime.KeepAlive(x)
}

func BenchmarkRead(b *testing.B) {
	g, err := Open(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Read(); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzParseMemberships(f *testing.F) {
	for _, s := range []string{
		"0::/\n",
		"12:cpu,cpuacct:/docker/abc\n1:name=systemd:/init.scope\n0::/x\n",
		"0::/../../init.scope",
		"4:memory:/a:b\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		ms, err := ParseMemberships(data)
		if err != nil {
			return
		}
		for _, m := range ms {
			if !strings.HasPrefix(m.Path, "/") || m.HierarchyID < 0 || (m.HierarchyID == 0 && len(m.Controllers) > 0) {
				t.Fatalf("ParseMemberships(%q) gave %+v", data, m)
			}
		}
		// Whatever was parsed must resolve without escaping the mount.
		mounts := []Mount{{Root: "/", Point: "/cg", FSType: "cgroup2"}}
		for _, d := range []Dir{Resolve(ms, mounts, "/r").CPU} {
			if d.Path != "" && d.Path != "/r/cg" && !strings.HasPrefix(d.Path, "/r/cg/") {
				t.Fatalf("Resolve(%q) escaped the mount: %q", data, d.Path)
			}
		}
	})
}

func FuzzParseMountInfoLine(f *testing.F) {
	for _, s := range []string{
		"703 701 0:31 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:16 - cgroup cgroup rw,cpu,cpuacct",
		"30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate",
		`30 23 0:26 /a\040b /c\011d rw - cgroup2 none rw`,
		"695 694 0:60 / / rw,relatime master:363 - overlay overlay rw,lowerdir=/a:/b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		m, err := ParseMountInfoLine(line)
		if err != nil {
			return
		}
		if !strings.HasPrefix(m.Root, "/") || !strings.HasPrefix(m.Point, "/") || m.FSType == "" {
			t.Fatalf("ParseMountInfoLine(%q) = %+v", line, m)
		}
		// A cgroup under the mount's root resolves below its mount point.
		cg := strings.TrimSuffix(m.Root, "/") + "/x"
		if rel, ok := relativeTo(m.Root, cg); ok && !strings.HasSuffix(rel, "/x") {
			t.Fatalf("relativeTo(%q, %q) = %q", m.Root, cg, rel)
		}
	})
}
