package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// selfExe is the executable install copies: the running program itself,
// read through the kernel so that it works in an image whose file system
// holds nothing but execd, and whatever name execd was started under.
var selfExe = "/proc/self/exe"

// install copies execd's own executable to dst, creating the parent
// directories. The copy is written to a temporary file beside dst, synced,
// made executable (0755) and renamed over dst, so dst is either absent,
// the previous file, or the whole new binary, never a partial one.
//
// It is what a Kubernetes sandbox pod's init container runs to place execd
// on a volume shared with the sandbox container:
//
//	/execd --install-to /opt/opensandbox/bin/execd
func install(dst string) (retErr error) {
	if dst == "" {
		return fmt.Errorf("install: empty destination path")
	}
	src, err := os.Open(selfExe)
	if err != nil {
		return fmt.Errorf("install: open own executable: %w", err)
	}
	defer src.Close()
	dir := filepath.Dir(dst)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("install: create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return fmt.Errorf("install: create temporary file in %s: %w", dir, err)
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, src); err != nil {
		return fmt.Errorf("install: copy to %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		return fmt.Errorf("install: chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("install: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install: close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("install: rename to %s: %w", dst, err)
	}
	// The rename is durable once the directory is synced; a file system
	// that cannot sync a directory still has the file in place.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
