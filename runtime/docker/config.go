package docker

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// Config configures the Docker runtime. It is the [runtime.docker] table
// of the server's configuration file; docs/configuration.md documents
// every key.
type Config struct {
	// Host is the engine's address (unix:///var/run/docker.sock,
	// tcp://...). Default: DOCKER_HOST, else the local socket.
	Host string `toml:"host"`
	// DataDir holds the runtime's state database and the sandboxes' token
	// files. Default /var/lib/opensandbox/docker.
	DataDir string `toml:"data_dir"`
	// ExecdPath is the static execd binary mounted read-only into every
	// sandbox. Default: "execd" beside the server's own binary.
	ExecdPath string `toml:"execd_path"`
	// LabelScope tells this server's containers from others' on the same
	// engine. Default "default".
	LabelScope string `toml:"label_scope"`
	// BindIP is the host address sandbox ports are published on. Default
	// 127.0.0.1: ports are private to this machine.
	BindIP string `toml:"bind_ip"`
	// PublicHost is the host name or address put in endpoints. Default:
	// BindIP, or 127.0.0.1 when BindIP is 0.0.0.0.
	PublicHost string `toml:"public_host"`
	// Network is the Docker network sandboxes join. Default
	// "opensandbox": a bridge the runtime makes, on which sandboxes cannot
	// reach each other. Any other network is used as it is.
	Network string `toml:"network"`
	// Runtime is the OCI runtime of sandboxes ("" for the engine's
	// default, "runsc" for gVisor). A sandbox may ask for another with the
	// extension "docker.runtime".
	Runtime string `toml:"runtime"`
	// AllowedRuntimes lists the runtimes a sandbox may ask for. Default:
	// "runc" and "runsc".
	AllowedRuntimes []string `toml:"allowed_runtimes"`
	// PullPolicy is when images are pulled: "if-not-present" (default),
	// "always" or "never".
	PullPolicy string `toml:"pull_policy"`
	// StartTimeout is how long a sandbox may take from its container's
	// start until execd answers. Default 60 s.
	StartTimeout time.Duration `toml:"start_timeout"`
	// PullTimeout bounds one image pull. Default 10 minutes.
	PullTimeout time.Duration `toml:"pull_timeout"`
	// NamedVolumeAllowlist lists prefixes of existing named volumes that
	// sandboxes may mount. Volumes made by this server (its label scope)
	// are always allowed; any other volume on the engine is refused.
	NamedVolumeAllowlist []string `toml:"named_volume_allowlist"`
	// DefaultCPU and DefaultMemory apply when a request sets no limit
	// ("1", "500m"; "1Gi", "512Mi"). Empty: no limit.
	DefaultCPU    string `toml:"default_cpu"`
	DefaultMemory string `toml:"default_memory"`
	// DefaultStorage is the storage limit (resourceLimits
	// "ephemeral-storage") of a sandbox whose request sets none ("10Gi").
	// Empty: no limit. How limits are enforced: storage.go.
	DefaultStorage string `toml:"default_storage"`
	// PidsLimit bounds the processes of a sandbox. Default 4096; -1: none.
	PidsLimit int64 `toml:"pids_limit"`
	// CapAdd is the capability set of sandboxes, all others dropped.
	// Default: what root needs to install packages and run services
	// (see defaultCaps).
	CapAdd []string `toml:"capabilities"`
	// BlockMetadata makes cloud metadata addresses unreachable from
	// sandboxes, whatever BlockedCIDRs says. Default true.
	BlockMetadata *bool `toml:"block_metadata"`
	// BlockedCIDRs are the destinations sandboxes may not reach: ranges
	// or addresses, IPv4 or IPv6. Default (absent): the private, shared
	// and link-local ranges (sandbox.DefaultBlockedCIDRs); [] blocks none of
	// them. While anything is blocked, sandboxes cannot open connections
	// to the host itself either (see netguard.go).
	BlockedCIDRs []string `toml:"blocked_cidrs"`
	// AllowedCIDRs are holes in what is blocked, the host included: an
	// address or range, with ":PORT" for one port of it ("10.1.2.3:443",
	// "[fd00::1]:443"). Default none.
	AllowedCIDRs []string `toml:"allowed_cidrs"`
	// DNS are the name servers sandboxes' queries are forwarded to
	// (Docker's --dns). Default: the engine's, from the host's
	// resolv.conf. The guard lets sandboxes reach them on port 53.
	DNS []string `toml:"dns"`

	// Egress is how sandboxes with a network policy are enforced: the
	// server's [egress] section, which the server copies here.
	Egress sandbox.EgressConfig `toml:"-"`

	// Observer receives the runtime's measurements: sandboxes ready,
	// image pulls, reconciliations. It is not read from the file; the
	// server sets it. Default: sandbox.NopObserver.
	Observer sandbox.Observer `toml:"-"`

	// blocked, allowed and dns are BlockedCIDRs (with the metadata
	// ranges), AllowedCIDRs and DNS, read by Validate.
	blocked []netip.Prefix
	allowed []sandbox.Destination
	dns     []netip.Addr
	// storage is how storage limits are enforced on the engine, found by
	// New.
	storage *storagePolicy
}

// defaultCaps is the capability set of a sandbox: Docker's default set
// without NET_RAW (spoofed packets), MKNOD (device nodes), SETFCAP and
// AUDIT_WRITE. Root in the sandbox can still install packages (chown,
// setuid to the package manager's user) and bind low ports.
var defaultCaps = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT"}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	var c Config
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	c.DataDir = cmp.Or(c.DataDir, "/var/lib/opensandbox/docker")
	c.LabelScope = cmp.Or(c.LabelScope, "default")
	c.BindIP = cmp.Or(c.BindIP, "127.0.0.1")
	if c.PublicHost == "" {
		c.PublicHost = c.BindIP
		if c.BindIP == "0.0.0.0" || c.BindIP == "::" {
			c.PublicHost = "127.0.0.1"
		}
	}
	c.Network = cmp.Or(c.Network, defaultNetwork)
	c.PullPolicy = cmp.Or(c.PullPolicy, "if-not-present")
	c.StartTimeout = cmp.Or(c.StartTimeout, 60*time.Second)
	c.PullTimeout = cmp.Or(c.PullTimeout, 10*time.Minute)
	c.PidsLimit = cmp.Or(c.PidsLimit, 4096)
	if c.CapAdd == nil {
		c.CapAdd = slices.Clone(defaultCaps)
	}
	if c.AllowedRuntimes == nil {
		c.AllowedRuntimes = []string{"runc", "runsc"}
	}
	if c.Observer == nil {
		c.Observer = sandbox.NopObserver{}
	}
	c.setNetworkDefaults()
	c.Egress.SetDefaults()
	if c.ExecdPath == "" {
		if self, err := os.Executable(); err == nil {
			c.ExecdPath = filepath.Join(filepath.Dir(self), "execd")
		}
	}
}

// Validate checks the configuration, naming the field at fault.
func (c *Config) Validate() error {
	switch c.PullPolicy {
	case "if-not-present", "always", "never":
	default:
		return fmt.Errorf("runtime.docker.pull_policy: %q is not if-not-present, always or never", c.PullPolicy)
	}
	if c.DefaultCPU != "" {
		if _, err := sandbox.ParseCPU(c.DefaultCPU); err != nil {
			return fmt.Errorf("runtime.docker.default_cpu: %w", err)
		}
	}
	if c.DefaultMemory != "" {
		if _, err := sandbox.ParseMemory(c.DefaultMemory); err != nil {
			return fmt.Errorf("runtime.docker.default_memory: %w", err)
		}
	}
	if c.DefaultStorage != "" {
		if _, err := sandbox.ParseStorage(c.DefaultStorage); err != nil {
			return fmt.Errorf("runtime.docker.default_storage: %w", err)
		}
	}
	fi, err := os.Stat(c.ExecdPath)
	if err != nil {
		return fmt.Errorf("runtime.docker.execd_path: %w (build it with make build)", err)
	}
	if fi.Mode()&0o111 == 0 {
		return fmt.Errorf("runtime.docker.execd_path: %s is not executable", c.ExecdPath)
	}
	if c.Runtime != "" && !slices.Contains(c.AllowedRuntimes, c.Runtime) {
		return fmt.Errorf("runtime.docker.runtime: %q is not in allowed_runtimes", c.Runtime)
	}
	return c.validateNetwork()
}

// defaultNetwork is the network the runtime makes for its sandboxes.
const defaultNetwork = "opensandbox"

// execdInSandbox is where execd is mounted in every sandbox.
const execdInSandbox = "/opt/opensandbox/bin/execd"

// envExecdToken carries the sandbox's token to execd, which moves it out
// of its environment at start and never passes it on.
const envExecdToken = "EXECD_ACCESS_TOKEN"

// Label keys. The values of labelScope and labelID locate a sandbox's
// container; the others record immutable facts.
const (
	labelScope      = "opensandbox.scope"
	labelID         = "opensandbox.id"
	labelCreated    = "opensandbox.created"
	labelImage      = "opensandbox.image"
	labelSnapshot   = "opensandbox.snapshot"
	labelEntrypoint = "opensandbox.entrypoint"
	labelMetadata   = "opensandbox.metadata"
	labelExtensions = "opensandbox.extensions"
	labelExpires    = "opensandbox.expires"
	labelSecure     = "opensandbox.secure-access"
	labelPlatform   = "opensandbox.platform"
	// labelStorage is the sandbox's storage limit in bytes, "" for none.
	labelStorage = "opensandbox.storage-limit"
	// labelPool marks a container started for a warm pool.
	labelPool = "opensandbox.pool"
	// labelVolumeOwner marks a named volume the runtime created for a
	// sandbox.
	labelVolumeOwner = "opensandbox.volume-owner"
	// labelSnapshotOf marks a snapshot image.
	labelSnapshotOf = "opensandbox.snapshot-of"
	// labelHeld is "true" on a container whose execd starts without the
	// entrypoint, which the server hands over through execd's /claim
	// once the disk watcher has the container (held.go); "" otherwise.
	labelHeld = "opensandbox.entrypoint-held"
	// labelSubPathVolumes lists, comma-separated, the named volumes a
	// sandbox mounts writable at a sub path: the engine sees those as
	// binds of their pins, and the disk watcher counts them from here.
	labelSubPathVolumes = "opensandbox.subpath-volumes"
)

// extRuntime is the extension that picks a sandbox's OCI runtime.
const extRuntime = "docker.runtime"

func containerName(id sandbox.ID) string { return "osb-" + string(id) }

// containerConfig builds the container of a sandbox. It is pure: the same
// input gives the same configuration.
//
// Every label is written, empty when it has no value: a container made
// from a snapshot would otherwise inherit the labels of the sandbox the
// snapshot was taken from.
func containerConfig(cfg *Config, id sandbox.ID, spec *sandbox.Spec, created time.Time, token, pool string) (*container.Config, *container.HostConfig, *ocispec.Platform, error) {
	labels := map[string]string{
		labelScope:    cfg.LabelScope,
		labelID:       string(id),
		labelCreated:  created.UTC().Format(time.RFC3339Nano),
		labelImage:    spec.Image,
		labelSnapshot: spec.SnapshotID,
		labelExpires:  "",
		labelSecure:   strconv.FormatBool(spec.SecureAccess),
		labelPlatform: "",
		labelStorage:  "",
		labelHeld:     "",
	}
	for key, v := range map[string]any{labelEntrypoint: spec.Entrypoint, labelMetadata: spec.Metadata, labelExtensions: spec.Extensions} {
		b, _ := json.Marshal(v)
		labels[key] = string(b)
	}
	if spec.ExpiresAt != nil {
		labels[labelExpires] = spec.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	if pool != "" {
		labels[labelPool] = pool
	}
	var platform *ocispec.Platform
	if spec.Platform != nil {
		labels[labelPlatform] = spec.Platform.OS + "/" + spec.Platform.Arch
		platform = &ocispec.Platform{OS: spec.Platform.OS, Architecture: spec.Platform.Arch}
	}

	env := make([]string, 0, len(spec.Env)+1)
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if k != envExecdToken {
			env = append(env, k+"="+spec.Env[k])
		}
	}
	env = append(env, envExecdToken+"="+token)
	limit := storageLimit(cfg, spec.Resources)
	cmd := append([]string{"--"}, spec.Entrypoint...)
	switch {
	case pool != "":
		// Started without its entrypoint, which a claim brings.
		cmd = []string{"--claimable", "--"}
	case heldEntrypoint(cfg, limit, spec.Entrypoint):
		// Started without its entrypoint, which the server hands over
		// once the disk watcher measures the container (held.go).
		cmd = []string{"--claimable", "--"}
		labels[labelHeld] = "true"
	}
	// The app port is published directly; with secure access every port
	// goes through execd's proxy, which wants the token.
	exposed, bindings := publishedPorts(cfg, spec.SecureAccess, false)
	cc := &container.Config{
		Image:        spec.Image,
		Entrypoint:   []string{execdInSandbox},
		Cmd:          cmd,
		Env:          env,
		Labels:       labels,
		ExposedPorts: exposed,
	}

	res, err := resources(cfg, spec.Resources)
	if err != nil {
		return nil, nil, nil, err
	}
	mounts := []mount.Mount{
		{Type: mount.TypeBind, Source: cfg.ExecdPath, Target: execdInSandbox, ReadOnly: true},
	}
	var subPathVolumes []string
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		src := ""
		if pinned(v) {
			src = cfg.pinTarget(id, i, v)
		}
		if v.Claim != nil && v.SubPath != "" && !v.ReadOnly && !slices.Contains(subPathVolumes, v.Claim.Name) {
			subPathVolumes = append(subPathVolumes, v.Claim.Name)
		}
		m, err := volumeMount(v, src)
		if err != nil {
			return nil, nil, nil, err
		}
		mounts = append(mounts, m)
	}
	labels[labelSubPathVolumes] = strings.Join(subPathVolumes, ",")
	ociRuntime := cfg.Runtime
	if r, ok := spec.Extensions[extRuntime]; ok {
		if !slices.Contains(cfg.AllowedRuntimes, r) {
			return nil, nil, nil, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter,
				fmt.Sprintf("extension %s: runtime %q is not allowed (allowed: %v)", extRuntime, r, cfg.AllowedRuntimes))
		}
		ociRuntime = r
	}
	if ociRuntime == "runc" {
		ociRuntime = "" // the engine's default
	}
	hc := &container.HostConfig{
		NetworkMode:  container.NetworkMode(cfg.Network),
		PortBindings: bindings,
		Mounts:       mounts,
		Resources:    res,
		SecurityOpt:  []string{"no-new-privileges:true"},
		CapDrop:      []string{"ALL"},
		CapAdd:       slices.Clone(cfg.CapAdd),
		Runtime:      ociRuntime,
		DNS:          slices.Clone(cfg.DNS),
	}
	if limit > 0 {
		labels[labelStorage] = strconv.FormatInt(limit, 10)
		if err := applyStorage(cfg, hc, limit, ociRuntime); err != nil {
			return nil, nil, nil, err
		}
	}
	if hasEgress(spec) {
		joinEgress(id, cc, hc)
		if spec.CredentialProxy {
			cc.Env = append(cc.Env, sandbox.CredentialCAEnv()...)
		}
	}
	return cc, hc, platform, nil
}

// minMemory is the smallest memory limit the engine accepts.
const minMemory = 6 << 20

// resources turns a sandbox's limits, or the configured defaults, into
// the engine's.
func resources(cfg *Config, r sandbox.Resources) (container.Resources, error) {
	var res container.Resources
	cpu := r.CPUMillis
	if cpu == 0 && cfg.DefaultCPU != "" {
		cpu, _ = sandbox.ParseCPU(cfg.DefaultCPU)
	}
	res.NanoCPUs = cpu * 1_000_000
	mem := r.MemoryBytes
	if mem == 0 && cfg.DefaultMemory != "" {
		mem, _ = sandbox.ParseMemory(cfg.DefaultMemory)
	}
	if mem > 0 && mem < minMemory {
		return res, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, fmt.Sprintf("memory %d bytes: Docker needs at least 6Mi", mem))
	}
	if mem > 0 {
		res.Memory = mem
		res.MemorySwap = mem // no swap beyond the limit
	}
	pids := r.Pids
	if pids == 0 {
		pids = cfg.PidsLimit
	}
	if pids > 0 {
		res.PidsLimit = &pids
	}
	switch r.GPUs {
	case "":
	case "all":
		res.DeviceRequests = []container.DeviceRequest{{Count: -1, Capabilities: [][]string{{"gpu"}}}}
	default:
		n, err := strconv.Atoi(r.GPUs)
		if err != nil || n < 1 {
			return res, sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, fmt.Sprintf("gpu %q: want a count or \"all\"", r.GPUs))
		}
		res.DeviceRequests = []container.DeviceRequest{{Count: n, Capabilities: [][]string{{"gpu"}}}}
	}
	return res, nil
}

// volumeMount is the mount of volume v. A pinned volume (see pins.go)
// is a bind of its staging path pin, never of the path the request named.
func volumeMount(v *sandbox.Volume, pin string) (mount.Mount, error) {
	switch {
	case pin != "":
		return mount.Mount{Type: mount.TypeBind, Source: pin, Target: v.MountPath, ReadOnly: v.ReadOnly,
			BindOptions: &mount.BindOptions{CreateMountpoint: false}}, nil
	case v.HostPath != "":
		return mount.Mount{}, errors.New("volume " + v.Name + ": a host path is only mounted through its pin")
	case v.Claim != nil:
		return mount.Mount{Type: mount.TypeVolume, Source: v.Claim.Name, Target: v.MountPath, ReadOnly: v.ReadOnly}, nil
	}
	return mount.Mount{}, errors.New("volume " + v.Name + " has no backend")
}
