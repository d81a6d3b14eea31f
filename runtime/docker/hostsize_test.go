package docker

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// TestHostSize: the runtime reports the engine's machine as the engine
// itself counts it (docker info), and its GPU count agrees with what the
// engine can do: where it reports none, a container asking for a GPU
// cannot start; where it reports some, one can.
func TestHostSize(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	got, err := rt.HostSize(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("docker", "info", "--format", "{{.NCPU}} {{.MemTotal}}").Output()
	if err != nil {
		t.Fatalf("docker info: %v", err)
	}
	f := strings.Fields(string(out))
	ncpu, _ := strconv.ParseInt(f[0], 10, 64)
	mem, _ := strconv.ParseInt(f[1], 10, 64)
	if ncpu < 1 || got.CPUMillis != ncpu*1000 || got.MemoryBytes != mem || got.Where == "" {
		t.Fatalf("HostSize = %+v; docker info says %d CPUs, %d bytes", got, ncpu, mem)
	}
	if !got.GPUsKnown {
		t.Fatalf("HostSize = %+v: the engine is on this machine, so its GPUs are known", got)
	}

	// The GPU rule against the engine: the same device request the
	// runtime makes for "gpu": "1".
	run := exec.Command("docker", "run", "--rm", "--gpus", "1", "--entrypoint", "/bin/true", testImage)
	runOut, runErr := run.CombinedOutput()
	if got.GPUs == 0 && runErr == nil {
		t.Fatalf("HostSize says no GPU, but the engine started a container with one")
	}
	if got.GPUs > 0 && runErr != nil {
		t.Fatalf("HostSize says %d GPUs, but the engine cannot give one: %v\n%s", got.GPUs, runErr, runOut)
	}
	t.Logf("host: %d CPUs, %d bytes, %d GPUs; a GPU container: %v %s", got.CPUMillis/1000, got.MemoryBytes, got.GPUs, runErr, strings.TrimSpace(string(runOut)))

	// The answer read at start is served at once, however old, and never
	// waits for the engine: against an engine that takes connections and
	// never answers (a frozen one), a stale answer still comes back at
	// once while one refresh waits in the background (it gives up after
	// 10 s, so a create that waited for it would take that long).
	sock := filepath.Join(t.TempDir(), "frozen.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	frozen, err := newEngine("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.close()
	rctx, cancel := context.WithCancel(context.Background())
	cut := &Runtime{eng: frozen, ctx: rctx, cancel: cancel, log: slog.New(slog.DiscardHandler)}
	cut.size.set(got, time.Now().Add(-2*hostSizeTTL))
	began := time.Now()
	for range 3 {
		if again, err := cut.HostSize(ctx); err != nil || again != got {
			t.Fatalf("HostSize with the engine frozen = %+v, %v; want the last answer %+v", again, err, got)
		}
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("HostSize waited %v for a frozen engine", d)
	}
	if cut.size.refresh() {
		t.Fatal("no refresh was asked of the engine")
	}
	cancel()
	cut.wg.Wait()
}

// TestEngineRefusesMoreCPUsThanItHas shows why creates are checked: the
// engine refuses a container with more CPUs than its machine has, which
// the asynchronous create would only report as a failed sandbox.
func TestEngineRefusesMoreCPUsThanItHas(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	out, err := exec.Command("docker", "info", "--format", "{{.NCPU}}").Output()
	if err != nil {
		t.Fatalf("docker info: %v", err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	run := exec.Command("docker", "run", "--rm", "--cpus", strconv.Itoa(n+1), "--entrypoint", "/bin/true", testImage)
	if msg, err := run.CombinedOutput(); err == nil {
		t.Fatalf("the engine ran a container with %d CPUs on a machine of %d", n+1, n)
	} else {
		t.Logf("engine: %s", strings.TrimSpace(string(msg)))
	}
}

func TestGPUsOf(t *testing.T) {
	dir := t.TempDir()
	if n, ok := gpusOf(filepath.Join(dir, "missing")); n != 0 || !ok {
		t.Errorf("no driver directory: %d, %v; want 0 GPUs, known", n, ok)
	}
	gpus := filepath.Join(dir, "gpus")
	for _, bus := range []string{"0000:17:00.0", "0000:65:00.0"} {
		if err := os.MkdirAll(filepath.Join(gpus, bus), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if n, ok := gpusOf(gpus); n != 2 || !ok {
		t.Errorf("two GPU directories: %d, %v; want 2, known", n, ok)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	if _, ok := gpusOf(file); ok {
		t.Errorf("an unreadable driver directory must leave the count unknown")
	}
	remote := hostSizeOf(hostInfo{cpus: 4, memory: 1 << 30, local: false}, gpus)
	if remote.GPUsKnown || remote.CPUMillis != 4000 || remote.MemoryBytes != 1<<30 {
		t.Errorf("remote engine: %+v; want 4 CPUs, 1Gi, GPUs unknown", remote)
	}
}
