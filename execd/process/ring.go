package process

import "sync"

// Ring keeps the last bytes of a stream, addressed by their offset in the
// whole stream, so a client that reconnects can ask for what it missed.
type Ring struct {
	mu    sync.Mutex
	buf   []byte // fixed capacity
	n     int    // bytes held, <= len(buf)
	head  int    // index of the oldest byte held
	total int64  // bytes ever written
}

// NewRing returns a ring that keeps the last size bytes.
func NewRing(size int) *Ring {
	return &Ring{buf: make([]byte, size)}
}

// Write appends p, dropping the oldest bytes beyond the ring's size.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	written := len(p)
	r.total += int64(written)
	size := len(r.buf)
	if len(p) >= size {
		copy(r.buf, p[len(p)-size:])
		r.head, r.n = 0, size
		return written, nil
	}
	tail := (r.head + r.n) % size
	c := copy(r.buf[tail:], p)
	copy(r.buf, p[c:])
	r.n += len(p)
	if r.n > size {
		r.head = (r.head + r.n - size) % size
		r.n = size
	}
	return written, nil
}

// Total returns the number of bytes ever written.
func (r *Ring) Total() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// Since returns a copy of the kept bytes from offset since on, and the
// offset of the first byte returned. An offset older than what the ring
// keeps is moved up to its oldest byte; one at or beyond the end returns
// nothing.
func (r *Ring) Since(since int64) (data []byte, start int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	oldest := r.total - int64(r.n)
	if since < oldest {
		since = oldest
	}
	if since >= r.total {
		return nil, r.total
	}
	skip := int(since - oldest)
	out := make([]byte, 0, r.n-skip)
	from := (r.head + skip) % len(r.buf)
	if from+r.n-skip <= len(r.buf) {
		out = append(out, r.buf[from:from+r.n-skip]...)
	} else {
		out = append(out, r.buf[from:]...)
		out = append(out, r.buf[:r.n-skip-(len(r.buf)-from)]...)
	}
	return out, since
}
