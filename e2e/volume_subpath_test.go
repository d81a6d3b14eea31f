package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
)

// TestNamedVolumeSubPath mounts a sub path of a real named volume: the
// sandbox sees that directory of the volume and nothing else of it; a sub
// path that is a symlink leading out of the volume gives no sandbox what
// it leads to; a volume of another driver, or a local one with driver
// options, is refused with VOLUME::PVC_SUBPATH_UNSUPPORTED_DRIVER.
func TestNamedVolumeSubPath(t *testing.T) {
	s := startServer(t, serverOptions{docker: `named_volume_allowlist = ["e2e-subpath-opts-"]`})
	vol := "e2e-subpath-" + randomHex(4)
	owner := sandboxRequest(busyboxImage, "sleep", "100000")
	owner.Volumes = []api.Volume{{Name: "whole", MountPath: "/whole", PVC: &api.PVCVolume{ClaimName: vol, DeleteOnSandboxTermination: true}}}
	ownerID := s.create(owner)
	s.waitState(ownerID, "Running")
	s.execd(ownerID).mustRun("mkdir -p /whole/a/b && echo in-b > /whole/a/b/f && echo top > /whole/top && ln -s /etc /whole/esc && ln -s ../../.. /whole/up")

	req := sandboxRequest(busyboxImage, "sleep", "100000")
	req.Volumes = []api.Volume{{Name: "part", MountPath: "/part", SubPath: "a/b", PVC: &api.PVCVolume{ClaimName: vol}}}
	id := s.create(req)
	s.waitState(id, "Running")
	c := s.execd(id)
	if out := c.mustRun("cat /part/f; ls /part"); out != "in-b\nf" {
		t.Fatalf("sub path a/b shows %q", out)
	}
	c.mustRun("echo from-part > /part/g")
	if out := s.execd(ownerID).mustRun("cat /whole/a/b/g"); out != "from-part" {
		t.Fatalf("a write through the sub path reads %q in the volume", out)
	}

	for _, sub := range []string{"esc", "up", "esc/ssl"} {
		t.Run("symlink "+sub, func(t *testing.T) {
			s.t = t
			req := sandboxRequest(busyboxImage, "sleep", "100000")
			req.Volumes = []api.Volume{{Name: "v", MountPath: "/v", SubPath: sub, PVC: &api.PVCVolume{ClaimName: vol}}}
			resp, body := s.do("POST", "/v1/sandboxes", req)
			if resp.StatusCode == 400 {
				return
			}
			var created api.CreateSandboxResponse
			if resp.StatusCode != 202 || json.Unmarshal(body, &created) != nil {
				t.Fatalf("create: %d %s", resp.StatusCode, body)
			}
			sb := s.waitState(created.ID, "Failed")
			if sb.Status.Reason == "" {
				t.Fatalf("sub path %s through a link out of the volume: %+v", sub, sb.Status)
			}
		})
	}

	t.Run("driver options", func(t *testing.T) {
		s.t = t
		opts := "e2e-subpath-opts-" + randomHex(4)
		if out, err := exec.Command("docker", "volume", "create", "--opt", "type=tmpfs", "--opt", "device=tmpfs", opts).CombinedOutput(); err != nil {
			t.Fatalf("docker volume create: %v %s", err, out)
		}
		t.Cleanup(func() { exec.Command("docker", "volume", "rm", "-f", opts).Run() })
		req := sandboxRequest(busyboxImage, "sleep", "100000")
		req.Volumes = []api.Volume{{Name: "v", MountPath: "/v", SubPath: "x", PVC: &api.PVCVolume{ClaimName: opts}}}
		e := s.wantError("POST", "/v1/sandboxes", req, 400, api.CodeVolumePVCSubPathUnsupportedDriver)
		if !strings.Contains(e.Message, "volume v") {
			t.Errorf("message %q", e.Message)
		}
	})
}
