package standin

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// netprobePkg is the in-sandbox probe's package (internal/netprobe).
const netprobePkg = "github.com/opensandbox/opensandbox/internal/netprobe"

// Netprobe builds the netprobe command (internal/netprobe) as a static
// Linux binary for the machine's architecture, for tests to upload into a
// sandbox, and returns its path in t's temporary directory. The go
// command's build cache makes every build after the first a link. It
// needs the go command and must be called from inside the module (a
// test's working directory is).
func Netprobe(t testing.TB) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("build netprobe: no go command: %v", err)
	}
	out := filepath.Join(t.TempDir(), "netprobe")
	cmd := exec.Command(goCmd, "build", "-trimpath", "-ldflags=-s -w", "-o", out, netprobePkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build netprobe: %v: %s", err, b)
	}
	return out
}

// ProbeResult is the line netprobe prints.
type ProbeResult struct {
	// OK reports that the attempt got through: a server answered.
	OK bool `json:"ok"`
	// Detail says what came back, or what stopped the attempt.
	Detail string `json:"detail"`
}

// ParseProbe reads netprobe's output: the last non-empty line must be
// its JSON result (a shell or exec wrapper may print before it).
func ParseProbe(out []byte) (ProbeResult, error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r ProbeResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return r, fmt.Errorf("netprobe output %q: %w", out, err)
	}
	return r, nil
}
