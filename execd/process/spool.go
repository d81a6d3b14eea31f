package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// SpoolFloor is what a spool keeps of its own output at least when the
// spools' shared budget is used up.
const SpoolFloor = 64 << 10

// ErrOverwritten reports bytes that gave way while they were being read:
// newer output overwrote them, or the budget took them.
var ErrOverwritten = errors.New("log bytes gave way while being read")

// Spools makes the spools of background commands and keeps what they hold
// together within a budget. Each spool holds at most its capacity; when
// the spools together would hold more than the budget, the spools of
// finished commands give way first, oldest finished first, and then the
// spool being written loses its own oldest bytes, down to SpoolFloor. So
// together they hold at most the budget and SpoolFloor for each spool
// still being written.
//
// Storage is freed as it gives way (holes are punched in the files), so
// the budget bounds the memory (a memfd, a file on tmpfs) or the disk the
// spools take, not just what can be read back.
type Spools struct {
	dir      string
	capacity int64
	budget   int64
	// writes bounds the spool writes under way at once: each may hold an
	// OS thread while the kernel writes back dirty pages.
	writes chan struct{}

	held atomic.Int64 // bytes the spools hold, all together

	mu       sync.Mutex
	finished []*Spool // in the order they were marked done
	memory   bool     // a spool was made in memory: a memfd, or a tmpfs
}

// NewSpools returns a maker of spools of capacity bytes each in dir (""
// for the system's temporary directory), holding budget bytes together,
// with at most writers writes under way at once.
func NewSpools(dir string, capacity, budget int64, writers int) (*Spools, error) {
	if dir == "" {
		dir = os.TempDir()
	}
	if capacity <= 0 || budget <= 0 || writers <= 0 {
		return nil, fmt.Errorf("spools: capacity %d, budget %d, writers %d: all must be positive", capacity, budget, writers)
	}
	return &Spools{dir: dir, capacity: capacity, budget: budget, writes: make(chan struct{}, writers)}, nil
}

// Held returns the bytes the open spools hold together.
func (ss *Spools) Held() int64 { return ss.held.Load() }

// InMemory reports whether a spool made so far lives in memory.
func (ss *Spools) InMemory() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.memory
}

// New creates an empty spool. Its bytes live in an anonymous file: one
// with no name in any directory (O_TMPFILE), or, where the directory
// cannot hold one, a memory file (memfd). Either way no other process can
// open it, and it disappears with the last descriptor.
func (ss *Spools) New() (*Spool, error) {
	fd, err := unix.Open(ss.dir, unix.O_RDWR|unix.O_CLOEXEC|unix.O_TMPFILE, 0o600)
	inMemory := false
	if err != nil {
		mfd, merr := unix.MemfdCreate("execd-spool", unix.MFD_CLOEXEC)
		if merr != nil {
			return nil, fmt.Errorf("create spool: O_TMPFILE in %s: %v; memfd: %w", ss.dir, err, merr)
		}
		fd, inMemory = mfd, true
	} else {
		inMemory = onTmpfs(fd)
	}
	if inMemory {
		ss.mu.Lock()
		ss.memory = true
		ss.mu.Unlock()
	}
	return &Spool{set: ss, f: os.NewFile(uintptr(fd), "spool"), cap: ss.capacity}, nil
}

// SpoolsInMemory reports whether spools made in dir would live in memory:
// dir is a tmpfs, or cannot hold anonymous files, so memory files stand
// in. Memory-backed spools count against the sandbox's memory limit.
func SpoolsInMemory(dir string) bool {
	if dir == "" {
		dir = os.TempDir()
	}
	fd, err := unix.Open(dir, unix.O_RDWR|unix.O_CLOEXEC|unix.O_TMPFILE, 0o600)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	return onTmpfs(fd)
}

func onTmpfs(fd int) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(fd, &st) == nil && (st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC)
}

// reclaim brings what the spools hold back within the budget after w
// wrote: finished spools give way first, then w's own oldest bytes.
func (ss *Spools) reclaim(w *Spool) {
	if ss.held.Load() <= ss.budget {
		return
	}
	ss.mu.Lock()
	for i := 0; i < len(ss.finished) && ss.held.Load() > ss.budget; {
		f := ss.finished[i]
		// A spool being read is passed over rather than waited for: a
		// slow client must not stall a writer.
		if !f.mu.TryLock() {
			i++
			continue
		}
		f.trimLocked(ss.held.Load()-ss.budget, 0)
		empty := f.closed || f.held() == 0
		f.mu.Unlock()
		if empty {
			ss.finished = append(ss.finished[:i], ss.finished[i+1:]...)
		} else {
			i++
		}
	}
	ss.mu.Unlock()
	if excess := ss.held.Load() - ss.budget; excess > 0 {
		w.mu.RLock()
		if !w.closed {
			w.trimLocked(excess, SpoolFloor)
		}
		w.mu.RUnlock()
	}
}

// Spool keeps a background command's combined output so that clients can
// read it from any byte offset. It is used as a ring: once more than its
// capacity has been written, the oldest bytes give way, and the spools'
// budget can take more of them (see Spools). Offsets stay those of the
// whole stream; reading from an offset that has given way starts at the
// oldest byte kept.
type Spool struct {
	set *Spools
	// mu is held for reading by Write, WriteRange and a writer trimming
	// its own oldest bytes, which may run at once, and for writing by
	// Close and by another spool's writer trimming this one.
	mu     sync.RWMutex
	f      *os.File
	cap    int64
	closed bool
	done   bool

	size atomic.Int64 // bytes ever written
	// oldest is the offset of the oldest byte kept. It is moved up before
	// the bytes below it are overwritten or freed, so a reader that finds
	// it still at or below what it read knows the bytes were intact.
	oldest atomic.Int64
}

func (s *Spool) held() int64 { return s.size.Load() - s.oldest.Load() }

// Write appends p. Only one goroutine may write.
func (s *Spool) Write(p []byte) (int, error) {
	s.set.writes <- struct{}{}
	defer func() { <-s.set.writes }()
	n, err := s.write(p)
	s.set.reclaim(s)
	return n, err
}

func (s *Spool) write(p []byte) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, os.ErrClosed
	}
	written := len(p)
	before := s.held()
	if int64(len(p)) > s.cap {
		skip := int64(len(p)) - s.cap
		s.raiseOldest(s.size.Load() + skip)
		s.size.Add(skip)
		p = p[skip:]
	}
	defer func() { s.set.held.Add(s.held() - before) }()
	for len(p) > 0 {
		size := s.size.Load()
		pos := size % s.cap
		n := min(int64(len(p)), s.cap-pos)
		// The bytes about to be overwritten give way first.
		s.raiseOldest(size + n - s.cap)
		m, err := s.f.WriteAt(p[:n], pos)
		s.size.Add(int64(m))
		if err != nil {
			return written - len(p) + m, err
		}
		p = p[n:]
	}
	return written, nil
}

// raiseOldest moves oldest up to off, never down.
func (s *Spool) raiseOldest(off int64) {
	for {
		old := s.oldest.Load()
		if off <= old || s.oldest.CompareAndSwap(old, off) {
			return
		}
	}
}

// trimLocked lets up to n of the oldest bytes go, keeping at least keep,
// and frees their storage. s.mu is held (for reading by s's own writer).
func (s *Spool) trimLocked(n, keep int64) {
	from := s.oldest.Load()
	to := min(from+n, s.size.Load()-keep)
	if to <= from {
		return
	}
	s.raiseOldest(to)
	s.set.held.Add(-(to - from))
	// Free the storage of [from, to), which may wrap around the ring.
	for from < to {
		pos := from % s.cap
		k := min(to-from, s.cap-pos)
		// Where holes cannot be punched the bytes stay until overwritten,
		// within the spool's capacity.
		unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, pos, k)
		from += k
	}
}

// Done marks the spool's command finished: when the budget is used up its
// bytes give way before those of spools still being written.
func (s *Spool) Done() {
	s.set.mu.Lock()
	defer s.set.mu.Unlock()
	if !s.done {
		s.done = true
		s.set.finished = append(s.set.finished, s)
	}
}

// Size returns the number of bytes written so far, which is the offset
// of the next byte.
func (s *Spool) Size() int64 {
	return s.size.Load()
}

// Oldest returns the offset of the oldest byte kept.
func (s *Spool) Oldest() int64 {
	return s.oldest.Load()
}

// WriteRange copies the bytes in [from, to) into w, clamped to what the
// spool holds, and returns the offset it started at and the number of
// bytes copied. If bytes give way while they are being copied, it stops
// with ErrOverwritten before handing any of them to w.
func (s *Spool) WriteRange(w io.Writer, from, to int64) (start, n int64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, 0, os.ErrClosed
	}
	to = min(to, s.size.Load())
	from = max(from, s.oldest.Load(), 0)
	if from >= to {
		return from, 0, nil
	}
	start = from
	buf := make([]byte, min(to-from, 32<<10))
	for from < to {
		pos := from % s.cap
		chunk := min(to-from, s.cap-pos, int64(len(buf)))
		m, err := s.f.ReadAt(buf[:chunk], pos)
		if err != nil && !(err == io.EOF && int64(m) == chunk) {
			return start, n, err
		}
		if s.oldest.Load() > from {
			return start, n, ErrOverwritten
		}
		m, err = w.Write(buf[:chunk])
		n += int64(m)
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
	s.set.held.Add(-s.held())
	s.raiseOldest(s.size.Load())
	s.set.mu.Lock()
	for i, f := range s.set.finished {
		if f == s {
			s.set.finished = append(s.set.finished[:i], s.set.finished[i+1:]...)
			break
		}
	}
	s.set.mu.Unlock()
	return s.f.Close()
}
