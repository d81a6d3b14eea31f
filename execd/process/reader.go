package process

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// Reader reads a child's output pipe and hands every chunk to a sink.
//
// A process that exits may leave grandchildren holding the pipe open, so
// EOF cannot mark the end of its output. Instead, once the process is known
// to have exited, Finish makes the reader take what is in the pipe at that
// moment, without waiting, and stop: everything the process wrote before it
// exited is in the pipe by then. Sync does the same without stopping, which
// lets a shell session cut its output between runs.
//
// After Finish the pipe stays open, read in the background until its last
// writer closes it and passed to the tail function (discarded when there
// is none): a server started with "&" by a command that has returned must
// not die of SIGPIPE at its next write.
type Reader struct {
	f         *os.File
	sink      func([]byte)
	idle      func()
	idleAfter time.Duration
	// Tail, when set before Run, receives what the pipe carries after the
	// drain that Finish asks for.
	Tail func([]byte)

	mu       sync.Mutex
	syncs    []chan struct{}
	finished bool

	finish  chan struct{}
	stopped chan struct{}
}

// NewReader returns a reader of f. sink is called from Run's goroutine with
// each chunk; the chunk is only valid during the call. When idle is not
// nil, it is called after output has paused for idleAfter.
func NewReader(f *os.File, sink func([]byte), idleAfter time.Duration, idle func()) *Reader {
	return &Reader{
		f:         f,
		sink:      sink,
		idle:      idle,
		idleAfter: idleAfter,
		finish:    make(chan struct{}),
		stopped:   make(chan struct{}),
	}
}

// aLongTimeAgo is a deadline that wakes a blocked Read at once.
var aLongTimeAgo = time.Unix(1, 0)

// Finish tells the reader that no more output matters beyond what the pipe
// holds now. Run drains the pipe and returns. Finish may be called more
// than once and from any goroutine.
func (r *Reader) Finish() {
	r.mu.Lock()
	if !r.finished {
		r.finished = true
		close(r.finish)
	}
	r.mu.Unlock()
	r.f.SetReadDeadline(aLongTimeAgo)
}

// Sync returns after every byte that was in the pipe when it was called has
// been given to the sink, or once Run has returned.
func (r *Reader) Sync() {
	ack := make(chan struct{})
	r.mu.Lock()
	r.syncs = append(r.syncs, ack)
	r.mu.Unlock()
	// The request is queued before the wake-up, and Run looks at the queue
	// after every change of deadline, so neither can be missed.
	r.f.SetReadDeadline(aLongTimeAgo)
	select {
	case <-ack:
	case <-r.stopped:
	}
}

// Done is closed when Run has returned.
func (r *Reader) Done() <-chan struct{} { return r.stopped }

// Run reads until EOF, a read error, or the drain after Finish. The file
// is closed at EOF or error; after Finish it is closed once its writers
// have all closed it (see Reader).
func (r *Reader) Run() error {
	defer close(r.stopped)
	buf := make([]byte, 64<<10)
	canDeadline := r.f.SetReadDeadline(time.Time{}) == nil
	var idleAt time.Time // zero: no idle callback pending
	for {
		if canDeadline {
			r.f.SetReadDeadline(idleAt)
			if done, eof := r.serveRequests(buf); eof {
				r.f.Close()
				return nil
			} else if done {
				go r.readTail()
				return nil
			}
		}
		n, err := r.f.Read(buf)
		if n > 0 {
			r.sink(buf[:n])
			if r.idle != nil && canDeadline {
				idleAt = time.Now().Add(r.idleAfter)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			if !idleAt.IsZero() && !time.Now().Before(idleAt) {
				idleAt = time.Time{}
				r.idle()
			}
		case err == io.EOF, errors.Is(err, syscall.EIO): // EIO: a terminal whose other side closed
			r.f.Close()
			return nil
		default:
			r.f.Close()
			return err
		}
	}
}

// readTail reads the pipe after Finish until its writers are gone.
func (r *Reader) readTail() {
	defer r.f.Close()
	r.f.SetReadDeadline(time.Time{})
	buf := make([]byte, 32<<10)
	for {
		n, err := r.f.Read(buf)
		if n > 0 && r.Tail != nil {
			r.Tail(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// serveRequests answers a pending Finish or Sync. done reports a Finish;
// eof reports that the pipe's write side is closed.
func (r *Reader) serveRequests(buf []byte) (done, eof bool) {
	select {
	case <-r.finish:
		r.drain(buf)
		return true, false
	default:
	}
	r.mu.Lock()
	syncs := r.syncs
	r.syncs = nil
	r.mu.Unlock()
	if len(syncs) == 0 {
		return false, false
	}
	eof = r.drain(buf)
	for _, ack := range syncs {
		close(ack)
	}
	return false, eof
}

// drain hands over what the pipe holds without waiting for more. It
// reports whether it reached EOF.
func (r *Reader) drain(buf []byte) (eof bool) {
	rc, err := r.f.SyscallConn()
	if err != nil {
		return false
	}
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, rerr = syscall.Read(int(fd), buf)
			return rerr != syscall.EINTR
		})
		if err != nil {
			return false
		}
		switch {
		case n > 0:
			r.sink(buf[:n])
		case rerr == nil, rerr == syscall.EIO: // n == 0: EOF
			return true
		default: // EAGAIN: empty for now
			return false
		}
	}
}
