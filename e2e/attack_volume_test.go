package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
)

// raceAttempts is how many creates each race attack makes
// (OSB_ATTACK_RACE overrides it).
func raceAttempts() int {
	if n, err := strconv.Atoi(os.Getenv("OSB_ATTACK_RACE")); err == nil && n > 0 {
		return n
	}
	return 240
}

// swapLoop is the attacker's side of the race: at path, a directory and a
// link to target take turns, a few milliseconds each, for ever; one
// directory in four stays 1.5 s, long enough for a victim to mount it.
func swapLoop(path, target string) string {
	return fmt.Sprintf(`i=0; while :; do mkdir %[1]s 2>/dev/null; if [ $((i %% 4)) = 0 ]; then usleep 1500000; else usleep 2000; fi; rmdir %[1]s 2>/dev/null; ln -s %[2]s %[1]s 2>/dev/null; usleep 2000; rm -f %[1]s; i=$((i + 1)); done`, path, target)
}

// evenSwapLoop is a shell loop that holds path as a link to target for
// 300 ms, then as a directory for 0.3, 1 or 3 s in turn. The short
// phases make a create's check and its mount, some hundred milliseconds
// apart, see different things, which swapLoop's 2 ms links rarely give a
// sub path of a named volume (whose check and mount are both in the
// server); the 3 s directory lets creates through even when a loaded
// machine stretches a create past a second, so that the race is run
// from both sides whatever the machine's speed.
func evenSwapLoop(path, target string) string {
	return fmt.Sprintf(`while :; do for d in 300000 1000000 3000000; do mkdir %[1]s 2>/dev/null; usleep $d; rmdir %[1]s 2>/dev/null; ln -s %[2]s %[1]s 2>/dev/null; usleep 300000; rm -f %[1]s; done; done`, path, target)
}

// raceOutcomes counts what the victim's creates came to.
type raceOutcomes struct {
	mu       sync.Mutex
	byResult map[string]int
	escapes  []string
}

func (o *raceOutcomes) add(result string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byResult[result]++
}

func (o *raceOutcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var parts []string
	for _, k := range []string{"mounted the directory", "refused (400)", "failed: VOLUME_CHANGED", "failed: VOLUME_NOT_FOUND", "ESCAPED"} {
		if n := o.byResult[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	for k, n := range o.byResult {
		if !strings.Contains(strings.Join(parts, ","), k) {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	return strings.Join(parts, ", ")
}

// mustHaveRaced fails the test when the race was not run: some victims
// must have mounted the directory, and some met the link (at the check
// or at the mount), or the attempt proved nothing.
func (o *raceOutcomes) mustHaveRaced(t *testing.T) {
	t.Helper()
	o.mu.Lock()
	mounted, linked := o.byResult["mounted the directory"], o.byResult["refused (400)"]+o.byResult["failed: VOLUME_CHANGED"]
	o.mu.Unlock()
	if mounted == 0 || linked == 0 {
		t.Errorf("the race was not exercised: %s", o)
	}
}

// raceVictim creates sandboxes that mount vol while the attacker swaps
// its path, n of them, four at a time, and reports what each saw: a
// sandbox that shows marker (a file of the directory the attacker's link
// leads to) is an escape.
func raceVictim(t *testing.T, s *server, vol api.Volume, marker string, n int) *raceOutcomes {
	o := &raceOutcomes{byResult: map[string]int{}}
	work := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				result, detail := raceOnce(s, vol, marker)
				o.add(result)
				if os.Getenv("OSB_ATTACK_DEBUG") != "" {
					t.Logf("%s: %s", result, detail)
				}
				if result == "ESCAPED" {
					o.mu.Lock()
					o.escapes = append(o.escapes, detail)
					o.mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return o
}

// raceOnce makes one victim sandbox and looks at what its volume shows.
// It reports through its results, never t.Fatal: it runs in goroutines.
func raceOnce(s *server, vol api.Volume, marker string) (result, detail string) {
	req := sandboxRequest(busyboxImage, "sleep", "1000")
	req.Volumes = []api.Volume{vol}
	status, body := rawCall(s, "POST", "/v1/sandboxes", req)
	if status == 400 {
		return "refused (400)", string(body)
	}
	if status != 202 {
		return fmt.Sprintf("create answered %d", status), string(body)
	}
	var created api.CreateSandboxResponse
	json.Unmarshal(body, &created)
	id := created.ID
	defer rawCall(s, "DELETE", "/v1/sandboxes/"+id, nil)
	var sb api.Sandbox
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if status, body := rawCall(s, "GET", "/v1/sandboxes/"+id, nil); status == 200 {
			json.Unmarshal(body, &sb)
		}
		if sb.Status.State == "Failed" {
			return "failed: " + sb.Status.Reason, sb.Status.Message
		}
		if sb.Status.State == "Running" {
			break
		}
		if time.Now().After(deadline) {
			return "still " + sb.Status.State, ""
		}
	}
	status, body = rawCall(s, "GET", "/v1/sandboxes/"+id+"/endpoints/"+execdPort, nil)
	var ep api.Endpoint
	if status != 200 || json.Unmarshal(body, &ep) != nil {
		return fmt.Sprintf("endpoint answered %d", status), string(body)
	}
	out, err := execdRun(ep, "ls -a "+vol.MountPath)
	if err != nil {
		return "command failed", err.Error()
	}
	if strings.Contains(out, marker) {
		return "ESCAPED", fmt.Sprintf("sandbox %s sees %q at %s", id, out, vol.MountPath)
	}
	return "mounted the directory", ""
}

// rawCall sends one lifecycle request with the API key, for goroutines.
func rawCall(s *server, method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(context.Background(), method, s.base+path, rd)
	req.Header.Set(api.HeaderAPIKey, s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// execdRun runs a command through an endpoint and returns its stdout.
func execdRun(ep api.Endpoint, command string) (string, error) {
	b, _ := json.Marshal(api.RunCommandRequest{Command: command})
	req, _ := http.NewRequest("POST", "http://"+ep.Endpoint+"/command", bytes.NewReader(b))
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("%d %s", resp.StatusCode, data)
	}
	var out []string
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			return strings.Join(out, "\n"), nil
		} else if err != nil {
			return "", err
		}
		switch ev.Type {
		case api.EventStdout:
			out = append(out, ev.Text)
		case api.EventError:
			return "", fmt.Errorf("exit %s: %s", ev.Error.EValue, strings.Join(out, "\n"))
		}
	}
}

// secretDir makes a directory outside every allow-list entry holding a
// file whose name no sandbox could guess: what an escape would show.
func secretDir(t *testing.T) (dir, marker string) {
	dir = filepath.Join(t.TempDir(), "host-secrets")
	marker = "host-secret-" + randomHex(6)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, marker), []byte("the host's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, marker
}

// startSwapper starts the attacker's loop in a background command of
// sandbox a and makes sure it really swaps.
func startSwapper(t *testing.T, a *container, loop, path string) {
	t.Helper()
	a.call("POST", "/command", api.RunCommandRequest{Command: loop, Background: true}, 200, nil)
	seen := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); !(seen["d"] && seen["l"]); {
		out := a.run(fmt.Sprintf(`if [ -L %[1]s ]; then echo l; elif [ -d %[1]s ]; then echo d; fi`, path)).stdout
		seen[strings.TrimSpace(out)] = true
		if time.Now().After(deadline) {
			t.Fatalf("the swap loop is not swapping: saw %v", seen)
		}
	}
}

// TestAttackHostVolumeRace: a sandbox that can write in an allowed host
// directory swaps a directory there for a link to the host's secrets,
// again and again, while sandboxes that mount that directory are made.
// The runtime checks the path, then mounts exactly what it checked (a
// pin), so each victim mounts the directory or fails; none ever shows the
// link's target. Before the pins, 1 create in 18 to 10 in 38 escaped.
func TestAttackHostVolumeRace(t *testing.T) {
	testenv.MustHaveRoot(t)
	allowed := filepath.Join(t.TempDir(), "allowed")
	os.MkdirAll(allowed, 0o777)
	secrets, marker := secretDir(t)
	s := startServer(t, serverOptions{server: fmt.Sprintf("host_volume_allowlist = [%q]", allowed)})

	attacker := sandboxRequest(busyboxImage, "sleep", "100000")
	attacker.Volumes = []api.Volume{{Name: "shared", MountPath: "/shared", Host: &api.HostVolume{Path: allowed}}}
	a := s.execd(s.create(attacker))
	s.waitState(a.id, "Running")
	startSwapper(t, a, swapLoop("/shared/race", secrets), "/shared/race")

	n := raceAttempts()
	var o *raceOutcomes
	attack(t, "host-volume-symlink-race", func(t *testing.T) string {
		o = raceVictim(t, s, api.Volume{Name: "v", MountPath: "/v", Host: &api.HostVolume{Path: filepath.Join(allowed, "race")}}, marker, n)
		for _, e := range o.escapes {
			t.Errorf("escape: %s", e)
		}
		return fmt.Sprintf("%d creates of %s/race while another sandbox swaps it with a link to %s: %s", n, allowed, secrets, o)
	})
	if o != nil {
		o.mustHaveRaced(t)
	}
	if got := pinMounts(s.dataDir); len(got) > 0 {
		t.Errorf("volume pins still mounted on the host after every victim went: %v", got)
	}
}

// TestAttackNamedVolumeSubPathRace: the same race inside a named volume,
// against sandboxes that mount a sub path of it.
func TestAttackNamedVolumeSubPathRace(t *testing.T) {
	testenv.MustHaveRoot(t)
	secrets, marker := secretDir(t)
	s := startServer(t, serverOptions{})
	vol := "e2e-race-" + randomHex(4)
	attacker := sandboxRequest(busyboxImage, "sleep", "100000")
	attacker.Volumes = []api.Volume{{Name: "shared", MountPath: "/shared", PVC: &api.PVCVolume{ClaimName: vol, DeleteOnSandboxTermination: true}}}
	a := s.execd(s.create(attacker))
	s.waitState(a.id, "Running")
	startSwapper(t, a, evenSwapLoop("/shared/race", secrets), "/shared/race")

	n := raceAttempts() / 2
	attack(t, "named-volume-subpath-symlink-race", func(t *testing.T) string {
		o := raceVictim(t, s, api.Volume{Name: "v", MountPath: "/v", SubPath: "race", PVC: &api.PVCVolume{ClaimName: vol}}, marker, n)
		for _, e := range o.escapes {
			t.Errorf("escape: %s", e)
		}
		o.mustHaveRaced(t)
		return fmt.Sprintf("%d creates of sub path race of volume %s while another sandbox swaps it with a link to %s: %s", n, vol, secrets, o)
	})
}

// TestAttackSiblingEntry: a sandbox given one allowed directory plants a
// link in it to another allowed directory, whose files are another
// tenant's; a create that names the link is refused, since a path must
// stay within the entry it is written under.
func TestAttackSiblingEntry(t *testing.T) {
	testenv.MustHaveRoot(t)
	base := t.TempDir()
	mine, theirs := filepath.Join(base, "tenant1"), filepath.Join(base, "tenant2")
	marker := "tenant2-secret-" + randomHex(6)
	os.MkdirAll(mine, 0o777)
	os.MkdirAll(filepath.Join(theirs, "private"), 0o755)
	os.WriteFile(filepath.Join(theirs, "private", marker), []byte("not tenant1's\n"), 0o644)
	s := startServer(t, serverOptions{server: fmt.Sprintf("host_volume_allowlist = [%q, %q]", mine, theirs)})
	req := sandboxRequest(busyboxImage, "sleep", "100000")
	req.Volumes = []api.Volume{{Name: "mine", MountPath: "/mine", Host: &api.HostVolume{Path: mine}}}
	a := s.execd(s.create(req))
	a.mustRun("ln -s " + filepath.Join(theirs, "private") + " /mine/task7")

	attack(t, "host volume through a link into another allowed directory", func(t *testing.T) string {
		result, detail := raceOnce(s, api.Volume{Name: "v", MountPath: "/v", Host: &api.HostVolume{Path: filepath.Join(mine, "task7")}}, marker)
		if result != "refused (400)" {
			t.Errorf("a create naming %s/task7 (a link to %s/private): %s %s", mine, theirs, result, detail)
		}
		return result + ": " + detail
	})
	attack(t, "sub path through a link into another allowed directory", func(t *testing.T) string {
		result, detail := raceOnce(s, api.Volume{Name: "v", MountPath: "/v", SubPath: "task7", Host: &api.HostVolume{Path: mine}}, marker)
		if result != "refused (400)" {
			t.Errorf("a create naming %s with subPath task7: %s %s", mine, result, detail)
		}
		return result + ": " + detail
	})
}

// TestAttackNestedAllowlist: an allow-list entry inside another could be
// swapped for a link by the outer entry's sandboxes before it is even
// checked; the server refuses to start with such a list, written either
// way.
func TestAttackNestedAllowlist(t *testing.T) {
	testenv.MustHaveImage(t, busyboxImage)
	base := t.TempDir()
	outer, inner := filepath.Join(base, "outer"), filepath.Join(base, "outer", "inner")
	os.MkdirAll(inner, 0o755)
	os.Symlink(inner, filepath.Join(base, "link-to-inner"))
	for name, list := range map[string][]string{
		"allowlist-nested-as-written":     {outer, inner},
		"allowlist-nested-through-a-link": {outer, filepath.Join(base, "link-to-inner")},
	} {
		attack(t, name, func(t *testing.T) string {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "sandbox.toml")
			entries, _ := json.Marshal(list)
			os.WriteFile(cfg, []byte(fmt.Sprintf("version = 1\n[server]\nlisten = \"127.0.0.1:%d\"\napi_key = %q\nhost_volume_allowlist = %s\n[runtime.docker]\ndata_dir = %q\nlabel_scope = %q\n",
				freePort(t), randomHex(24), entries, filepath.Join(dir, "data"), "e2e-"+randomHex(6))), 0o600)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, serverBin, "--config", cfg).CombinedOutput()
			if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "lies inside") {
				t.Fatalf("server with allow-list %v: %v\n%s", list, err, out)
			}
			return "the server refused to start: " + lastLine(string(out))
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// pinMounts lists mount points under a server's data directory.
func pinMounts(dataDir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dataDir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
