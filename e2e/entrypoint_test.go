package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// TestEntrypointCannotStart creates sandboxes whose entrypoint cannot
// start, cold and from a warm pool: each is Failed with the reason
// ENTRYPOINT_FAILED, execd's error in the message and in the events. An
// entrypoint that starts and exits at once leaves its sandbox Running and
// execd serving.
func TestEntrypointCannotStart(t *testing.T) {
	s := startServer(t, serverOptions{docker: `
[[pools]]
name = "warm"
image = "` + busyboxImage + `"
resource_limits = { cpu = "250m", memory = "96Mi" }
buffer_min = 1
buffer_max = 1
pool_max = 4
`})
	wantFailed := func(t *testing.T, id, path, why string) {
		t.Helper()
		s.t = t
		sb := s.waitState(id, "Failed")
		if sb.Status.Reason != api.ReasonEntrypointFailed || !strings.Contains(sb.Status.Message, path) ||
			!strings.Contains(sb.Status.Message, why) {
			t.Fatalf("status %+v, want reason %s naming %s (%s)", sb.Status, api.ReasonEntrypointFailed, path, why)
		}
		var diag api.DiagnosticContent
		s.call("GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=all", nil, 200, &diag)
		if diag.Content == nil || !strings.Contains(*diag.Content, api.ReasonEntrypointFailed) || !strings.Contains(*diag.Content, path) {
			t.Fatalf("events do not tell: %v", diag.Content)
		}
		s.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
	}
	cases := []struct{ name, path, why string }{
		{"missing", "/no/such/entrypoint", "no such file"},
		{"not executable", "/etc/passwd", "permission denied"},
		{"not in PATH", "no-such-command", "not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantFailed(t, s.create(sandboxRequest(busyboxImage, c.path)), c.path, c.why)
		})
	}
	t.Run("warm pool", func(t *testing.T) {
		s.t = t
		s.waitPool("warm", func(st api.PoolStatus) bool { return st.Available == 1 })
		var created api.CreateSandboxResponse
		s.call("POST", "/v1/sandboxes", api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "warm"},
			Entrypoint: []string{"/no/such/entrypoint"}}, 202, &created)
		wantFailed(t, created.ID, "/no/such/entrypoint", "no such file")
		// The pool is not drained by a bad entrypoint: the next claim
		// with a good one is served and runs.
		s.waitPool("warm", func(st api.PoolStatus) bool { return st.Available == 1 })
		s.call("POST", "/v1/sandboxes", api.CreateSandboxRequest{Extensions: map[string]string{"poolRef": "warm"},
			Entrypoint: []string{"sleep", "1000"}}, 202, &created)
		if created.Status.State != "Running" {
			t.Fatalf("good claim answered %+v", created)
		}
		s.execd(created.ID).mustRun("true")
	})
	t.Run("started and exited", func(t *testing.T) {
		s.t = t
		id := s.create(sandboxRequest(busyboxImage, "sh", "-c", "exit 3"))
		s.waitState(id, "Running")
		c := s.execd(id)
		var st api.CommandStatus
		testwait.Until(t, "the entrypoint to exit", func() bool {
			c.call("GET", "/command/status/"+api.EntrypointCommandID, nil, 200, &st)
			return !st.Running
		}, func() string { return fmt.Sprintf("%+v", st) })
		if st.ExitCode == nil || *st.ExitCode != 3 || st.StartFailed() {
			t.Fatalf("entrypoint status %+v", st)
		}
		if out := c.mustRun("echo serving"); out != "serving" {
			t.Fatalf("execd after the entrypoint exited: %q", out)
		}
		var sb api.Sandbox
		s.call("GET", "/v1/sandboxes/"+id, nil, 200, &sb)
		if sb.Status.State != "Running" {
			t.Fatalf("status after the entrypoint exited: %+v", sb.Status)
		}
	})
}

// codeInterpreterScript is the entrypoint script of the code-interpreter
// image, relative to this package.
const codeInterpreterScript = "../scripts/code-interpreter/code-interpreter.sh"

// codeInterpreterServer starts a server for sandboxes of the code
// interpreter image with the entrypoint the clients name. When the image
// was not made with the script in the tree (its label carries the
// script's SHA-256), the script is mounted at its place from the tree.
func codeInterpreterServer(t *testing.T) (*server, func(env map[string]*string) api.CreateSandboxRequest) {
	testenv.MustHaveImage(t, interpreterImage)
	script, err := os.ReadFile(codeInterpreterScript)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(script)
	label, _ := exec.Command("docker", "image", "inspect", "--format",
		`{{index .Config.Labels "io.opensandbox.entrypoint.sha256"}}`, interpreterImage).Output()
	var dir string
	opts := serverOptions{}
	if strings.TrimSpace(string(label)) != hex.EncodeToString(sum[:]) {
		t.Logf("%s lacks this tree's %s: mounting it", interpreterImage, filepath.Base(codeInterpreterScript))
		if dir, err = filepath.Abs(filepath.Dir(codeInterpreterScript)); err != nil {
			t.Fatal(err)
		}
		opts.server = fmt.Sprintf("host_volume_allowlist = [%q]", dir)
	}
	s := startServer(t, opts)
	return s, func(env map[string]*string) api.CreateSandboxRequest {
		req := sandboxRequest(interpreterImage, "/opt/code-interpreter/code-interpreter.sh")
		req.Env = env
		if dir != "" {
			req.Volumes = []api.Volume{{Name: "entrypoint", MountPath: "/opt/code-interpreter", ReadOnly: true,
				Host: &api.HostVolume{Path: dir}}}
		}
		return req
	}
}

// TestCodeInterpreterEntrypoint creates code-interpreter sandboxes with
// the entrypoint clients use: with the image's own Python version asked
// for, the entrypoint keeps running and code runs; with another version
// asked for, the entrypoint says so in the container's log and exits 2.
func TestCodeInterpreterEntrypoint(t *testing.T) {
	s, request := codeInterpreterServer(t)

	id := s.create(request(map[string]*string{"PYTHON_VERSION": ptr("3")}))
	s.waitState(id, "Running")
	c := s.execd(id)
	var cc api.CodeContext
	c.call("POST", "/code/context", api.CodeContext{Language: "python"}, 200, &cc)
	if r := c.stream("/code", api.RunCodeRequest{Code: "import sys\nprint(sys.version_info[0] + 1)", Context: &cc}); r.exit != "0" || strings.TrimSpace(r.stdout) != "4" {
		t.Fatalf("code run: exit %q stdout %q stderr %q", r.exit, r.stdout, r.stderr)
	}
	var st api.CommandStatus
	c.call("GET", "/command/status/"+api.EntrypointCommandID, nil, 200, &st)
	if !st.Running || st.Content != "/opt/code-interpreter/code-interpreter.sh" {
		t.Fatalf("entrypoint status %+v", st)
	}

	bad := s.create(request(map[string]*string{"PYTHON_VERSION": ptr("2.7")}))
	s.waitState(bad, "Running")
	c = s.execd(bad)
	testwait.Until(t, "the entrypoint to refuse PYTHON_VERSION=2.7", func() bool {
		c.call("GET", "/command/status/"+api.EntrypointCommandID, nil, 200, &st)
		return !st.Running
	}, func() string { return fmt.Sprintf("%+v\n%s", st, s.describe(bad)) })
	if st.ExitCode == nil || *st.ExitCode != 2 {
		t.Fatalf("entrypoint status %+v, want exit code 2", st)
	}
	var diag api.DiagnosticContent
	s.call("GET", "/v1/sandboxes/"+bad+"/diagnostics/logs?scope=container", nil, 200, &diag)
	if diag.Content == nil || !strings.Contains(*diag.Content, "PYTHON_VERSION=2.7 asks for Python 2.7, but this image has Python 3.") {
		t.Fatalf("container log does not say why: %v", diag.Content)
	}
}
