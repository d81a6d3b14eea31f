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
	// refreshing marks a refresh under way.
	refreshing bool
}

// refresh claims the next refresh: it reports false when one is under
// way.
func (c *hostSizeCache) refresh() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refreshing {
		return false
	}
	c.refreshing = true
	return true
}

func (c *hostSizeCache) set(s sandbox.HostSize, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.size, c.at, c.refreshing = s, at, false
}

func (c *hostSizeCache) refreshFailed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshing = false
}

func (c *hostSizeCache) get() (sandbox.HostSize, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.at
}

// HostSize reports the engine's machine: its CPUs and memory as the
// engine counts them (docker info's NCPU and MemTotal), and its GPUs
// where the engine runs on this machine's kernel (see gpusOf). The answer
// read at start, or since, is given at once: a request never waits for
// the engine, which may be stuck. Once it is a minute old, one refresh
// is asked of the engine in the background; if the engine does not
// answer, the last answer stands.
func (r *Runtime) HostSize(ctx context.Context) (sandbox.HostSize, error) {
	size, at := r.size.get()
	if time.Since(at) >= hostSizeTTL && r.size.refresh() {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
			defer cancel()
			info, err := r.eng.info(ctx)
			if err != nil {
				r.size.refreshFailed()
				r.log.Debug("refresh the engine's host size", "err", err)
				return
			}
			r.size.set(hostSizeOf(info, nvidiaGPUsDir), time.Now())
		}()
	}
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

// ExtensionKeys returns the extensions the runtime reads: docker.runtime,
// and opensandbox.extensions.*, which it keeps with the sandbox (in its
// container's labels, as the reference's Docker server does).
func (r *Runtime) ExtensionKeys() []string { return []string{extRuntime, extPassThrough + "*"} }

// extPassThrough prefixes the extensions a runtime keeps with the
// sandbox for whoever looks at it: labels on Docker, annotations on
// Kubernetes.
const extPassThrough = "opensandbox.extensions."
