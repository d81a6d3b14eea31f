package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// refusal is a create asking for what the server will not do, and the
// 400 it must get: its code, and words the message must hold to name the
// problem.
type refusal struct {
	name  string
	req   api.CreateSandboxRequest
	code  string
	words []string
}

// refusals lists the creates of the attack on validation for a server
// on runtime image, whose host volume allowlist holds rootLink, a
// symbolic link to /. gpu is a GPU count the runtime's largest machine
// does not have.
func refusals(image, rootLink string, gpus int) []refusal {
	req := func(mod func(r *api.CreateSandboxRequest)) api.CreateSandboxRequest {
		r := sandboxRequest(image, "sleep", "100000")
		mod(&r)
		return r
	}
	ext := func(k, v string) api.CreateSandboxRequest {
		return req(func(r *api.CreateSandboxRequest) { r.Extensions = map[string]string{k: v} })
	}
	limits := func(k, v string) api.CreateSandboxRequest {
		return req(func(r *api.CreateSandboxRequest) { r.ResourceLimits = map[string]string{k: v} })
	}
	mount := func(at string) api.CreateSandboxRequest {
		return req(func(r *api.CreateSandboxRequest) {
			r.Volumes = []api.Volume{{Name: "v", MountPath: at, PVC: &api.PVCVolume{ClaimName: "osb-attack-unused"}}}
		})
	}
	image2 := func(uri string) api.CreateSandboxRequest {
		return req(func(r *api.CreateSandboxRequest) { r.Image.URI = uri })
	}
	const (
		param = api.CodeSandboxInvalidParameter
		mpath = api.CodeVolumeInvalidMountPath
	)
	out := []refusal{
		// A runtime would ignore these keys: a 202 would promise a
		// privileged, capable, host-networked sandbox it never gets (or,
		// if a runtime ever read them, give it one).
		{"extension docker.privileged=true", ext("docker.privileged", "true"), param, []string{`"docker.privileged"`, "allowed_extensions"}},
		{"extension docker.capAdd=SYS_ADMIN", ext("docker.capAdd", "SYS_ADMIN"), param, []string{`"docker.capAdd"`}},
		{"extension docker.network=host", ext("docker.network", "host"), param, []string{`"docker.network"`}},
		{"extension docker.securityOpt=seccomp=unconfined", ext("docker.securityOpt", "seccomp=unconfined"), param, []string{`"docker.securityOpt"`}},
		{"extension kubernetes.hostNetwork=true", ext("kubernetes.hostNetwork", "true"), param, []string{`"kubernetes.hostNetwork"`}},
		// Mounts that would replace the kernel's view or execd.
		{"mount at /proc", mount("/proc"), mpath, []string{"/proc"}},
		{"mount under /proc", mount("/proc/sys"), mpath, []string{"/proc"}},
		{"mount at /sys/fs", mount("/sys/fs"), mpath, []string{"/sys"}},
		{"mount at /dev", mount("/dev"), mpath, []string{"/dev"}},
		{"mount at /", mount("/"), mpath, []string{"/"}},
		{"mount at /opt/opensandbox/bin (execd)", mount("/opt/opensandbox/bin"), mpath, []string{"execd"}},
		{"mount at /opt/opensandbox/bin/execd", mount("/opt/opensandbox/bin/execd"), mpath, []string{"execd"}},
		{"mount at /opt, over execd", mount("/opt"), mpath, []string{"/opt/opensandbox", "execd"}},
		{"mount at /proc spelled /tmp/../proc", mount("/tmp/../proc"), mpath, []string{"/proc"}},
		// What the kernel's execve refuses: the sandbox would never
		// start.
		{"a 200 KiB environment value", req(func(r *api.CreateSandboxRequest) {
			r.Env = map[string]*string{"BIG": ptr(strings.Repeat("x", 200<<10))}
		}),
			param, []string{"BIG", "MAX_ARG_STRLEN", "131071"}},
		{"an environment of 20 × 120 KiB", req(func(r *api.CreateSandboxRequest) {
			r.Env = map[string]*string{}
			for i := range 20 {
				r.Env["V"+strconv.Itoa(i)] = ptr(strings.Repeat("x", 120<<10))
			}
		}), param, []string{"ARG_MAX", "2 MiB"}},
		{"a 200 KiB entrypoint argument", req(func(r *api.CreateSandboxRequest) { r.Entrypoint = []string{"echo", strings.Repeat("x", 200<<10)} }),
			param, []string{"entrypoint[1]", "MAX_ARG_STRLEN"}},
		// More than the machine has: the engine would fail it later, or
		// run it without the limit asked for.
		{`cpu "1000"`, limits("cpu", "1000"), param, []string{"cpu", "1000 CPUs"}},
		{`memory "10Ti"`, limits("memory", "10Ti"), param, []string{"memory", "10240Gi"}},
		{fmt.Sprintf(`gpu "%d"`, gpus), limits("gpu", strconv.Itoa(gpus)), param, []string{"gpu"}},
		// Registries on the host's loopback or link: the engine pulls as
		// the host, so these reach its own services (this server's API)
		// or a cloud metadata service.
		{"image 127.0.0.1:5000/x", image2("127.0.0.1:5000/x"), param, []string{"127.0.0.1", "loopback", "allow_local_registries"}},
		{"image [::1]:5000/x", image2("[::1]:5000/x"), param, []string{"[::1]", "loopback"}},
		{"image localhost:5000/x", image2("localhost:5000/x"), param, []string{"localhost", "loopback"}},
		{"image 169.254.169.254/x", image2("169.254.169.254/x"), param, []string{"169.254.169.254", "link-local"}},
		{"image [fe80::1]:5000/x", image2("[fe80::1]:5000/x"), param, []string{"link-local"}},
		{"image 0.0.0.0:5000/x", image2("0.0.0.0:5000/x"), param, []string{"unspecified"}},
		{"image [::ffff:7f00:1]:5000/x (IPv4-mapped)", image2("[::ffff:7f00:1]:5000/x"), param, []string{"loopback", "127.0.0.1"}},
		{"image [::ffff:a9fe:a9fe]/x (IPv4-mapped metadata)", image2("[::ffff:a9fe:a9fe]/x"), param, []string{"link-local", "169.254.169.254"}},
		{"image 127.1:5000/x (short form)", image2("127.1:5000/x"), param, []string{"loopback"}},
		{"image 2130706433:5000/x (one number)", image2("2130706433:5000/x"), param, []string{"loopback"}},
		{"image 0x7f.0.0.1:5000/x (hexadecimal)", image2("0x7f.0.0.1:5000/x"), param, []string{"loopback"}},
		{"image ip6-localhost:5000/x (Debian's hosts name)", image2("ip6-localhost:5000/x"), param, []string{"loopback"}},
		// A host path that is the host's root, through a link in an
		// allowed directory.
		{"host volume leading to /", req(func(r *api.CreateSandboxRequest) {
			r.Volumes = []api.Volume{{Name: "root", MountPath: "/host", Host: &api.HostVolume{Path: rootLink}}}
		}), api.CodeVolumeHostPathNotAllowed, []string{"host's root directory"}},
	}
	return out
}

// tryRefusals makes every attempt against s: each must be a 400 with the
// code and a message naming the problem. A create that gets through is
// deleted again.
func tryRefusals(t *testing.T, s *server, list []refusal) {
	for _, a := range list {
		attack(t, a.name, func(t *testing.T) string {
			s.t = t
			resp, data := s.do("POST", "/v1/sandboxes", a.req)
			var e api.ErrorResponse
			json.Unmarshal(data, &e)
			if resp.StatusCode != http.StatusBadRequest {
				var c api.CreateSandboxResponse
				if json.Unmarshal(data, &c) == nil && c.ID != "" {
					s.do("DELETE", "/v1/sandboxes/"+c.ID, nil)
				}
				t.Errorf("create answered %d, want 400: %.300s", resp.StatusCode, data)
				return fmt.Sprintf("%d: accepted", resp.StatusCode)
			}
			if e.Code != a.code {
				t.Errorf("code %q, want %q (%s)", e.Code, a.code, e.Message)
			}
			for _, w := range a.words {
				if !strings.Contains(e.Message, w) {
					t.Errorf("message %q does not name %q", e.Message, w)
				}
			}
			return fmt.Sprintf("400 %s: %.160s", e.Code, e.Message)
		})
	}
}

// localGPUs counts the GPUs the NVIDIA driver lists on this machine.
func localGPUs() int {
	entries, _ := os.ReadDir("/proc/driver/nvidia/gpus")
	return len(entries)
}

// rootLinkDir makes an allowed directory holding a symbolic link to /.
func rootLinkDir(t *testing.T) (allowed, link string) {
	allowed = t.TempDir()
	link = filepath.Join(allowed, "root")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	return allowed, link
}

// TestAttackValidate: on the Docker runtime, through the real server,
// every create that asks for what the server will not do is a 400 that
// names the problem, and leaves nothing behind; the operator's options
// let through exactly what they allow.
func TestAttackValidate(t *testing.T) {
	allowed, link := rootLinkDir(t)
	// Bodies up to 8 MiB, so that an environment past the kernel's 2 MiB
	// reaches validation.
	s := startServer(t, serverOptions{server: fmt.Sprintf("host_volume_allowlist = [%q]\nmax_body_bytes = 8388608", allowed)})
	list := refusals(busyboxImage, link, localGPUs()+1)
	list = append(list, refusal{"extension kubernetes.runtimeClassName on Docker",
		func() api.CreateSandboxRequest {
			r := sandboxRequest(busyboxImage, "sleep", "1")
			r.Extensions = map[string]string{"kubernetes.runtimeClassName": "gvisor"}
			return r
		}(), api.CodeSandboxInvalidParameter, []string{`"kubernetes.runtimeClassName"`, "docker.runtime"}})
	tryRefusals(t, s, list)
	attack(t, "refused creates leave no container", func(t *testing.T) string {
		s.t = t
		if n := s.scopeContainers(); n != 0 {
			t.Errorf("%d containers left by refused creates", n)
		}
		return "none left"
	})

	// What the reference accepts and keeps is accepted: keys
	// opensandbox.extensions.<suffix>, kept with the sandbox.
	t.Run("opensandbox.extensions keys are kept", func(t *testing.T) {
		s.t = t
		r := sandboxRequest(busyboxImage, "sleep", "100000")
		r.Extensions = map[string]string{"opensandbox.extensions.team": "ml"}
		id := s.create(r)
		s.waitState(id, "Running")
		labels := docker(t, "inspect", "--format", `{{index .Config.Labels "opensandbox.extensions"}}`, "osb-"+id)
		if !strings.Contains(labels, `"opensandbox.extensions.team":"ml"`) {
			t.Errorf("the container's extensions label: %s", labels)
		}
		s.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
	})

	// The operator's options: listed extension keys pass, and so do
	// local registries; nothing else does.
	open := startServer(t, serverOptions{server: `allowed_extensions = ["team.*"]
allow_local_registries = true`})
	attack(t, "operator allows team.* extensions", func(t *testing.T) string {
		open.t = t
		r := sandboxRequest(busyboxImage, "sleep", "100000")
		r.Extensions = map[string]string{"team.owner": "ml"}
		id := open.create(r)
		open.waitState(id, "Running")
		open.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
		r.Extensions = map[string]string{"docker.privileged": "true"}
		e := open.wantError("POST", "/v1/sandboxes", r, 400, api.CodeSandboxInvalidParameter)
		if !strings.Contains(e.Message, "team.*") {
			t.Errorf("the refusal does not list the allowed prefix: %s", e.Message)
		}
		return "team.owner accepted and the sandbox ran; docker.privileged still refused"
	})
	attack(t, "operator allows local registries", func(t *testing.T) string {
		open.t = t
		// A closed loopback port: the pull is tried and fails on this
		// machine.
		id := open.create(sandboxRequest("127.0.0.1:1/opensandbox/missing:latest", "sleep", "1"))
		sb := open.waitState(id, "Failed")
		open.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
		if sb.Status.Reason != "IMAGE_PULL_FAILED" {
			t.Errorf("status %+v, want a pull that was tried and failed", sb.Status)
		}
		return "accepted, pull tried: " + sb.Status.Reason
	})
}

// TestAttackInsecureFlag: the server's warning that it accepts every
// request appears exactly when it does.
func TestAttackInsecureFlag(t *testing.T) {
	attack(t, "insecure = true with an API key set", func(t *testing.T) string {
		s := startServer(t, serverOptions{server: "insecure = true"})
		s.t = t
		resp, data := s.do("GET", "/v1/sandboxes", nil, api.HeaderAPIKey, "")
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a request without the key: %d %s", resp.StatusCode, data)
		}
		if strings.Contains(s.logs.String(), "running without an API key") {
			t.Errorf("the server claims to run without a key while it wants one:\n%s", s.logs.String())
		}
		return fmt.Sprintf("no key: %d; no warning", resp.StatusCode)
	})
	attack(t, "insecure = true without a key", func(t *testing.T) string {
		dir := t.TempDir()
		s := &server{t: t, scope: "e2e-" + randomHex(6), dataDir: filepath.Join(dir, "data"), config: filepath.Join(dir, "c.toml"),
			listen: "127.0.0.1:" + strconv.Itoa(freePort(t)), hc: &http.Client{Timeout: time.Minute}}
		s.base = "http://" + s.listen
		cfg := fmt.Sprintf("version = 1\n[server]\nlisten = %q\ninsecure = true\n[runtime.docker]\ndata_dir = %q\nlabel_scope = %q\n", s.listen, s.dataDir, s.scope)
		if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.stop(syscall.SIGKILL); removeScope(s.scope) })
		s.start()
		resp, _ := s.do("GET", "/v1/sandboxes", nil, api.HeaderAPIKey, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("insecure server refused a request without a key: %d", resp.StatusCode)
		}
		if !strings.Contains(s.logs.String(), "running without an API key") {
			t.Errorf("an open server does not warn:\n%s", s.logs.String())
		}
		return "accepted without a key, and warned"
	})
}

// TestAttackValidateKubernetes: the same attempts against the server on
// the Kubernetes runtime (the test cluster), where CPU, memory and GPUs
// are judged by the largest node.
func TestAttackValidateKubernetes(t *testing.T) {
	k := needCluster(t)
	testenv.MustHaveImage(t, busyboxImage)
	ns := "osb-e2e-" + randomHex(5)
	k.must(t, "create", "namespace", ns)
	t.Cleanup(func() { k.run("delete", "namespace", ns, "--wait=false") })
	gpus := 0
	for _, f := range strings.Fields(k.must(t, "get", "nodes", "-o", `jsonpath={range .items[*]}{.status.allocatable.nvidia\.com/gpu}{" "}{end}`)) {
		n, _ := strconv.Atoi(f)
		gpus = max(gpus, n)
	}
	allowed, link := rootLinkDir(t)
	dir := t.TempDir()
	s := &server{t: t, key: randomHex(24), scope: "e2e-" + randomHex(6), config: filepath.Join(dir, "c.toml"),
		listen: "127.0.0.1:" + strconv.Itoa(freePort(t)), hc: &http.Client{Timeout: time.Minute}}
	s.base = "http://" + s.listen
	cfg := fmt.Sprintf(`version = 1
[server]
listen = %q
api_key = %q
host_volume_allowlist = [%q]
allowed_extensions = ["team.*"]
max_body_bytes = 8388608
[runtime]
type = "kubernetes"
[runtime.kubernetes]
kubeconfig = %q
namespace = %q
label_scope = %q
`, s.listen, s.key, allowed, k.kubeconfig, ns, s.scope)
	if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("server log (tail):\n%s", tail(s.logs.String(), 60))
		}
	})
	s.start()

	const image = "docker.io/opensandbox/busybox:latest"
	list := refusals(image, link, gpus+1)
	list = append(list, refusal{"extension docker.runtime on Kubernetes",
		func() api.CreateSandboxRequest {
			r := sandboxRequest(image, "sleep", "1")
			r.Extensions = map[string]string{"docker.runtime": "runsc"}
			return r
		}(), api.CodeSandboxInvalidParameter, []string{`"docker.runtime"`, "kubernetes.runtimeClassName"}})
	tryRefusals(t, s, list)
	attack(t, "refused creates leave no pod", func(t *testing.T) string {
		out := k.must(t, "-n", ns, "get", "pods", "-l", "opensandbox.io/scope="+s.scope, "-o", "name")
		if n := len(strings.Fields(out)); n != 0 {
			t.Errorf("%d pods left by refused creates", n)
		}
		return "none left"
	})
	attack(t, "operator allows team.* extensions (Kubernetes)", func(t *testing.T) string {
		s.t = t
		r := sandboxRequest(image, "sleep", "100000")
		r.Extensions = map[string]string{"team.owner": "ml"}
		id := s.create(r)
		s.call("DELETE", "/v1/sandboxes/"+id, nil, 204, nil)
		return "team.owner accepted"
	})
}
