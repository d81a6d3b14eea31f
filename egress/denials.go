package egress

import (
	"sync"
	"time"
)

// DefaultDenialsKept is how many denials NewDenials keeps when asked for
// none.
const DefaultDenialsKept = 1000

// Denials keeps the most recent denials, for diagnostics, and counts all
// of them. It is safe for concurrent use; the zero value is not usable,
// use NewDenials.
type Denials struct {
	mu    sync.Mutex
	buf   []Denial // ring of cap n
	next  int      // where the next denial goes once buf is full
	total uint64
}

// NewDenials returns a ring that keeps the last n denials
// (DefaultDenialsKept when n <= 0).
func NewDenials(n int) *Denials {
	if n <= 0 {
		n = DefaultDenialsKept
	}
	return &Denials{buf: make([]Denial, 0, n)}
}

// Add records a denial, stamping it with the current time when it has
// none; the oldest is dropped when the ring is full.
func (d *Denials) Add(x Denial) {
	if x.Time.IsZero() {
		x.Time = time.Now()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.total++
	if len(d.buf) < cap(d.buf) {
		d.buf = append(d.buf, x)
		return
	}
	d.buf[d.next] = x
	d.next = (d.next + 1) % len(d.buf)
}

// List returns the kept denials, oldest first, newest last.
func (d *Denials) List() []Denial {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Denial, 0, len(d.buf))
	out = append(out, d.buf[d.next:]...)
	return append(out, d.buf[:d.next]...)
}

// Total reports how many denials were ever added, kept or not.
func (d *Denials) Total() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.total
}
