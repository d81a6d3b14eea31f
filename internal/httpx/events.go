package httpx

import (
	"net/http"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// StartStream answers 200 with the headers of an event stream: what execd
// sends for commands and metrics, and what proxies need to pass each
// event on at once.
func StartStream(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
}

// StallTimeout is how long one write of an event stream may wait for a
// client that does not read. Past it the client is taken as gone: the
// stream's producer then drops its output instead of blocking (a command
// or a code run must never hang on a stalled client).
const StallTimeout = time.Minute

// EventWriter writes an execd event stream: each event is one JSON object
// and a blank line, flushed at once. Headers go out with the first event,
// so an error before it can still be answered as plain JSON.
type EventWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

// NewEventWriter returns a writer for w. Nothing is written until Send.
func NewEventWriter(w http.ResponseWriter) *EventWriter {
	return &EventWriter{w: w, rc: http.NewResponseController(w)}
}

// writeChunk is how much encoded output Send gathers before it writes,
// so that encoding a large batch never holds more than about this much.
const writeChunk = 256 << 10

// Send writes events, stamping those without a timestamp with the current
// time, and flushes. An error means the client has gone.
func (ew *EventWriter) Send(events ...api.Event) error {
	return ew.SendBatches(events)
}

// SendBatches writes the events of every batch in order, as Send does,
// with one flush at the end.
func (ew *EventWriter) SendBatches(batches ...[]api.Event) error {
	if ew.buf == nil {
		StartStream(ew.w)
		ew.buf = make([]byte, 0, 4096)
	}
	// A deadline per write, cleared after it: a later request on the same
	// connection must not inherit it. Writers without deadlines (tests'
	// recorders) just go without.
	defer ew.rc.SetWriteDeadline(time.Time{})
	var now int64
	b := ew.buf[:0]
	for _, events := range batches {
		for i := range events {
			e := &events[i]
			if e.Timestamp == 0 {
				if now == 0 {
					now = time.Now().UnixMilli()
				}
				e.Timestamp = now
			}
			b = e.AppendFrame(b)
			if len(b) >= writeChunk {
				if err := ew.write(b); err != nil {
					return err
				}
				b = b[:0]
			}
		}
	}
	var err error
	if len(b) > 0 {
		err = ew.write(b)
	}
	if cap(b) <= 1<<20 {
		ew.buf = b[:0]
	} else {
		ew.buf = make([]byte, 0, 4096) // one huge event's buffer is not kept
	}
	if err != nil {
		return err
	}
	return ew.rc.Flush()
}

func (ew *EventWriter) write(b []byte) error {
	ew.rc.SetWriteDeadline(time.Now().Add(StallTimeout))
	_, err := ew.w.Write(b)
	return err
}
