package docker

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestHardening: the container runs with the reduced capability set,
// no-new-privileges, a pids limit, no engine socket, and still lets root
// install a package.
func TestHardening(t *testing.T) {
	testenv.MustHaveImage(t, "opensandbox/python:3.11")
	testenv.MustHaveCommand(t, "dpkg-deb")
	rt := newTestRuntime(t, nil)
	id := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"sleep", "infinity"},
		Resources: sandbox.Resources{MemoryBytes: 256 << 20, CPUMillis: 500}})
	status := mustRun(t, rt, id, "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
	capEff, _ := strconv.ParseUint(strings.Fields(strings.Split(status, "\n")[0])[1], 16, 64)
	const netRaw, mknod, sysAdmin, netAdmin = 13, 27, 21, 12
	for _, c := range []uint{netRaw, mknod, sysAdmin, netAdmin} {
		if capEff&(1<<c) != 0 {
			t.Errorf("capability %d is effective: %s", c, status)
		}
	}
	if !strings.Contains(status, "NoNewPrivs:\t1") {
		t.Errorf("no-new-privileges is off: %s", status)
	}
	if got := mustRun(t, rt, id, "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"); got != "4096" {
		t.Errorf("pids.max = %q", got)
	}
	if got := mustRun(t, rt, id, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"); got != strconv.Itoa(256<<20) {
		t.Errorf("memory limit = %q", got)
	}
	if out, _ := run(t, rt, id, "ls /var/run/docker.sock /run/docker.sock"); out != "" {
		t.Errorf("engine socket inside: %q", out)
	}

	// A package whose installation needs chown and a maintainer script.
	pkg := t.TempDir()
	os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755)
	os.MkdirAll(filepath.Join(pkg, "usr/share/osb-test"), 0o755)
	os.WriteFile(filepath.Join(pkg, "usr/share/osb-test/file"), []byte("installed\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: osb-test\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n"), 0o644)
	os.WriteFile(filepath.Join(pkg, "DEBIAN/postinst"), []byte("#!/bin/sh\nchown nobody:nogroup /usr/share/osb-test/file\n"), 0o755)
	deb := filepath.Join(t.TempDir(), "osb-test.deb")
	if out, err := exec.Command("dpkg-deb", "--build", "--root-owner-group", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, out)
	}
	if out, err := exec.Command("docker", "cp", deb, containerName(id)+":/tmp/osb-test.deb").CombinedOutput(); err != nil {
		t.Fatalf("docker cp: %v: %s", err, out)
	}
	mustRun(t, rt, id, "dpkg -i /tmp/osb-test.deb >/dev/null")
	if got := mustRun(t, rt, id, "stat -c '%U %s' /usr/share/osb-test/file"); got != "nobody 10" {
		t.Fatalf("installed file: %q", got)
	}
}

// TestGVisor runs a sandbox under gVisor, asked for per sandbox.
func TestGVisor(t *testing.T) {
	testenv.MustHaveDocker(t)
	rt := newTestRuntime(t, nil)
	info, err := rt.eng.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !info.runtimes["runsc"] {
		testenv.Missing(t, "runsc is not a runtime of the engine (run make docker)")
	}
	id := start(t, rt, sandbox.Spec{Extensions: map[string]string{extRuntime: "runsc"}})
	if got := mustRun(t, rt, id, "dmesg | head -n 1"); !strings.Contains(got, "gVisor") {
		t.Fatalf("dmesg in a runsc sandbox: %q", got)
	}
	if _, err := rt.Create(context.Background(), sandbox.NewID(), sandbox.Spec{Image: testImage, Entrypoint: []string{"x"},
		Extensions: map[string]string{extRuntime: "kata"}}); err == nil {
		t.Fatal("a runtime outside allowed_runtimes was accepted")
	}
}

// TestSandboxesCannotReachEachOther: on the runtime's network, one
// sandbox cannot open a connection to another's address.
func TestSandboxesCannotReachEachOther(t *testing.T) {
	testenv.MustHaveImage(t, "opensandbox/python:3.11")
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	a := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"python3", "-m", "http.server", "8080"}})
	b := start(t, rt, sandbox.Spec{Image: "opensandbox/python:3.11", Entrypoint: []string{"sleep", "infinity"}})
	ipA := mustRun(t, rt, a, "hostname -i")
	// A reaches itself: the server is up.
	fetch := `python3 -c "import urllib.request; print(urllib.request.urlopen('http://%s:8080/', timeout=3).status)"`
	if got := mustRun(t, rt, a, strings.Replace(fetch, "%s", ipA, 1)); got != "200" {
		t.Fatalf("a to itself: %q", got)
	}
	if out, exit := run(t, rt, b, strings.Replace(fetch, "%s", ipA, 1)+" 2>&1"); exit == "0" {
		t.Fatalf("sandbox b reached sandbox a at %s: %q", ipA, out)
	}
	_ = ctx
}
