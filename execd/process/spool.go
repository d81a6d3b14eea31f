package process

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Spool keeps a background command's combined output so that clients can
// read it from any byte offset. The bytes live in an anonymous file: one
// with no name in any directory (O_TMPFILE), or, where the temporary
// directory cannot hold one, a memory file (memfd). Either way no other
// process can open it, and it disappears with the last descriptor.
type Spool struct {
	// mu is held for reading by Write and WriteTo, which may run at once,
	// and for writing by Close.
	mu     sync.RWMutex
	f      *os.File
	size   atomic.Int64
	closed bool
}

// NewSpool creates an empty spool in dir ("" for the default temporary
// directory).
func NewSpool(dir string) (*Spool, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	fd, err := unix.Open(dir, unix.O_RDWR|unix.O_CLOEXEC|unix.O_TMPFILE, 0o600)
	if err == nil {
		return &Spool{f: os.NewFile(uintptr(fd), "spool")}, nil
	}
	mfd, merr := unix.MemfdCreate("execd-spool", unix.MFD_CLOEXEC)
	if merr != nil {
		return nil, fmt.Errorf("create spool: O_TMPFILE in %s: %v; memfd: %w", dir, err, merr)
	}
	return &Spool{f: os.NewFile(uintptr(mfd), "spool")}, nil
}

// Write appends p. Only one goroutine may write.
func (s *Spool) Write(p []byte) (int, error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return 0, os.ErrClosed
	}
	defer s.mu.RUnlock()
	n, err := s.f.WriteAt(p, s.size.Load())
	s.size.Add(int64(n))
	return n, err
}

// Size returns the number of bytes written so far.
func (s *Spool) Size() int64 {
	return s.size.Load()
}

// WriteRange copies the bytes in [from, to) into w, clamped to what has
// been written, and returns the number of bytes copied.
func (s *Spool) WriteRange(w io.Writer, from, to int64) (int64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, os.ErrClosed
	}
	to = min(to, s.size.Load())
	from = max(from, 0)
	if from >= to {
		return 0, nil
	}
	return io.Copy(w, io.NewSectionReader(s.f, from, to-from))
}

// Close releases the spool's storage.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.f.Close()
}
