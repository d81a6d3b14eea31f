package kubernetes

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sandbox"
)

// TestAttackHostPathSubPath: a host volume reaches a pod as its allow-list
// entry plus a subPath, which the kubelet opens inside the entry without
// following a link out of it. A directory of the entry that is a link to
// the node's secrets when the pod starts, or is swapped with one again and
// again while pods start, is never mounted: each pod mounts the directory
// or fails to start. The test cluster's node is this machine, so the
// entry, the secrets and the swapping are all local.
func TestAttackHostPathSubPath(t *testing.T) {
	env := newTestEnv(t)
	base := t.TempDir()
	allowed, secrets := filepath.Join(base, "allowed"), filepath.Join(base, "secrets")
	marker := "node-secret-" + randomSuffix()
	for _, d := range []string{allowed, secrets} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(secrets, marker), []byte("the node's own\n"), 0o644)
	cfg := env.config("hostpath")
	cfg.HostPathAllowlist = []string{allowed}
	rt := env.runtime(t, cfg)
	race := filepath.Join(allowed, "race")

	// mountOnce starts a pod mounting allowed/race, as the lifecycle server
	// hands it over after its check, and reports what the pod saw.
	mountOnce := func() (string, error) {
		ctx := context.Background()
		id := sandbox.NewID()
		spec := sandbox.Spec{Image: testImage, Entrypoint: testEntrypoint, Volumes: []sandbox.Volume{
			{Name: "v", MountPath: "/v", HostPath: race, HostPathAsWritten: race}}}
		if _, err := rt.Create(ctx, id, spec); err != nil {
			return "", err
		}
		defer rt.Delete(context.WithoutCancel(ctx), id)
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			sb, err := rt.Get(ctx, id)
			if err != nil {
				return "", err
			}
			switch sb.Status.State {
			case sandbox.StateFailed:
				return "failed: " + sb.Status.Reason, fmt.Errorf("%s", sb.Status.Message)
			case sandbox.StateRunning:
				ep, err := rt.Endpoint(ctx, id, api.ExecdPort)
				if err != nil {
					return "", err
				}
				out, err := commandOutput(ep, "ls -a /v")
				if err != nil {
					return "", err
				}
				if strings.Contains(out, marker) {
					return "ESCAPED", fmt.Errorf("pod of %s shows the node's secrets at /v: %s", id, out)
				}
				return "mounted the directory", nil
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("sandbox %s still %s", id, sb.Status.State)
			}
		}
	}

	t.Run("link-when-the-pod-starts", func(t *testing.T) {
		if err := os.Symlink(secrets, race); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(race)
		got, err := mountOnce()
		if got != "failed: CONTAINER_START_FAILED" {
			t.Fatalf("a pod whose subPath is a link out of its entry: %q, %v", got, err)
		}
		t.Logf("attempt hostpath-subpath-link → held: the pod failed to start (%s)", got)
	})

	t.Run("swapped-while-pods-start", func(t *testing.T) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the attacker: a directory and a link take turns
			defer wg.Done()
			// Each round: the directory for 3 s (pods starting then mount
			// it), a second of flipping every 2 ms, the link for 2 s
			// (pods starting then meet it).
			phases := []struct {
				dir, link time.Duration
				for_      time.Duration
			}{{3 * time.Second, 0, 3 * time.Second}, {2 * time.Millisecond, 2 * time.Millisecond, time.Second}, {0, 2 * time.Second, 2 * time.Second}}
			for {
				for _, ph := range phases {
					for end := time.Now().Add(ph.for_); time.Now().Before(end); {
						select {
						case <-stop:
							os.Remove(race)
							return
						default:
						}
						if ph.dir > 0 {
							os.Mkdir(race, 0o755)
							time.Sleep(ph.dir)
							os.Remove(race)
						}
						if ph.link > 0 {
							os.Symlink(secrets, race)
							time.Sleep(ph.link)
							os.Remove(race)
						}
					}
				}
			}
		}()
		defer func() { close(stop); wg.Wait() }()
		const n = 16
		counts := map[string]int{}
		var mu sync.Mutex
		var pods sync.WaitGroup
		sem := make(chan struct{}, 4)
		for range n {
			pods.Add(1)
			sem <- struct{}{}
			go func() {
				defer pods.Done()
				defer func() { <-sem }()
				got, err := mountOnce()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil && !strings.HasPrefix(got, "failed: "):
					t.Errorf("%s: %v", got, err)
					got = "error"
				case err != nil:
					t.Logf("%s: %v", got, err)
				}
				counts[got]++
			}()
		}
		pods.Wait()
		if counts["ESCAPED"] > 0 {
			t.Errorf("%d of %d pods mounted the node's secrets", counts["ESCAPED"], n)
		}
		if counts["mounted the directory"] == 0 || counts["failed: CONTAINER_START_FAILED"] == 0 {
			t.Errorf("the race was not exercised (some pods must mount the directory, some meet the link): %v", counts)
		}
		verdict := "held"
		if t.Failed() {
			verdict = "BROKEN"
		}
		t.Logf("attempt hostpath-subpath-race → %s: %d pods while the directory is swapped with a link: %v", verdict, n, counts)
	})
}

// commandOutput runs a shell command through execd and returns the
// response, for goroutines (runCommand fails the test itself).
func commandOutput(ep sandbox.Endpoint, cmd string) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+ep.Address+"/command", strings.NewReader(`{"command":`+quoteJSON(cmd)+`}`))
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("command: %s: %s", resp.Status, b)
	}
	return string(b), err
}
