package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// The disk attempts: a sandbox with a storage limit (resourceLimits
// "ephemeral-storage") tries to put more than that on the host's disk,
// through every place it can write. On this host (overlay2 on ext4) the
// server measures sandboxes and stops one over its limit; each attempt
// writes gigabytes, so a limit that did not hold leaves far more on the
// disk than the bound checked here, and a sandbox that was not stopped
// fails the wait. Limits are small, so the host is never filled.

// diskLimit and diskMemory are the disk and memory limits of the
// attempts' sandboxes.
const (
	diskLimit  = 64 << 20
	diskMemory = 256 << 20
)

// diskOvershoot bounds how far past its limit a sandbox with a memory
// limit of memory may get before it is stopped. It follows from how it is
// stopped: its entrypoint starts only once the server has measured it
// (it is held until then), and it is measured again before it could
// have filled what is left at memory speed, every 10 to 15 ms near a
// small limit, then killed within milliseconds. Should the kill come
// late (a loaded CPU), the sandbox writes into its page cache at memory
// speed only until its page cache fills its memory limit, which then
// makes it wait for writeback, and beyond that at the speed the disk
// takes: at most its memory limit, plus what the disk takes in diskLag.
// The attempts write gigabytes: a limit that did not hold leaves far
// more.
func diskOvershoot(memory int64) int64 {
	return memory + int64(float64(diskWriteRate)*diskLag.Seconds())
}

// diskWriteRate is how fast this machine's disk takes writes (measured:
// 617 MB/s with dd oflag=direct, 169 MB/s with conv=fdatasync, on a
// loaded machine), and diskLag how late the kill may come: more than
// fifteen times the interval between measurements near the limit.
const (
	diskWriteRate = 640 << 20 // bytes per second
	diskLag       = 250 * time.Millisecond
)

// inspectContainer returns fields of a sandbox's container, by Go
// template.
func inspectContainer(t *testing.T, id, format string) string {
	t.Helper()
	out, err := exec.Command("docker", "inspect", "-f", format, "osb-"+id).CombinedOutput()
	if err != nil {
		t.Fatalf("docker inspect osb-%s: %v: %s", id, err, out)
	}
	return strings.TrimSpace(string(out))
}

// allocated is what du counts under paths: allocated blocks, each inode
// once.
func allocated(t *testing.T, paths ...string) int64 {
	t.Helper()
	out, err := exec.Command("du", append([]string{"-s", "-c", "-B1"}, paths...)...).Output()
	if err != nil {
		t.Fatalf("du %v: %v", paths, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	n, err := strconv.ParseInt(strings.Fields(lines[len(lines)-1])[0], 10, 64)
	if err != nil {
		t.Fatalf("du %v: %q", paths, out)
	}
	return n
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// limitedRequest is a create request for a sandbox limited to diskLimit
// running script.
func limitedRequest(script string) api.CreateSandboxRequest {
	req := sandboxRequest(busyboxImage, "sh", "-c", script)
	req.ResourceLimits["ephemeral-storage"] = "64Mi"
	req.ResourceLimits["memory"] = "256Mi" // diskMemory
	return req
}

// createIn creates a sandbox for an attempt; failures are the attempt's.
func createIn(t *testing.T, s *server, req api.CreateSandboxRequest) string {
	t.Helper()
	resp, body := s.do("POST", "/v1/sandboxes", req)
	var out api.CreateSandboxResponse
	if resp.StatusCode != 202 || json.Unmarshal(body, &out) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	return out.ID
}

// waitFor polls a sandbox until it is in state, for as long as starts
// sandbox starts may take (see testwait); failures are the attempt's.
func waitFor(t *testing.T, s *server, id, state string, starts int) api.Sandbox {
	t.Helper()
	var sb api.Sandbox
	testwait.Wait{What: "sandbox " + id + " to be " + state, Starts: starts, Every: 25 * time.Millisecond,
		Describe: func() string { return s.describe(id) }}.Until(t, func() bool {
		resp, body := s.do("GET", "/v1/sandboxes/"+id, nil)
		if resp.StatusCode == 200 && json.Unmarshal(body, &sb) == nil && sb.Status.State == state {
			return true
		}
		if sb.Status.State == "Failed" && state != "Failed" {
			t.Fatalf("sandbox %s failed: %+v", id, sb.Status)
		}
		return false
	})
	return sb
}

// sandboxNow returns a sandbox as the server has it now.
func sandboxNow(t *testing.T, s *server, id string) api.Sandbox {
	t.Helper()
	var sb api.Sandbox
	resp, body := s.do("GET", "/v1/sandboxes/"+id, nil)
	if resp.StatusCode != 200 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("GET sandbox %s: %d %s", id, resp.StatusCode, body)
	}
	return sb
}

// wantDiskStopped waits for a sandbox to be stopped for its disk and
// returns what it holds on the host then (its writable layer and the
// paths extra returns), failing the attempt if it was not stopped, or
// holds more than diskOvershoot past the limit.
func wantDiskStopped(t *testing.T, s *server, id string, extra ...func() string) string {
	t.Helper()
	sb := waitFor(t, s, id, "Failed", 2)
	if sb.Status.Reason != "DISK_LIMIT_EXCEEDED" || !strings.Contains(sb.Status.Message, "64 MiB") {
		t.Fatalf("sandbox failed with %s: %s; want DISK_LIMIT_EXCEEDED naming its limit", sb.Status.Reason, sb.Status.Message)
	}
	for deadline := time.Now().Add(15 * time.Second); inspectContainer(t, id, "{{.State.Running}}") == "true"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox is Failed but its container still runs")
		}
	}
	paths := []string{inspectContainer(t, id, "{{.GraphDriver.Data.UpperDir}}")}
	for _, p := range extra {
		paths = append(paths, p())
	}
	held := allocated(t, paths...)
	if bound := diskOvershoot(diskMemory); held > diskLimit+bound {
		t.Errorf("it holds %s on the host's disk, more than %s past its limit", mib(held), mib(bound))
	}
	return fmt.Sprintf("stopped (%s); it holds %s on the host for a limit of %s, %s past it", sb.Status.Message, mib(held), mib(diskLimit), mib(max(held-diskLimit, 0)))
}

func TestAttackDisk(t *testing.T) {
	testenv.MustHaveRoot(t) // to measure what sandboxes left under the engine's data root
	s := startServer(t, serverOptions{docker: `default_storage = "32Mi"`})
	if !strings.Contains(s.logs.String(), "enforcement=watch") {
		testenv.Missing(t, "storage limits are not measured by the server on this engine: %s", tail(s.logs.String(), 20))
	}

	attack(t, "fill /tmp past the limit", func(t *testing.T) string {
		id := createIn(t, s, limitedRequest("dd if=/dev/zero of=/tmp/fill bs=1M count=4096; sleep 1000000"))
		return wantDiskStopped(t, s, id)
	})

	attack(t, "a sandbox below its limit is left alone", func(t *testing.T) string {
		id := createIn(t, s, limitedRequest("sleep 1000000"))
		waitFor(t, s, id, "Running", 1)
		c := s.execd(id)
		c.t = t // a command that fails fails this attempt
		c.mustRun("dd if=/dev/zero of=/tmp/some bs=1M count=40 2>/dev/null && sync")
		time.Sleep(2 * time.Second)
		c.mustRun("rm /tmp/some && dd if=/dev/zero of=/tmp/more bs=1M count=40 2>/dev/null && sync")
		time.Sleep(2 * time.Second)
		if sb := sandboxNow(t, s, id); sb.Status.State != "Running" {
			t.Fatalf("a sandbox that wrote 40 MB, freed it and wrote 40 MB again, under 64 MiB, is %+v", sb.Status)
		}
		return "still Running after writing 40 MB twice under a 64 MiB limit"
	})

	attack(t, "fill a volume the server made", func(t *testing.T) string {
		req := limitedRequest("dd if=/dev/zero of=/data/fill bs=1M count=4096; sleep 1000000")
		del := true
		vol := "osb-e2e-disk-" + randomHex(4)
		req.Volumes = []api.Volume{{Name: "data", MountPath: "/data", PVC: &api.PVCVolume{ClaimName: vol, DeleteOnSandboxTermination: del}}}
		id := createIn(t, s, req)
		return wantDiskStopped(t, s, id, func() string {
			mount, err := exec.Command("docker", "volume", "inspect", "-f", "{{.Mountpoint}}", vol).Output()
			if err != nil {
				t.Fatalf("the sandbox's volume: %v", err)
			}
			return strings.TrimSpace(string(mount))
		})
	})

	attack(t, "hide the data in a file deleted while open", func(t *testing.T) string {
		id := createIn(t, s, limitedRequest("exec 3>/tmp/hidden; rm /tmp/hidden; dd if=/dev/zero bs=1M count=4096 >&3; sleep 1000000"))
		res := wantDiskStopped(t, s, id)
		if sb := sandboxNow(t, s, id); !strings.Contains(sb.Status.Message, "deleted but still open") {
			t.Errorf("the message does not say where the space went: %s", sb.Status.Message)
		}
		return res
	})

	attack(t, "fill /etc/hosts, a file of the engine outside the writable layer", func(t *testing.T) string {
		id := createIn(t, s, limitedRequest("dd if=/dev/zero of=/etc/hosts bs=1M count=4096; sleep 1000000"))
		return wantDiskStopped(t, s, id, func() string { return inspectContainer(t, id, "{{.HostsPath}}") })
	})

	attack(t, "reserve the disk with fallocate", func(t *testing.T) string {
		// Called directly, fallocate is refused; through the C library
		// it becomes writes, which are measured. Unrefused, one call
		// would reserve 4 GiB before any measurement.
		req := sandboxRequest(pythonImage, "python3", "-c", `
import ctypes, os, time
fd = os.open("/tmp/reserved", os.O_CREAT | os.O_WRONLY)
libc = ctypes.CDLL(None, use_errno=True)
r = libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(4 << 30))
print("fallocate", r, ctypes.get_errno(), flush=True)
os.posix_fallocate(fd, 0, 4 << 30)
time.sleep(1000000)
`)
		req.ResourceLimits["ephemeral-storage"] = "64Mi"
		req.ResourceLimits["memory"] = "256Mi" // diskMemory
		id := createIn(t, s, req)
		res := wantDiskStopped(t, s, id)
		logs, _ := exec.Command("docker", "logs", "osb-"+id).CombinedOutput()
		if !strings.Contains(string(logs), "fallocate -1 95") {
			t.Errorf("fallocate was not refused with EOPNOTSUPP: %s", tail(string(logs), 5))
			return "fallocate(2) was not refused; " + res
		}
		return "fallocate(2) refused with EOPNOTSUPP; posix_fallocate's writes " + res
	})

	attack(t, "blind the measurement with a deep directory tree", func(t *testing.T) string {
		id := createIn(t, s, limitedRequest(`d=/tmp/deep; i=0; while [ $i -lt 1100 ]; do d=$d/d; i=$((i+1)); done; mkdir -p $d; dd if=/dev/zero of=$d/fill bs=1M count=4096; sleep 1000000`))
		return wantDiskStopped(t, s, id)
	})

	attack(t, "fill the disk through the container log", func(t *testing.T) string {
		id := createIn(t, s, limitedRequest("yes 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"))
		waitFor(t, s, id, "Running", 1)
		time.Sleep(8 * time.Second)
		logPath := inspectContainer(t, id, "{{.LogPath}}")
		files, _ := filepath.Glob(logPath + "*")
		var total int64
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				total += fi.Size()
			}
		}
		if total > 24<<20 {
			t.Errorf("the container's logs take %s after 8 s of output", mib(total))
		}
		return fmt.Sprintf("after 8 s of output the logs take %s in %d files (capped at 2 × 10 MB)", mib(total), len(files))
	})

	attack(t, "escape the measurement by asking for gVisor", func(t *testing.T) string {
		req := limitedRequest("sleep 1000000")
		req.Extensions = map[string]string{"docker.runtime": "runsc"}
		resp, body := s.do("POST", "/v1/sandboxes", req)
		var e api.ErrorResponse
		json.Unmarshal(body, &e)
		if resp.StatusCode != 400 || !strings.Contains(e.Message, "ephemeral-storage") {
			// On an engine whose runsc applies seccomp profiles, the
			// sandbox is accepted and measured like any other.
			runtimes, _ := exec.Command("docker", "info", "--format", "{{json .Runtimes}}").Output()
			if resp.StatusCode == 202 && strings.Contains(string(runtimes), "oci-seccomp") {
				return "accepted: runsc applies the seccomp profile on this engine"
			}
			t.Fatalf("create of a limited gVisor sandbox: %d %s, want 400 naming ephemeral-storage", resp.StatusCode, body)
		}
		return "refused: " + e.Message
	})

	attack(t, "no limit asked: the server's default holds", func(t *testing.T) string {
		id := createIn(t, s, sandboxRequest(busyboxImage, "sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=4096; sleep 1000000"))
		sb := waitFor(t, s, id, "Failed", 2)
		if sb.Status.Reason != "DISK_LIMIT_EXCEEDED" || !strings.Contains(sb.Status.Message, "32 MiB") {
			t.Fatalf("a sandbox without a limit of its own failed with %s: %s; want DISK_LIMIT_EXCEEDED at the default 32 MiB", sb.Status.Reason, sb.Status.Message)
		}
		held := allocated(t, inspectContainer(t, id, "{{.GraphDriver.Data.UpperDir}}"))
		if bound := diskOvershoot(512 << 20); held > 32<<20+bound { // sandboxRequest's memory
			t.Errorf("it holds %s, more than %s past its limit", mib(held), mib(bound))
		}
		return fmt.Sprintf("stopped at the default limit; it holds %s, %s past it", mib(held), mib(max(held-32<<20, 0)))
	})

	attack(t, "a malformed limit", func(t *testing.T) string {
		req := limitedRequest("sleep 1")
		req.ResourceLimits["ephemeral-storage"] = "lots"
		resp, body := s.do("POST", "/v1/sandboxes", req)
		var e api.ErrorResponse
		json.Unmarshal(body, &e)
		if resp.StatusCode != 400 || e.Code != api.CodeSandboxInvalidParameter || !strings.Contains(e.Message, "ephemeral-storage") {
			t.Fatalf("create with ephemeral-storage \"lots\": %d %s, want 400 naming the key", resp.StatusCode, body)
		}
		return "400: " + e.Message
	})
}
