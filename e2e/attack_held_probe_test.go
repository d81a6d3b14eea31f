package e2e

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// probeScript is what untrusted code in a sandbox tries, as a Python
// program, so that each attempt reports the exact errno it met:
//
//	probe.py priv                  capabilities, raw sockets, mounts, setuid, /proc and /sys
//	probe.py ns HEXMARKER PORT     namespaces, host processes, a host loopback listener
//	probe.py engine                engine sockets on disk and abstract, the engine's TCP ports
//	probe.py connect JSON          TCP connections to ["host:port", ...] ("gw" is the gateway)
//	probe.py secret HEXSECRET      where a string can be read: /proc, descriptors, files
//
// It prints one JSON object, attempt → result. Results start with "done"
// when the attempt succeeded and "refused: ERRNO" when it did not. Every
// attempt is harmless even where it succeeds (values are written back
// unchanged, routes go to the documentation range 192.0.2.0/24, mounts
// are undone), since the controls run it where the boundary is off.
const probeScript = `
import ctypes, errno, fcntl, json, os, shutil, socket, stat, struct, sys, threading

libc = ctypes.CDLL(None, use_errno=True)

def check(ret):
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def attempt(fn):
    try:
        r = fn()
        return "done" if r is None else "done: " + str(r)
    except socket.timeout:
        return "refused: timeout"
    except OSError as e:
        return "refused: " + errno.errorcode.get(e.errno, str(e.errno))

def in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except OSError as e:
            os._exit(e.errno or 255)
    _, st = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(st)
    if code:
        raise OSError(code, os.strerror(code))

def sockaddr(ip):
    return struct.pack("=HH4s8x", socket.AF_INET, 0, socket.inet_aton(ip))

def add_route():
    dev = ctypes.create_string_buffer(b"lo")
    rt = struct.pack("@L16s16s16sHhLPhPLLH", 0, sockaddr("192.0.2.0"), sockaddr("0.0.0.0"),
                     sockaddr("255.255.255.0"), 1, 0, 0, 0, 0, ctypes.addressof(dev), 0, 0, 0)
    with socket.socket() as s:
        fcntl.ioctl(s, 0x890B, rt + bytes(8))  # SIOCADDRT

def set_mtu():
    with socket.socket() as s:
        cur = struct.unpack("16si", fcntl.ioctl(s, 0x8921, struct.pack("16si", b"lo", 0)))[1]  # SIOCGIFMTU
        fcntl.ioctl(s, 0x8922, struct.pack("16si", b"lo", cur))  # SIOCSIFMTU, unchanged

def mount_tmpfs():
    os.makedirs("/tmp/probe-mnt", exist_ok=True)
    check(libc.mount(b"none", b"/tmp/probe-mnt", b"tmpfs", 0, None))
    libc.umount2(b"/tmp/probe-mnt", 0)

def mknod():
    os.mknod("/tmp/probe-null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.unlink("/tmp/probe-null")

def setuid_gain():
    # A setuid-root copy of the interpreter, run by uid 65534: with
    # no_new_privs the kernel ignores the setuid bit.
    exe = "/tmp/probe-suid"
    shutil.copy(os.path.realpath(sys.executable), exe)
    os.chmod(exe, 0o4755)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        os.execv(exe, [exe, "-c", "import os; print(os.geteuid())"])
    os.close(w)
    out = os.read(r, 100).decode().strip()
    os.waitpid(pid, 0)
    os.unlink(exe)
    return "euid " + out

def write_back(path):
    def fn():
        with open(path) as f:
            cur = f.read()
        with open(path, "w") as f:
            f.write(cur)
    return fn

def read_kcore():
    with open("/proc/kcore", "rb") as f:
        return f.read(4).hex() or "empty"

def open_sysrq():
    os.close(os.open("/proc/sysrq-trigger", os.O_WRONLY))  # opened, never written

def mount_flag(path):
    return "ro" if os.statvfs(path).f_flag & os.ST_RDONLY else "rw"

def priv():
    out = {}
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
    for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "Seccomp", "NoNewPrivs"):
        out[k] = status.get(k, "").strip()
    out["raw socket"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())
    out["packet socket"] = attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close())
    out["set link mtu"] = attempt(set_mtu)
    out["add route"] = attempt(add_route)
    out["mount tmpfs"] = attempt(mount_tmpfs)
    out["mknod"] = attempt(mknod)
    out["unshare user"] = attempt(lambda: in_child(lambda: check(libc.unshare(0x10000000))))
    out["unshare mount"] = attempt(lambda: in_child(lambda: check(libc.unshare(0x00020000))))
    out["setuid binary as nobody"] = attempt(setuid_gain)
    out["write /proc/sys"] = attempt(write_back("/proc/sys/kernel/hostname"))
    out["write /sys"] = attempt(write_back("/sys/class/net/lo/mtu"))
    out["/proc/sys mount"] = mount_flag("/proc/sys")
    out["/sys mount"] = mount_flag("/sys")
    out["read /proc/kcore"] = attempt(read_kcore)
    out["open /proc/sysrq-trigger"] = attempt(open_sysrq)
    return out

def recv_from(host, port, send=b""):
    with socket.create_connection((host, port), timeout=3) as s:
        s.settimeout(3)
        if send:
            s.sendall(send)
        try:
            return s.recv(200).decode(errors="replace")
        except socket.timeout:
            return "(connected, nothing received)"

def ns(marker, port):
    out = {}
    for n in ("net", "pid", "ipc", "uts", "mnt"):
        out["ns " + n] = os.readlink("/proc/self/ns/" + n)
    seen = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/cmdline" % p, "rb") as f:
                    if marker in f.read():
                        seen.append(p)
            except OSError:
                pass
    out["host process"] = "seen as pid " + ",".join(seen) if seen else "not seen"
    out["host listener"] = attempt(lambda: recv_from("127.0.0.1", port))
    return out

def gateway():
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(f[2], 16)))
    return None

def sockets_on_disk():
    found = []
    for top in os.listdir("/"):
        if top in ("proc", "sys"):
            continue
        for d, dirs, files in os.walk("/" + top):
            for n in dirs + files:
                p = os.path.join(d, n)
                try:
                    if stat.S_ISSOCK(os.lstat(p).st_mode):
                        found.append(p)
                except OSError:
                    pass
    return found

def ping_unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    try:
        s.connect(path)
        s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
        return s.recv(200).decode(errors="replace")
    finally:
        s.close()

def engine():
    out = {}
    for p in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
              "/run/docker/containerd/containerd.sock", "/var/run/docker", "/run/docker", "/run/containerd"):
        out["exists " + p] = "yes" if os.path.lexists(p) else "no"
    socks = sockets_on_disk()
    out["sockets on disk"] = socks
    for p in socks:
        out["ping " + p] = attempt(lambda: ping_unix(p))
    abstract = [l.split()[-1] for l in open("/proc/net/unix").read().splitlines()[1:] if l.split()[-1].startswith("@")]
    out["abstract sockets"] = abstract
    gw = gateway()
    out["gateway"] = gw
    for port in (2375, 2376):
        out["engine tcp %d" % port] = attempt(lambda: recv_from(gw, port, b"GET /_ping HTTP/1.0\r\n\r\n"))
    out["DOCKER_HOST"] = os.environ.get("DOCKER_HOST", "")
    return out

def connect(targets):
    out = {}
    gw = gateway()
    def one(t):
        host, port = t.rsplit(":", 1)
        if host == "gw":
            host = gw
        out[t] = attempt(lambda: recv_from(host, int(port), b"GET / HTTP/1.0\r\n\r\n"))
    threads = [threading.Thread(target=one, args=(t,)) for t in targets]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out

def secret(s):
    found = []
    def look(where, data):
        if s in data:
            found.append(where)
    for k, v in os.environ.items():
        look("own environment " + k, (k + "=" + v).encode())
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        for f in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (p, f), "rb") as fh:
                    look("/proc/%s/%s" % (p, f), fh.read())
            except OSError:
                pass
        try:
            fds = os.listdir("/proc/%s/fd" % p)
        except OSError:
            continue
        for fd in fds:
            path = "/proc/%s/fd/%s" % (p, fd)
            try:
                target = os.readlink(path)
                look(path + " -> " + target, target.encode())
                if target.startswith("/memfd:") or (target.startswith("/") and stat.S_ISREG(os.stat(path).st_mode)):
                    with open(path, "rb") as fh:
                        look(path + " (" + target + ")", fh.read(1 << 20))
            except OSError:
                pass
    for top in os.listdir("/"):
        if top in ("proc", "sys", "dev"):
            continue
        for d, dirs, files in os.walk("/" + top):
            for n in files:
                p = os.path.join(d, n)
                try:
                    if stat.S_ISREG(os.lstat(p).st_mode):
                        with open(p, "rb") as fh:
                            look(p, fh.read())
                except OSError:
                    pass
    return {"found": found}

mode = sys.argv[1]
if mode == "priv":
    result = priv()
elif mode == "ns":
    result = ns(bytes.fromhex(sys.argv[2]), int(sys.argv[3]))
elif mode == "engine":
    result = engine()
elif mode == "connect":
    result = connect(json.loads(sys.argv[2]))
elif mode == "secret":
    result = secret(bytes.fromhex(sys.argv[2]))
print(json.dumps(result, sort_keys=True))
`

// probePath is where the probe is put inside sandboxes.
const probePath = "/tmp/osb-probe.py"

// putProbe uploads the probe into a sandbox through its files API.
func (c *container) putProbe() {
	c.t.Helper()
	c.upload(map[string][]byte{probePath: []byte(probeScript)}, nil)
}

// probe runs the probe in the sandbox (as uid, when not nil) and decodes
// its report.
func (c *container) probe(uid *uint32, args ...string) map[string]any {
	c.t.Helper()
	r := c.stream("/command", api.RunCommandRequest{Command: "python3 " + probePath + " " + shellQuote(args...), UID: uid})
	if r.exit != "0" {
		c.t.Fatalf("probe %v: exit %q, stdout %q, stderr %q", args, r.exit, r.stdout, r.stderr)
	}
	return decodeProbe(c.t, r.stdout)
}

func decodeProbe(t *testing.T, out string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("probe report %q: %v", out, err)
	}
	return m
}

// probeControl runs the probe in a throwaway container that docker run
// starts with flags instead of the server's hardening: where a boundary
// is off on purpose, the probe must see it off, or the probe itself
// could not tell a broken boundary from a whole one.
func probeControl(t *testing.T, flags []string, args ...string) map[string]any {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "probe.py")
	if err := os.WriteFile(script, []byte(probeScript), 0o644); err != nil {
		t.Fatal(err)
	}
	run := append([]string{"run", "--rm", "--label", "osb-e2e=1", "-v", script + ":/probe.py:ro"}, flags...)
	run = append(run, pythonImage, "python3", "/probe.py")
	out := docker(t, append(run, args...)...)
	return decodeProbe(t, strings.TrimSpace(out))
}

// shellQuote quotes words for sh.
func shellQuote(words ...string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// hexOf is the form the probe takes markers and secrets in, so that the
// string searched for is not on the probe's own command line.
func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

// str reads a probe result as text.
func str(m map[string]any, key string) string {
	switch v := m[key].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// refused reports whether a probe attempt failed.
func refused(result string) bool { return strings.HasPrefix(result, "refused: ") }
