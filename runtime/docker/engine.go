package docker

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	pathpkg "path"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/registry"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"
	"github.com/docker/docker/pkg/stdcopy"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// engine is the only place that speaks to the Docker Engine API. It turns
// the client's types into the few facts the runtime needs, and its
// errors into errNoSuchObject, errConflict or plain errors.
type engine struct {
	c *client.Client
}

var (
	errNoSuchObject = errors.New("no such object")
	errNameConflict = errors.New("name already in use")
)

func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%w: %v", errNoSuchObject, err)
	case strings.Contains(err.Error(), "Conflict.") || strings.Contains(err.Error(), "is already in use"):
		return fmt.Errorf("%w: %v", errNameConflict, err)
	}
	return err
}

// newEngine connects to the engine at host ("" for DOCKER_HOST or the
// default socket), negotiating the API version so that older engines
// (Debian's 20.10 speaks 1.41) are served.
func newEngine(host string) (*engine, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	c, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return &engine{c: c}, nil
}

func (e *engine) ping(ctx context.Context) (string, error) {
	p, err := e.c.Ping(ctx)
	if err != nil {
		return "", fmt.Errorf("reach the Docker engine: %w", err)
	}
	e.c.NegotiateAPIVersionPing(p)
	return p.APIVersion, nil
}

// containerInfo is what the runtime needs to know of a container.
type containerInfo struct {
	ID     string
	Labels map[string]string
	// State is the engine's: created, running, paused, restarting,
	// removing, exited, dead.
	State     string
	ExitCode  int
	OOMKilled bool
	Error     string
	// Ports maps a container TCP port to the host address it is
	// published on.
	Ports map[int]string
	// StartedAt is when its container last started, as the engine
	// writes it: it tells one start from the next (from inspect only).
	StartedAt string
	// Env is the container's environment (from inspect only).
	Env []string
	// Files says where its writes land (from inspect only).
	Files containerFiles
}

// list returns the containers carrying label (key=value), running or not,
// with their published ports: one engine call for all of them.
func (e *engine) list(ctx context.Context, label string) ([]containerInfo, error) {
	cs, err := e.c.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]containerInfo, 0, len(cs))
	for _, c := range cs {
		info := containerInfo{ID: c.ID, Labels: c.Labels, State: string(c.State), Ports: map[int]string{}}
		if info.State == "exited" {
			// "Exited (137) 2 minutes ago"
			if _, rest, ok := strings.Cut(c.Status, "("); ok {
				if code, _, ok := strings.Cut(rest, ")"); ok {
					info.ExitCode, _ = strconv.Atoi(code)
				}
			}
		}
		info.Ports = listedPorts(c.Ports)
		out = append(out, info)
	}
	return e.egressPorts(ctx, out)
}

// listedPorts are the published TCP ports of a listed container.
func listedPorts(ports []container.Port) map[int]string {
	out := map[int]string{}
	for _, p := range ports {
		if p.PublicPort != 0 && p.Type == "tcp" {
			out[int(p.PrivatePort)] = net.JoinHostPort(p.IP, strconv.Itoa(int(p.PublicPort)))
		}
	}
	return out
}

// egressPorts gives each listed container that joined an egress
// container's network namespace (egress.go) the ports published from
// that container: one more engine call, when there is any.
func (e *engine) egressPorts(ctx context.Context, cs []containerInfo) ([]containerInfo, error) {
	if !slices.ContainsFunc(cs, func(c containerInfo) bool { return c.Labels[labelEgress] != "" }) {
		return cs, nil
	}
	egs, err := e.c.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", labelEgressOf))})
	if err != nil {
		return nil, fmt.Errorf("list egress containers: %w", err)
	}
	byName := map[string]map[int]string{}
	for _, c := range egs {
		for _, n := range c.Names {
			byName[strings.TrimPrefix(n, "/")] = listedPorts(c.Ports)
		}
	}
	for i := range cs {
		if name := cs[i].Labels[labelEgress]; name != "" {
			cs[i].Ports = byName[name]
			if cs[i].Ports == nil {
				cs[i].Ports = map[int]string{}
			}
		}
	}
	return cs, nil
}

func (e *engine) inspect(ctx context.Context, id string) (containerInfo, error) {
	c, err := e.c.ContainerInspect(ctx, id)
	if err != nil {
		return containerInfo{}, classify(err)
	}
	info := containerInfo{ID: c.ID, Labels: c.Config.Labels, Ports: map[int]string{}, Env: c.Config.Env, Files: filesOf(&c)}
	if c.State != nil {
		info.State, info.ExitCode, info.OOMKilled, info.Error = c.State.Status, c.State.ExitCode, c.State.OOMKilled, c.State.Error
		info.StartedAt = c.State.StartedAt
	}
	if name := info.Labels[labelEgress]; name != "" {
		// Its ports are published from its egress container.
		if eg, err := e.c.ContainerInspect(ctx, name); err == nil {
			c.NetworkSettings = eg.NetworkSettings
		} else {
			c.NetworkSettings = nil
		}
	}
	if c.NetworkSettings != nil {
		for port, bindings := range c.NetworkSettings.Ports {
			if port.Proto() != "tcp" {
				continue
			}
			for _, b := range bindings {
				if b.HostPort != "" {
					info.Ports[port.Int()] = net.JoinHostPort(b.HostIP, b.HostPort)
					break
				}
			}
		}
	}
	return info, nil
}

// inspectJSON returns the engine's full description of a container.
func (e *engine) inspectJSON(ctx context.Context, id string) ([]byte, error) {
	_, raw, err := e.c.ContainerInspectWithRaw(ctx, id, false)
	if err != nil {
		return nil, classify(err)
	}
	return raw, nil
}

func (e *engine) create(ctx context.Context, name string, cfg *container.Config, host *container.HostConfig, platform *ocispec.Platform) (string, error) {
	resp, err := e.c.ContainerCreate(ctx, cfg, host, &network.NetworkingConfig{}, platform, name)
	if err != nil {
		return "", classify(err)
	}
	return resp.ID, nil
}

func (e *engine) start(ctx context.Context, id string) error {
	return classify(e.c.ContainerStart(ctx, id, container.StartOptions{}))
}

// remove force-removes a container with its anonymous volumes. A
// container that is already gone is not an error.
func (e *engine) remove(ctx context.Context, id string) error {
	err := classify(e.c.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true}))
	if errors.Is(err, errNoSuchObject) || (err != nil && strings.Contains(err.Error(), "is already in progress")) {
		return nil
	}
	return err
}

// kill stops a container at once, keeping it (and its log).
func (e *engine) kill(ctx context.Context, id string) error {
	err := classify(e.c.ContainerKill(ctx, id, "KILL"))
	if err != nil && strings.Contains(err.Error(), "is not running") {
		return nil
	}
	return err
}

func (e *engine) pause(ctx context.Context, id string) error {
	return classify(e.c.ContainerPause(ctx, id))
}

func (e *engine) unpause(ctx context.Context, id string) error {
	return classify(e.c.ContainerUnpause(ctx, id))
}

// imageExists reports whether ref is in the engine's image store.
func (e *engine) imageExists(ctx context.Context, ref string) (bool, error) {
	_, err := e.c.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("inspect image %s: %w", ref, err)
}

// pull pulls ref, with credentials when auth is not nil, and returns once
// the engine has finished (or failed, with the registry's message).
func (e *engine) pull(ctx context.Context, ref string, username, password string, platform *ocispec.Platform) error {
	opts := image.PullOptions{}
	if username != "" || password != "" {
		b, _ := json.Marshal(registry.AuthConfig{Username: username, Password: password})
		opts.RegistryAuth = base64.URLEncoding.EncodeToString(b)
	}
	if platform != nil {
		opts.Platform = platform.OS + "/" + platform.Architecture
	}
	rc, err := e.c.ImagePull(ctx, ref, opts)
	if err != nil {
		return err
	}
	defer rc.Close()
	// The stream carries progress, and errors as messages.
	return jsonmessage.DisplayJSONMessagesStream(rc, io.Discard, 0, false, nil)
}

// commit captures a container's file system as image ref.
func (e *engine) commit(ctx context.Context, id, ref string, labels map[string]string) error {
	changes := make([]string, 0, len(labels))
	for k, v := range labels {
		changes = append(changes, fmt.Sprintf("LABEL %s=%q", k, v))
	}
	_, err := e.c.ContainerCommit(ctx, id, container.CommitOptions{Reference: ref, Pause: true, Changes: changes})
	return classify(err)
}

func (e *engine) removeImage(ctx context.Context, ref string) error {
	_, err := e.c.ImageRemove(ctx, ref, image.RemoveOptions{Force: true, PruneChildren: true})
	if err = classify(err); errors.Is(err, errNoSuchObject) {
		return nil
	}
	return err
}

// imagesWithLabel lists the references of images carrying label.
func (e *engine) imagesWithLabel(ctx context.Context, label string) ([]image.Summary, error) {
	return e.c.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("label", label))})
}

// logs returns a container's output, stdout and stderr interleaved as the
// engine recorded them.
func (e *engine) logs(ctx context.Context, id string, tail int, since time.Time) (string, error) {
	opts := container.LogsOptions{ShowStdout: true, ShowStderr: true, Timestamps: true}
	if tail > 0 {
		opts.Tail = strconv.Itoa(tail)
	}
	if !since.IsZero() {
		opts.Since = strconv.FormatInt(since.Unix(), 10)
	}
	rc, err := e.c.ContainerLogs(ctx, id, opts)
	if err != nil {
		return "", classify(err)
	}
	defer rc.Close()
	var out strings.Builder
	if _, err := stdcopy.StdCopy(&out, &out, rc); err != nil {
		return out.String(), err
	}
	return out.String(), nil
}

// events streams container events for label until ctx ends.
func (e *engine) events(ctx context.Context, label string) (<-chan events.Message, <-chan error) {
	return e.c.Events(ctx, events.ListOptions{Filters: filters.NewArgs(filters.Arg("type", "container"), filters.Arg("label", label))})
}

func (e *engine) volumeExists(ctx context.Context, name string) (map[string]string, bool, error) {
	v, err := e.c.VolumeInspect(ctx, name)
	switch {
	case err == nil:
		return v.Labels, true, nil
	case cerrdefs.IsNotFound(err):
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("inspect volume %s: %w", name, err)
}

// volumeInfo is what the runtime needs to know of a named volume.
type volumeInfo struct {
	Name       string
	Driver     string
	Mountpoint string
	Options    map[string]string
	Labels     map[string]string
}

func (e *engine) volumeInfo(ctx context.Context, name string) (volumeInfo, error) {
	v, err := e.c.VolumeInspect(ctx, name)
	if err != nil {
		return volumeInfo{}, fmt.Errorf("inspect volume %s: %w", name, classify(err))
	}
	return volumeInfo{Name: v.Name, Driver: v.Driver, Mountpoint: v.Mountpoint, Options: v.Options, Labels: v.Labels}, nil
}

func (e *engine) createVolume(ctx context.Context, name string, labels map[string]string) error {
	_, err := e.c.VolumeCreate(ctx, volume.CreateOptions{Name: name, Labels: labels})
	return err
}

func (e *engine) removeVolume(ctx context.Context, name string) error {
	err := classify(e.c.VolumeRemove(ctx, name, true))
	if errors.Is(err, errNoSuchObject) {
		return nil
	}
	return err
}

// hostInfo is what the engine says of itself and its machine.
type hostInfo struct {
	// runtimes are the OCI runtimes the engine knows ("runc", "runsc").
	runtimes map[string]bool
	cpus     int   // the machine's CPUs (NCPU)
	memory   int64 // the machine's memory in bytes (MemTotal)
	// local: the engine is reached on a Unix socket, so it runs on this
	// machine's kernel.
	local bool
}

// info asks the engine about itself and its machine.
func (e *engine) info(ctx context.Context) (hostInfo, error) {
	info, err := e.c.Info(ctx)
	if err != nil {
		return hostInfo{}, fmt.Errorf("engine info: %w", err)
	}
	out := hostInfo{runtimes: map[string]bool{}, cpus: info.NCPU, memory: info.MemTotal,
		local: strings.HasPrefix(e.c.DaemonHost(), "unix://")}
	for name := range info.Runtimes {
		out.runtimes[name] = true
	}
	return out, nil
}

// engineStorage is what the engine says of where containers' files go.
type engineStorage struct {
	// Driver is the storage driver ("overlay2"); BackingFS the file
	// system under it ("extfs", "xfs").
	Driver    string
	BackingFS string
	// RootDir is the engine's data root (/var/lib/docker).
	RootDir string
	// LogDriver is the default logging driver ("json-file").
	LogDriver string
	// RuntimeArgs are the arguments each OCI runtime is started with.
	RuntimeArgs map[string][]string
}

// storage reads the engine's storage and logging setup.
func (e *engine) storage(ctx context.Context) (engineStorage, error) {
	info, err := e.c.Info(ctx)
	if err != nil {
		return engineStorage{}, fmt.Errorf("read the engine's info: %w", err)
	}
	s := engineStorage{Driver: info.Driver, RootDir: info.DockerRootDir, LogDriver: info.LoggingDriver, RuntimeArgs: map[string][]string{}}
	for _, kv := range info.DriverStatus {
		if kv[0] == "Backing Filesystem" {
			s.BackingFS = kv[1]
		}
	}
	for name, rt := range info.Runtimes {
		s.RuntimeArgs[name] = rt.Args
	}
	return s, nil
}

// containerFiles are the places on the host where a running container
// keeps what it writes.
type containerFiles struct {
	// Running is false for a container that is not running.
	Running bool
	// Pid is the host PID of its init process.
	Pid int
	// UpperDir is its writable layer (overlay storage drivers only).
	UpperDir string
	// EtcFiles are the engine's files mounted writable at /etc/hosts,
	// /etc/resolv.conf and /etc/hostname.
	EtcFiles []string
	// Volumes are the named volumes it mounts writable.
	Volumes []volumeMountPoint
}

// volumeMountPoint is a named volume and where its data is on the host.
type volumeMountPoint struct {
	Name, Driver, Source string
}

func filesOf(c *container.InspectResponse) containerFiles {
	var f containerFiles
	if c.GraphDriver.Data != nil {
		f.UpperDir = c.GraphDriver.Data["UpperDir"]
	}
	if c.State != nil {
		f.Running, f.Pid = c.State.Running && !c.State.Paused, c.State.Pid
	}
	for _, p := range []string{c.HostsPath, c.ResolvConfPath, c.HostnamePath} {
		if p != "" {
			f.EtcFiles = append(f.EtcFiles, p)
		}
	}
	for _, m := range c.Mounts {
		if m.Type == "volume" && m.RW && m.Source != "" {
			f.Volumes = append(f.Volumes, volumeMountPoint{Name: m.Name, Driver: m.Driver, Source: m.Source})
		}
	}
	return f
}

// ensureIsolatedNetwork makes a bridge network on which containers cannot
// reach each other (inter-container communication off), if there is none
// of that name.
func (e *engine) ensureIsolatedNetwork(ctx context.Context, name string) error {
	if _, err := e.c.NetworkInspect(ctx, name, network.InspectOptions{}); err == nil {
		return nil
	} else if !cerrdefs.IsNotFound(err) {
		return err
	}
	_, err := e.c.NetworkCreate(ctx, name, network.CreateOptions{
		Driver:  "bridge",
		Options: map[string]string{"com.docker.network.bridge.enable_icc": "false"},
		Labels:  map[string]string{"opensandbox.network": "true"},
	})
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil // made by a concurrent server
	}
	return err
}

// guardNetwork is what the network guard needs to know of a Docker
// network: whose traffic its rules match.
type guardNetwork struct {
	id   string
	name string
	// subnets are the network's address ranges, IPv4 and IPv6.
	subnets []netip.Prefix
	// ipv6 reports whether containers on the network get IPv6 at all;
	// without it Docker turns IPv6 off inside them (no address, not even
	// a link-local one).
	ipv6 bool
	// bridge is the host interface of a bridge network, "" for other
	// drivers.
	bridge string
	// gateways are the host's addresses on the network.
	gateways []netip.Addr
}

// network looks a network up by name or ID; errNoSuchObject when there is
// none.
func (e *engine) network(ctx context.Context, name string) (guardNetwork, error) {
	n, err := e.c.NetworkInspect(ctx, name, network.InspectOptions{})
	if err != nil {
		return guardNetwork{}, fmt.Errorf("inspect network %s: %w", name, classify(err))
	}
	g := guardNetwork{id: n.ID, name: n.Name, ipv6: n.EnableIPv6}
	for _, c := range n.IPAM.Config {
		if p, err := netip.ParsePrefix(c.Subnet); err == nil {
			g.subnets = append(g.subnets, p.Masked())
		}
		if a, err := netip.ParseAddr(c.Gateway); err == nil {
			g.gateways = append(g.gateways, a)
		}
	}
	if n.Driver == "bridge" {
		g.bridge = n.Options["com.docker.network.bridge.name"]
		if g.bridge == "" && len(n.ID) >= 12 {
			g.bridge = "br-" + n.ID[:12]
		}
	}
	return g, nil
}

// readFile reads one regular file of a container (created or running),
// at most limit bytes; ok is false when there is no such file or it is
// not a regular file.
// A symbolic link is followed (a few levels deep).
func (e *engine) readFile(ctx context.Context, id, path string, limit int64) (data []byte, ok bool, err error) {
	for range 4 {
		rc, _, err := e.c.CopyFromContainer(ctx, id, path)
		if err != nil {
			if errors.Is(classify(err), errNoSuchObject) {
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("read %s: %w", path, classify(err))
		}
		tr := tar.NewReader(rc)
		hdr, err := tr.Next()
		if err != nil {
			rc.Close()
			return nil, false, fmt.Errorf("read %s: %w", path, err)
		}
		switch {
		case hdr.Typeflag == tar.TypeSymlink:
			rc.Close()
			if !strings.HasPrefix(hdr.Linkname, "/") {
				hdr.Linkname = pathpkg.Join(pathpkg.Dir(path), hdr.Linkname)
			}
			path = hdr.Linkname
			continue
		case hdr.Typeflag != tar.TypeReg || hdr.Size > limit:
			rc.Close()
			return nil, false, nil
		}
		data, err = io.ReadAll(io.LimitReader(tr, limit))
		rc.Close()
		if err != nil {
			return nil, false, fmt.Errorf("read %s: %w", path, err)
		}
		return data, true, nil
	}
	return nil, false, nil
}

// writeFiles puts files into a container (created or running) from a tar
// stream, extracted at its root.
func (e *engine) writeFiles(ctx context.Context, id string, archive io.Reader) error {
	if err := e.c.CopyToContainer(ctx, id, "/", archive, container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("copy files into the container: %w", classify(err))
	}
	return nil
}

func (e *engine) close() error { return e.c.Close() }
