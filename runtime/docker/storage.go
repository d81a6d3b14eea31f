package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/docker/docker/api/types/container"
	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// How a sandbox's storage limit (resourceLimits "ephemeral-storage") is
// enforced on the engine the runtime found at start.
const (
	// storageEngine: the engine bounds the writable layer itself (overlay2
	// on XFS mounted with project quotas takes HostConfig.StorageOpt
	// size): writes past the limit fail with ENOSPC. The watcher still
	// measures the rest (volumes, the engine's /etc files).
	storageEngine = "engine"
	// storageWatch: the runtime measures what each sandbox occupies and
	// stops one over its limit (diskwatch.go).
	storageWatch = "watch"
	// storageNone: limits cannot be enforced here, and creates that ask
	// for one are refused.
	storageNone = "none"
)

// storagePolicy is how this runtime bounds sandboxes' disk. It is found
// once, at start (storagePolicyFor), except that an engine that refuses
// project quotas after all turns engine mode into watch mode for good.
type storagePolicy struct {
	// why says, for the log and for refusals, what the mode rests on.
	why string
	// watchable is false when the server cannot see the engine's files,
	// which watching needs.
	watchable bool
	// engineQuota is set while the engine is taken to bound writable
	// layers itself.
	engineQuota atomic.Bool
	// logDriver is the engine's default logging driver.
	logDriver string
	// runscSeccomp reports whether gVisor applies a container's seccomp
	// profile (runsc runs with --oci-seccomp).
	runscSeccomp bool
	// seccompProfile is the profile of watched sandboxes (JSON).
	seccompProfile string
}

// mode is the enforcement in force now.
func (p *storagePolicy) mode() string {
	switch {
	case p == nil:
		return storageNone
	case p.engineQuota.Load():
		return storageEngine
	case p.watchable:
		return storageWatch
	}
	return storageNone
}

// storagePolicyFor decides how limits are enforced on an engine with
// storage st, whose files the server sees under its data root when
// visible.
func storagePolicyFor(st engineStorage, visible bool) (*storagePolicy, error) {
	p := &storagePolicy{logDriver: st.LogDriver, runscSeccomp: hasOCISeccomp(st.RuntimeArgs["runsc"])}
	prof, err := watchedSeccompProfile()
	if err != nil {
		return nil, err
	}
	p.seccompProfile = prof
	if st.Driver != "overlay2" {
		p.why = fmt.Sprintf("the engine's storage driver is %s; storage limits need overlay2", st.Driver)
		return p, nil
	}
	p.watchable = visible
	switch {
	case st.BackingFS == "xfs":
		p.engineQuota.Store(true)
		p.why = "overlay2 on xfs: the engine bounds each writable layer with a project quota (the first sandbox with a limit confirms that the file system is mounted with pquota)"
		if !visible {
			p.why += "; the engine's data root is not visible to the server, so a sandbox's volumes and the engine's /etc files are not counted"
		}
	case !visible:
		p.why = fmt.Sprintf("overlay2 on %s cannot bound writable layers, and the engine's data root %s is not visible to the server, which must run on the engine's host to measure them", st.BackingFS, st.RootDir)
	default:
		p.why = fmt.Sprintf("overlay2 on %s cannot bound writable layers (that needs xfs with project quotas): the server measures each sandbox and stops one over its limit", st.BackingFS)
	}
	return p, nil
}

// findStoragePolicy asks the engine how storage limits can be enforced,
// and checks that the configured default limit can be.
func findStoragePolicy(ctx context.Context, eng *engine, cfg *Config) (*storagePolicy, error) {
	st, err := eng.storage(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrUnavailable, err)
	}
	p, err := storagePolicyFor(st, rootVisible(st))
	if err != nil {
		return nil, err
	}
	if cfg.DefaultStorage == "" {
		return p, nil
	}
	switch mode := p.mode(); {
	case mode == storageNone:
		return nil, fmt.Errorf("runtime.docker.default_storage: this server cannot enforce storage limits: %s", p.why)
	case mode == storageWatch && cfg.Runtime == "runsc" && !p.runscSeccomp:
		return nil, errors.New("runtime.docker.default_storage: sandboxes run under gVisor (runtime.docker.runtime = runsc), which ignores the seccomp profile that keeps fallocate from outrunning the measurement of their disk; run runsc with --oci-seccomp, or use runc")
	}
	return p, nil
}

// hasOCISeccomp reports whether runsc's arguments make it apply the
// container's seccomp profile.
func hasOCISeccomp(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool {
		a = strings.TrimLeft(a, "-")
		return a == "oci-seccomp" || a == "oci-seccomp=true"
	})
}

// rootVisible reports whether the engine's data root, with its storage
// driver's directory, is on this machine's file system.
func rootVisible(st engineStorage) bool {
	if st.RootDir == "" || st.Driver == "" {
		return false
	}
	fi, err := os.Stat(filepath.Join(st.RootDir, st.Driver))
	return err == nil && fi.IsDir()
}

// eopnotsupp is what fallocate answers in a watched sandbox.
const eopnotsupp = 95

// watchedSeccompProfile is moby's current default seccomp profile (which
// also refuses io_uring, which could allocate too, where older engines'
// defaults allowed it), except that fallocate fails with EOPNOTSUPP. fallocate reserves any
// number of blocks in one call, faster than any measurement: a watched
// sandbox could fill the host's disk between two of them. Refused that
// way, the C library's posix_fallocate falls back to writing the blocks,
// which takes as long as writing does, and programs that call fallocate
// directly treat it as a file system without it.
func watchedSeccompProfile() (string, error) {
	p := seccomp.DefaultProfile()
	for _, s := range p.Syscalls {
		s.Names = slices.DeleteFunc(s.Names, func(n string) bool { return n == "fallocate" })
	}
	errno := uint(eopnotsupp)
	p.Syscalls = append(p.Syscalls, &seccomp.Syscall{
		LinuxSyscall: specs.LinuxSyscall{Names: []string{"fallocate"}, Action: specs.ActErrno, ErrnoRet: &errno},
		Comment:      "opensandbox: storage limits are measured, and fallocate would outrun the measurement",
	})
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode the seccomp profile of watched sandboxes: %w", err)
	}
	return string(b), nil
}

// Container logs of a sandbox with a storage limit are capped: the engine
// keeps at most logFiles files of logMaxSize each.
const (
	logMaxSize = "10m"
	logFiles   = "2"
)

// storageLimit is a sandbox's limit in bytes: its own, else the
// configured default; 0 for none.
func storageLimit(cfg *Config, r sandbox.Resources) int64 {
	if r.StorageBytes > 0 {
		return r.StorageBytes
	}
	if cfg.DefaultStorage != "" {
		n, _ := sandbox.ParseStorage(cfg.DefaultStorage)
		return n
	}
	return 0
}

// applyStorage makes the container of a sandbox limited to limit bytes
// (running on OCI runtime ociRuntime, "" for the engine's default) honour
// the limit, or refuses it when this server cannot.
func applyStorage(cfg *Config, hc *container.HostConfig, limit int64, ociRuntime string) error {
	p := cfg.storage
	refuse := func(msg string) error {
		return sandbox.Coded(sandbox.ErrInvalid, api.CodeSandboxInvalidParameter, "ephemeral-storage: "+msg)
	}
	mode := p.mode()
	switch mode {
	case storageNone:
		why := "the runtime was not started"
		if p != nil {
			why = p.why
		}
		return refuse("this server cannot enforce storage limits: " + why)
	case storageEngine, storageWatch:
		if mode == storageEngine {
			hc.StorageOpt = map[string]string{"size": strconv.FormatInt(limit, 10)}
		}
		// The engine's quota bounds only the writable layer; the rest
		// (volumes, the engine's /etc files) is measured in both modes,
		// and fallocate must not outrun the measurement there either.
		if ociRuntime == "runsc" && !p.runscSeccomp {
			return refuse("gVisor (runsc) on this engine ignores a container's seccomp profile, which keeps fallocate from reserving past the limit faster than it can be measured; " +
				"run runsc with --oci-seccomp (runtimeArgs in /etc/docker/daemon.json), or use runc")
		}
		hc.SecurityOpt = append(hc.SecurityOpt, "seccomp="+p.seccompProfile)
	}
	if p.logDriver == "json-file" {
		hc.LogConfig = container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": logMaxSize, "max-file": logFiles}}
	}
	return nil
}

// isStorageOptRefusal reports whether the engine refused a container
// because it cannot bound its writable layer.
func isStorageOptRefusal(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "storage-opt") || strings.Contains(msg, "storage option") || strings.Contains(msg, "quota")
}
