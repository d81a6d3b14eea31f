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
//
// A spool holds at most its capacity: the file is used as a ring, and
// once more has been written the oldest bytes give way. Offsets stay
// those of the whole stream; reading from an offset that has given way
// starts at the oldest byte kept.
type Spool struct {
	// mu is held for reading by Write and WriteRange, which may run at
	// once, and for writing by Close.
	mu     sync.RWMutex
	f      *os.File
	cap    int64
	size   atomic.Int64 // bytes ever written
	closed bool
}

// NewSpool creates an empty spool of capacity bytes in dir ("" for the
// default temporary directory).
func NewSpool(dir string, capacity int64) (*Spool, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	if capacity <= 0 {
		return nil, fmt.Errorf("spool capacity %d", capacity)
	}
	fd, err := unix.Open(dir, unix.O_RDWR|unix.O_CLOEXEC|unix.O_TMPFILE, 0o600)
	if err == nil {
		return &Spool{f: os.NewFile(uintptr(fd), "spool"), cap: capacity}, nil
	}
	mfd, merr := unix.MemfdCreate("execd-spool", unix.MFD_CLOEXEC)
	if merr != nil {
		return nil, fmt.Errorf("create spool: O_TMPFILE in %s: %v; memfd: %w", dir, err, merr)
	}
	return &Spool{f: os.NewFile(uintptr(mfd), "spool"), cap: capacity}, nil
}

// Write appends p. Only one goroutine may write.
func (s *Spool) Write(p []byte) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, os.ErrClosed
	}
	written := len(p)
	if int64(len(p)) > s.cap {
		s.size.Add(int64(len(p)) - s.cap)
		p = p[int64(len(p))-s.cap:]
	}
	for len(p) > 0 {
		pos := s.size.Load() % s.cap
		n := min(int64(len(p)), s.cap-pos)
		m, err := s.f.WriteAt(p[:n], pos)
		s.size.Add(int64(m))
		if err != nil {
			return written - len(p) + m, err
		}
		p = p[n:]
	}
	return written, nil
}

// Size returns the number of bytes written so far, which is the offset
// of the next byte.
func (s *Spool) Size() int64 {
	return s.size.Load()
}

// Oldest returns the offset of the oldest byte kept.
func (s *Spool) Oldest() int64 {
	return max(0, s.size.Load()-s.cap)
}

// WriteRange copies the bytes in [from, to) into w, clamped to what the
// spool holds, and returns the offset it started at and the number of
// bytes copied.
func (s *Spool) WriteRange(w io.Writer, from, to int64) (start, n int64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, 0, os.ErrClosed
	}
	size := s.size.Load()
	to = min(to, size)
	from = max(from, size-s.cap, 0)
	if from >= to {
		return from, 0, nil
	}
	start = from
	for from < to {
		pos := from % s.cap
		chunk := min(to-from, s.cap-pos)
		m, err := io.Copy(w, io.NewSectionReader(s.f, pos, chunk))
		n += m
		if err != nil {
			return start, n, err
		}
		from += chunk
	}
	return start, n, nil
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
