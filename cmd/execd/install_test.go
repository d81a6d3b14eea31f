package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallTo builds execd as make build does, runs --install-to the way a
// sandbox pod's init container does, and runs the copy.
func TestInstallTo(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "execd")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version=v-test", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	dst := filepath.Join(dir, "opt", "opensandbox", "bin", "execd")
	for i := range 2 { // the second run replaces the first copy
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, "--install-to", dst)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("run %d: execd --install-to %s: %v\n%s", i, dst, err, stderr.Bytes())
		}
		if stdout.Len()+stderr.Len() > 0 {
			t.Fatalf("run %d: execd --install-to printed %q %q, want nothing", i, stdout.Bytes(), stderr.Bytes())
		}
	}
	want, _ := os.ReadFile(bin)
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("copy at %s: %d bytes, err %v; want the %d bytes of the binary", dst, len(got), err, len(want))
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o755 {
		t.Errorf("copy mode %v, want 0755", st.Mode().Perm())
	}
	if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 1 {
		t.Errorf("directory of the copy holds %d entries, want only execd (no temporary file left)", len(ents))
	}

	out, err := exec.Command(dst, "--version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "execd v-test" {
		t.Errorf("copy --version: %q, %v", out, err)
	}
	out, err = exec.Command(dst, "-h").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--install-to PATH") {
		t.Errorf("copy -h: %v\n%s", err, out)
	}

	// Failures exit 1 and say why.
	file := filepath.Join(dir, "plain-file")
	os.WriteFile(file, nil, 0o644)
	out, err = exec.Command(bin, "--install-to", filepath.Join(file, "execd")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "install: create") {
		t.Errorf("install under a regular file: %v, output %q; want exit 1 with the reason", err, out)
	}
	out, err = exec.Command(bin, "--install-to", dst, "--", "sleep", "1").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("install with an entrypoint: %v, output %q; want exit 2", err, out)
	}
}

// TestInstallLeavesNothingOnFailure checks that a copy that cannot finish
// removes its temporary file and leaves an existing destination alone.
func TestInstallLeavesNothingOnFailure(t *testing.T) {
	dir := t.TempDir()
	old := selfExe
	t.Cleanup(func() { selfExe = old })
	selfExe = dir // reading a directory fails after the temporary file exists
	dst := filepath.Join(dir, "bin", "execd")
	os.MkdirAll(filepath.Dir(dst), 0o755)
	os.WriteFile(dst, []byte("previous"), 0o755)
	if err := install(dst); err == nil {
		t.Fatal("install from a directory succeeded")
	}
	if b, _ := os.ReadFile(dst); string(b) != "previous" {
		t.Errorf("destination now holds %q, want the previous file", b)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 1 {
		t.Errorf("%d entries beside the destination, want 1 (temporary file removed)", len(ents))
	}
}
