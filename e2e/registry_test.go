package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testregistry"
)

// TestPullWithCredentials: an image from a registry that wants a password
// is pulled with the credentials of the request, never stored; without
// them the sandbox fails with the registry's reason; concurrent creates
// of one image share one pull.
func TestPullWithCredentials(t *testing.T) {
	ref := testregistry.Start(t, busyboxImage, "osb", "s3cret-pass")
	s := startServer(t, serverOptions{server: "allow_local_registries = true"}) // the test registry is on loopback

	noAuth := s.create(sandboxRequest(ref, "sleep", "1000000"))
	sb := s.waitState(noAuth, "Failed")
	if sb.Status.Reason != "IMAGE_PULL_FAILED" || !strings.Contains(strings.ToLower(sb.Status.Message), "auth") {
		t.Fatalf("pull without credentials: %+v", sb.Status)
	}
	wrong := sandboxRequest(ref, "sleep", "1000000")
	wrong.Image.Auth = &api.ImageAuth{Username: "osb", Password: "wrong"}
	s.waitState(s.create(wrong), "Failed")

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
		sb := s.waitState(id, "Running")
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
