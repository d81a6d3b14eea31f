package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// The attempts in this file are the ones that held when the boundary was
// first tried as an attacker would (issue 13): they are here so that they
// keep holding. Each says, where it is not plain, why it would fail if
// the boundary broke; most also run their probe where the boundary is
// off on purpose (a control), which proves the probe can see a break.

// hostNamespaces returns this process's namespace links (net, pid, ...).
func hostNamespaces(t *testing.T) map[string]string {
	t.Helper()
	ns := map[string]string{}
	for _, n := range []string{"net", "pid", "ipc", "uts", "mnt"} {
		l, err := os.Readlink("/proc/self/ns/" + n)
		if err != nil {
			t.Fatal(err)
		}
		ns[n] = l
	}
	return ns
}

// hostMarkerProcess starts a process on this host whose command line
// holds marker, and stops it when the test ends.
func hostMarkerProcess(t *testing.T, marker string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 3600; : "+marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
}

// hostLoopbackListener listens on this host's 127.0.0.1 and greets every
// connection with greeting; it returns the port.
func hostLoopbackListener(t *testing.T, greeting string) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(greeting))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// pythonSandbox creates a Python sandbox on s, waits for it and returns
// its id and an execd client with the probe in place.
func pythonSandbox(s *server, entrypoint ...string) (string, *container) {
	s.t.Helper()
	if len(entrypoint) == 0 {
		entrypoint = []string{"sleep", "infinity"}
	}
	id := s.create(sandboxRequest(pythonImage, entrypoint...))
	s.waitState(id, "Running", 60*time.Second)
	c := s.execd(id)
	c.putProbe()
	return id, c
}

// TestAttackPrivileges: root in a sandbox holds only the documented
// capabilities, under seccomp and no_new_privs, in namespaces of its own,
// with /proc/sys and /sys read-only.
func TestAttackPrivileges(t *testing.T) {
	s := startServer(t, serverOptions{})
	_, c := pythonSandbox(s)
	marker := "osb-attack-host-process-" + randomHex(8)
	hostMarkerProcess(t, marker)
	greeting := "host-loopback-" + randomHex(8)
	port := hostLoopbackListener(t, greeting)
	host := hostNamespaces(t)

	priv := c.probe(nil, "priv")
	nsr := c.probe(nil, "ns", hexOf(marker), fmt.Sprint(port))

	// The controls: the same probe with the hardening off must see every
	// attempt succeed, or a "refused" in the sandbox would prove nothing.
	// (All capabilities but SYS_RESOURCE, which root on some hosts lacks;
	// no seccomp, AppArmor or masked /proc paths; no no-new-privileges.)
	open := probeControl(t, []string{"--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
		"--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
		"--security-opt", "systempaths=unconfined"}, "priv")
	for _, k := range []string{"raw socket", "packet socket", "set link mtu", "add route", "mount tmpfs",
		"mknod", "unshare user", "unshare mount", "write /proc/sys"} {
		if refused(str(open, k)) {
			t.Fatalf("control: %q is refused even without the hardening (%s): the probe cannot see a break", k, str(open, k))
		}
	}
	if str(open, "setuid binary as nobody") != "done: euid 0" || str(open, "Seccomp") != "0" || str(open, "NoNewPrivs") != "0" {
		t.Fatalf("control: setuid %q, Seccomp %q, NoNewPrivs %q: the probe cannot see a break",
			str(open, "setuid binary as nobody"), str(open, "Seccomp"), str(open, "NoNewPrivs"))
	}
	shared := probeControl(t, []string{"--pid=host", "--network=host", "--ipc=host", "--uts=host"}, "ns", hexOf(marker), fmt.Sprint(port))
	if !strings.HasPrefix(str(shared, "host process"), "seen") || str(shared, "host listener") != "done: "+greeting ||
		str(shared, "ns net") != host["net"] || str(shared, "ns pid") != host["pid"] {
		t.Fatalf("control in the host's namespaces: %v: the probe cannot see a break", shared)
	}

	attack(t, "capabilities beyond the documented set", func(t *testing.T) string {
		want := docCapabilities(t)
		mask := capabilityMask(t, want)
		for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
			if got := str(priv, k); got != mask {
				t.Errorf("%s = %s, want %s (%v, docs/configuration.md)", k, got, mask, want)
			}
		}
		if got := str(priv, "CapAmb"); got != "0000000000000000" {
			t.Errorf("CapAmb = %s, want none", got)
		}
		return fmt.Sprintf("root holds CapEff %s = %v, bounding set the same", str(priv, "CapEff"), want)
	})
	refusedAttempt := func(name, key, why string) {
		attack(t, name, func(t *testing.T) string {
			got := str(priv, key)
			if !refused(got) {
				t.Errorf("%s: %s; %s", key, got, why)
			}
			return got
		})
	}
	refusedAttempt("raw socket (NET_RAW)", "raw socket", "a raw socket crafts and spoofs packets")
	refusedAttempt("packet socket (NET_RAW)", "packet socket", "a packet socket sniffs and injects frames")
	refusedAttempt("change a link (NET_ADMIN)", "set link mtu", "NET_ADMIN would let the sandbox rewrite its own network")
	refusedAttempt("add a route (NET_ADMIN)", "add route", "NET_ADMIN would let the sandbox rewrite its own network")
	refusedAttempt("mount a file system (SYS_ADMIN)", "mount tmpfs", "SYS_ADMIN is the door to most container escapes")
	refusedAttempt("make a device node (MKNOD)", "mknod", "a device node of the host's disk would bypass the file system")
	refusedAttempt("new user namespace (seccomp)", "unshare user", "a user namespace gives back every capability inside it")
	refusedAttempt("new mount namespace", "unshare mount", "a mount namespace of its own needs SYS_ADMIN")
	refusedAttempt("write /proc/sys", "write /proc/sys", "kernel settings must stay read-only")
	refusedAttempt("write /sys", "write /sys", "sysfs must stay read-only")
	attack(t, "setuid-root binary run by nobody (no-new-privileges)", func(t *testing.T) string {
		got := str(priv, "setuid binary as nobody")
		if got != "done: euid 65534" {
			t.Errorf("a setuid-root copy of python run by uid 65534: %s, want euid 65534", got)
		}
		if str(priv, "NoNewPrivs") != "1" {
			t.Errorf("NoNewPrivs %s, want 1", str(priv, "NoNewPrivs"))
		}
		return got + ", NoNewPrivs " + str(priv, "NoNewPrivs")
	})
	attack(t, "seccomp off", func(t *testing.T) string {
		if got := str(priv, "Seccomp"); got != "2" {
			t.Errorf("Seccomp: %s, want 2 (filtering)", got)
		}
		return "Seccomp: " + str(priv, "Seccomp")
	})
	attack(t, "read-only /proc/sys and /sys", func(t *testing.T) string {
		if str(priv, "/proc/sys mount") != "ro" || str(priv, "/sys mount") != "ro" {
			t.Errorf("/proc/sys %s, /sys %s; want both ro", str(priv, "/proc/sys mount"), str(priv, "/sys mount"))
		}
		return "/proc/sys " + str(priv, "/proc/sys mount") + ", /sys " + str(priv, "/sys mount")
	})
	attack(t, "/proc/kcore and /proc/sysrq-trigger", func(t *testing.T) string {
		// /proc/kcore is the host's memory as an ELF core file: reading
		// its magic means it is readable. sysrq-trigger is opened for
		// writing, never written.
		kcore, sysrq := str(priv, "read /proc/kcore"), str(priv, "open /proc/sysrq-trigger")
		if kcore != "done: empty" && !refused(kcore) {
			t.Errorf("/proc/kcore: %s", kcore)
		}
		if !refused(sysrq) {
			t.Errorf("/proc/sysrq-trigger opened for writing: %s", sysrq)
		}
		note := ""
		if _, err := os.Stat("/proc/kcore"); err != nil {
			note = " (this host's kernel has no /proc/kcore)"
		}
		return "kcore " + kcore + ", sysrq-trigger " + sysrq + note
	})
	for _, n := range []string{"net", "pid", "ipc", "uts", "mnt"} {
		attack(t, "the host's "+n+" namespace", func(t *testing.T) string {
			got := str(nsr, "ns "+n)
			if got == host[n] {
				t.Errorf("the sandbox shares the host's %s namespace %s", n, got)
			}
			return "sandbox " + got + ", host " + host[n]
		})
	}
	attack(t, "see host processes", func(t *testing.T) string {
		got := str(nsr, "host process")
		if got != "not seen" {
			t.Errorf("a process of the host (%s): %s", marker, got)
		}
		return got
	})
	attack(t, "reach the host's 127.0.0.1", func(t *testing.T) string {
		got := str(nsr, "host listener")
		if !refused(got) {
			t.Errorf("a listener on the host's 127.0.0.1:%d: %s", port, got)
		}
		return got
	})
}

// unused keeps imports while the file grows.
var _ = api.HeaderAPIKey
