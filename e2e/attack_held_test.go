package e2e

import (
	"archive/tar"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/textproto"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
)

// The attempts in this file try the boundaries that need no new code to
// hold: authentication, privileges, the engine socket, neighbours, /proc,
// traversal and cleanup. Each says, where it is not plain, why it would
// fail if the boundary broke; most also run their probe where the
// boundary is off on purpose (a control), which proves the probe can see
// a break.

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
	s.waitState(id, "Running")
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

// TestAttackAuth: every route of the lifecycle API and of execd, taken
// from the code, refuses a request without credentials, with wrong ones,
// with another sandbox's, and with the right ones anywhere but where they
// belong. /health is the one route open to all (and /metrics where
// metrics_auth = false says so).
func TestAttackAuth(t *testing.T) {
	s := startServer(t, serverOptions{})
	app := []string{"python3", "-m", "http.server", "8080", "--directory", "/etc"}
	a, b := s.create(sandboxRequest(pythonImage, app...)), s.create(sandboxRequest(pythonImage, app...))
	s.waitState(a, "Running")
	s.waitState(b, "Running")
	ca, cb := s.execd(a), s.execd(b)
	ca.mustRun("mkdir -p /tmp/keepdir && echo keep > /tmp/keep")
	var sess api.CreateSessionResponse
	ca.call("POST", "/session", nil, 200, &sess)
	var pty api.PTYSession
	ca.call("POST", "/pty", nil, 201, &pty)

	wrong := randomHex(24)
	lifecycleCreds := []credentials{
		{name: "no credentials"},
		{name: "a wrong key", header: map[string]string{api.HeaderAPIKey: wrong}},
		{name: "the key cut short", header: map[string]string{api.HeaderAPIKey: s.key[:len(s.key)-1]}},
		{name: "the key and one more character", header: map[string]string{api.HeaderAPIKey: s.key + "0"}},
		{name: "sandbox A's token as the key", header: map[string]string{api.HeaderAPIKey: ca.token}},
		{name: "sandbox A's token in its own header", header: map[string]string{api.HeaderExecdToken: ca.token}},
		{name: "the key in X-API-Key", header: map[string]string{"X-API-Key": s.key}},
		{name: "the key in a header spelt with underscores", header: map[string]string{"OPEN_SANDBOX_API_KEY": s.key}},
		{name: "the key in the query", query: url.Values{"api_key": {s.key}, "apiKey": {s.key}, "key": {s.key}, api.HeaderAPIKey: {s.key}}},
	}
	// Only GET /metrics takes the key as a bearer token (docs/metrics.md).
	bearerKey := credentials{name: "the key as a bearer token", header: map[string]string{"Authorization": "Bearer " + s.key}}

	// Bodies that would change something if a refused request got through;
	// afterwards the test checks that nothing changed.
	lifecycleBody := map[string]string{
		"POST /sandboxes":                       mustJSON(sandboxRequest(busyboxImage, "sleep", "1000")),
		"PATCH /sandboxes/{id}/metadata":        `{"pwned":"yes"}`,
		"POST /sandboxes/{id}/renew-expiration": `{"expiresAt":"2099-01-01T00:00:00Z"}`,
		"POST /sandboxes/{id}/snapshots":        `{"name":"pwned"}`,
		"POST /pools":                           `{"name":"pwned","template":{"image":{"uri":"` + busyboxImage + `"}},"capacitySpec":{"bufferMax":1,"bufferMin":1,"poolMax":1,"poolMin":0}}`,
		"PUT /pools/{name}":                     `{"capacitySpec":{"bufferMax":1,"bufferMin":1,"poolMax":1,"poolMin":0}}`,
	}

	routes, computed := registeredRoutes(t, "lifecycle", "cmd/opensandbox-server")
	// The two known computed registrations mount the table at / and /v1,
	// and answer 405 on its paths.
	if len(computed) != 2 {
		t.Fatalf("the lifecycle server registers routes with computed patterns at %v, 2 known (the route table's mounts and its 405 answers): teach registeredRoutes the new one, so that it is attacked", computed)
	}
	for _, must := range []string{"POST /sandboxes", "GET /sandboxes/{id}", "DELETE /sandboxes/{id}", "GET /health", "GET /metrics", "GET /pools"} {
		if !slices.ContainsFunc(routes, func(r route) bool { return r.String() == must }) {
			t.Fatalf("the lifecycle routes read from the code (%v) lack %s: the reader no longer understands lifecycle/routes.go", routes, must)
		}
	}
	attacked := map[string]bool{}
	for _, mount := range []string{"", "/v1"} {
		for _, r := range routes {
			name := "lifecycle " + r.method + " " + mount + r.pattern
			attacked[r.String()] = true
			switch {
			case r.method == "" && r.pattern == "/":
				continue // the answer to paths no route has; the odd paths below try it
			case r.pattern == "/health":
				attack(t, name+" without credentials (the documented exception)", func(t *testing.T) string {
					status, body := tryRequest(t, r.method, s.base, mount+r.pattern, "", credentials{}, nil)
					if status != 200 || strings.Contains(body, a) {
						t.Errorf("%d %s, want 200 with nothing but health", status, body)
					}
					return fmt.Sprintf("%d %s", status, strings.TrimSpace(body))
				})
				continue
			}
			path := mount + fillPattern(t, r.pattern, map[string]string{"id": a, "port": execdPort, "name": "pwned"})
			attack(t, name, func(t *testing.T) string {
				creds := lifecycleCreds
				if r.pattern == "/metrics" {
					creds = append(slices.Clone(creds), credentials{name: "sandbox A's token as a bearer token", header: map[string]string{"Authorization": "Bearer " + ca.token}},
						credentials{name: "a wrong bearer token", header: map[string]string{"Authorization": "Bearer " + wrong}})
				} else {
					creds = append(slices.Clone(creds), bearerKey)
				}
				methods := []string{r.method}
				if r.method == "GET" {
					methods = append(methods, "HEAD")
				}
				var seen []string
				for _, m := range methods {
					for _, cred := range creds {
						status, body := tryRequest(t, m, s.base, path, lifecycleBody[r.String()], cred, nil)
						if status != 401 {
							t.Errorf("%s %s with %s: %d %.200s, want 401", m, path, cred.name, status, body)
						}
						seen = append(seen, fmt.Sprint(status))
					}
				}
				// The same route with the key must get past authentication,
				// or the 401s above would prove nothing. Harmless ids: the
				// key may do anything.
				okPath := mount + fillPattern(t, r.pattern, map[string]string{"id": "00000000-0000-4000-8000-000000000000", "port": execdPort, "name": "no-such-pool"})
				okCred := credentials{name: "the key", header: map[string]string{api.HeaderAPIKey: s.key}}
				status, body := tryRequest(t, r.method, s.base, okPath, "{}", okCred, nil)
				if status == 401 || status == 405 || strings.Contains(body, "no route for") {
					t.Fatalf("%s %s with the key: %d %.200s: the route is not where the code says", r.method, okPath, status, body)
				}
				return fmt.Sprintf("%d requests (%s) all %s; with the key %d", len(seen), joinNames(creds), uniq(seen), status)
			})
		}
	}

	attack(t, "lifecycle GET /metrics with the key as a bearer token (the documented alternative)", func(t *testing.T) string {
		status, _ := tryRequest(t, "GET", s.base, "/metrics", "", bearerKey, nil)
		if status != 200 {
			t.Errorf("GET /metrics with Authorization: Bearer KEY: %d, want 200", status)
		}
		return fmt.Sprintf("%d", status)
	})

	// Paths a router might read differently from the authentication in
	// front of it.
	attack(t, "lifecycle paths written oddly, without credentials", func(t *testing.T) string {
		var got []string
		for _, target := range []string{"//v1/sandboxes", "/v1//sandboxes", "/v1/./sandboxes", "/v1/health/../sandboxes",
			"/health/../v1/sandboxes", "/v1/health%2F..%2Fsandboxes", "/%76%31/sandboxes", "/v1/sandboxes/" + a + "/%2e%2e",
			"/health/", "/v1/health/x", "/v1/sandboxes?x=/health", "/v1/metrics/../sandboxes", "/V1/SANDBOXES",
			"/v1/sandboxes/" + a + "/proxy/" + execdPort + "/../../../" + a, "http://" + s.listen + "/v1/sandboxes"} {
			status, body := rawRequest(t, s.listen, "GET", target, nil)
			if status < 400 || status >= 500 || strings.Contains(body, a) {
				t.Errorf("GET %s: %d %.200s, want a refusal", target, status, body)
			}
			got = append(got, fmt.Sprintf("%s %d", target, status))
		}
		return strings.Join(got, ", ")
	})

	// The proxy route takes the key or the sandbox's own token, nothing
	// else: not another sandbox's, nor either one anywhere but its header.
	proxyCreds := []credentials{
		{name: "no credentials"},
		{name: "a wrong key", header: map[string]string{api.HeaderAPIKey: wrong}},
		{name: "a wrong token", header: map[string]string{api.HeaderExecdToken: wrong}},
		{name: "sandbox B's token", header: map[string]string{api.HeaderExecdToken: cb.token}},
		{name: "sandbox A's token as the key", header: map[string]string{api.HeaderAPIKey: ca.token}},
		{name: "sandbox A's token as a bearer token", header: map[string]string{"Authorization": "Bearer " + ca.token}},
		{name: "the key as a bearer token", header: map[string]string{"Authorization": "Bearer " + s.key}},
		{name: "sandbox A's token in the query", query: url.Values{"access_token": {ca.token}, "token": {ca.token}, api.HeaderExecdToken: {ca.token}}},
		{name: "the key in the query", query: url.Values{"api_key": {s.key}, api.HeaderAPIKey: {s.key}}},
		{name: "sandbox A's token as a cookie", header: map[string]string{"Cookie": api.HeaderExecdToken + "=" + ca.token}},
	}
	for _, mount := range []string{"", "/v1"} {
		for _, pr := range []struct{ method, rest, body string }{
			{"GET", "/proxy/8080/hostname", ""},
			{"GET", "/proxy/" + execdPort + "/ping", ""},
			{"POST", "/proxy/" + execdPort + "/command", `{"command":"touch /tmp/pwned-proxy"}`},
			{"GET", "/proxy/" + execdPort + "/files/download?path=/etc/hostname", ""},
		} {
			path := mount + "/sandboxes/" + a + pr.rest
			attack(t, "server proxy "+pr.method+" "+mount+"/sandboxes/A"+pr.rest, func(t *testing.T) string {
				for _, cred := range proxyCreds {
					if status, body := tryRequest(t, pr.method, s.base, path, pr.body, cred, nil); status != 401 {
						t.Errorf("%s %s with %s: %d %.200s, want 401", pr.method, path, cred.name, status, body)
					}
				}
				status, _ := tryRequest(t, "GET", s.base, mount+"/sandboxes/"+a+"/proxy/"+execdPort+"/ping", "",
					credentials{name: "A's token", header: map[string]string{api.HeaderExecdToken: ca.token}}, nil)
				if status != 200 {
					t.Fatalf("the proxy with sandbox A's own token: %d, want 200", status)
				}
				return fmt.Sprintf("%d credentials (%s) all 401; A's own token 200", len(proxyCreds), joinNames(proxyCreds))
			})
		}
	}
	attack(t, "server proxy WebSocket upgrade to A's terminal", func(t *testing.T) string {
		path := "/v1/sandboxes/" + a + "/proxy/" + execdPort + "/pty/" + pty.SessionID + "/ws"
		for _, cred := range proxyCreds {
			if status, body := tryRequest(t, "GET", s.base, path, "", cred, wsUpgrade); status != 401 {
				t.Errorf("upgrade with %s: %d %.200s, want 401", cred.name, status, body)
			}
		}
		status, _ := tryRequest(t, "GET", s.base, path, "", credentials{name: "A's token", header: map[string]string{api.HeaderExecdToken: ca.token}}, wsUpgrade)
		if status != 101 {
			t.Fatalf("upgrade with A's own token: %d, want 101", status)
		}
		return fmt.Sprintf("%d credentials refused with 401; A's own token 101", len(proxyCreds))
	})
	attack(t, "server proxy with B's token and an id that walks from B to A", func(t *testing.T) string {
		var got []string
		for _, id := range []string{b + "%2F..%2F" + a, b + "%2F%2E%2E%2F" + a, b + "/../" + a, a + "%00" + b, b + "," + a} {
			status, body := rawRequest(t, s.listen, "GET", "/v1/sandboxes/"+id+"/proxy/"+execdPort+"/ping",
				map[string]string{api.HeaderExecdToken: cb.token})
			if status == 200 {
				t.Errorf("B's token on /v1/sandboxes/%s/proxy/%d/ping: %d %.200s", id, api.ExecdPort, status, body)
			}
			got = append(got, fmt.Sprint(status))
		}
		return "answers " + strings.Join(got, ", ")
	})

	// execd, straight to sandbox A's published port.
	execdCreds := []credentials{
		{name: "no token"},
		{name: "a wrong token", header: map[string]string{api.HeaderExecdToken: wrong}},
		{name: "sandbox B's token", header: map[string]string{api.HeaderExecdToken: cb.token}},
		{name: "the server's API key", header: map[string]string{api.HeaderExecdToken: s.key}},
		{name: "the token cut short", header: map[string]string{api.HeaderExecdToken: ca.token[:len(ca.token)-1]}},
		{name: "the token and one more character", header: map[string]string{api.HeaderExecdToken: ca.token + "0"}},
		{name: "the token in the query", query: url.Values{"access_token": {ca.token}, "token": {ca.token}, api.HeaderExecdToken: {ca.token}}},
		{name: "the token as a bearer token", header: map[string]string{"Authorization": "Bearer " + ca.token}},
		{name: "the token in the API key header", header: map[string]string{api.HeaderAPIKey: ca.token}},
		{name: "the token as a cookie", header: map[string]string{"Cookie": api.HeaderExecdToken + "=" + ca.token}},
		{name: "the token in a header spelt with underscores", header: map[string]string{"X_EXECD_ACCESS_TOKEN": ca.token}},
	}
	execdBody := map[string]string{
		"POST /command":           `{"command":"touch /tmp/pwned-command"}`,
		"POST /session/{id}/run":  `{"command":"touch /tmp/pwned-session"}`,
		"POST /code":              `{"code":"open('/tmp/pwned-code','w')","context":{"language":"python"}}`,
		"POST /files/mv":          `[{"src":"/tmp/keep","dest":"/tmp/pwned-mv"}]`,
		"POST /files/replace":     `{"/tmp/keep":{"old":"keep","new":"pwned"}}`,
		"POST /files/permissions": `{"/tmp/keep":{"mode":777}}`,
		"POST /directories":       `{"/tmp/pwned-dir":{"mode":755}}`,
		"POST /claim":             `{"token":"` + wrong + `"}`,
	}
	execdQuery := map[string]string{
		"DELETE /files":         "?path=/tmp/keep",
		"DELETE /directories":   "?path=/tmp/keepdir",
		"GET /files/download":   "?path=/etc/hostname",
		"GET /files/archive":    "?path=/etc",
		"POST /files/archive":   "?path=/tmp",
		"GET /files/info":       "?path=/tmp/keep",
		"GET /directories/list": "?path=/tmp",
		"GET /files/search":     "?path=/tmp",
		"DELETE /command":       "?id=entrypoint",
		"DELETE /code/contexts": "?language=python",
	}
	execdRoutes, computed := registeredRoutes(t, "execd", "cmd/execd")
	if len(computed) != 0 {
		t.Fatalf("execd registers routes with computed patterns at %v: teach registeredRoutes to read them, so that they are attacked", computed)
	}
	for _, must := range []string{"POST /command", "GET /ping", "GET /pty/{id}/ws", "POST /files/upload", "GET /metrics/watch"} {
		if !slices.ContainsFunc(execdRoutes, func(r route) bool { return r.String() == must }) {
			t.Fatalf("the execd routes read from the code (%v) lack %s: the reader no longer understands execd/routes.go", execdRoutes, must)
		}
	}
	type execdTarget struct {
		name, method, path, okPath string
		header                     map[string]string
	}
	var targets []execdTarget
	for _, r := range execdRoutes {
		method := cmp.Or(r.method, "GET")
		vars := map[string]string{"id": "ctx", "a": "status", "b": "entrypoint"}
		switch {
		case strings.HasPrefix(r.pattern, "/session/"):
			vars["id"] = sess.SessionID
		case strings.HasPrefix(r.pattern, "/pty/"):
			vars["id"] = pty.SessionID
		}
		var header map[string]string
		if strings.HasSuffix(r.pattern, "/ws") {
			header = wsUpgrade
		}
		targets = append(targets, execdTarget{
			name: method + " " + r.pattern, method: method,
			path:   fillPattern(t, r.pattern, vars) + execdQuery[method+" "+r.pattern],
			okPath: fillPattern(t, r.pattern, map[string]string{"id": "nope", "a": "status", "b": "nope"}),
			header: header,
		})
	}
	// The port proxy sits outside the route table: execd's own port, the
	// app's, and a closed one, and a WebSocket through it.
	targets = append(targets,
		execdTarget{name: "GET /proxy/" + execdPort + "/ping", method: "GET", path: "/proxy/" + execdPort + "/ping", okPath: "/proxy/" + execdPort + "/ping"},
		execdTarget{name: "POST /proxy/" + execdPort + "/command", method: "POST", path: "/proxy/" + execdPort + "/command", okPath: "/proxy/" + execdPort + "/command"},
		execdTarget{name: "GET /proxy/" + execdPort + "/pty/{id}/ws", method: "GET", path: "/proxy/" + execdPort + "/pty/" + pty.SessionID + "/ws", okPath: "/proxy/" + execdPort + "/pty/nope/ws", header: wsUpgrade},
		execdTarget{name: "GET /proxy/8080/", method: "GET", path: "/proxy/8080/hostname", okPath: "/proxy/8080/hostname"},
		execdTarget{name: "GET /proxy/1/", method: "GET", path: "/proxy/1/", okPath: "/proxy/1/"},
	)
	execdBody["POST /proxy/"+execdPort+"/command"] = execdBody["POST /command"]
	for _, tg := range targets {
		attack(t, "execd "+tg.name, func(t *testing.T) string {
			methods := []string{tg.method}
			if tg.method == "GET" && tg.header == nil {
				methods = append(methods, "HEAD")
			}
			for _, m := range methods {
				for _, cred := range execdCreds {
					status, body := tryRequest(t, m, ca.base, tg.path, execdBody[tg.name], cred, tg.header)
					if status != 401 {
						t.Errorf("%s %s with %s: %d %.200s, want 401", m, tg.path, cred.name, status, body)
					}
				}
			}
			// With the token the route answers something else: it exists.
			okCred := credentials{name: "A's token", header: map[string]string{api.HeaderExecdToken: ca.token}}
			status, body := tryRequest(t, tg.method, ca.base, tg.okPath, "{}", okCred, tg.header)
			if status == 401 || body == "404 page not found\n" {
				t.Fatalf("%s %s with A's token: %d %.200s: the route is not where the code says", tg.method, tg.okPath, status, body)
			}
			return fmt.Sprintf("%d credentials (%s) × %v all 401; A's own token %d", len(execdCreds), joinNames(execdCreds), methods, status)
		})
	}
	attack(t, "execd paths written oddly, without a token", func(t *testing.T) string {
		// execd itself, not the /proxy/{port} path its endpoint carries.
		addr, _, _ := strings.Cut(strings.TrimPrefix(ca.base, "http://"), "/")
		var got []string
		for _, target := range []string{"//ping", "/./ping", "/%70ing", "/proxy/" + execdPort + "/../../ping", "/proxy/" + execdPort + "//ping",
			"/proxy/" + execdPort + "/%2e%2e/ping", "/proxy/../ping", "*", "http://" + addr + "/ping", "/ping?" + api.HeaderExecdToken + "=" + ca.token} {
			status, body := rawRequest(t, addr, "GET", target, nil)
			if status != 401 && status != 400 {
				t.Errorf("GET %s: %d %.200s, want 401", target, status, body)
			}
			got = append(got, fmt.Sprintf("%s %d", target, status))
		}
		return strings.Join(got, ", ")
	})

	// /ready is the one execd route without the token: outside the
	// route table read above (every route of which wants the token), on
	// exactly its path, and it tells whether the sandbox serves, nothing
	// else: the same empty 200 whatever credentials come with it.
	attack(t, "execd GET/HEAD /ready, the one route open without a token, tells nothing", func(t *testing.T) string {
		addr, _, _ := strings.Cut(strings.TrimPrefix(ca.base, "http://"), "/")
		var got []string
		for _, m := range []string{"GET", "HEAD"} {
			for _, cred := range append([]credentials{{name: "A's token", header: map[string]string{api.HeaderExecdToken: ca.token}}}, execdCreds...) {
				status, body := tryRequest(t, m, "http://"+addr, api.ExecdReadyPath, "", cred, nil)
				if status != 200 || body != "" {
					t.Errorf("%s %s with %s: %d %.200q, want 200 and an empty body", m, api.ExecdReadyPath, cred.name, status, body)
				}
			}
			got = append(got, m+" 200 empty")
		}
		// Nothing else is open: other methods, other spellings, and the
		// path under the forwarder to execd itself.
		self := "/proxy/" + execdPort
		for _, tg := range []struct{ method, target string }{
			{"POST", "/ready"}, {"PUT", "/ready"}, {"DELETE", "/ready"}, {"OPTIONS", "/ready"}, {"GET", "/ready/"},
			{"GET", "//ready"}, {"GET", "/./ready"}, {"GET", "/%72eady"}, {"GET", "/READY"}, {"GET", "/ready/../ping"},
			{"GET", "/ready/../command/status/entrypoint"}, {"GET", self + "/ready"}, {"GET", self + "/ready/../ping"},
		} {
			status, body := rawRequest(t, addr, tg.method, tg.target, nil)
			if status != 401 && status != 400 {
				t.Errorf("%s %s without a token: %d %.200s, want 401", tg.method, tg.target, status, body)
			}
			got = append(got, fmt.Sprintf("%s %s %d", tg.method, tg.target, status))
		}
		// With the token, the forwarder does not serve it either.
		if status, body := tryRequest(t, "GET", "http://"+addr, self+api.ExecdReadyPath, "",
			credentials{name: "A's token", header: map[string]string{api.HeaderExecdToken: ca.token}}, nil); status != 404 {
			t.Errorf("GET %s%s with A's token: %d %.200s, want 404", self, api.ExecdReadyPath, status, body)
		}
		return strings.Join(got, ", ")
	})

	attack(t, "refused requests changed nothing", func(t *testing.T) string {
		// Every refused request above would have left a trace had it been
		// served: files in A, a sandbox, metadata, a snapshot, a pool.
		if out := ca.mustRun("ls /tmp; cat /tmp/keep"); strings.Contains(out, "pwned") || !strings.HasSuffix(out, "keep") {
			t.Errorf("sandbox A's /tmp after the refused requests: %q", out)
		}
		var list api.ListSandboxesResponse
		s.call("GET", "/v1/sandboxes", nil, 200, &list)
		var sa api.Sandbox
		s.call("GET", "/v1/sandboxes/"+a, nil, 200, &sa)
		var snaps api.ListSnapshotsResponse
		s.call("GET", "/v1/snapshots", nil, 200, &snaps)
		if list.Pagination.TotalItems != 2 || sa.Metadata["pwned"] != "" || len(snaps.Items) != 0 || s.scopeContainers() != 2 {
			t.Errorf("after the refused requests: %d sandboxes, %d containers, A's metadata %v, %d snapshots",
				list.Pagination.TotalItems, s.scopeContainers(), sa.Metadata, len(snaps.Items))
		}
		if resp, _ := s.do("GET", "/v1/pools/pwned", nil); resp.StatusCode != 404 {
			t.Errorf("GET /v1/pools/pwned: %d, want 404", resp.StatusCode)
		}
		return "A's files, the sandboxes, their metadata, snapshots and pools as they were"
	})

	// Every route the code registers was attacked above.
	for _, r := range routes {
		if !attacked[r.String()] {
			t.Errorf("lifecycle route %s was not attacked", r)
		}
	}
}

// TestAttackAuthMetricsOpen: with metrics_auth = false only GET /metrics
// opens; every other route still wants the key.
func TestAttackAuthMetricsOpen(t *testing.T) {
	s := startServer(t, serverOptions{server: "metrics_auth = false"})
	attack(t, "metrics_auth = false opens /metrics and nothing else", func(t *testing.T) string {
		var got []string
		for _, p := range []string{"/metrics", "/v1/metrics"} {
			status, _ := tryRequest(t, "GET", s.base, p, "", credentials{}, nil)
			if status != 200 {
				t.Errorf("GET %s without credentials: %d, want 200 (metrics_auth = false)", p, status)
			}
			got = append(got, fmt.Sprintf("%s %d", p, status))
		}
		for _, p := range []string{"/v1/sandboxes", "/sandboxes", "/v1/pools", "/v1/snapshots", "/v1/metrics/../sandboxes"} {
			status, body := rawRequest(t, s.listen, "GET", p, nil)
			if status != 401 {
				t.Errorf("GET %s without credentials: %d %.200s, want 401", p, status, body)
			}
			got = append(got, fmt.Sprintf("%s %d", p, status))
		}
		return strings.Join(got, ", ")
	})
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func joinNames(creds []credentials) string {
	names := make([]string, len(creds))
	for i, c := range creds {
		names[i] = c.name
	}
	return strings.Join(names, "; ")
}

// uniq lists the distinct values of vs.
func uniq(vs []string) string {
	var out []string
	for _, v := range vs {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return strings.Join(out, ",")
}

// TestAttackEngineSocket: nothing in a sandbox leads to the container
// engine: no socket on disk or in the abstract namespace, no engine port
// on the host, and no host volume that would bring the socket in.
func TestAttackEngineSocket(t *testing.T) {
	dir := t.TempDir()
	os.Symlink("/var/run/docker.sock", dir+"/sock-link")
	os.Symlink("/run", dir+"/run-link")
	os.Symlink("/var/run", dir+"/var-run-link")
	s := startServer(t, serverOptions{server: fmt.Sprintf("host_volume_allowlist = [%q, %q, %q]", "/run", "/var/run", dir)})
	_, c := pythonSandbox(s)
	eng := c.probe(nil, "engine")

	// The control: with the socket mounted, the probe finds it and the
	// engine answers its ping.
	withSock := probeControl(t, []string{"-v", "/var/run/docker.sock:/var/run/docker.sock"}, "engine")
	if str(withSock, "exists /var/run/docker.sock") != "yes" || len(engineAnswers(withSock)) == 0 {
		t.Fatalf("control with the socket mounted: %v: the probe cannot see a break", withSock)
	}

	attack(t, "engine socket on disk", func(t *testing.T) string {
		var seen []string
		for k := range eng {
			if strings.HasPrefix(k, "exists ") {
				if str(eng, k) != "no" {
					t.Errorf("%s in the sandbox", strings.TrimPrefix(k, "exists "))
				}
				seen = append(seen, strings.TrimPrefix(k, "exists "))
			}
		}
		// Any socket at all is tried: one that answers an engine's ping
		// is the engine, whatever its name.
		socks := str(eng, "sockets on disk")
		if answers := engineAnswers(eng); len(answers) > 0 {
			t.Errorf("sockets answer as the engine: %v", answers)
		}
		slices.Sort(seen)
		return fmt.Sprintf("none of %s; sockets anywhere (outside /proc, /sys): %s", strings.Join(seen, ", "), socks)
	})
	attack(t, "engine socket in the abstract namespace", func(t *testing.T) string {
		abstract := str(eng, "abstract sockets")
		if strings.Contains(abstract, "containerd") || strings.Contains(abstract, "docker") {
			t.Errorf("abstract sockets of the engine are visible: %s", abstract)
		}
		return "abstract sockets visible: " + abstract
	})
	attack(t, "engine TCP API on the host", func(t *testing.T) string {
		var got []string
		for _, p := range []string{"2375", "2376"} {
			r := str(eng, "engine tcp "+p)
			if !refused(r) {
				t.Errorf("the gateway %s:%s answers: %s", str(eng, "gateway"), p, r)
			}
			got = append(got, str(eng, "gateway")+":"+p+" "+r)
		}
		if h := str(eng, "DOCKER_HOST"); h != "" {
			t.Errorf("DOCKER_HOST=%s in the sandbox", h)
		}
		return strings.Join(got, ", ")
	})

	// Host volumes: the allow-list here holds /run and /var/run, as a
	// careless operator's might; the engine's sockets stay refused.
	before := s.scopeContainers()
	for _, v := range []struct {
		name, path, sub string
	}{
		{"the socket", "/var/run/docker.sock", ""},
		{"the socket under /run", "/run/docker.sock", ""},
		{"the socket's directory", "/var/run", ""},
		{"the socket's directory under /run", "/run", ""},
		{"the socket's directory with a trailing slash", "/run/", ""},
		{"the socket's directory with a dot", "/run/.", ""},
		{"the socket's directory through ..", "/var/run/../run", ""},
		{"a symlink to the socket", dir + "/sock-link", ""},
		{"a symlink to its directory", dir + "/run-link", ""},
		{"a symlink to /var/run", dir + "/var-run-link", ""},
		{"its directory with the socket as subPath", "/run", "docker.sock"},
		{"an allowed directory with a symlink to it as subPath", dir, "run-link"},
		{"containerd's socket under the engine's run directory", "/run/docker/containerd/containerd.sock", ""},
		{"containerd's socket directory", "/run/docker/containerd", ""},
		{"the engine's run directory", "/run/docker", ""},
		{"containerd's shim sockets", "/run/containerd", ""},
		{"a system containerd's socket", "/run/containerd/containerd.sock", ""},
	} {
		attack(t, "host volume of "+v.name, func(t *testing.T) string {
			if _, err := os.Lstat(v.path); err != nil {
				return v.path + " is not on this host: nothing to mount" // engines lay their sockets out differently
			}
			req := sandboxRequest(busyboxImage, "sleep", "1000")
			req.Volumes = []api.Volume{{Name: "engine", MountPath: "/engine", SubPath: v.sub, Host: &api.HostVolume{Path: v.path}}}
			resp, body := s.do("POST", "/v1/sandboxes", req)
			if resp.StatusCode != 400 {
				t.Errorf("host volume %s (subPath %q): %d %s, want 400", v.path, v.sub, resp.StatusCode, body)
			}
			return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		})
	}
	if after := s.scopeContainers(); after != before {
		t.Errorf("refused creates left containers: %d then %d", before, after)
	}
}

// engineAnswers lists the sockets of a probe's engine report that
// answered a ping as a Docker engine does.
func engineAnswers(report map[string]any) []string {
	var socks []string
	for k := range report {
		if strings.HasPrefix(k, "ping ") && strings.Contains(str(report, k), "Api-Version") {
			socks = append(socks, strings.TrimPrefix(k, "ping "))
		}
	}
	return socks
}

// containerIP is a sandbox's address on its Docker network.
func containerIP(t *testing.T, id string) string {
	t.Helper()
	ip := strings.TrimSpace(docker(t, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", "osb-"+id))
	if net.ParseIP(ip) == nil {
		t.Fatalf("address of sandbox %s: %q", id, ip)
	}
	return ip
}

// endpointPort is the host port of a sandbox's endpoint for port.
func endpointPort(s *server, id string, port int) string {
	s.t.Helper()
	var ep api.Endpoint
	s.call("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d", id, port), nil, 200, &ep)
	addr, _, _ := strings.Cut(ep.Endpoint, "/") // execd's carries /proxy/{port}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		s.t.Fatalf("endpoint %+v: %v", ep, err)
	}
	return p
}

// execdStatus runs, in a sandbox, a request to its own execd at
// 127.0.0.1:44772 with token (none when empty) and returns the status.
func execdStatus(c *container, uid *uint32, method, path, token string) string {
	c.t.Helper()
	script := `import sys, urllib.request as u
req = u.Request("http://127.0.0.1:` + execdPort + `" + sys.argv[2], method=sys.argv[1], data=b'{"command":"touch /tmp/pwned-inside"}' if sys.argv[1] == "POST" else None)
req.add_header("Content-Type", "application/json")
if sys.argv[3]:
    req.add_header("X-EXECD-ACCESS-TOKEN", sys.argv[3])
try:
    print(u.urlopen(req, timeout=10).status)
except u.HTTPError as e:
    print(e.code)
`
	r := c.stream("/command", api.RunCommandRequest{Command: "python3 -c " + shellQuote(script, method, path, token), UID: uid})
	if r.exit != "0" {
		c.t.Fatalf("request from inside: %+v", r)
	}
	return strings.TrimSpace(r.stdout)
}

// TestAttackNeighbours: a sandbox cannot open a connection to another
// sandbox, to the ports the host publishes for it, or to the lifecycle
// server, and another sandbox's token opens nothing from inside.
func TestAttackNeighbours(t *testing.T) {
	t.Run("default", func(t *testing.T) { neighbours(t, startServer(t, serverOptions{})) })
	// Ports published on every address of the host, and the private
	// ranges (the sandbox network's among them) open: the kernel forwards
	// a connection to a published port, from A through the gateway, to
	// B's own address, which the guard still shuts.
	t.Run("ports on every address, private ranges open", func(t *testing.T) {
		neighbours(t, startServer(t, serverOptions{docker: "bind_ip = \"0.0.0.0\"\nblocked_cidrs = []"}))
	})
}

// neighbours tries, from sandbox A, everything of sandbox B and of the
// server that A must not reach.
func neighbours(t *testing.T, s *server) {
	_, a := pythonSandbox(s)
	bID, b := pythonSandbox(s, "python3", "-m", "http.server", "8080", "--directory", "/etc")
	bIP := containerIP(t, bID)
	_, serverPort, _ := net.SplitHostPort(s.listen)

	// From the host, B's address answers on both ports: the refusals seen
	// from A are the network's, not a sandbox that is not listening.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := attackClient.Get("http://" + bIP + ":8080/hostname")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's app at %s:8080 does not answer the host: %v", bIP, err)
		}
	}
	if status, _ := tryRequest(t, "GET", "http://"+bIP+":"+execdPort, "/ping", "", credentials{header: map[string]string{api.HeaderExecdToken: b.token}}, nil); status != 200 {
		t.Fatalf("B's execd at %s:%d does not answer the host: %d", bIP, api.ExecdPort, status)
	}

	targets := map[string]string{
		bIP + ":8080":         "B's app on the sandbox network",
		bIP + ":" + execdPort: "B's execd on the sandbox network",
		"gw:" + endpointPort(s, bID, api.ExecdPort):        "B's execd as the host publishes it, through the gateway",
		"gw:" + endpointPort(s, bID, 8080):                 "B's app as the host publishes it, through the gateway",
		"gw:" + serverPort:                                 "the lifecycle server's port on the gateway",
		"127.0.0.1:" + serverPort:                          "the lifecycle server's port on loopback",
		"127.0.0.1:" + endpointPort(s, bID, api.ExecdPort): "B's published execd port on loopback",
	}
	list := []string{"127.0.0.1:" + execdPort} // A's own execd: the probe's connections work
	for k := range targets {
		list = append(list, k)
	}
	got := a.probe(nil, "connect", mustJSON(list))
	if r := str(got, "127.0.0.1:"+execdPort); refused(r) {
		t.Fatalf("A cannot reach its own execd (%s): the probe cannot connect at all", r)
	}
	for target, what := range targets {
		attack(t, "A connects to "+what, func(t *testing.T) string {
			r := str(got, target)
			if !refused(r) {
				t.Errorf("A reached %s (%s): %s", what, target, r)
			}
			return target + " " + r
		})
	}

	attack(t, "A uses B's token on its own execd", func(t *testing.T) string {
		var res []string
		for _, p := range []string{"/ping", "/command", "/files/download?path=/etc/hostname", "/proxy/" + execdPort + "/ping"} {
			method := "GET"
			if p == "/command" {
				method = "POST"
			}
			st := execdStatus(a, nil, method, p, b.token)
			if st != "401" {
				t.Errorf("%s %s with B's token from inside A: %s, want 401", method, p, st)
			}
			res = append(res, p+" "+st)
		}
		return strings.Join(res, ", ")
	})
	attack(t, "nobody in A uses A's execd without the token", func(t *testing.T) string {
		// execd runs commands as any user: without its token, a process
		// of an unprivileged user would become root through it.
		nobody := uint32(65534)
		st := execdStatus(a, &nobody, "POST", "/command", "")
		if st != "401" {
			t.Errorf("POST /command from uid 65534 without a token: %s, want 401", st)
		}
		if out := a.mustRun("ls /tmp"); strings.Contains(out, "pwned") {
			t.Errorf("a refused command ran: /tmp holds %q", out)
		}
		return "POST /command as uid 65534 without the token: " + st
	})
}

// TestAttackProc: neither the sandbox's token nor the server's key can be
// read anywhere in the sandbox (/proc of every process, descriptors, any
// file), and no application behind a proxy is handed either.
func TestAttackProc(t *testing.T) {
	s := startServer(t, serverOptions{})
	control := "osb-attack-control-" + randomHex(8)
	echo := []string{"python3", "-c", `import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        b = str(self.headers).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b)
h.HTTPServer(("0.0.0.0", 8080), H).serve_forever()`}
	req := sandboxRequest(pythonImage, echo...)
	req.Env = map[string]*string{"CONTROL_SECRET": ptr(control)}
	id := s.create(req)
	s.waitState(id, "Running")
	c := s.execd(id)
	c.putProbe()
	c.mustRun("echo " + control + " > /tmp/control")

	// The control: a value the sandbox was given in its environment (in
	// the entrypoint's /proc/N/environ: execd's own, /proc/1, is
	// unreadable) and one written to a file are found, so a token as easy
	// to reach would be too.
	found := str(c.probe(nil, "secret", hexOf(control)), "found")
	if !regexp.MustCompile(`/proc/[0-9]+/environ`).MatchString(found) || !strings.Contains(found, "/tmp/control") {
		t.Fatalf("control: the probe finds %s for a value in the environment and /tmp/control: it cannot see a leak", found)
	}

	nobody := uint32(65534)
	for _, v := range []struct{ what, secret string }{{"the sandbox's token", c.token}, {"the server's API key", s.key}} {
		for _, as := range []struct {
			who string
			uid *uint32
		}{{"root", nil}, {"nobody", &nobody}} {
			attack(t, as.who+" in the sandbox looks for "+v.what, func(t *testing.T) string {
				found := str(c.probe(as.uid, "secret", hexOf(v.secret)), "found")
				if found != "[]" {
					t.Errorf("%s readable by %s at %s", v.what, as.who, found)
				}
				return "found in none of /proc/*/environ, /proc/*/cmdline, /proc/*/fd, the environment, the files outside /proc, /sys, /dev"
			})
		}
	}

	// What the application behind each proxy is handed.
	mark := "X-Attack-Control"
	secure := sandboxRequest(pythonImage, echo...)
	secure.SecureAccess = true
	sid := s.create(secure)
	s.waitState(sid, "Running")
	sc := s.execd(sid)
	for _, p := range []struct {
		name, base, path string
		header           map[string]string
		secrets          []string
	}{
		{"execd's port proxy with the token", c.base, "/proxy/8080/", map[string]string{api.HeaderExecdToken: c.token}, []string{c.token}},
		{"the server proxy with the key", s.base, "/v1/sandboxes/" + id + "/proxy/8080/", map[string]string{api.HeaderAPIKey: s.key}, []string{s.key}},
		{"the server proxy with the token", s.base, "/v1/sandboxes/" + id + "/proxy/8080/", map[string]string{api.HeaderExecdToken: c.token}, []string{c.token}},
		{"the server proxy to a secure-access sandbox with the key", s.base, "/v1/sandboxes/" + sid + "/proxy/8080/", map[string]string{api.HeaderAPIKey: s.key}, []string{s.key, sc.token}},
		{"the server proxy to a secure-access sandbox with its token", s.base, "/v1/sandboxes/" + sid + "/proxy/8080/", map[string]string{api.HeaderExecdToken: sc.token}, []string{s.key, sc.token}},
	} {
		attack(t, "the app behind "+p.name+" reads the credentials", func(t *testing.T) string {
			cred := credentials{name: p.name, header: p.header}
			var status int
			var body string
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				status, body = tryRequest(t, "GET", p.base, p.path, "", cred, map[string]string{mark: control})
				if status == 200 || time.Now().After(deadline) {
					break
				}
			}
			if status != 200 || !strings.Contains(body, control) {
				t.Fatalf("the echo app through %s: %d %q: the request did not reach it", p.name, status, body)
			}
			for _, secret := range p.secrets {
				if strings.Contains(body, secret) {
					t.Errorf("the app was handed a credential: %q", body)
				}
			}
			return "the app saw: " + strings.Join(strings.Fields(strings.ReplaceAll(body, control, "(control)")), " ")
		})
	}
}

// uploadStatus uploads one file through the multipart API and returns the
// status and answer, whatever they are.
func (c *container) uploadStatus(path string, data []byte) (int, string) {
	c.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	w, _ := mw.CreatePart(h)
	json.NewEncoder(w).Encode(api.FileMetadata{Path: path})
	fw, _ := mw.CreateFormFile("file", "blob")
	fw.Write(data)
	mw.Close()
	resp := c.request("POST", "/files/upload", &body, "Content-Type", mw.FormDataContentType())
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// tarEntry is one entry of a hand-made archive.
type tarEntry struct {
	name, link, body string
	typ              byte
	major, minor     int64
	size             int64 // when not len(body): a header that lies
}

func makeTar(entries ...tarEntry) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		typ := cmp.Or(e.typ, byte(tar.TypeReg))
		size := int64(0)
		if typ == tar.TypeReg {
			size = cmp.Or(e.size, int64(len(e.body)))
		}
		tw.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: 0o644, Size: size, Devmajor: e.major, Devminor: e.minor})
		if e.size != 0 {
			// A lying header: write what there is and stop, unfinished.
			tw.Flush()
			b.WriteString(e.body)
			return b.Bytes()
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return b.Bytes()
}

// dirEntries lists a host directory's entries, sorted.
func dirEntries(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}

// TestAttackTraversal: execd's file API, uploads and archives resolve
// every path inside the sandbox, whatever "..", absolute paths and
// symlinks it holds: a file of the host is never read or written, bad
// archives get a clear 4xx, and osb cp writes nothing on the host outside
// the destination it was given.
func TestAttackTraversal(t *testing.T) {
	// A host directory with a secret beside an allowed host volume: from
	// the host's side, a symlink in the volume to ../secret leads to it.
	hostDir := t.TempDir()
	secret := "host-secret-" + randomHex(12)
	if err := os.WriteFile(filepath.Join(hostDir, "secret"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	allowed := filepath.Join(hostDir, "allowed")
	os.Mkdir(allowed, 0o777)
	hostBefore := dirEntries(t, hostDir)
	s := startServer(t, serverOptions{server: fmt.Sprintf("host_volume_allowlist = [%q]", allowed)})
	req := sandboxRequest(pythonImage, "sleep", "infinity")
	req.Volumes = []api.Volume{{Name: "work", MountPath: "/work", Host: &api.HostVolume{Path: allowed}}}
	id := s.create(req)
	s.waitState(id, "Running")
	c := s.execd(id)
	c.putProbe()
	hostSecret := filepath.Join(hostDir, "secret")
	c.mustRun("ln -s " + hostDir + " /tmp/l-abs; ln -s / /tmp/l-root; ln -s ../../../../../../.. /tmp/l-up; " +
		"ln -s ../secret /work/up; ln -s " + hostSecret + " /work/abs")

	reads := []string{
		"/files/download?path=" + hostSecret,
		"/files/download?path=/../../../.." + hostSecret,
		"/files/download?path=" + url.QueryEscape("/"+strings.ReplaceAll(hostSecret, "/", "//")),
		"/files/download?path=" + url.QueryEscape("/%2e%2e/%2e%2e"+hostSecret),
		"/files/download?path=/tmp/l-abs/secret",
		"/files/download?path=/tmp/l-root" + hostSecret,
		"/files/download?path=/tmp/l-up" + hostSecret,
		"/files/download?path=/proc/1/root" + hostSecret,
		"/files/download?path=/proc/self/root" + hostSecret,
		"/files/download?path=/proc/1/cwd/../../../.." + hostSecret,
		"/files/download?path=/work/up",
		"/files/download?path=/work/abs",
		"/files/download?path=/work/../secret",
		"/files/download?path=/work/../../../.." + hostSecret,
		"/files/info?path=" + hostSecret,
		"/files/info?path=/work/up",
		"/directories/list?path=" + hostDir,
		"/directories/list?path=/tmp/l-abs",
		"/files/search?path=" + hostDir + "&pattern=secret",
		"/files/search?path=/tmp/l-abs&pattern=*",
		"/files/archive?path=" + hostDir,
		"/files/archive?path=/tmp/l-abs",
		"/files/archive?path=/work",
	}
	readAll := func(t *testing.T) map[string]string {
		got := map[string]string{}
		for _, p := range reads {
			resp := c.request("GET", p, nil)
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(data), secret) {
				t.Errorf("GET %s: %d, the host's secret: %.200q", p, resp.StatusCode, data)
			}
			got[p] = fmt.Sprint(resp.StatusCode)
		}
		return got
	}
	attack(t, "read a host file through the file API (.., absolute, symlinks, /proc/N/root, a host volume)", func(t *testing.T) string {
		got := readAll(t)
		for _, p := range reads {
			if strings.HasPrefix(p, "/files/download") && got[p] != "404" {
				t.Errorf("GET %s: %s, want 404 (nothing there in the sandbox)", p, got[p])
			}
		}
		return fmt.Sprintf("%d reads, none answered with the host's file: %v", len(reads), got)
	})
	attack(t, "the same paths once the sandbox has a file there", func(t *testing.T) string {
		// The paths resolve in the sandbox's own tree: with a file of the
		// sandbox's at the host secret's path they find that file, and
		// still never the host's.
		c.mustRun("mkdir -p " + hostDir + " && echo inside-copy > " + hostSecret)
		defer c.mustRun("rm -rf " + hostDir)
		readAll(t)
		resp, data := c.download(hostSecret)
		if resp.StatusCode != 200 || strings.TrimSpace(string(data)) != "inside-copy" {
			t.Errorf("GET the sandbox's own copy: %d %q", resp.StatusCode, data)
		}
		resp, data = c.download("/proc/1/root" + hostSecret)
		if strings.TrimSpace(string(data)) != "inside-copy" {
			t.Errorf("GET /proc/1/root%s: %d %q, want the sandbox's copy", hostSecret, resp.StatusCode, data)
		}
		return "every path that reached a file reached the sandbox's copy"
	})

	attack(t, "write a host file through uploads (.., absolute, symlinks)", func(t *testing.T) string {
		var got []string
		for _, p := range []string{"../../../../.." + hostDir + "/up-rel", hostDir + "/up-abs", "/tmp/l-abs/up-link",
			"/tmp/l-up" + hostDir + "/up-up", "/work/../" + filepath.Base(hostDir) + "-up", "/work/up"} {
			status, body := c.uploadStatus(p, []byte("pwned"))
			got = append(got, fmt.Sprintf("%s %d", p, status))
			if status >= 500 {
				t.Errorf("upload to %s: %d %s", p, status, body)
			}
		}
		if after := dirEntries(t, hostDir); after != hostBefore {
			t.Errorf("the host directory changed: %s, was %s", after, hostBefore)
		}
		if data, _ := os.ReadFile(hostSecret); string(data) != secret {
			t.Errorf("the host's secret now holds %q", data)
		}
		// What the uploads made is in the sandbox: its own copy of the
		// host directory's path, and in the volume itself.
		inside := c.mustRun("ls " + hostDir + "; ls -l /work | tail -n +2")
		return strings.Join(got, ", ") + "; in the sandbox: " + strings.Join(strings.Fields(inside), " ")
	})

	c.mustRun("mkdir -p /tmp/x")
	for _, tc := range []struct {
		name    string
		archive []byte
	}{
		{"an entry with ..", makeTar(tarEntry{name: "../escaped", body: "x"})},
		{"an entry with .. further in", makeTar(tarEntry{name: "a/../../escaped", body: "x"})},
		{"an absolute entry", makeTar(tarEntry{name: "/abs-escaped", body: "x"})},
		{"an absolute entry at the host's path", makeTar(tarEntry{name: hostDir + "/tar-abs", body: "x"})},
		{"a symlink out, then a file through it", makeTar(tarEntry{name: "l", typ: tar.TypeSymlink, link: hostDir}, tarEntry{name: "l/through-abs", body: "x"})},
		{"a relative symlink out, then a file through it", makeTar(tarEntry{name: "l", typ: tar.TypeSymlink, link: "../../../../../.." + hostDir}, tarEntry{name: "l/through-rel", body: "x"})},
		{"a symlink out, then a directory through it", makeTar(tarEntry{name: "l", typ: tar.TypeSymlink, link: "/"}, tarEntry{name: "l/tmp/through-dir/", typ: tar.TypeDir})},
		{"a hard link to an absolute path", makeTar(tarEntry{name: "h", typ: tar.TypeLink, link: "/etc/passwd"})},
		{"a hard link up the tree", makeTar(tarEntry{name: "h", typ: tar.TypeLink, link: "../keep"})},
		{"not an archive", []byte("this is not a tar archive, and it is long enough to hold a header block..." + strings.Repeat("!", 600))},
		{"an entry longer than the archive", makeTar(tarEntry{name: "short", body: "only this", size: 1 << 20})},
	} {
		attack(t, "tar upload: "+tc.name, func(t *testing.T) string {
			resp := c.request("POST", "/files/archive?path=/tmp/x", bytes.NewReader(tc.archive), "Content-Type", "application/x-tar")
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e api.ErrorResponse
			json.Unmarshal(data, &e)
			if resp.StatusCode < 400 || resp.StatusCode >= 500 || e.Code == "" || e.Message == "" {
				t.Errorf("%d %s, want a 4xx with {code,message}", resp.StatusCode, data)
			}
			// Where each entry would have landed had it been followed.
			if out := c.mustRun("ls -d /tmp/escaped /abs-escaped /tmp/through-dir /tmp/x/h " + hostDir + "/tar-abs " +
				hostDir + "/through-abs " + hostDir + "/through-rel 2>/dev/null; rm -rf /tmp/x/*"); out != "" {
				t.Errorf("entries landed outside /tmp/x: %q", out)
			}
			return fmt.Sprintf("%d %s: %s", resp.StatusCode, e.Code, e.Message)
		})
	}
	attack(t, "tar upload: device nodes and a FIFO", func(t *testing.T) string {
		archive := makeTar(tarEntry{name: "null", typ: tar.TypeChar, major: 1, minor: 3},
			tarEntry{name: "disk", typ: tar.TypeBlock, major: 8, minor: 0},
			tarEntry{name: "fifo", typ: tar.TypeFifo})
		resp := c.request("POST", "/files/archive?path=/tmp/x", bytes.NewReader(archive), "Content-Type", "application/x-tar")
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Errorf("%d %s", resp.StatusCode, data)
		}
		if out := c.mustRun("ls /tmp/x/null /tmp/x/disk /tmp/x/fifo 2>/dev/null; true"); out != "" {
			t.Errorf("device nodes made: %q", out)
		}
		return fmt.Sprintf("%d %s; none made", resp.StatusCode, strings.TrimSpace(string(data)))
	})
	attack(t, "archives changed nothing on the host", func(t *testing.T) string {
		if after := dirEntries(t, hostDir); after != hostBefore {
			t.Errorf("the host directory changed: %s, was %s", after, hostBefore)
		}
		return "the host directory holds " + hostBefore
	})

	// osb cp from a sandbox that plants symlinks to the host's directory
	// and swaps a directory with such a symlink while it is copied.
	c.mustRun("mkdir -p /tmp/tree/swap /tmp/tree/data && echo pwned > /tmp/tree/swap/pwned && echo data > /tmp/tree/data/f && " +
		"ln -s " + hostDir + " /tmp/tree/abs && ln -s ../../../../../../.." + hostDir + " /tmp/tree/rel && ln -s " + hostDir + " /tmp/tree/alt")
	racer := c.stream("/command", api.RunCommandRequest{Background: true, Command: `python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/tmp/tree")
while True:
    libc.renameat2(-100, b"swap", -100, b"alt", 2)  # RENAME_EXCHANGE: a directory and a symlink out trade places
'`})
	defer c.call("DELETE", "/command?id="+racer.id, nil, 200, nil)
	attack(t, "osb cp out of a sandbox that plants and swaps symlinks to the host", func(t *testing.T) string {
		parent := t.TempDir()
		ok, refusedN := 0, 0
		var refusals []string
		for i := range 30 {
			dst := filepath.Join(parent, fmt.Sprint(i))
			r := s.osb("cp", id+":/tmp/tree", dst)
			if r.code == 0 {
				ok++
				for _, l := range []string{"abs", "rel"} {
					if fi, err := os.Lstat(filepath.Join(dst, l)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
						t.Errorf("copy %d: %s is not copied as a symlink: %v", i, l, err)
					}
				}
			} else {
				refusedN++
				if msg := strings.TrimSpace(r.err); !slices.Contains(refusals, msg) {
					refusals = append(refusals, msg)
				}
			}
			if after := dirEntries(t, hostDir); after != hostBefore {
				t.Fatalf("copy %d wrote into the host directory: %s, was %s (osb: %s)", i, after, hostBefore, r.err)
			}
		}
		// Nothing beside the destinations either.
		if got := dirEntries(t, parent); len(strings.Split(got, ",")) > 30 {
			t.Errorf("beside the destinations: %s", got)
		}
		return fmt.Sprintf("30 copies while the tree swapped: %d done, %d refused (%s), nothing written outside their destinations",
			ok, refusedN, strings.Join(refusals, "; "))
	})
	attack(t, "osb cp back into the sandbox of a tree holding symlinks to the host", func(t *testing.T) string {
		// A user copies the tree out and back in: the links go as links,
		// and the host's secret they point at never reaches the sandbox.
		local := filepath.Join(t.TempDir(), "tree")
		os.MkdirAll(filepath.Join(local, "d"), 0o755)
		os.Symlink(hostDir, filepath.Join(local, "abs"))
		os.Symlink(hostSecret, filepath.Join(local, "d", "file-link"))
		s.osb("cp", local, id+":/tmp/back").ok(t)
		found := str(c.probe(nil, "secret", hexOf(secret)), "found")
		if strings.Contains(found, "/tmp/back") {
			t.Errorf("the host's secret reached the sandbox: %s", found)
		}
		return "links copied as links; the secret they point at is nowhere in the sandbox"
	})
}

// TestAttackFrozenEngine: an engine that stops answering (frozen, not
// gone) neither stops the server from answering nor leaks anything: once
// it answers again, a sandbox that expired meanwhile is removed, a delete
// asked meanwhile is done, a create asked meanwhile comes up, and no
// container is left without its sandbox, even when the server was killed
// while creates were held at the frozen engine.
//
// The other ways to leave resources behind are tried elsewhere: kill -9
// of the server during creates and an expiry that passes while no server
// runs in TestRestart, expiry within a second in TestExpiry, a pull that
// never ends in TestSlowPullDoesNotBlock and runtime/docker's
// TestDeleteAbandonsStalledPull.
func TestAttackFrozenEngine(t *testing.T) {
	testenv.MustHaveDocker(t)
	gate := newEngineGate(t, "/var/run/docker.sock")
	s := startServer(t, serverOptions{docker: fmt.Sprintf("host = %q", "unix://"+gate.path)})
	// The expiring sandbox gets its short expiry once it runs, right
	// before the freeze: a short timeout at create could pass while the
	// sandbox still starts on a busy machine, and then no expiry would
	// happen while the engine is frozen.
	expiring := sandboxRequest(busyboxImage, "sleep", "1000000")
	expiring.Timeout = ptr(int64(3600))
	exp := s.create(expiring)
	deleted := s.create(sandboxRequest(busyboxImage, "sleep", "1000000"))
	s.waitState(exp, "Running")
	s.waitState(deleted, "Running")

	attack(t, "freeze the engine while sandboxes expire, are deleted and created", func(t *testing.T) string {
		expiresAt := time.Now().Add(2 * time.Second)
		s.call("POST", "/v1/sandboxes/"+exp+"/renew-expiration", map[string]string{"expiresAt": expiresAt.UTC().Format(time.RFC3339Nano)}, 200, nil)
		gate.set(true)
		type answer struct {
			what   string
			status int
			body   []byte
		}
		answers := make(chan answer, 4)
		ask := func(what, method, path string, body any) {
			go func() {
				resp, data := s.do(method, path, body)
				answers <- answer{what, resp.StatusCode, data}
			}()
		}
		ask("GET /health", "GET", "/health", nil)
		ask("GET /v1/sandboxes", "GET", "/v1/sandboxes", nil)
		ask("POST /v1/sandboxes", "POST", "/v1/sandboxes", sandboxRequest(busyboxImage, "sleep", "1000000"))
		ask("DELETE the second sandbox", "DELETE", "/v1/sandboxes/"+deleted, nil)
		time.Sleep(5 * time.Second) // the expiring sandbox's time passes, frozen
		got := map[string]answer{}
		var frozen []string
	drain:
		for {
			select {
			case a := <-answers:
				got[a.what] = a
				frozen = append(frozen, fmt.Sprintf("%s %d", a.what, a.status))
			default:
				break drain
			}
		}
		for _, what := range []string{"GET /health", "GET /v1/sandboxes", "POST /v1/sandboxes"} {
			if _, ok := got[what]; !ok {
				t.Errorf("%s did not answer in 5 s of a frozen engine", what)
			}
		}
		gate.set(false)
		for len(got) < 4 {
			a := <-answers
			got[a.what] = a
		}
		if a := got["DELETE the second sandbox"]; a.status != 204 {
			t.Errorf("DELETE once thawed: %d %s", a.status, a.body)
		}
		var created api.CreateSandboxResponse
		if a := got["POST /v1/sandboxes"]; a.status != 202 || json.Unmarshal(a.body, &created) != nil {
			t.Fatalf("create while frozen: %d %s", a.status, a.body)
		}
		s.waitGone(exp)
		s.waitGone(deleted)
		s.waitState(created.ID, "Running")
		waitContainers(t, s, 1)
		return fmt.Sprintf("answered while frozen: %s; once thawed: the expired sandbox and the deleted one gone, the new one Running, 1 container",
			strings.Join(frozen, ", "))
	})

	attack(t, "kill -9 the server while its container creates are held at the engine", func(t *testing.T) string {
		// The requests that create the containers sit at the gate when
		// the server dies; let through, they make containers for a server
		// that is gone. The next server must adopt or remove every one.
		before := s.scopeContainers()
		ids := holdCreates(t, s, gate, 3)
		s.stop(syscall.SIGKILL)
		gate.hold(false)
		testwait.Wait{What: "the held creates to make 3 containers", Starts: 3,
			Describe: func() string { return testwait.Containers("label=opensandbox.scope=" + s.scope) }}.Until(t, func() bool {
			return s.scopeContainers() >= before+3
		})
		made := s.scopeContainers() - before
		s.start()
		var states []string
		for _, id := range ids {
			sb := waitSettled(t, s, id, 1)
			states = append(states, sb)
		}
		var list api.ListSandboxesResponse
		s.call("GET", "/v1/sandboxes", nil, 200, &list)
		waitContainers(t, s, list.Pagination.TotalItems)
		return fmt.Sprintf("%d containers made for the dead server; its 3 creates ended %v; %d sandboxes, %d containers, none orphaned",
			made, states, list.Pagination.TotalItems, s.scopeContainers())
	})

	attack(t, "delete sandboxes whose container creates are held at the engine", func(t *testing.T) string {
		// The deletes are answered before the engine has made the
		// containers; when it does, the server must remove them.
		before := s.scopeContainers()
		ids := holdCreates(t, s, gate, 3)
		deletes := make(chan int, len(ids))
		for _, id := range ids {
			go func() {
				resp, _ := s.do("DELETE", "/v1/sandboxes/"+id, nil)
				deletes <- resp.StatusCode
			}()
		}
		time.Sleep(time.Second)
		gate.hold(false)
		var statuses []string
		for range ids {
			statuses = append(statuses, fmt.Sprint(<-deletes))
		}
		for _, id := range ids {
			s.waitGone(id)
		}
		waitContainers(t, s, before)
		return fmt.Sprintf("deletes answered %v; the 3 sandboxes gone and their containers with them (%d containers, as before)",
			statuses, s.scopeContainers())
	})
}

// waitSettled waits until a sandbox is Running, Failed or gone, and
// returns which.
func waitSettled(t *testing.T, s *server, id string, starts int) string {
	t.Helper()
	var settled string
	testwait.Wait{What: "sandbox " + id + " to be Running, Failed or gone", Starts: starts,
		Describe: func() string { return s.describe(id) }}.Until(t, func() bool {
		resp, data := s.do("GET", "/v1/sandboxes/"+id, nil)
		var sb api.Sandbox
		json.Unmarshal(data, &sb)
		switch {
		case resp.StatusCode == 404:
			settled = "gone"
		case sb.Status.State == "Running":
			settled = "Running"
		case sb.Status.State == "Failed":
			settled = "Failed (" + sb.Status.Reason + ")"
		}
		return settled != ""
	})
	return settled
}

// waitContainers waits until the server's scope holds n containers.
func waitContainers(t *testing.T, s *server, n int) {
	t.Helper()
	testwait.Wait{What: fmt.Sprintf("%d containers in the scope", n), Starts: max(n, 1), Every: 100 * time.Millisecond,
		Describe: func() string { return testwait.Containers("label=opensandbox.scope=" + s.scope) }}.Until(t, func() bool {
		return s.scopeContainers() == n
	})
}

// holdCreates makes n sandboxes whose container creates the gate holds
// at the engine, and returns their ids once all n are held.
func holdCreates(t *testing.T, s *server, gate *engineGate, n int) []string {
	t.Helper()
	gate.hold(true)
	var ids []string
	for range n {
		ids = append(ids, s.create(sandboxRequest(busyboxImage, "sleep", "1000000")))
	}
	testwait.Wait{What: fmt.Sprintf("%d container creates to reach the engine's gate", n), Starts: n,
		Describe: func() string { return fmt.Sprintf("%d reached it", gate.heldCreates()) }}.Until(t, func() bool {
		return gate.heldCreates() >= n
	})
	return ids
}
