package execd

import (
	"os"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
)

// Memory bounds of an event stream.
const (
	// streamBudget bounds the events that wait in a stream for its
	// client, counted by eventCost. A producer that would pass it waits
	// (and with it the process, on its full pipe) until the writer has
	// taken what is queued. One batch may exceed it when nothing else is
	// queued, so a single large result still goes through.
	streamBudget = 1 << 20
	// sendChunk is the most a line reader hands over in one send, so that
	// a read of many short lines becomes several sends within the budget.
	sendChunk = 64 << 10
	// eventOverhead is what an event costs beyond its text: the Event
	// value, its string header and its share of the batch slice.
	eventOverhead = 96
)

// eventCost is what an event counts against a stream's budget: its
// text, its error's text, and its results' strings.
func eventCost(ev *api.Event) int {
	n := eventOverhead + len(ev.Text)
	if ev.Error != nil {
		n += len(ev.Error.EName) + len(ev.Error.EValue)
		for _, l := range ev.Error.Traceback {
			n += len(l) + 16
		}
	}
	for k, v := range ev.Results {
		n += len(k) + 16
		if s, ok := v.(string); ok {
			n += len(s)
		} else {
			n += 64
		}
	}
	return n
}

// outputStream carries a command's events from the goroutines that read
// its pipes to the goroutine that writes the HTTP response. It holds at
// most streamBudget of them (plus one oversized batch): a producer that
// would pass that waits for the writer, which takes everything queued at
// once. When the client leaves, detach turns every send into a no-op, so
// the readers keep draining the pipes and the process never blocks on a
// full one.
type outputStream struct {
	mu     sync.Mutex
	space  sync.Cond     // signalled when the writer has taken the queue, or on detach
	queue  [][]api.Event // batches as sent; a sender gives up its slice
	cost   int
	closed bool // the producer has sent its last event
	gone   bool // the client has left
	// ready holds a token while there is something for the writer: events
	// queued, or the end of the stream.
	ready chan struct{}

	readers sync.WaitGroup
}

func newOutputStream() *outputStream {
	st := &outputStream{ready: make(chan struct{}, 1)}
	st.space.L = &st.mu
	return st
}

// send queues events for the writer, waiting while the stream's budget is
// used up; once the client is gone it drops them. The stream keeps evs:
// the caller must not change it afterwards.
func (st *outputStream) send(evs ...api.Event) {
	c := 0
	for i := range evs {
		c += eventCost(&evs[i])
	}
	st.mu.Lock()
	for !st.gone && st.cost > 0 && st.cost+c > streamBudget {
		st.space.Wait()
	}
	if st.gone || st.closed {
		st.mu.Unlock()
		return
	}
	st.queue = append(st.queue, evs)
	st.cost += c
	st.mu.Unlock()
	st.wake()
}

// close marks the end of the stream, after the events sent so far.
func (st *outputStream) close() {
	st.mu.Lock()
	st.closed = true
	st.mu.Unlock()
	st.wake()
}

func (st *outputStream) wake() {
	select {
	case st.ready <- struct{}{}:
	default:
	}
}

// take returns the queued batches, leaving spare (emptied) as the new
// queue, and whether the stream has ended: closed, with nothing left
// after these. Producers waiting for room go on.
func (st *outputStream) take(spare [][]api.Event) ([][]api.Event, bool) {
	clear(spare)
	st.mu.Lock()
	q := st.queue
	st.queue = spare[:0]
	st.cost = 0
	ended := st.closed
	st.space.Broadcast()
	st.mu.Unlock()
	return q, ended
}

// detach marks the client as gone: queued events are dropped and every
// later send returns at once.
func (st *outputStream) detach() {
	st.mu.Lock()
	st.gone = true
	st.queue, st.cost = nil, 0
	st.space.Broadcast()
	st.mu.Unlock()
}

// readLines reads f until EOF or, once exited is closed, until f is empty,
// and sends one event of type typ per line (an empty line as "\n", as the
// clients expect); a line longer than process.MaxLine comes in pieces of
// that size. A partial line is sent after it has waited idleFlush for its
// end.
func (st *outputStream) readLines(f *os.File, typ string, exited <-chan struct{}) {
	var lines process.Lines
	var batch []api.Event
	var batchCost int
	var now int64
	flush := func() {
		if len(batch) > 0 {
			st.send(batch...)
			batch, batchCost = nil, 0
		}
	}
	emit := func(line []byte) {
		text := string(line)
		if text == "" {
			text = "\n"
		}
		batch = append(batch, api.Event{Type: typ, Text: text, Timestamp: now})
		if batchCost += eventOverhead + len(text); batchCost >= sendChunk {
			flush()
		}
	}
	rd := process.NewReader(f, func(b []byte) {
		now = time.Now().UnixMilli()
		lines.Write(b, emit)
		flush()
	}, idleFlush, func() {
		now = time.Now().UnixMilli()
		lines.Flush(false, emit)
		flush()
	})
	st.readers.Add(2)
	go func() {
		defer st.readers.Done()
		rd.Run()
		now = time.Now().UnixMilli()
		lines.Flush(true, emit)
		flush()
	}()
	go func() {
		defer st.readers.Done()
		select {
		case <-exited:
			rd.Finish()
		case <-rd.Done():
		}
	}()
}
