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
	cfg := Config{DataDir: t.TempDir(), ExecdPath: testExecd, LabelScope: testScope(), StartTimeout: 30e9}
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
	runtimetest.WaitState(t, rt, id, sandbox.StateRunning, 60*time.Second)
	return id
}

// run runs a shell command in a sandbox through its execd endpoint and
// returns its stdout and exit status ("0" on success).
func run(t *testing.T, rt *Runtime, id sandbox.ID, command string) (string, string) {
	t.Helper()
	ep, err := rt.Endpoint(context.Background(), id, sandbox.PortExecd)
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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestConformance(t *testing.T) {
	testenv.MustHaveDocker(t)
	runtimetest.Run(t, func(t *testing.T) sandbox.Runtime { return newTestRuntime(t, nil) }, runtimetest.Options{
		Image:        testImage,
		Entrypoint:   []string{"sleep", "1000000"},
		MissingImage: "127.0.0.1:1/opensandbox/missing:latest",
		Reach:        runtimetest.ReachExecd,
	})
}
