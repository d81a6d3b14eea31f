package egress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// FileStore keeps the policy in one file so that it survives a restart
// of osb-egress (OPENSANDBOX_EGRESS_POLICY_FILE). Save replaces the file
// atomically: a reader, or a restart after a crash at any point, sees
// either the old policy or the new one, never part of one.
type FileStore struct {
	path string
}

// NewFileStore returns a store for the file at path. Nothing is read or
// written until Load or Save.
func NewFileStore(path string) *FileStore {
	return &FileStore{path: path}
}

// Path returns the file's path.
func (s *FileStore) Path() string { return s.path }

// Load returns the stored policy. ok is false when the file does not
// exist or holds only whitespace; a file that does not parse is an error.
func (s *FileStore) Load() (p Policy, ok bool, err error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return Policy{}, false, nil
	} else if err != nil {
		return Policy{}, false, fmt.Errorf("read policy file: %w", err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return Policy{}, false, nil
	}
	p, err = ParsePolicy(data)
	if err != nil {
		return Policy{}, false, fmt.Errorf("policy file %s: %w", s.path, err)
	}
	return p, true, nil
}

// LoadOr returns the stored policy when the file has one, else initial:
// a policy set through the API before a restart wins over the one the
// sidecar was started with.
func (s *FileStore) LoadOr(initial Policy) (Policy, error) {
	p, ok, err := s.Load()
	if err != nil {
		return Policy{}, err
	}
	if !ok {
		return initial, nil
	}
	return p, nil
}

// Save writes p with WriteFileAtomic.
func (s *FileStore) Save(p Policy) error {
	data, err := json.Marshal(p.API())
	if err != nil {
		return fmt.Errorf("encode policy: %w", err)
	}
	if err := WriteFileAtomic(s.path, append(data, '\n')); err != nil {
		return fmt.Errorf("save policy: %w", err)
	}
	return nil
}

// WriteFileAtomic replaces the file at path with data (mode 0600): to a
// temporary file in the same directory, synced, then renamed over the
// file, and the directory synced so the rename itself survives a crash.
// A reader, or a restart after a crash at any point, sees the old content
// or the new, never part of one.
func WriteFileAtomic(path string, data []byte) (retErr error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod %s: %w", f.Name(), err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir syncs a directory, so that a rename or a removal in it
// survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
