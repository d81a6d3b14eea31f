package ingress

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// KeyFile is a key set kept from a file that may change while the
// gateway or server runs: the keys in use are swapped for the file's new
// content when it reads, and kept when it does not (a broken file, an
// empty one, one caught while it is rewritten in place).
type KeyFile struct {
	path string
	log  *slog.Logger
	keys atomic.Pointer[Keys]

	mu sync.Mutex
	// stamp is the file's size and modification time at the last read.
	stamp string
}

// NewKeyFile keeps the keys of path. keys, when not nil, are the file's
// content already read (the configuration's check read it); otherwise
// the file is read now. Without a path the set is keys, fixed.
func NewKeyFile(path string, keys *Keys, log *slog.Logger) (*KeyFile, error) {
	f := &KeyFile{path: path, log: log}
	if keys != nil || path == "" {
		f.keys.Store(keys)
		f.stamp = fileStamp(path)
		return f, nil
	}
	return f, f.Load()
}

// Keys returns the keys in use (nil without any).
func (f *KeyFile) Keys() *Keys { return f.keys.Load() }

// Load reads the file now, changed or not; on failure the keys in use
// stay and the error says why.
func (f *KeyFile) Load() error {
	if f.path == "" {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stamp = fileStamp(f.path)
	keys, err := ReadKeysFile(f.path)
	if err != nil {
		return fmt.Errorf("signing keys: %w", err)
	}
	f.keys.Store(keys)
	f.log.Info("signing keys loaded", "file", f.path, "ids", keys.IDs())
	return nil
}

// Reload reads the file again if its size or modification time changed
// since the last read, logging what came of it.
func (f *KeyFile) Reload() {
	if f.path == "" {
		return
	}
	f.mu.Lock()
	stamp := fileStamp(f.path)
	if stamp == f.stamp {
		f.mu.Unlock()
		return
	}
	f.stamp = stamp
	keys, err := ReadKeysFile(f.path)
	f.mu.Unlock()
	if err != nil {
		f.log.Error("signing keys not reloaded; the keys in use stay", "file", f.path, "err", err)
		return
	}
	f.keys.Store(keys)
	f.log.Info("signing keys reloaded", "file", f.path, "ids", keys.IDs())
}

// Watch calls Reload every interval until ctx ends.
func (f *KeyFile) Watch(ctx context.Context, every time.Duration) {
	if f.path == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.Reload()
		}
	}
}

func fileStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprint(fi.Size(), fi.ModTime().UnixNano())
}
