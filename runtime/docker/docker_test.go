package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/internal/testenv"
	"github.com/opensandbox/opensandbox/internal/testwait"
	"github.com/opensandbox/opensandbox/runtime/runtimetest"
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
