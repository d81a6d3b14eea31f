package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// Attacks on execd from inside its own sandbox: use up the sandbox's
// memory or processes so that the kernel kills execd (the sandbox then
// fails as a whole), make execd hold output until it runs out of memory,
// or read execd's access token out of the process. Each attempt ends by
// checking that the sandbox is Running, execd answers, and a new command
// works.

const baseImage = "opensandbox/base:bookworm"

// hogSandbox creates a sandbox of image limited to one CPU and 256 MiB
// and returns its id and execd.
func hogSandbox(s *server, image string) (string, *container) {
	s.t.Helper()
	req := sandboxRequest(image, "sleep", "infinity")
	req.ResourceLimits = map[string]string{"cpu": "1", "memory": "256Mi"}
	id := s.create(req)
	s.waitStateN(id, "Running", 2)
	return id, s.execd(id)
}

// answersWithin reports whether execd answers /ping within d.
func answersWithin(c *container, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/ping", nil)
	req.Header.Set(api.HeaderExecdToken, c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// execdStart returns the start time of the sandbox's PID 1 (field 22 of
// /proc/1/stat), which changes if execd is ever replaced.
func execdStart(c *container) string {
	c.t.Helper()
	stat := c.mustRun("cat /proc/1/stat")
	f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	return f[19]
}

// execdKB returns a field of execd's /proc/1/status in KiB (VmRSS, VmHWM).
func execdKB(c *container, field string) int {
	c.t.Helper()
	out := c.mustRun("grep '^" + field + ":' /proc/1/status")
	n, err := strconv.Atoi(strings.Fields(out)[1])
	if err != nil {
		c.t.Fatalf("%s of execd: %q", field, out)
	}
	return n
}

// oomKills returns how many processes the kernel's OOM killer has killed
// in the sandbox's memory cgroup (v1 or v2).
func oomKills(c *container) int {
	c.t.Helper()
	out := c.mustRun("cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null | grep '^oom_kill ' || true")
	f := strings.Fields(out)
	if len(f) < 2 {
		c.t.Fatalf("no oom_kill count in the sandbox's cgroup: %q", out)
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// survived checks what every attempt must leave: the sandbox Running,
// execd answering, the same execd as before (started at start), and a new
// command working. The attack's processes may take a while to go, so
// execd gets a minute to answer and a command a minute to start.
func survived(t *testing.T, s *server, id string, c *container, start string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !answersWithin(c, 5*time.Second) {
		if time.Now().After(deadline) {
			t.Fatal("execd no longer answers")
		}
	}
	var r result
	for {
		r = c.run("echo alive")
		if r.exit == "0" && r.stdout == "alive" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a new command does not work: exit %q, %q %q", r.exit, r.stdout, r.stderr)
		}
		time.Sleep(time.Second)
	}
	var sb api.Sandbox
	s.call("GET", "/v1/sandboxes/"+id, nil, 200, &sb)
	if sb.Status.State != "Running" {
		t.Fatalf("the sandbox is %+v", sb.Status)
	}
	if now := execdStart(c); now != start {
		t.Fatalf("execd was replaced: PID 1 started at %s, then at %s", start, now)
	}
	return "sandbox Running, execd answering, a new command works"
}

// endFromOutside ends what is left of an attack in the sandbox's
// container from the host, as an operator would when the sandbox is too
// busy to answer (a docker exec cannot start in it either): every process
// of the container but execd gets SIGKILL. The container's cgroup is found
// by the container's id, and each process is pinned (pidfd) and checked to
// be in that cgroup before it is signalled, so no process outside the
// container can be hit, however fast the attack recycles pids. It returns
// how many processes it killed.
func endFromOutside(t *testing.T, id string) int {
	t.Helper()
	testenv.MustHaveRoot(t)
	cid := strings.TrimSpace(docker(t, "ps", "-q", "--no-trunc", "--filter", "label=opensandbox.id="+id))
	if len(cid) != 64 {
		t.Fatalf("the sandbox's container is not running (docker ps: %q)", cid)
	}
	inContainer := func(pid int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		return err == nil && strings.Contains(string(b), cid)
	}
	execd, _ := strconv.Atoi(strings.TrimSpace(docker(t, "inspect", "-f", "{{.State.Pid}}", cid)))
	if execd <= 0 || !inContainer(execd) {
		t.Fatalf("execd (host pid %d) is not in container %.12s", execd, cid)
	}
	var procs string
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && (d.Name() == cid || d.Name() == "docker-"+cid+".scope") {
				procs = filepath.Join(p, "cgroup.procs")
				return fs.SkipAll
			}
			return nil
		})
		if procs != "" {
			break
		}
	}
	if procs == "" {
		t.Fatalf("no cgroup of container %.12s", cid)
	}
	killed := make(map[int]bool)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		b, err := os.ReadFile(procs)
		if err != nil {
			t.Fatalf("the container's processes: %v", err)
		}
		others := 0
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if pid <= 0 || pid == execd {
				continue
			}
			others++
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone already
			}
			// Pinned: from here the pid cannot name another process.
			if inContainer(pid) && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
				killed[pid] = true
			}
			unix.Close(fd)
		}
		if others == 0 {
			return len(killed)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes still in the container after two minutes", others)
		}
	}
}

// TestAttackExecdMemory: a sandbox of 256 MiB uses up its memory, its
// processes, or execd's own memory through its output. The fork bomb
// proves the ranking: its processes are each smaller than execd, and
// with the processes left at execd's own score (--child-oom-score-adj -1)
// the OOM killer took execd and the attempt fails ("execd no longer
// answers"). A single allocation is larger than execd and would be taken
// first by size alone; those attempts hold the outcome (the sandbox and
// execd's state go on), not the ranking. A 400 MB line grew execd to
// 230 MB until the OOM killer took it, before output was bounded.
func TestAttackExecdMemory(t *testing.T) {
	testenv.MustHaveImage(t, baseImage)
	testenv.MustHaveImage(t, pythonImage)
	s := startServer(t, serverOptions{})

	attack(t, "fork bomb (256Mi, 1 CPU, the default pids_limit 4096)", func(t *testing.T) string {
		id, c := hogSandbox(s, baseImage)
		start, kills := execdStart(c), oomKills(c)
		// A bomb that stops forking after 20 s, so that the sandbox can be
		// checked afterwards; until then it forks as fast as it can.
		bomb := `end=$((EPOCHSECONDS+20)); f(){ ((EPOCHSECONDS<end)) && { f|f& }; }; f`
		c.call("POST", "/command", api.RunCommandRequest{Command: bomb, Background: true}, 200, nil)
		answered, asked := 0, 0
		for until := time.Now().Add(20 * time.Second); time.Now().Before(until); asked++ {
			if answersWithin(c, 2*time.Second) {
				answered++
				time.Sleep(time.Second)
			}
		}
		// The bomb stops forking, but processes that wait for memory can
		// keep a sandbox of one CPU thrashing for minutes; the attempt is
		// over, and what is left of it goes the way an operator would end
		// it, from outside.
		left := endFromOutside(t, id)
		verdict := survived(t, s, id, c, start)
		killed := oomKills(c) - kills
		if killed == 0 {
			t.Fatal("the bomb never reached the memory limit: the attempt proves nothing")
		}
		return fmt.Sprintf("%d processes OOM-killed, none of them execd; execd answered %d of %d pings during the bomb; %d of its processes ended from outside; %s",
			killed, answered, asked, left, verdict)
	})

	attack(t, "one allocation of 1 GiB", func(t *testing.T) string {
		id, c := hogSandbox(s, pythonImage)
		start, kills := execdStart(c), oomKills(c)
		r := c.run("python3 -c 'b = bytearray(1 << 30); print(len(b))'")
		if r.exit != "-1" {
			t.Fatalf("the allocation was not killed: exit %q, %q %q", r.exit, r.stdout, r.stderr)
		}
		if oomKills(c) == kills {
			t.Fatal("no OOM kill: the attempt proves nothing")
		}
		return "the allocating process was OOM-killed; " + survived(t, s, id, c, start)
	})

	attack(t, "allocations that grow until the OOM killer comes, in a code context", func(t *testing.T) string {
		id, c := hogSandbox(s, pythonImage)
		start := execdStart(c)
		var cc api.CodeContext
		c.call("POST", "/code/context", api.CodeContext{Language: "python"}, 200, &cc)
		r := c.stream("/code", api.RunCodeRequest{Code: "b = []\nwhile True:\n    b.append(bytearray(16 << 20))", Context: &cc})
		var died bool
		for _, ev := range r.events {
			if ev.Type == api.EventError && ev.Error.EName == "ContextDied" {
				died = true
			}
		}
		if !died {
			t.Fatalf("the context did not die: %+v", r.events)
		}
		return "the interpreter was OOM-killed and its context reported dead; " + survived(t, s, id, c, start)
	})

	const lineBytes = 400_000_000
	line := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo", lineBytes)
	maxHWM := 64 << 10 // KiB: what execd may reach at its peak

	attack(t, "a 400 MB line, read by the client", func(t *testing.T) string {
		id, c := hogSandbox(s, baseImage)
		start := execdStart(c)
		resp := c.request("POST", "/command", api.RunCommandRequest{Command: line})
		defer resp.Body.Close()
		dec := api.NewEventDecoder(resp.Body)
		got, events, longest := 0, 0, 0
		for {
			ev, err := dec.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d bytes: %v", got, err)
			}
			if ev.Type == api.EventStdout {
				got += len(ev.Text)
				events++
				longest = max(longest, len(ev.Text))
			}
		}
		if got != lineBytes {
			t.Fatalf("the client got %d bytes of the line", got)
		}
		hwm := execdKB(c, "VmHWM")
		if hwm > maxHWM {
			t.Fatalf("execd's peak RSS was %d KiB", hwm)
		}
		return fmt.Sprintf("the line came in %d events of at most %d bytes; execd's peak RSS %d KiB; %s",
			events, longest, hwm, survived(t, s, id, c, start))
	})

	attack(t, "a 400 MB line to a client that stops reading", func(t *testing.T) string {
		id, c := hogSandbox(s, baseImage)
		start := execdStart(c)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", c.base+"/command", strings.NewReader(`{"command":`+strconv.Quote(line)+`}`))
		req.Header.Set(api.HeaderExecdToken, c.token)
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		dec := api.NewEventDecoder(resp.Body)
		for read := 0; read < 4<<20; {
			ev, err := dec.Next()
			if err != nil {
				t.Fatal(err)
			}
			read += len(ev.Text)
		}
		time.Sleep(5 * time.Second) // the client stalls
		rss := execdKB(c, "VmRSS")
		cancel()
		resp.Body.Close()
		if rss > maxHWM {
			t.Fatalf("execd's RSS was %d KiB while the client stalled", rss)
		}
		hwm := execdKB(c, "VmHWM")
		if hwm > maxHWM {
			t.Fatalf("execd's peak RSS was %d KiB", hwm)
		}
		return fmt.Sprintf("execd's RSS %d KiB while the client stalled, peak %d KiB; %s", rss, hwm, survived(t, s, id, c, start))
	})

	attack(t, "a 400 MB line into a background command's log", func(t *testing.T) string {
		id, c := hogSandbox(s, baseImage)
		start := execdStart(c)
		r := c.stream("/command", api.RunCommandRequest{Command: line, Background: true})
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			var st api.CommandStatus
			c.call("GET", "/command/status/"+r.id, nil, 200, &st)
			if !st.Running {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command did not finish")
			}
		}
		resp := c.request("GET", "/command/"+r.id+"/logs?cursor=0", nil)
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n == 0 || n > 64<<20 {
			t.Fatalf("the log holds %d bytes; want its last 64 MiB", n)
		}
		hwm := execdKB(c, "VmHWM")
		if hwm > maxHWM {
			t.Fatalf("execd's peak RSS was %d KiB", hwm)
		}
		return fmt.Sprintf("the log kept its last %d MiB, execd's peak RSS %d KiB; %s", n>>20, hwm, survived(t, s, id, c, start))
	})
}

// TestAttackExecdPids: the sandbox's processes take every pid its limit
// allows, and then its client makes execd busy. Go aborts a program that
// needs a new OS thread the kernel refuses; before execd made its threads
// at start and bounded what holds one, 60 uploads at once did that to it.
func TestAttackExecdPids(t *testing.T) {
	testenv.MustHaveImage(t, baseImage)
	s := startServer(t, serverOptions{docker: "pids_limit = 256"})
	attack(t, "every pid taken, then 100 uploads, 50 archives and 50 commands at once", func(t *testing.T) string {
		id, c := hogSandbox(s, baseImage)
		start := execdStart(c)
		hold := c.stream("/command", api.RunCommandRequest{Command: "for i in $(seq 400); do sleep 600 & done; wait", Background: true})
		// Wait until forks fail: every pid is taken.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			if r := c.run("true"); strings.Contains(r.stderr+r.exit, "resource temporarily unavailable") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the pids never ran out: the attempt proves nothing")
			}
		}
		blob := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[string]int{}
		count := func(kind string, code int) {
			mu.Lock()
			codes[kind+" "+strconv.Itoa(code)]++
			mu.Unlock()
		}
		for i := range 100 {
			wg.Go(func() {
				var body bytes.Buffer
				mw := multipart.NewWriter(&body)
				meta, _ := mw.CreateFormFile("metadata", "metadata")
				fmt.Fprintf(meta, `{"path":"/tmp/upload-%d"}`, i)
				f, _ := mw.CreateFormFile("file", "blob")
				f.Write(blob)
				mw.Close()
				req, _ := http.NewRequest("POST", c.base+"/files/upload", &body)
				req.Header.Set(api.HeaderExecdToken, c.token)
				req.Header.Set("Content-Type", mw.FormDataContentType())
				if resp, err := c.hc.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count("upload", resp.StatusCode)
				} else {
					count("upload", 0)
				}
			})
		}
		for range 50 {
			wg.Go(func() {
				req := mustRequest(c, "GET", "/files/archive?path=/usr/share/doc")
				if resp, err := c.hc.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count("archive", resp.StatusCode)
				} else {
					count("archive", 0)
				}
			})
			wg.Go(func() {
				req, _ := http.NewRequest("POST", c.base+"/command", strings.NewReader(`{"command":"true"}`))
				req.Header.Set(api.HeaderExecdToken, c.token)
				if resp, err := c.hc.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count("command", resp.StatusCode)
				} else {
					count("command", 0)
				}
			})
		}
		wg.Wait()
		if !answersWithin(c, 10*time.Second) {
			t.Fatalf("execd no longer answers after the burst (%v)", codes)
		}
		for k := range codes {
			if strings.HasSuffix(k, " 0") {
				t.Errorf("requests without an answer: %v", codes)
				break
			}
		}
		c.call("DELETE", "/command?id="+hold.id, nil, 200, nil)
		return fmt.Sprintf("answers %v; %s", codes, survived(t, s, id, c, start))
	})
}

// tokenProbe is run inside the sandbox to look for execd's token where a
// process could find it. It first shows on a process of its own that its
// methods work (reading another process's memory, tracing it), then tries
// them on PID 1, and prints one JSON object of what it found.
const tokenProbe = `
import ctypes, json, os, sys, time
token = sys.argv[1].encode()
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206

def scan(pid, secret):
    try:
        maps = open("/proc/%d/maps" % pid).read().splitlines()
    except OSError as e:
        return "maps: " + e.strerror
    try:
        mem = open("/proc/%d/mem" % pid, "rb", 0)
    except OSError as e:
        return "mem: " + e.strerror
    n = 0
    for line in maps:
        f = line.split()
        if "r" not in f[1]:
            continue
        a, b = (int(x, 16) for x in f[0].split("-"))
        try:
            mem.seek(a)
            data = mem.read(b - a)
        except (OSError, ValueError, OverflowError):
            continue
        n += len(data)
        if secret in data:
            return "FOUND"
    return "read %d bytes, not found" % n

def trace(pid):
    for req in (PTRACE_ATTACH, PTRACE_SEIZE):
        if libc.ptrace(req, pid, None, None) == 0:
            libc.ptrace(PTRACE_DETACH, pid, None, None)
            return "ATTACHED"
    return "refused: " + os.strerror(ctypes.get_errno())

def readall(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, e.strerror
    try:
        return os.read(fd, 1 << 20), "read"
    except OSError as e:
        return None, e.strerror
    finally:
        os.close(fd)

out = {}
secret = b"control-" + os.urandom(8).hex().encode()
r, w = os.pipe()
child = os.fork()
if child == 0:
    held = secret * 2
    os.write(w, b"x")
    time.sleep(60)
    os._exit(0)
os.read(r, 1)
out["control_mem"] = scan(child, secret * 2)
out["control_trace"] = trace(child)
os.kill(child, 9)
os.waitpid(child, 0)

out["mem"] = scan(1, token)
out["trace"] = trace(1)
for name in ("environ", "cmdline"):
    data, how = readall("/proc/1/" + name)
    out[name] = "FOUND" if data and token in data else how
fds = []
try:
    names = os.listdir("/proc/1/fd")
except OSError as e:
    names, fds = [], ["list: " + e.strerror]
for n in names:
    try:
        target = os.readlink("/proc/1/fd/" + n)
    except OSError as e:
        fds.append(n + ": " + e.strerror)
        continue
    data, how = readall("/proc/1/fd/" + n)
    fds.append(n + " -> " + target + (": FOUND" if data and token in data else ": " + how))
out["fds"] = fds
print(json.dumps(out))
`

// TestAttackExecdToken: a process of the sandbox, as root and as another
// user, looks for execd's token in execd's memory, environment, command
// line and open files, and tries to trace it. Before execd made itself
// non-dumpable, root in the sandbox read the token out of /proc/1/mem.
func TestAttackExecdToken(t *testing.T) {
	testenv.MustHaveImage(t, pythonImage)
	s := startServer(t, serverOptions{})
	_, c := hogSandbox(s, pythonImage)
	c.mustRun("cat > /tmp/probe.py <<'EOF'\n" + tokenProbe + "\nEOF")
	nobody := uint32(65534)
	for _, as := range []struct {
		name string
		uid  *uint32
	}{{"root", nil}, {"uid 65534", &nobody}} {
		r := c.stream("/command", api.RunCommandRequest{Command: "python3 /tmp/probe.py " + c.token, UID: as.uid})
		if r.exit != "0" {
			t.Fatalf("probe as %s: exit %q, %s", as.name, r.exit, r.stderr)
		}
		var found struct {
			ControlMem   string   `json:"control_mem"`
			ControlTrace string   `json:"control_trace"`
			Mem          string   `json:"mem"`
			Trace        string   `json:"trace"`
			Environ      string   `json:"environ"`
			Cmdline      string   `json:"cmdline"`
			Fds          []string `json:"fds"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &found); err != nil {
			t.Fatalf("probe as %s printed %q: %v", as.name, r.stdout, err)
		}
		if found.ControlMem != "FOUND" || found.ControlTrace != "ATTACHED" {
			t.Fatalf("as %s the probe cannot read or trace a process of its own (%q, %q): it would prove nothing", as.name, found.ControlMem, found.ControlTrace)
		}
		attack(t, "read the token from /proc/1/mem as "+as.name, func(t *testing.T) string {
			if strings.Contains(found.Mem, "FOUND") {
				t.Fatal("the token is in execd's memory, readable")
			}
			return found.Mem + " (the same read found a secret in a process of the probe's own)"
		})
		attack(t, "ptrace PID 1 as "+as.name, func(t *testing.T) string {
			if found.Trace == "ATTACHED" {
				t.Fatal("attached to execd")
			}
			return found.Trace + " (the probe traced a process of its own)"
		})
		attack(t, "read the token from /proc/1/environ and /proc/1/cmdline as "+as.name, func(t *testing.T) string {
			if found.Environ == "FOUND" || found.Cmdline == "FOUND" {
				t.Fatalf("environ %q, cmdline %q", found.Environ, found.Cmdline)
			}
			return "environ: " + found.Environ + "; cmdline: " + found.Cmdline + ", no token"
		})
		attack(t, "read the token through /proc/1/fd/* as "+as.name, func(t *testing.T) string {
			for _, f := range found.Fds {
				if strings.Contains(f, "FOUND") || strings.Contains(f, ": read") {
					t.Fatalf("execd's descriptor opened: %s", f)
				}
			}
			return strings.Join(found.Fds[:min(3, len(found.Fds))], "; ") + fmt.Sprintf(" (%d descriptors)", len(found.Fds))
		})
	}
}

// TestAttackExecdUnreadable: files execd may not read. An execd that is
// not root (the image's user) meets them in the sandbox's own files; as
// root it meets paths longer than the kernel takes. Each gets a proper
// error, and an archive that cannot be finished says so to every client
// rather than cutting the connection or looking whole.
func TestAttackExecdUnreadable(t *testing.T) {
	testenv.MustHaveImage(t, baseImage)
	c := startContainer(t, baseImage, []string{"--user", "65534"}, "sleep", "infinity")

	attack(t, "download a file execd may not read (/etc/shadow, execd as uid 65534)", func(t *testing.T) string {
		resp := c.request("GET", "/files/download?path=/etc/shadow", nil)
		defer resp.Body.Close()
		var e api.ErrorResponse
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusForbidden || json.Unmarshal(body, &e) != nil || e.Code != api.CodePermissionDenied {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return fmt.Sprintf("%d %s: %s", resp.StatusCode, e.Code, e.Message)
	})
	attack(t, "archive a directory execd may not list (/root)", func(t *testing.T) string {
		resp := c.request("GET", "/files/archive?path=/root", nil)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), api.CodePermissionDenied) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
	})
	attack(t, "archive a tree with files execd may not read (/etc)", func(t *testing.T) string {
		resp := c.request("GET", "/files/archive?path=/etc", nil)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("the connection was cut: %v", err)
		}
		reason := resp.Trailer.Get(api.HeaderArchiveError)
		if resp.StatusCode != http.StatusOK || !strings.Contains(reason, "permission denied") {
			t.Fatalf("%d, trailer %q", resp.StatusCode, reason)
		}
		tr := tar.NewReader(bytes.NewReader(body))
		n := 0
		for {
			_, err := tr.Next()
			if err == io.EOF {
				t.Fatalf("a tar reader took the archive as whole (%d entries)", n)
			}
			if err != nil {
				break
			}
			n++
		}
		return fmt.Sprintf("%d entries, then an entry cut short and the trailer %q", n, reason)
	})

	testenv.MustHaveImage(t, busyboxImage)
	s := startServer(t, serverOptions{})
	attack(t, "osb cp of a tree the sandbox cannot finish packing", func(t *testing.T) string {
		id := s.create(sandboxRequest(baseImage, "sleep", "infinity"))
		s.waitStateN(id, "Running", 2)
		sc := s.execd(id)
		// A chain of directories deeper than the kernel takes a path.
		sc.mustRun(`mkdir /tmp/t && cd /tmp/t && echo kept > a && d=$(printf 'd%.0s' $(seq 250)) && for i in $(seq 18); do mkdir $d && cd $d; done && echo lost > bottom`)
		dst := filepath.Join(t.TempDir(), "out")
		r := s.osb("cp", id+":/tmp/t", dst)
		r.fails(t, 1, "incomplete")
		if b, err := os.ReadFile(filepath.Join(dst, "a")); err != nil || string(b) != "kept\n" {
			t.Errorf("the file before the failure: %q, %v", b, err)
		}
		first, _, _ := strings.Cut(r.err, "\n")
		return first
	})
}
