package sdk_test

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// TestCopyFromHostileSandbox has a sandbox answer a copy of /work/out
// with more than was asked for: entries beside "out", and a setuid,
// world-writable file. Nothing may land outside the copy, and no mode may
// give others more than the umask allows.
func TestCopyFromHostileSandbox(t *testing.T) {
	execd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-tar")
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o777})
		tw.WriteHeader(&tar.Header{Name: "out/tool", Typeflag: tar.TypeReg, Mode: 0o6777, Size: 2})
		tw.Write([]byte("hi"))
		tw.WriteHeader(&tar.Header{Name: ".bashrc", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4})
		tw.Write([]byte("evil"))
		tw.Close()
	}))
	defer execd.Close()
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: strings.TrimPrefix(execd.URL, "http://")})
	}))
	defer lifecycle.Close()
	c, _ := sdk.NewClient(sdk.Config{Domain: lifecycle.URL})
	sb := c.Sandbox("sb")
	umask := os.FileMode(syscall.Umask(0))
	syscall.Umask(int(umask))

	for _, dst := range []string{".", "out", "renamed"} {
		t.Run(dst, func(t *testing.T) {
			home := t.TempDir()
			os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
			_, err := sb.CopyFrom(t.Context(), "/work/out", filepath.Join(home, dst), nil)
			if !errors.Is(err, sdk.ErrInvalid) && (err == nil || !strings.Contains(err.Error(), "not under")) {
				t.Errorf("err = %v, want a refusal of the stray entry", err)
			}
			if data, _ := os.ReadFile(filepath.Join(home, ".bashrc")); string(data) != "mine" {
				t.Errorf(".bashrc now holds %q", data)
			}
			matches, _ := filepath.Glob(filepath.Join(home, "*", "tool"))
			for _, m := range matches {
				fi, _ := os.Stat(m)
				if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm()&umask != 0 {
					t.Errorf("%s has mode %v", m, fi.Mode())
				}
			}
		})
	}
}

// TestCopyFromIncompleteArchive: an archive the sandbox could not finish
// (it ends with execd's incomplete-archive block and trailer) fails the
// copy with the sandbox's reason, for CopyFrom and for a plain read of
// DownloadArchive alike.
func TestCopyFromIncompleteArchive(t *testing.T) {
	const reason = "open /work/out/secret: permission denied"
	execd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Trailer", api.HeaderArchiveError)
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Name: "out/", Typeflag: tar.TypeDir, Mode: 0o755})
		tw.WriteHeader(&tar.Header{Name: "out/readable", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
		tw.Write([]byte("ok"))
		tw.Flush()
		w.Write(api.ArchiveIncompleteEntry(reason))
		w.Header().Set(api.HeaderArchiveError, reason)
	}))
	defer execd.Close()
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: strings.TrimPrefix(execd.URL, "http://")})
	}))
	defer lifecycle.Close()
	c, _ := sdk.NewClient(sdk.Config{Domain: lifecycle.URL})
	sb := c.Sandbox("sb")

	_, err := sb.CopyFrom(t.Context(), "/work/out", t.TempDir(), nil)
	var ie *sdk.ArchiveIncompleteError
	if !errors.As(err, &ie) || ie.Reason != reason {
		t.Fatalf("CopyFrom: %v, want the sandbox's reason", err)
	}

	ar, err := sb.DownloadArchive(t.Context(), "/work/out", false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ar.Close()
	if _, err := io.Copy(io.Discard, ar); !errors.As(err, &ie) {
		t.Fatalf("reading the whole stream: %v, want an *ArchiveIncompleteError", err)
	}
}

// TestPermissionDeniedIsNotUnauthorized: a sandbox refusing access to one
// of its files is fs.ErrPermission, not a problem with the caller's
// credentials.
func TestPermissionDeniedIsNotUnauthorized(t *testing.T) {
	execd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(api.ErrorResponse{Code: api.CodePermissionDenied, Message: "open /etc/shadow: permission denied"})
	}))
	defer execd.Close()
	lifecycle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Endpoint{Endpoint: strings.TrimPrefix(execd.URL, "http://")})
	}))
	defer lifecycle.Close()
	c, _ := sdk.NewClient(sdk.Config{Domain: lifecycle.URL})
	_, err := c.Sandbox("sb").ReadFile(t.Context(), "/etc/shadow")
	if !errors.Is(err, fs.ErrPermission) || errors.Is(err, sdk.ErrUnauthorized) {
		t.Fatalf("err = %v: want fs.ErrPermission and not ErrUnauthorized", err)
	}
}
