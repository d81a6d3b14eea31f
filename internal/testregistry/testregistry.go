// Package testregistry runs a real image registry for tests: Debian's
// docker-registry on a loopback port, with password authentication, holding
// a copy of a local image. Only tests import it.
package testregistry

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

// Start runs the registry with one user, pushes an image made from the
// local image src to it (through the Docker engine), and returns the
// image's reference there. The pushed image is src with a label of its
// own, so that its ID is no other image's: a kubelet that pulled it with
// credentials would otherwise want credentials for src too (it verifies
// access to images pulled with credentials by their ID). The engine's own
// copy of the reference is removed, so that whoever uses it has to pull
// it. Everything goes when the test ends.
func Start(t testing.TB, src, user, pass string) string {
	t.Helper()
	bin := testenv.MustHaveCommand(t, "docker-registry")
	testenv.MustHaveDocker(t)
	dir := t.TempDir()
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	config := fmt.Sprintf(`version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: %s
http:
  addr: %s
auth:
  htpasswd:
    realm: osb-test
    path: %s
`, filepath.Join(dir, "data"), addr, filepath.Join(dir, "htpasswd"))
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the registry did not come up")
		}
	}
	ref := addr + "/osb/busybox:test"
	login := exec.Command("docker", "login", "--username", user, "--password-stdin", addr)
	login.Stdin = strings.NewReader(pass)
	if out, err := login.CombinedOutput(); err != nil {
		t.Fatalf("docker login: %v: %s", err, out)
	}
	build := exec.Command("docker", "build", "-q", "-t", ref, "-")
	build.Stdin = strings.NewReader(fmt.Sprintf("FROM %s\nLABEL io.opensandbox.test-registry=%q\n", src, addr+"-"+t.Name()))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build %s: %v: %s", ref, err, out)
	}
	docker(t, "push", ref)
	docker(t, "rmi", ref)
	docker(t, "logout", addr)
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", ref).Run() })
	return ref
}

func docker(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
