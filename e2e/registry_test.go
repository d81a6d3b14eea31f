package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// startRegistry runs Debian's docker-registry on loopback with password
// authentication, pushes the busybox image to it, and returns the image
// reference there, with the local copy of that reference removed so that
// the engine has to pull it.
func startRegistry(t *testing.T, user, pass string) string {
	t.Helper()
	bin := testenv.MustHaveCommand(t, "docker-registry")
	dir := t.TempDir()
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600)
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
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
    realm: osb-e2e
    path: %s
`, filepath.Join(dir, "data"), addr, filepath.Join(dir, "htpasswd"))
	os.WriteFile(filepath.Join(dir, "config.yml"), []byte(config), 0o600)
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if out, err := exec.Command("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://"+addr+"/v2/").Output(); err == nil && string(out) == "401" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("registry did not come up")
		}
	}
	ref := addr + "/osb/busybox:e2e"
	login := exec.Command("docker", "login", "--username", user, "--password-stdin", addr)
	login.Stdin = strings.NewReader(pass)
	if out, err := login.CombinedOutput(); err != nil {
		t.Fatalf("docker login: %v: %s", err, out)
	}
	docker(t, "tag", busyboxImage, ref)
	docker(t, "push", ref)
	docker(t, "rmi", ref)
	docker(t, "logout", addr)
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", ref).Run() })
	return ref
}

// TestPullWithCredentials: an image from a registry that wants a password
// is pulled with the credentials of the request, never stored; without
// them the sandbox fails with the registry's reason; concurrent creates
// of one image share one pull.
func TestPullWithCredentials(t *testing.T) {
	ref := startRegistry(t, "osb", "s3cret-pass")
	s := startServer(t, serverOptions{})

	noAuth := s.create(sandboxRequest(ref, "sleep", "1000000"))
	sb := s.waitState(noAuth, "Failed", 30*time.Second)
	if sb.Status.Reason != "IMAGE_PULL_FAILED" || !strings.Contains(strings.ToLower(sb.Status.Message), "auth") {
		t.Fatalf("pull without credentials: %+v", sb.Status)
	}
	wrong := sandboxRequest(ref, "sleep", "1000000")
	wrong.Image.Auth = &api.ImageAuth{Username: "osb", Password: "wrong"}
	s.waitState(s.create(wrong), "Failed", 30*time.Second)

	const n = 4
	ids := make(chan string, n)
	for range n {
		go func() {
			req := sandboxRequest(ref, "sleep", "1000000")
			req.Image.Auth = &api.ImageAuth{Username: "osb", Password: "s3cret-pass"}
			ids <- s.create(req)
		}()
	}
	for range n {
		id := <-ids
		sb := s.waitState(id, "Running", 60*time.Second)
		if sb.Image.Auth != nil {
			t.Fatal("credentials echoed back")
		}
		s.execd(id).mustRun("true")
	}
	pulls := 0
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(line, `msg="image pulled"`) && strings.Contains(line, ref) {
			pulls++
		}
	}
	if pulls != 1 {
		t.Fatalf("%d successful pulls for %d concurrent creates, want 1:\n%s", pulls, n, s.logs.String())
	}
	if data, _ := os.ReadFile(filepath.Join(s.dataDir, "state.db")); strings.Contains(string(data), "s3cret-pass") {
		t.Fatal("the registry password was written to the state store")
	}
}
