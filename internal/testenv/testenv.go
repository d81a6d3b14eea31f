// Package testenv lets tests state what real dependencies they need. A
// missing dependency skips the test on a developer machine and fails it in
// CI (CI=true or OSB_REQUIRE_ALL=1), so CI can never pass by skipping.
// Only tests import it.
package testenv

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Required reports whether missing dependencies must fail tests.
func Required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("OSB_REQUIRE_ALL") == "1"
}

// Missing reports a dependency the test needs and does not have: the
// test is skipped on a developer machine and fails in CI.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("required dependency missing (CI): "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

// MustHaveRoot requires that the test runs as root.
func MustHaveRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "test needs root")
	}
}

var (
	dockerOnce sync.Once
	dockerErr  error
)

// MustHaveDocker requires a Docker engine that answers.
func MustHaveDocker(t testing.TB) {
	t.Helper()
	dockerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput()
		if err != nil {
			dockerErr = &dockerError{err: err, out: string(out)}
		}
	})
	if dockerErr != nil {
		Missing(t, "no Docker engine answers (run make docker): %v", dockerErr)
	}
}

// MustHaveImage requires a local Docker image.
func MustHaveImage(t testing.TB, image string) {
	t.Helper()
	MustHaveDocker(t)
	if err := exec.Command("docker", "image", "inspect", image).Run(); err != nil {
		Missing(t, "image %s is missing (run make images)", image)
	}
}

// MustHaveCommand requires an executable in PATH.
func MustHaveCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s is not installed", name)
	}
	return p
}

// MustHaveChromium requires a headless-capable Chromium (Debian's
// chromium; scripts/test-deps.sh installs it) and returns its path.
func MustHaveChromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	Missing(t, "chromium is not installed (run scripts/test-deps.sh)")
	return ""
}

type dockerError struct {
	err error
	out string
}

func (e *dockerError) Error() string { return e.err.Error() + ": " + e.out }
