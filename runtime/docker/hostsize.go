package docker

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

// hostSizeTTL is how long the engine's account of its machine is reused:
// CPUs and memory change only when the machine is resized.
const hostSizeTTL = time.Minute

// nvidiaGPUsDir is where the NVIDIA kernel driver lists the machine's
// GPUs, one directory each. The directory is the kernel's, not a mount
// namespace's: a server in a container sees the host's.
const nvidiaGPUsDir = "/proc/driver/nvidia/gpus"

// hostSizeCache keeps the last HostSize and when it was read.
type hostSizeCache struct {
	mu   sync.Mutex
	size sandbox.HostSize
	at   time.Time
}

func (c *hostSizeCache) set(s sandbox.HostSize, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.size, c.at = s, at
}

func (c *hostSizeCache) get() (sandbox.HostSize, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.at
}

// HostSize reports the engine's machine: its CPUs and memory as the
// engine counts them (docker info's NCPU and MemTotal), and its GPUs
// where the engine runs on this machine's kernel (see gpusOf). It asks
// the engine at most once a minute; if the engine does not answer, the
// last answer stands.
func (r *Runtime) HostSize(ctx context.Context) (sandbox.HostSize, error) {
	size, at := r.size.get()
	if time.Since(at) < hostSizeTTL {
		return size, nil
	}
	info, err := r.eng.info(ctx)
	if err != nil {
		if !at.IsZero() {
			return size, nil
		}
		return sandbox.HostSize{}, err
	}
	size = hostSizeOf(info, nvidiaGPUsDir)
	r.size.set(size, time.Now())
	return size, nil
}

// hostSizeOf is the HostSize of what the engine said.
func hostSizeOf(info hostInfo, gpuDir string) sandbox.HostSize {
	s := sandbox.HostSize{CPUMillis: int64(info.cpus) * 1000, MemoryBytes: info.memory, Where: "the Docker engine's host"}
	if info.local {
		s.GPUs, s.GPUsKnown = gpusOf(gpuDir)
	}
	return s
}

// gpusOf counts the GPUs the NVIDIA driver lists in dir (its
// /proc/driver/nvidia/gpus): none when the driver is not loaded, in which
// case the engine has no GPU to give either (a GPU request would fail at
// start, "could not select device driver"). Any other failure to read
// leaves the count unknown.
func gpusOf(dir string) (int64, bool) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, true
	}
	if err != nil {
		return 0, false
	}
	var n int64
	for _, e := range entries {
		if e.IsDir() {
			n++
		}
	}
	return n, true
}

// ExtensionKeys returns the extension the runtime reads: docker.runtime.
func (r *Runtime) ExtensionKeys() []string { return []string{extRuntime} }
