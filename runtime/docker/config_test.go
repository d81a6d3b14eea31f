package docker

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/go-connections/nat"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// The container configuration the runtime sends to the engine, checked
// without an engine: golden files of a few representative requests
// (TestContainerConfigGolden), and named hardening checks run over many
// kinds of request (TestContainerConfigHardening). The tests against a
// real engine (TestHardening, TestGVisor, TestVolumes) check that the
// engine does what this configuration asks.

// configCreated is the creation time of every sandbox here, so that the
// golden files do not change with the clock.
var configCreated = time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)

const (
	configToken = "the-runtime-token"
	// configDataDir is the data directory of the test configurations: the
	// pins of host volumes are under it.
	configDataDir = "/var/lib/osb-unit"
)

// configFor is the runtime configuration of these tests, changed by mod,
// with the defaults filled in as New fills them. storage is the storage
// enforcement the runtime found ("" for none, storageWatch,
// storageEngine).

// execdTCP is execd's port as the engine names it.
var execdTCP = nat.Port(fmt.Sprintf("%d/tcp", api.ExecdPort))

func configFor(t *testing.T, storage string, mod func(*Config)) *Config {
	t.Helper()
	cfg := Config{DataDir: configDataDir, ExecdPath: "/usr/local/libexec/execd", LabelScope: "unit"}
	if mod != nil {
		mod(&cfg)
	}
	cfg.setDefaults()
	if err := cfg.validateNetwork(); err != nil {
		t.Fatal(err)
	}
	var st engineStorage
	switch storage {
	case "":
		return &cfg
	case storageWatch:
		st = engineStorage{Driver: "overlay2", BackingFS: "extfs", LogDriver: "json-file",
			RuntimeArgs: map[string][]string{"runsc": {"--oci-seccomp"}}}
	case storageEngine:
		st = engineStorage{Driver: "overlay2", BackingFS: "xfs", LogDriver: "json-file"}
	default:
		t.Fatalf("storage enforcement %q", storage)
	}
	p, err := storagePolicyFor(st, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.mode() != storage {
		t.Fatalf("storage policy of %+v: %s, want %s", st, p.mode(), storage)
	}
	cfg.storage = p
	return &cfg
}

// configCase is one request to the runtime: its configuration and the
// sandbox asked for.
type configCase struct {
	name    string
	storage string        // enforcement of storage limits, as configFor
	cfg     func(*Config) // changes to the test configuration
	spec    sandbox.Spec
	pool    string // the pool a warm container is started for
}

// built is a configCase's container configuration.
type built struct {
	c        *configCase
	cfg      *Config
	cc       *container.Config
	hc       *container.HostConfig
	platform *ocispec.Platform
}

func (c *configCase) build(t *testing.T) built {
	t.Helper()
	cfg := configFor(t, c.storage, c.cfg)
	spec := c.spec
	if spec.Image == "" {
		spec.Image = "opensandbox/python:3.11"
	}
	cc, hc, platform, err := containerConfig(cfg, "sbx-1", &spec, configCreated, configToken, c.pool)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return built{c: c, cfg: cfg, cc: cc, hc: hc, platform: platform}
}

var configExpiry = time.Date(2030, 1, 3, 0, 0, 0, 0, time.UTC)

// configCases are the kinds of request the hardening checks run over; the
// golden files hold those in goldenCases.
var configCases = []configCase{
	{name: "minimal", spec: sandbox.Spec{Entrypoint: []string{"sleep", "infinity"}}},
	{name: "no-entrypoint", spec: sandbox.Spec{}},
	{name: "everything", cfg: func(c *Config) { c.DNS = []string{"10.0.0.2", "fd00::53"} }, spec: sandbox.Spec{
		Entrypoint: []string{"python3", "-m", "http.server", "8080"},
		Env:        map[string]string{"B": "2", "A": "1", envExecdToken: "smuggled"},
		Metadata:   map[string]string{"team": "agents"},
		Extensions: map[string]string{extRuntime: "runsc", "opensandbox.extensions.note": "kept"},
		Resources:  sandbox.Resources{CPUMillis: 1500, MemoryBytes: 512 << 20, Pids: 256, GPUs: "1"},
		Volumes: []sandbox.Volume{
			{Name: "src", MountPath: "/src", HostPath: "/srv/src", ReadOnly: true},
			{Name: "cache", MountPath: "/cache", Claim: &sandbox.Claim{Name: "osb-cache"}},
			{Name: "work", MountPath: "/work", SubPath: "a/b", Claim: &sandbox.Claim{Name: "osb-work"}},
		},
		Platform:     &sandbox.Platform{OS: "linux", Arch: "arm64"},
		SecureAccess: true,
		ExpiresAt:    &configExpiry,
	}},
	{name: "secure-access", spec: sandbox.Spec{Entrypoint: []string{"x"}, SecureAccess: true}},
	{name: "network-policy", spec: sandbox.Spec{Entrypoint: []string{"x"}, NetworkPolicy: []byte(`{"defaultAction":"deny","egress":[]}`)}},
	{name: "smuggled-token", spec: sandbox.Spec{Entrypoint: []string{"x"}, Env: map[string]string{envExecdToken: "smuggled", "PATH": "/bin"}}},
	{name: "limits", spec: sandbox.Spec{Entrypoint: []string{"x"}, Resources: sandbox.Resources{CPUMillis: 250, MemoryBytes: 64 << 20, Pids: 100}}},
	{name: "limits-default", cfg: func(c *Config) { c.DefaultCPU, c.DefaultMemory = "2", "1Gi" }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "limits-default-overridden", cfg: func(c *Config) { c.DefaultCPU, c.DefaultMemory = "2", "1Gi" },
		spec: sandbox.Spec{Entrypoint: []string{"x"}, Resources: sandbox.Resources{CPUMillis: 500, MemoryBytes: 128 << 20}}},
	{name: "pids-unlimited", cfg: func(c *Config) { c.PidsLimit = -1 }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "gpus-all", spec: sandbox.Spec{Entrypoint: []string{"x"}, Resources: sandbox.Resources{GPUs: "all"}}},
	{name: "gvisor-configured", cfg: func(c *Config) { c.Runtime = "runsc" }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "gvisor-requested", spec: sandbox.Spec{Entrypoint: []string{"x"}, Extensions: map[string]string{extRuntime: "runsc"}}},
	{name: "runc-requested-over-gvisor", cfg: func(c *Config) { c.Runtime = "runsc" },
		spec: sandbox.Spec{Entrypoint: []string{"x"}, Extensions: map[string]string{extRuntime: "runc"}}},
	{name: "host-volume", spec: sandbox.Spec{Entrypoint: []string{"x"},
		Volumes: []sandbox.Volume{{Name: "data", MountPath: "/data", HostPath: "/srv/data"}}}},
	{name: "host-volume-read-only", spec: sandbox.Spec{Entrypoint: []string{"x"},
		Volumes: []sandbox.Volume{{Name: "data", MountPath: "/data", HostPath: "/srv/data", SubPath: "x", ReadOnly: true}}}},
	{name: "named-volumes", spec: sandbox.Spec{Entrypoint: []string{"x"}, Volumes: []sandbox.Volume{
		{Name: "a", MountPath: "/a", Claim: &sandbox.Claim{Name: "osb-a", CreateIfNotExists: true, DeleteOnTermination: true}},
		{Name: "b", MountPath: "/b", ReadOnly: true, Claim: &sandbox.Claim{Name: "osb-b"}},
	}}},
	{name: "named-volume-sub-paths", spec: sandbox.Spec{Entrypoint: []string{"x"}, Volumes: []sandbox.Volume{
		{Name: "one", MountPath: "/one", SubPath: "1", Claim: &sandbox.Claim{Name: "osb-shared"}},
		{Name: "two", MountPath: "/two", SubPath: "2", Claim: &sandbox.Claim{Name: "osb-shared"}},
		{Name: "ro", MountPath: "/ro", SubPath: "3", ReadOnly: true, Claim: &sandbox.Claim{Name: "osb-other"}},
	}}},
	{name: "pooled", spec: sandbox.Spec{Entrypoint: []string{"python3", "app.py"}, Resources: sandbox.Resources{MemoryBytes: 256 << 20}}, pool: "warm-python"},
	{name: "pooled-secure-access", spec: sandbox.Spec{SecureAccess: true}, pool: "warm"},
	{name: "network-custom", cfg: func(c *Config) { c.Network = "corp-net"; c.BindIP = "0.0.0.0" }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "network-bind-ip", cfg: func(c *Config) { c.BindIP = "10.1.2.3" }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "network-dns", cfg: func(c *Config) { c.DNS = []string{"192.0.2.53"} }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "capabilities-configured", cfg: func(c *Config) { c.CapAdd = []string{"CHOWN", "SETUID", "SETGID"} }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "snapshot-restore", spec: sandbox.Spec{Image: "opensandbox/snapshot:snap-1", SnapshotID: "snap-1", Entrypoint: []string{"x"}}},
	{name: "storage-watch", storage: storageWatch, spec: sandbox.Spec{Entrypoint: []string{"x"}, Resources: sandbox.Resources{StorageBytes: 1 << 30}}},
	{name: "storage-watch-no-entrypoint", storage: storageWatch, spec: sandbox.Spec{Resources: sandbox.Resources{StorageBytes: 1 << 30}}},
	{name: "storage-watch-default", storage: storageWatch, cfg: func(c *Config) { c.DefaultStorage = "10Gi" }, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
	{name: "storage-watch-gvisor", storage: storageWatch, spec: sandbox.Spec{Entrypoint: []string{"x"},
		Resources: sandbox.Resources{StorageBytes: 1 << 30}, Extensions: map[string]string{extRuntime: "runsc"}}},
	{name: "storage-engine", storage: storageEngine, spec: sandbox.Spec{Entrypoint: []string{"x"}, Resources: sandbox.Resources{StorageBytes: 2 << 30},
		Volumes: []sandbox.Volume{{Name: "w", MountPath: "/w", SubPath: "s", Claim: &sandbox.Claim{Name: "osb-w"}}}}},
	{name: "storage-policy-without-limit", storage: storageWatch, spec: sandbox.Spec{Entrypoint: []string{"x"}}},
}

// goldenCases are the requests whose whole configuration is kept in
// testdata/containerconfig/NAME.json.
var goldenCases = []string{"minimal", "everything", "pooled", "storage-watch", "storage-engine", "network-custom", "network-policy"}

// TestContainerConfigGolden compares the configuration of representative
// requests with testdata/containerconfig: every field the engine gets,
// so a change to any of them shows in review. go test -run
// TestContainerConfigGolden -update rewrites the files.
func TestContainerConfigGolden(t *testing.T) {
	for _, name := range goldenCases {
		t.Run(name, func(t *testing.T) {
			i := slices.IndexFunc(configCases, func(c configCase) bool { return c.name == name })
			if i < 0 {
				t.Fatalf("no case %s", name)
			}
			b := configCases[i].build(t)
			got := goldenJSON(t, b)
			golden := filepath.Join("testdata", "containerconfig", name+".json")
			if *updateGolden {
				os.MkdirAll(filepath.Dir(golden), 0o755)
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("configuration differs from %s (go test -run TestContainerConfigGolden -update rewrites it):\n%s", golden, got)
			}
		})
	}
}

// goldenJSON is the configuration as the golden files hold it: the
// engine's JSON, with the seccomp profile of a storage-limited sandbox
// (moby's default profile, tens of kilobytes that change with the moby
// module; TestWatchedSeccompProfile checks it) shown by name.
func goldenJSON(t *testing.T, b built) []byte {
	t.Helper()
	hc := *b.hc
	hc.SecurityOpt = slices.Clone(hc.SecurityOpt)
	for i, o := range hc.SecurityOpt {
		if o == "seccomp="+b.cfg.storage.seccompProfileOrEmpty() {
			hc.SecurityOpt[i] = "seccomp=<watchedSeccompProfile>"
		}
	}
	out, err := json.MarshalIndent(struct {
		Config     *container.Config
		HostConfig *container.HostConfig
		Platform   *ocispec.Platform
	}{b.cc, &hc, b.platform}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// seccompProfileOrEmpty is the watched profile, "" without a policy.
func (p *storagePolicy) seccompProfileOrEmpty() string {
	if p == nil {
		return ""
	}
	return p.seccompProfile
}

// hardeningCheck is one property every sandbox's container must have.
// check returns what is wrong, "" when nothing is.
type hardeningCheck struct {
	name  string
	check func(b built) string
}

// dangerousCaps are capabilities no sandbox gets by default: each lets
// root in the sandbox reach past it (modules, mounts, raw packets, the
// audit log, devices, other processes' memory, file capabilities).
var dangerousCaps = []string{"SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "SYS_RAWIO", "SYS_BOOT", "SYS_TIME", "SYS_RESOURCE",
	"NET_ADMIN", "NET_RAW", "MKNOD", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "DAC_READ_SEARCH", "LINUX_IMMUTABLE",
	"MAC_ADMIN", "MAC_OVERRIDE", "SYSLOG", "BPF", "PERFMON", "CHECKPOINT_RESTORE", "IPC_LOCK", "WAKE_ALARM", "BLOCK_SUSPEND", "LEASE"}

// everyLabel is every label the runtime writes on a sandbox's container:
// each is written even when empty, so that a container made from a
// snapshot image never inherits the labels of the snapshot's sandbox.
var everyLabel = []string{labelScope, labelID, labelCreated, labelImage, labelSnapshot, labelEntrypoint, labelMetadata,
	labelExtensions, labelExpires, labelSecure, labelPlatform, labelStorage, labelHeld, labelSubPathVolumes}

var hardeningChecks = []hardeningCheck{
	{"capabilities-all-dropped", func(b built) string {
		if !slices.Equal(b.hc.CapDrop, []string{"ALL"}) {
			return fmt.Sprintf("CapDrop %q, want [ALL]", b.hc.CapDrop)
		}
		return ""
	}},
	{"capabilities-only-configured", func(b built) string {
		if !slices.Equal(b.hc.CapAdd, b.cfg.CapAdd) {
			return fmt.Sprintf("CapAdd %q, want the configured %q", b.hc.CapAdd, b.cfg.CapAdd)
		}
		return ""
	}},
	{"capabilities-none-dangerous", func(b built) string {
		for _, c := range b.hc.CapAdd {
			if slices.Contains(dangerousCaps, strings.TrimPrefix(strings.ToUpper(c), "CAP_")) || strings.EqualFold(c, "ALL") {
				return "CapAdd has " + c
			}
		}
		return ""
	}},
	{"no-new-privileges", func(b built) string {
		if !slices.Contains(b.hc.SecurityOpt, "no-new-privileges:true") {
			return fmt.Sprintf("SecurityOpt %.200q lacks no-new-privileges:true", b.hc.SecurityOpt)
		}
		return ""
	}},
	{"confinement-kept", func(b built) string {
		// seccomp, AppArmor and SELinux stay on: the engine's defaults,
		// or a profile of the runtime's own.
		for _, o := range b.hc.SecurityOpt {
			k, v := o, ""
			if i := strings.IndexAny(o, "=:"); i >= 0 {
				k, v = o[:i], o[i+1:]
			}
			switch {
			case v == "unconfined" || (k == "label" && v == "disable") || (k == "systempaths" && v == "unconfined"):
				return "SecurityOpt " + o
			case k == "seccomp" && v != b.cfg.storage.seccompProfileOrEmpty():
				return fmt.Sprintf("a seccomp profile not the runtime's: %.100s", o)
			}
		}
		if b.hc.MaskedPaths != nil || b.hc.ReadonlyPaths != nil {
			return fmt.Sprintf("masked paths %q, read-only paths %q: want the engine's defaults (nil)", b.hc.MaskedPaths, b.hc.ReadonlyPaths)
		}
		return ""
	}},
	{"seccomp-when-storage-limited", func(b built) string {
		limited := b.cc.Labels[labelStorage] != ""
		has := slices.ContainsFunc(b.hc.SecurityOpt, func(o string) bool { return strings.HasPrefix(o, "seccomp=") })
		switch {
		case limited && (!has || !slices.Contains(b.hc.SecurityOpt, "seccomp="+b.cfg.storage.seccompProfile)):
			return "storage-limited without the profile that refuses fallocate"
		case !limited && has:
			return "a seccomp profile without a storage limit"
		}
		return ""
	}},
	{"not-privileged", func(b built) string {
		if b.hc.Privileged || b.hc.PublishAllPorts || b.hc.OomKillDisable != nil && *b.hc.OomKillDisable {
			return fmt.Sprintf("privileged %v, publish all %v, OOM killer off %v", b.hc.Privileged, b.hc.PublishAllPorts, b.hc.OomKillDisable)
		}
		return ""
	}},
	{"no-host-namespaces", func(b built) string {
		hc := b.hc
		for what, mode := range map[string]string{"network": string(hc.NetworkMode), "pid": string(hc.PidMode), "ipc": string(hc.IpcMode),
			"uts": string(hc.UTSMode), "user": string(hc.UsernsMode), "cgroup": string(hc.CgroupnsMode)} {
			if what == "network" && hasEgress(&b.c.spec) && mode == "container:"+egressName("sbx-1") {
				continue // its own egress container's, and only that
			}
			if mode == "host" || strings.HasPrefix(mode, "container:") {
				return what + " namespace " + mode
			}
		}
		if hc.CgroupParent != "" || hc.Cgroup != "" {
			return fmt.Sprintf("cgroup parent %q, cgroup %q", hc.CgroupParent, hc.Cgroup)
		}
		return ""
	}},
	{"no-devices-or-sysctls", func(b built) string {
		hc := b.hc
		if len(hc.Devices) > 0 || len(hc.DeviceCgroupRules) > 0 || len(hc.Sysctls) > 0 || len(hc.GroupAdd) > 0 {
			return fmt.Sprintf("devices %v, device rules %v, sysctls %v, groups %v", hc.Devices, hc.DeviceCgroupRules, hc.Sysctls, hc.GroupAdd)
		}
		gpus := b.c.spec.Resources.GPUs
		if (gpus == "") != (len(hc.DeviceRequests) == 0) {
			return fmt.Sprintf("device requests %+v for GPUs %q", hc.DeviceRequests, gpus)
		}
		return ""
	}},
	{"on-the-runtime-network", func(b built) string {
		if hasEgress(&b.c.spec) {
			// It joins its egress container, which is on the network.
			if string(b.hc.NetworkMode) != "container:"+egressName("sbx-1") || len(b.hc.DNS) > 0 || len(b.hc.Links) > 0 || len(b.hc.ExtraHosts) > 0 {
				return fmt.Sprintf("network %q, dns %v, links %v, extra hosts %v: want its egress container's namespace alone", b.hc.NetworkMode, b.hc.DNS, b.hc.Links, b.hc.ExtraHosts)
			}
			return ""
		}
		if string(b.hc.NetworkMode) != b.cfg.Network {
			return fmt.Sprintf("network %q, want %q", b.hc.NetworkMode, b.cfg.Network)
		}
		if len(b.hc.Links) > 0 || len(b.hc.ExtraHosts) > 0 || len(b.hc.VolumesFrom) > 0 {
			return fmt.Sprintf("links %v, extra hosts %v, volumes from %v", b.hc.Links, b.hc.ExtraHosts, b.hc.VolumesFrom)
		}
		if !slices.Equal(b.hc.DNS, b.cfg.DNS) || len(b.hc.DNSOptions) > 0 || len(b.hc.DNSSearch) > 0 {
			return fmt.Sprintf("dns %v (options %v, search %v), want the configured %v", b.hc.DNS, b.hc.DNSOptions, b.hc.DNSSearch, b.cfg.DNS)
		}
		return ""
	}},
	{"ports-on-bind-ip-only", func(b built) string {
		want := []nat.Port{nat.Port(strconv.Itoa(api.ExecdPort) + "/tcp")}
		if !b.c.spec.SecureAccess {
			want = append(want, "8080/tcp") // with secure access every port goes through execd
		}
		if hasEgress(&b.c.spec) {
			want = nil // published from its egress container
		}
		var got []nat.Port
		for p, bindings := range b.hc.PortBindings {
			got = append(got, p)
			for _, pb := range bindings {
				if pb.HostIP != b.cfg.BindIP || pb.HostPort != "" {
					return fmt.Sprintf("port %s published on %q:%q, want %s and a port the engine picks", p, pb.HostIP, pb.HostPort, b.cfg.BindIP)
				}
			}
			if _, ok := b.cc.ExposedPorts[p]; !ok {
				return fmt.Sprintf("port %s published, not exposed", p)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) || len(b.cc.ExposedPorts) != len(want) {
			return fmt.Sprintf("published %v, exposed %v, want %v", got, b.cc.ExposedPorts, want)
		}
		return ""
	}},
	{"pids-limit", func(b built) string {
		want := b.c.spec.Resources.Pids
		if want == 0 {
			want = b.cfg.PidsLimit
		}
		switch got := b.hc.PidsLimit; {
		case want < 0 && got != nil:
			return fmt.Sprintf("pids limit %d, want none", *got)
		case want > 0 && (got == nil || *got != want):
			return fmt.Sprintf("pids limit %v, want %d", got, want)
		}
		return ""
	}},
	{"memory-limit-without-swap", func(b built) string {
		want := b.c.spec.Resources.MemoryBytes
		if want == 0 && b.cfg.DefaultMemory != "" {
			want, _ = sandbox.ParseMemory(b.cfg.DefaultMemory)
		}
		if b.hc.Memory != want || b.hc.MemorySwap != want || b.hc.MemoryReservation != 0 || b.hc.MemorySwappiness != nil {
			return fmt.Sprintf("memory %d, swap %d (reservation %d, swappiness %v), want %d and no swap beyond it",
				b.hc.Memory, b.hc.MemorySwap, b.hc.MemoryReservation, b.hc.MemorySwappiness, want)
		}
		return ""
	}},
	{"cpu-limit", func(b built) string {
		want := b.c.spec.Resources.CPUMillis
		if want == 0 && b.cfg.DefaultCPU != "" {
			want, _ = sandbox.ParseCPU(b.cfg.DefaultCPU)
		}
		if b.hc.NanoCPUs != want*1_000_000 || b.hc.CPUShares != 0 || b.hc.CPUQuota != 0 || b.hc.CpusetCpus != "" {
			return fmt.Sprintf("NanoCPUs %d (shares %d, quota %d, cpuset %q), want %d", b.hc.NanoCPUs, b.hc.CPUShares, b.hc.CPUQuota, b.hc.CpusetCpus, want*1_000_000)
		}
		return ""
	}},
	{"oci-runtime-allowed", func(b built) string {
		want := b.cfg.Runtime
		if r, ok := b.c.spec.Extensions[extRuntime]; ok {
			want = r
		}
		if want == "runc" {
			want = ""
		}
		if b.hc.Runtime != want || (b.hc.Runtime != "" && !slices.Contains(b.cfg.AllowedRuntimes, b.hc.Runtime)) {
			return fmt.Sprintf("runtime %q, want %q (allowed %v)", b.hc.Runtime, want, b.cfg.AllowedRuntimes)
		}
		return ""
	}},
	{"execd-mounted-read-only", func(b built) string {
		if len(b.hc.Mounts) == 0 {
			return "no mounts"
		}
		want := mount.Mount{Type: mount.TypeBind, Source: b.cfg.ExecdPath, Target: execdInSandbox, ReadOnly: true}
		if m := b.hc.Mounts[0]; m.Type != want.Type || m.Source != want.Source || m.Target != want.Target || !m.ReadOnly || m.BindOptions != nil {
			return fmt.Sprintf("first mount %+v, want %+v", m, want)
		}
		if !slices.Equal(b.cc.Entrypoint, []string{execdInSandbox}) {
			return fmt.Sprintf("entrypoint %q, want execd", b.cc.Entrypoint)
		}
		return ""
	}},
	{"volumes-as-asked", func(b built) string {
		vols := b.c.spec.Volumes
		if len(b.hc.Mounts) != 1+len(vols) || len(b.hc.Binds) > 0 || len(b.hc.Tmpfs) > 0 || len(b.cc.Volumes) > 0 {
			return fmt.Sprintf("%d mounts, binds %v, tmpfs %v, anonymous volumes %v for %d volumes", len(b.hc.Mounts), b.hc.Binds, b.hc.Tmpfs, b.cc.Volumes, len(vols))
		}
		for i, v := range vols {
			m := b.hc.Mounts[1+i]
			if m.Target != v.MountPath || m.ReadOnly != v.ReadOnly {
				return fmt.Sprintf("volume %s mounted %+v", v.Name, m)
			}
			if m.VolumeOptions != nil || m.TmpfsOptions != nil || m.Consistency != "" {
				return fmt.Sprintf("volume %s with options %+v", v.Name, m)
			}
			if !pinned(&v) {
				if m.Type != mount.TypeVolume || m.Source != v.Claim.Name || m.BindOptions != nil {
					return fmt.Sprintf("named volume %s mounted %+v", v.Name, m)
				}
				continue
			}
			// A host path, or a named volume's sub path, is a bind of its
			// pin, never of the path the request named, and stays private
			// to the sandbox (no mount propagation either way).
			pin := filepath.Join(configDataDir, "mounts", "sbx-1", strconv.Itoa(i)+"-"+v.Name)
			if m.Type != mount.TypeBind || m.Source != pin {
				return fmt.Sprintf("volume %s mounted %+v, want a bind of its pin %s", v.Name, m, pin)
			}
			if o := m.BindOptions; o == nil || o.Propagation != "" || o.CreateMountpoint || o.NonRecursive || o.ReadOnlyNonRecursive || o.ReadOnlyForceRecursive {
				return fmt.Sprintf("volume %s bind options %+v, want the defaults (rprivate), no created mount point", v.Name, o)
			}
		}
		for _, m := range b.hc.Mounts {
			if strings.HasSuffix(m.Source, ".sock") || m.Source == "/" || strings.HasPrefix(m.Source, "/var/run") || strings.HasPrefix(m.Source, "/run") || strings.HasPrefix(m.Source, "/proc") {
				return "mounts the host's " + m.Source
			}
		}
		return ""
	}},
	{"labels-all-written", func(b built) string {
		for _, k := range everyLabel {
			if _, ok := b.cc.Labels[k]; !ok {
				return "no label " + k
			}
		}
		l := b.cc.Labels
		if l[labelScope] != b.cfg.LabelScope || l[labelID] != "sbx-1" || l[labelCreated] != configCreated.Format(time.RFC3339Nano) || l[labelSecure] != strconv.FormatBool(b.c.spec.SecureAccess) {
			return fmt.Sprintf("labels %v", l)
		}
		if _, pooled := l[labelPool]; pooled != (b.c.pool != "") || l[labelPool] != b.c.pool {
			return fmt.Sprintf("pool label %q, want %q", l[labelPool], b.c.pool)
		}
		if _, joined := l[labelEgress]; joined != hasEgress(&b.c.spec) || (joined && l[labelEgress] != egressName("sbx-1")) {
			return fmt.Sprintf("egress label %q", l[labelEgress])
		}
		for k := range l {
			if !slices.Contains(everyLabel, k) && k != labelPool && k != labelEgress {
				return "unknown label " + k
			}
		}
		return ""
	}},
	{"token-from-the-runtime-only", func(b built) string {
		var tokens []string
		for _, e := range b.cc.Env {
			if k, v, _ := strings.Cut(e, "="); k == envExecdToken {
				tokens = append(tokens, v)
			}
		}
		if !slices.Equal(tokens, []string{configToken}) {
			return fmt.Sprintf("%s values %q, want only the runtime's", envExecdToken, tokens)
		}
		want := len(b.c.spec.Env) + 1
		if _, smuggled := b.c.spec.Env[envExecdToken]; smuggled {
			want--
		}
		if len(b.cc.Env) != want {
			return fmt.Sprintf("env %q for a request's %v", b.cc.Env, b.c.spec.Env)
		}
		return ""
	}},
	{"command-started-by-execd", func(b built) string {
		want, held := append([]string{"--"}, b.c.spec.Entrypoint...), ""
		switch {
		case b.c.pool != "":
			want = []string{"--claimable", "--"} // a claim brings the entrypoint
		case b.cc.Labels[labelStorage] != "" && len(b.c.spec.Entrypoint) > 0 && b.cfg.storage.mode() == storageWatch:
			// Held until the disk watcher measures the container, then
			// handed over through /claim (held.go).
			want, held = []string{"--claimable", "--"}, "true"
		}
		if !slices.Equal(b.cc.Cmd, want) || b.cc.User != "" || b.cc.WorkingDir != "" {
			return fmt.Sprintf("cmd %q (user %q, dir %q), want %q as the image's user", b.cc.Cmd, b.cc.User, b.cc.WorkingDir, want)
		}
		if b.cc.Labels[labelHeld] != held {
			return fmt.Sprintf("held label %q, want %q", b.cc.Labels[labelHeld], held)
		}
		return ""
	}},
	{"engine-keeps-no-restart", func(b built) string {
		// The runtime decides what a stopped sandbox becomes; the engine
		// neither restarts nor removes its container.
		if b.hc.RestartPolicy.Name != "" || b.hc.AutoRemove {
			return fmt.Sprintf("restart policy %q, auto remove %v", b.hc.RestartPolicy.Name, b.hc.AutoRemove)
		}
		return ""
	}},
	{"storage-limit", func(b built) string {
		want := b.c.spec.Resources.StorageBytes
		if want == 0 && b.cfg.DefaultStorage != "" {
			want, _ = sandbox.ParseStorage(b.cfg.DefaultStorage)
		}
		label := ""
		if want > 0 {
			label = strconv.FormatInt(want, 10)
		}
		if b.cc.Labels[labelStorage] != label {
			return fmt.Sprintf("storage label %q, want %q", b.cc.Labels[labelStorage], label)
		}
		quota := want > 0 && b.cfg.storage.mode() == storageEngine
		if size, ok := b.hc.StorageOpt["size"]; ok != quota || (quota && size != label) || len(b.hc.StorageOpt) > 1 {
			return fmt.Sprintf("storage options %v with limit %d in mode %s", b.hc.StorageOpt, want, b.cfg.storage.mode())
		}
		capped := want > 0 && b.cfg.storage.logDriver == "json-file"
		if got := b.hc.LogConfig; capped != (got.Type != "") || capped && (got.Config["max-size"] != logMaxSize || got.Config["max-file"] != logFiles) {
			return fmt.Sprintf("log config %+v with limit %d", got, want)
		}
		return ""
	}},
}

// TestContainerConfigHardening runs every hardening check over every
// kind of request.
func TestContainerConfigHardening(t *testing.T) {
	for _, c := range configCases {
		b := c.build(t)
		for _, h := range hardeningChecks {
			t.Run(c.name+"/"+h.name, func(t *testing.T) {
				if msg := h.check(b); msg != "" {
					t.Error(msg)
				}
			})
		}
	}
}

// TestContainerConfigHardeningCanFail: each check finds the configuration
// of one request spoiled in the way the check guards against, so that a
// check that cannot fail shows.
func TestContainerConfigHardeningCanFail(t *testing.T) {
	spoil := map[string]func(b *built){
		"capabilities-all-dropped":     func(b *built) { b.hc.CapDrop = nil },
		"capabilities-only-configured": func(b *built) { b.hc.CapAdd = append(b.hc.CapAdd, "SYS_PTRACE") },
		"capabilities-none-dangerous":  func(b *built) { b.hc.CapAdd = append(b.hc.CapAdd, "CAP_NET_RAW") },
		"no-new-privileges":            func(b *built) { b.hc.SecurityOpt = nil },
		"confinement-kept":             func(b *built) { b.hc.SecurityOpt = append(b.hc.SecurityOpt, "apparmor=unconfined") },
		"seccomp-when-storage-limited": func(b *built) { b.hc.SecurityOpt = append(b.hc.SecurityOpt, "seccomp=unconfined") },
		"not-privileged":               func(b *built) { b.hc.Privileged = true },
		"no-host-namespaces":           func(b *built) { b.hc.PidMode = "host" },
		"no-devices-or-sysctls":        func(b *built) { b.hc.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"} },
		"on-the-runtime-network":       func(b *built) { b.hc.NetworkMode = "host" },
		"ports-on-bind-ip-only":        func(b *built) { b.hc.PortBindings[execdTCP] = []nat.PortBinding{{HostIP: "0.0.0.0"}} },
		"pids-limit":                   func(b *built) { b.hc.PidsLimit = nil },
		"memory-limit-without-swap":    func(b *built) { b.hc.MemorySwap = -1 },
		"cpu-limit":                    func(b *built) { b.hc.NanoCPUs = 0 },
		"oci-runtime-allowed":          func(b *built) { b.hc.Runtime = "kata" },
		"execd-mounted-read-only":      func(b *built) { b.hc.Mounts[0].ReadOnly = false },
		"volumes-as-asked": func(b *built) {
			b.hc.Mounts = append(b.hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: "/var/run/docker.sock", Target: "/var/run/docker.sock"})
		},
		"labels-all-written":          func(b *built) { delete(b.cc.Labels, labelExpires) },
		"token-from-the-runtime-only": func(b *built) { b.cc.Env = append(b.cc.Env, envExecdToken+"=smuggled") },
		"command-started-by-execd":    func(b *built) { b.cc.User = "root" },
		"engine-keeps-no-restart":     func(b *built) { b.hc.RestartPolicy.Name = "always" },
		"storage-limit":               func(b *built) { b.hc.StorageOpt = map[string]string{"size": "1"} },
	}
	c := configCase{name: "limits", spec: sandbox.Spec{Entrypoint: []string{"x"}, Resources: sandbox.Resources{CPUMillis: 250, MemoryBytes: 64 << 20}}}
	for _, h := range hardeningChecks {
		b := c.build(t)
		if msg := h.check(b); msg != "" {
			t.Fatalf("%s fails before the configuration is spoiled: %s", h.name, msg)
		}
		s, ok := spoil[h.name]
		if !ok {
			t.Errorf("%s: no way to spoil a configuration for it here", h.name)
			continue
		}
		s(&b)
		if msg := h.check(b); msg == "" {
			t.Errorf("%s passed a spoiled configuration", h.name)
		}
	}
}

// TestContainerConfigRefuses: requests the runtime cannot honour safely
// are refused before any container exists.
func TestContainerConfigRefuses(t *testing.T) {
	for _, c := range []struct {
		name    string
		storage string
		cfg     func(*Config)
		spec    sandbox.Spec
		want    string
	}{
		{name: "runtime-not-allowed", spec: sandbox.Spec{Extensions: map[string]string{extRuntime: "kata"}}, want: "not allowed"},
		{name: "runtime-outside-a-narrowed-list", cfg: func(c *Config) { c.AllowedRuntimes = []string{"runc"} },
			spec: sandbox.Spec{Extensions: map[string]string{extRuntime: "runsc"}}, want: "not allowed"},
		{name: "memory-below-the-engine-minimum", spec: sandbox.Spec{Resources: sandbox.Resources{MemoryBytes: 1 << 20}}, want: "at least 6Mi"},
		{name: "gpu-count-zero", spec: sandbox.Spec{Resources: sandbox.Resources{GPUs: "0"}}, want: "want a count"},
		{name: "gpu-not-a-count", spec: sandbox.Spec{Resources: sandbox.Resources{GPUs: "some"}}, want: "want a count"},
		{name: "storage-limit-unenforceable", spec: sandbox.Spec{Resources: sandbox.Resources{StorageBytes: 1 << 30}}, want: "cannot enforce"},
		{name: "storage-limit-gvisor-without-seccomp", storage: storageEngine,
			spec: sandbox.Spec{Resources: sandbox.Resources{StorageBytes: 1 << 30}, Extensions: map[string]string{extRuntime: "runsc"}}, want: "--oci-seccomp"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := configFor(t, c.storage, c.cfg)
			spec := c.spec
			spec.Image = "img"
			_, _, _, err := containerConfig(cfg, "sbx-1", &spec, configCreated, configToken, "")
			if !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrInvalid saying %q", err, c.want)
			}
		})
	}
	// A host path that reached here without its pin is never bound
	// as it was written.
	v := sandbox.Volume{Name: "h", MountPath: "/h", HostPath: "/etc"}
	if _, err := volumeMount(&v, ""); err == nil {
		t.Fatal("a host path was mounted without its pin")
	}
}

// TestContainerConfigIsPure: the same request gives the same
// configuration, and building it changes nothing in the request or the
// runtime's configuration.
func TestContainerConfigIsPure(t *testing.T) {
	for _, c := range configCases {
		t.Run(c.name, func(t *testing.T) {
			before, _ := json.Marshal(c.spec)
			a, b := goldenJSON(t, c.build(t)), goldenJSON(t, c.build(t))
			if string(a) != string(b) {
				t.Fatalf("two builds differ:\n%s\n%s", a, b)
			}
			if after, _ := json.Marshal(c.spec); string(after) != string(before) {
				t.Fatalf("the request changed: %s, was %s", after, before)
			}
			bb := c.build(t)
			bb.hc.CapAdd[0] = "SYS_ADMIN"
			if len(bb.hc.DNS) > 0 {
				bb.hc.DNS[0] = "192.0.2.1"
			}
			if bb.cfg.CapAdd[0] == "SYS_ADMIN" || slices.Contains(bb.cfg.DNS, "192.0.2.1") {
				t.Fatal("the container's capabilities or DNS share memory with the runtime's configuration")
			}
		})
	}
}
