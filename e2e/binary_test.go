package e2e

import (
	"bytes"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestExecdRefusesToRunOpen: without a token, the daemon starts only when
// told explicitly that it runs insecure.
func TestExecdRefusesToRunOpen(t *testing.T) {
	var stderr bytes.Buffer
	cmd := exec.Command(execdBin, "--host", "127.0.0.1", "--port", strconv.Itoa(freePort(t)))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil || !strings.Contains(stderr.String(), "--insecure") {
		t.Fatalf("execd without a token: %v, stderr %q", err, stderr.String())
	}

	port := freePort(t)
	open := exec.Command(execdBin, "--insecure", "--host", "127.0.0.1", "--port", strconv.Itoa(port))
	if err := open.Start(); err != nil {
		t.Fatal(err)
	}
	defer open.Process.Kill()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(base + "/ping")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("insecure execd did not answer: %v", err)
		}
	}
	open.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- open.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("execd exit after SIGTERM: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("execd did not stop on SIGTERM")
	}
}

func TestExecdFlags(t *testing.T) {
	for _, args := range [][]string{{"--port", "0", "--insecure"}, {"--log-level", "loud", "--insecure"}, {"--access-token-file", "/nonexistent"}} {
		out, err := exec.Command(execdBin, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("execd %v: %v, want exit 2; output %q", args, err, out)
		}
	}
}
