package docker

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestDeleteDuringCreateLeavesNothing: deletes racing creates, at every
// step of provisioning, leave no container and no sandbox behind, even
// after a reconcile.
func TestDeleteDuringCreateLeavesNothing(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	for i := range 15 {
		id := sandbox.NewID()
		if _, err := rt.Create(ctx, id, sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%10) * 4 * time.Millisecond)
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	if err := rt.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // engine events of the last removals
	if err := rt.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if all, _ := rt.List(ctx); len(all) != 0 {
		t.Fatalf("%d sandboxes came back after their delete", len(all))
	}
	if cs, _ := rt.eng.list(ctx, rt.scopeLabel()); len(cs) != 0 {
		t.Fatalf("%d containers left behind", len(cs))
	}
}

// stalledRegistry accepts connections and never answers.
func stalledRegistry(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	return ln.Addr().String()
}

// TestDeleteAbandonsStalledPull: deleting the only sandbox waiting for a
// pull cancels the pull, and an endpoint request waiting for its ports
// returns.
func TestDeleteAbandonsStalledPull(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	id := sandbox.NewID()
	if _, err := rt.Create(ctx, id, sandbox.Spec{Image: stalledRegistry(t) + "/x/y:z", Entrypoint: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pull", func() bool { sb, _ := rt.Get(ctx, id); return sb.Status.Reason == "PULLING_IMAGE" })
	endpointErr := make(chan error, 1)
	go func() {
		_, err := rt.Endpoint(ctx, id, api.ExecdPort)
		endpointErr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-endpointErr:
		if !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("endpoint of a deleted sandbox: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an endpoint request still waits for a deleted sandbox")
	}
	waitFor(t, "the pull to be abandoned", func() bool {
		rt.pulls.mu.Lock()
		defer rt.pulls.mu.Unlock()
		return len(rt.pulls.inflight) == 0
	})
}

// TestImageRemovedAfterUse: an image the runtime saw a moment ago and
// that was removed since is looked at again, not taken to be there.
func TestImageRemovedAfterUse(t *testing.T) {
	rt := newTestRuntime(t, func(c *Config) { c.PullPolicy = "never" })
	tag := "opensandbox/test-vanishing:" + testScope()
	if out, err := exec.Command("docker", "tag", testImage, tag).CombinedOutput(); err != nil {
		t.Fatalf("docker tag: %v: %s", err, out)
	}
	defer exec.Command("docker", "rmi", tag).Run()
	start(t, rt, sandbox.Spec{Image: tag})
	if out, err := exec.Command("docker", "rmi", tag).CombinedOutput(); err != nil {
		t.Fatalf("docker rmi: %v: %s", err, out)
	}
	id := sandbox.NewID()
	if _, err := rt.Create(context.Background(), id, sandbox.Spec{Image: tag, Entrypoint: []string{"sleep", "100"}}); err != nil {
		t.Fatal(err)
	}
	sb := waitState(t, rt, id, sandbox.StateFailed)
	if sb.Status.Reason != "IMAGE_NOT_FOUND" {
		t.Fatalf("status %+v", sb.Status)
	}
}

// TestImageWithNonRootUser: an image whose USER is not root starts, and
// its commands run as that user, as with the reference daemon.
func TestImageWithNonRootUser(t *testing.T) {
	testenv.MustHaveImage(t, testImage)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+testImage+"\nUSER 65534:65534\n"), 0o644)
	tag := "opensandbox/test-nonroot:" + testScope()
	if out, err := exec.Command("docker", "build", "-q", "-t", tag, dir).CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })
	rt := newTestRuntime(t, nil)
	id := start(t, rt, sandbox.Spec{Image: tag})
	if got := mustRun(t, rt, id, "id -u; cat /proc/1/status | grep '^Uid' | cut -f2"); got != "65534\n65534" {
		t.Fatalf("as the image's user: %q", got)
	}
}

// TestVolumes: a host directory and a named volume, the latter removed
// with its sandbox when asked.
func TestVolumes(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "in"), []byte("from host\n"), 0o644)
	volName := "osb-test-" + testScope()
	id := start(t, rt, sandbox.Spec{Volumes: []sandbox.Volume{
		{Name: "h", MountPath: "/data", HostPath: host},
		{Name: "n", MountPath: "/named", Claim: &sandbox.Claim{Name: volName, CreateIfNotExists: true, DeleteOnTermination: true}},
	}})
	if got := mustRun(t, rt, id, "cat /data/in; echo out > /data/out; echo v > /named/f; cat /named/f"); got != "from host\nv" {
		t.Fatalf("volumes: %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(host, "out")); string(b) != "out\n" {
		t.Fatalf("written to the host volume: %q", b)
	}
	if _, ok, _ := rt.eng.volumeExists(ctx, volName); !ok {
		t.Fatal("named volume not created")
	}
	rt.Delete(ctx, id)
	if _, ok, _ := rt.eng.volumeExists(ctx, volName); ok {
		t.Fatal("named volume marked deleteOnSandboxTermination survived its sandbox")
	}
	_, err := rt.Create(ctx, sandbox.NewID(), sandbox.Spec{Image: testImage, Entrypoint: []string{"x"}, Volumes: []sandbox.Volume{
		{Name: "n", MountPath: "/x", Claim: &sandbox.Claim{Name: "osb-no-such-volume"}}}})
	if err == nil {
		t.Fatal("a missing volume without createIfNotExists was accepted")
	}
}

// TestForeignNamedVolumesRefused: a named volume this server did not
// make is refused unless allowlisted.
func TestForeignNamedVolumesRefused(t *testing.T) {
	name := "osb-foreign-" + testScope()
	if out, err := exec.Command("docker", "volume", "create", name).CombinedOutput(); err != nil {
		t.Fatalf("docker volume create: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("docker", "volume", "rm", "-f", name).Run() })
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	spec := sandbox.Spec{Image: testImage, Entrypoint: []string{"sleep", "1000"},
		Volumes: []sandbox.Volume{{Name: "v", MountPath: "/v", Claim: &sandbox.Claim{Name: name, CreateIfNotExists: true}}}}
	if _, err := rt.Create(ctx, sandbox.NewID(), spec); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("foreign volume: %v, want ErrInvalid", err)
	}
	allowed := newTestRuntime(t, func(c *Config) { c.NamedVolumeAllowlist = []string{"osb-foreign-"} })
	id := sandbox.NewID()
	if _, err := allowed.Create(ctx, id, spec); err != nil {
		t.Fatalf("allowlisted volume: %v", err)
	}
	waitState(t, allowed, id, sandbox.StateRunning)
}
