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
type Reader struct {
	f         *os.File
	sink      func([]byte)
	idle      func()
	idleAfter time.Duration

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

// Run reads until EOF, a read error, or the drain after Finish. It closes
// the file before returning.
func (r *Reader) Run() error {
	defer close(r.stopped)
	defer r.f.Close()
	buf := make([]byte, 64<<10)
	canDeadline := r.f.SetReadDeadline(time.Time{}) == nil
	var idleAt time.Time // zero: no idle callback pending
	for {
		if canDeadline {
			r.f.SetReadDeadline(idleAt)
			if done, eof := r.serveRequests(buf); done || eof {
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
		case err == io.EOF:
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if !idleAt.IsZero() && !time.Now().Before(idleAt) {
				idleAt = time.Time{}
				r.idle()
			}
		case errors.Is(err, syscall.EIO):
			// A terminal whose other side has closed.
			return nil
		default:
			return err
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
