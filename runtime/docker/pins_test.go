package docker

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

// pinTree makes root/{dir/sub, file, inside -> dir, out -> outside,
// dir/up -> ..} and returns root and outside.
func pinTree(t testing.TB) (root, outside string) {
	t.Helper()
	tmp := t.TempDir()
	root, outside = filepath.Join(tmp, "allowed"), filepath.Join(tmp, "outside")
	for _, d := range []string{filepath.Join(root, "dir", "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "file"), []byte("f"), 0o644)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret"), 0o644)
	os.Symlink("dir", filepath.Join(root, "inside"))
	os.Symlink(outside, filepath.Join(root, "out"))
	os.Symlink("..", filepath.Join(root, "dir", "up"))
	return root, outside
}

// TestOpenBeneath: paths are opened beneath their root without following
// any link, by openat2 and by the walk older kernels use.
func TestOpenBeneath(t *testing.T) {
	root, _ := pinTree(t)
	tests := []struct {
		rel  string
		want error // nil: opened
	}{
		{"", nil},
		{"dir", nil},
		{"dir/sub", nil},
		{"file", nil},
		{"dir//sub/", nil},
		{"inside", unix.ELOOP},
		{"inside/sub", unix.ELOOP},
		{"out", unix.ELOOP},
		{"dir/up", unix.ELOOP},
		{"missing", unix.ENOENT},
		{"file/x", unix.ENOTDIR},
	}
	open := map[string]func(rel string) (int, error){
		"openat2": func(rel string) (int, error) { return openBeneath(root, rel) },
		"walk": func(rel string) (int, error) {
			rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(rfd)
			rel = strings.Trim(filepath.Clean("/"+rel), "/")
			if rel == "" {
				return unix.Dup(rfd)
			}
			return walkBeneath(rfd, rel)
		},
	}
	for name, openFn := range open {
		for _, tt := range tests {
			fd, err := openFn(tt.rel)
			if err == nil {
				unix.Close(fd)
			}
			if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Errorf("%s %q: %v, want %v", name, tt.rel, err, tt.want)
			}
		}
	}
	// The walk refuses ".." itself; openat2's RESOLVE_BENEATH refuses
	// leaving root with it.
	rfd, _ := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	defer unix.Close(rfd)
	if _, err := walkBeneath(rfd, "dir/../../outside"); !errors.Is(err, unix.EXDEV) {
		t.Errorf("walk through ..: %v", err)
	}
	if _, err := unix.Openat2(rfd, "dir/../../outside", &unix.OpenHow{Flags: unix.O_PATH, Resolve: unix.RESOLVE_BENEATH}); !errors.Is(err, unix.EXDEV) {
		t.Errorf("openat2 through ..: %v", err)
	}
}

// mountedUnder lists the mount points at or below dir.
func mountedUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// TestPinHoldsWhatWasChecked: once pinned, swapping the path for a link
// to elsewhere changes nothing at the staging path; removing the pins
// never touches the host directory.
func TestPinHoldsWhatWasChecked(t *testing.T) {
	testenv.MustHaveRoot(t)
	root, outside := pinTree(t)
	os.WriteFile(filepath.Join(root, "dir", "sub", "checked"), []byte("checked"), 0o644)
	pins := filepath.Join(t.TempDir(), "pins", "sb")
	target := filepath.Join(pins, "0-v")
	if err := pin(root, "dir/sub", target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unpin(target) })
	// The attacker's swap: the checked directory moves away and a link
	// to the host's secrets takes its place.
	if err := os.Rename(filepath.Join(root, "dir", "sub"), filepath.Join(root, "dir", "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "dir", "sub")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "checked")); err != nil || string(b) != "checked" {
		t.Fatalf("pinned directory after the swap: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(target, "secret")); err == nil {
		t.Fatal("the pin followed the swapped link")
	}
	// Pinned again now, the link is refused.
	if err := pin(root, "dir/sub", target); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("pin through the swapped link: %v", err)
	}
	// A file is pinned as a file.
	fileTarget := filepath.Join(pins, "1-f")
	if err := pin(root, "file", fileTarget); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(fileTarget); string(b) != "f" {
		t.Fatalf("pinned file reads %q", b)
	}
	if err := removePins(pins); err != nil {
		t.Fatal(err)
	}
	if got := mountedUnder(t, filepath.Dir(pins)); len(got) > 0 {
		t.Fatalf("still mounted after removePins: %v", got)
	}
	if _, err := os.Stat(pins); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pins directory left: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "dir", "moved", "checked")); err != nil || string(b) != "checked" {
		t.Fatalf("host directory after removePins: %q, %v", b, err)
	}
}

// hostVolume is a host volume of path, as the lifecycle server passes
// it: links resolved.
func hostVolume(name, mountPath, path string) sandbox.Volume {
	return sandbox.Volume{Name: name, MountPath: mountPath, HostPath: path}
}

// TestHostVolumePins: a host volume reaches the sandbox through a pin that
// is gone from the host once the container started; the sandbox reads
// and writes the host directory all the same, under runc and gVisor; its
// staging path goes with it.
func TestHostVolumePins(t *testing.T) {
	testenv.MustHaveRoot(t)
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a"), 0o755)
	os.WriteFile(filepath.Join(dir, "a", "in"), []byte("from host\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "single"), []byte("one file\n"), 0o644)
	for _, ociRuntime := range []string{"runc", "runsc"} {
		t.Run(ociRuntime, func(t *testing.T) {
			if ociRuntime == "runsc" && !rt.runtimes["runsc"] {
				testenv.Missing(t, "runsc is not a runtime of the engine (run make docker)")
			}
			id := start(t, rt, sandbox.Spec{Extensions: map[string]string{extRuntime: ociRuntime}, Volumes: []sandbox.Volume{
				hostVolume("h", "/data", filepath.Join(dir, "a")),
				hostVolume("f", "/etc/single", filepath.Join(dir, "single")),
			}})
			if got := mountedUnder(t, rt.cfg.pinsDir()); len(got) > 0 {
				t.Errorf("pins still mounted while the sandbox runs: %v", got)
			}
			out := mustRun(t, rt, id, "cat /data/in /etc/single; echo out-"+ociRuntime+" > /data/out")
			if out != "from host\none file" {
				t.Fatalf("volumes read %q", out)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "a", "out")); string(b) != "out-"+ociRuntime+"\n" {
				t.Fatalf("written to the host directory: %q", b)
			}
			if err := rt.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(rt.cfg.pinsDir(), string(id))); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("staging paths left after delete: %v", err)
			}
		})
	}
}

// TestHostVolumeSwappedAfterCheck: a path that became a link between the
// check and the mount fails the sandbox, wherever the link is; nothing is
// mounted.
func TestHostVolumeSwappedAfterCheck(t *testing.T) {
	testenv.MustHaveRoot(t)
	rt := newTestRuntime(t, nil)
	dir, outside := pinTree(t)
	// As the lifecycle server saw them: "dir/sub" and "dir", links
	// resolved. Then "dir" becomes a link to elsewhere.
	os.Rename(filepath.Join(dir, "dir"), filepath.Join(dir, "was-dir"))
	os.Symlink(outside, filepath.Join(dir, "dir"))
	for _, path := range []string{filepath.Join(dir, "dir"), filepath.Join(dir, "dir", "sub")} {
		id := sandbox.NewID()
		if _, err := rt.Create(context.Background(), id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"},
			Volumes: []sandbox.Volume{hostVolume("h", "/data", path)}}); err != nil {
			t.Fatal(err)
		}
		sb := waitState(t, rt, id, sandbox.StateFailed)
		if sb.Status.Reason != "VOLUME_CHANGED" {
			t.Fatalf("%s: status %+v", path, sb.Status)
		}
		if out, _ := exec.Command("docker", "ps", "-aq", "--filter", "name="+containerName(id)).Output(); len(strings.TrimSpace(string(out))) > 0 {
			t.Fatalf("%s: a container was made: %s", path, out)
		}
	}
}

// TestNamedVolumeSubPath: a sub path of a named volume is mounted through
// a pin (any engine version), a link in it is refused, and a volume whose
// owner goes stays while another sandbox mounts a sub path of it.
func TestNamedVolumeSubPath(t *testing.T) {
	testenv.MustHaveRoot(t)
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	name := "osb-test-sub-" + testScope()
	t.Cleanup(func() { exec.Command("docker", "volume", "rm", "-f", name).Run() })
	owner := start(t, rt, sandbox.Spec{Volumes: []sandbox.Volume{{Name: "n", MountPath: "/vol",
		Claim: &sandbox.Claim{Name: name, CreateIfNotExists: true, DeleteOnTermination: true}}}})
	mustRun(t, rt, owner, "mkdir -p /vol/team/a && echo a > /vol/team/a/f && echo top > /vol/top && ln -s / /vol/root")
	user := start(t, rt, sandbox.Spec{Volumes: []sandbox.Volume{{Name: "n", MountPath: "/sub", SubPath: "team/a",
		Claim: &sandbox.Claim{Name: name}}}})
	if got := mustRun(t, rt, user, "cat /sub/f; ls /sub"); got != "a\nf" {
		t.Fatalf("sub path shows %q", got)
	}
	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"},
		Volumes: []sandbox.Volume{{Name: "n", MountPath: "/sub", SubPath: "root", Claim: &sandbox.Claim{Name: name}}}}); err != nil {
		t.Fatal(err)
	}
	if sb := waitState(t, rt, id, sandbox.StateFailed); sb.Status.Reason != "VOLUME_CHANGED" {
		t.Fatalf("sub path through a link: %+v", sb.Status)
	}
	if err := rt.Delete(ctx, owner); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := rt.eng.volumeExists(ctx, name); !ok {
		t.Fatal("the volume was removed while another sandbox mounts a sub path of it")
	}
	if got := mustRun(t, rt, user, "cat /sub/f"); got != "a" {
		t.Fatalf("after the owner went: %q", got)
	}
	// The volume now goes with the last sandbox that names it.
	for _, id := range []sandbox.ID{id, user} {
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, _ := rt.eng.volumeExists(ctx, name); ok {
		t.Fatal("the volume outlived the last sandbox that used it")
	}
}

// TestEngineSeesPins: pins are refused for an engine on another machine
// or in another mount namespace than the server.
func TestEngineSeesPins(t *testing.T) {
	testenv.MustHaveRoot(t)
	pidFile := filepath.Join(t.TempDir(), "engine.pid")
	if err := engineSeesPins(false, pidFile); err == nil {
		t.Error("a remote engine was taken to see pins")
	}
	if err := engineSeesPins(true, pidFile); err != nil {
		t.Errorf("no pid file: %v", err)
	}
	os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
	if err := engineSeesPins(true, pidFile); err != nil {
		t.Errorf("an engine in this mount namespace: %v", err)
	}
	other := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		own, _ := os.Readlink("/proc/self/ns/mnt")
		if ns, _ := os.Readlink("/proc/" + strconv.Itoa(other.Process.Pid) + "/ns/mnt"); ns != "" && ns != own {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare did not make a mount namespace")
		}
	}
	os.WriteFile(pidFile, []byte(strconv.Itoa(other.Process.Pid)), 0o644)
	if err := engineSeesPins(true, pidFile); err == nil || !strings.Contains(err.Error(), "another mount namespace") {
		t.Errorf("an engine in another mount namespace: %v", err)
	}
}

// FuzzOpenBeneath: whatever path it is given (sub paths come from
// requests, and the tree from sandboxes), openBeneath opens something
// inside its root or nothing, by openat2 and by the walk alike; and it
// never follows a link.
func FuzzOpenBeneath(f *testing.F) {
	root, outside := pinTree(f)
	os.Symlink("/", filepath.Join(root, "dir", "sub", "to-root"))
	os.Symlink("../../..", filepath.Join(root, "dir", "sub", "up3"))
	for _, seed := range []string{"", ".", "dir", "dir/sub", "inside", "out", "dir/up", "dir/sub/to-root/etc",
		"../outside", "dir/../../outside", "/etc", "dir/sub/up3/" + filepath.Base(outside), "a\x00b", "//dir//sub/"} {
		f.Add(seed)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		check := func(how string, fd int, err error) {
			if err != nil {
				return
			}
			defer unix.Close(fd)
			got, rerr := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
			if rerr != nil {
				t.Fatal(rerr)
			}
			if got != root && !strings.HasPrefix(got, root+"/") {
				t.Fatalf("%s %q opened %s, outside %s", how, rel, got, root)
			}
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				t.Fatalf("%s %q opened a link", how, rel)
			}
		}
		fd, err := openBeneath(root, rel)
		check("openat2", fd, err)
		clean := strings.Trim(filepath.Clean("/"+rel), "/")
		if clean != "" && !strings.ContainsRune(clean, 0) {
			fd, err = walkBeneath(rootFD, clean)
			check("walk", fd, err)
		}
	})
}
