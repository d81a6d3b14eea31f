package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/runtime/runtimetest"
	"github.com/opensandbox/opensandbox/sandbox"
)

const testImage = "opensandbox/busybox"

var testExecd string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "docker-runtime-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_, file, _, _ := runtime.Caller(0)
	testExecd = filepath.Join(dir, "execd")
	build := exec.Command("go", "build", "-o", testExecd, "./cmd/execd")
	build.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build execd: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func testScope() string {
	var b [6]byte
	rand.Read(b[:])
	return "test-" + hex.EncodeToString(b[:])
}

// newTestRuntime returns a runtime with its own label scope and data
// directory; everything it made is removed when the test ends.
func newTestRuntime(t testing.TB, mod func(*Config)) *Runtime {
	t.Helper()
	testenv.MustHaveImage(t, testImage)
	cfg := Config{DataDir: t.TempDir(), ExecdPath: testExecd, LabelScope: testScope(), StartTimeout: startTimeout()}
	if mod != nil {
		mod(&cfg)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.RemoveScope(context.Background())
		rt.Close()
	})
	return rt
}

// startTimeout is the runtimes' StartTimeout: twice what a test waits for
// a start, so that the test's wait, which says what the sandbox was
// doing, runs out before the runtime fails the sandbox. At least 30 s.
func startTimeout() time.Duration { return max(30*time.Second, testwait.TimeoutN(2)) }

// start creates a sandbox from spec and waits until it runs.
func start(t *testing.T, rt *Runtime, spec sandbox.Spec) sandbox.ID {
	t.Helper()
	if spec.Image == "" {
		spec.Image = testImage
	}
	if spec.Entrypoint == nil {
		spec.Entrypoint = []string{"sleep", "1000000"}
	}
	id := sandbox.NewID()
	if _, err := rt.Create(context.Background(), id, spec); err != nil {
		t.Fatal(err)
	}
	waitState(t, rt, id, sandbox.StateRunning)
	return id
}

// run runs a shell command in a sandbox through its execd endpoint and
// returns its stdout and exit status ("0" on success).
func run(t *testing.T, rt *Runtime, id sandbox.ID, command string) (string, string) {
	t.Helper()
	ep, err := rt.Endpoint(context.Background(), id, api.ExecdPort)
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"command":%q}`, command)
	req, _ := http.NewRequest("POST", "http://"+ep.Address+"/command", strings.NewReader(body))
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("run %q: %v", command, err)
	}
	defer resp.Body.Close()
	var out []string
	exit := ""
	dec := api.NewEventDecoder(resp.Body)
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			return strings.Join(out, "\n"), exit
		}
		if err != nil {
			t.Fatalf("run %q: %v", command, err)
		}
		switch ev.Type {
		case api.EventStdout:
			out = append(out, ev.Text)
		case api.EventComplete:
			exit = "0"
		case api.EventError:
			exit = ev.Error.EValue
		}
	}
}

func mustRun(t *testing.T, rt *Runtime, id sandbox.ID, command string) string {
	t.Helper()
	out, exit := run(t, rt, id, command)
	if exit != "0" {
		t.Fatalf("%q exited %s: %s", command, exit, out)
	}
	return out
}

func newTestRuntimeNoCleanup(t *testing.T, mod func(*Config)) *Runtime {
	t.Helper()
	cfg := Config{ExecdPath: testExecd}
	mod(&cfg)
	rt, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// waitFor waits until cond holds, for as long as one sandbox start may
// take on this machine (see testwait).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Wait{What: what, Every: 20 * time.Millisecond}.Until(t, cond)
}

// waitState waits until a sandbox is in state, for as long as one start
// may take on this machine; a sandbox that fails instead fails the test
// at once. Either way the failure says what the sandbox was doing.
func waitState(t *testing.T, rt *Runtime, id sandbox.ID, want sandbox.State) *sandbox.Sandbox {
	t.Helper()
	var sb *sandbox.Sandbox
	testwait.Wait{What: fmt.Sprintf("sandbox %s to be %s", id, want), Every: 20 * time.Millisecond,
		Describe: func() string { return describe(rt, id) }}.Until(t, func() bool {
		var err error
		if sb, err = rt.Get(context.Background(), id); err != nil {
			t.Fatalf("Get(%s) while waiting for %s: %v\n%s", id, want, err, describe(rt, id))
		}
		if sb.Status.State == sandbox.StateFailed && want != sandbox.StateFailed {
			t.Fatalf("sandbox %s failed while waiting for %s: %s: %s\n%s", id, want, sb.Status.Reason, sb.Status.Message, describe(rt, id))
		}
		return sb.Status.State == want
	})
	return sb
}

// describe says what a sandbox is doing: its status, events and log as
// the runtime has them, and its container as the engine has it.
func describe(rt *Runtime, id sandbox.ID) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	if sb, err := rt.Get(ctx, id); err != nil {
		fmt.Fprintf(&b, "sandbox %s: %v\n", id, err)
	} else {
		fmt.Fprintf(&b, "sandbox %s: %s (%s) since %v: %s\n", id, sb.Status.State, sb.Status.Reason, sb.Status.Since, sb.Status.Message)
	}
	evs, err := rt.Events(ctx, id)
	fmt.Fprintf(&b, "events (%v):\n", err)
	for _, e := range evs {
		fmt.Fprintf(&b, "    %s %s:%s %s\n", e.Time.Format(time.StampMilli), e.Source, e.Type, e.Message)
	}
	logs, err := rt.Logs(ctx, id, 30, time.Time{})
	fmt.Fprintf(&b, "log (%v):\n%s\n", err, logs)
	b.WriteString(testwait.Containers("label=" + labelID + "=" + string(id)))
	return b.String()
}

func TestConformance(t *testing.T) {
	testenv.MustHaveDocker(t)
	testenv.MustHaveImage(t, testImage)
	runtimetest.Run(t, newSuiteRuntime, runtimetest.Options{
		Image:        testImage,
		Entrypoint:   []string{"sleep", "1000000"},
		MissingImage: "127.0.0.1:1/opensandbox/missing:latest",
		Reach:        runtimetest.ReachExecd,
		StartTimeout: max(60*time.Second, testwait.Timeout()),
		Hooks:        suiteHooks,
	})
}
