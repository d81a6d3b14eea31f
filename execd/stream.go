package execd

import (
	"os"
	"sync"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
)

// outputStream carries a command's events from the goroutines that read
// its pipes to the goroutine that writes the HTTP response. When the
// client leaves, detach turns every send into a no-op, so the readers keep
// draining the pipes and the process never blocks on a full one.
type outputStream struct {
	events  chan []api.Event
	gone    chan struct{}
	once    sync.Once
	readers sync.WaitGroup
}

func newOutputStream() *outputStream {
	return &outputStream{events: make(chan []api.Event, 64), gone: make(chan struct{})}
}

// send hands events to the writer, or drops them once the client is gone.
func (st *outputStream) send(evs ...api.Event) {
	select {
	case st.events <- evs:
	case <-st.gone:
	}
}

// detach marks the client as gone.
func (st *outputStream) detach() { st.once.Do(func() { close(st.gone) }) }

// readLines reads f until EOF or, once exited is closed, until f is empty,
// and sends one event of type typ per line (an empty line as "\n", as the
// clients expect). A partial line is sent after it has waited idleFlush for
// its end.
func (st *outputStream) readLines(f *os.File, typ string, exited <-chan struct{}) {
	var lines process.Lines
	var batch []api.Event
	var now int64
	emit := func(line []byte) {
		text := string(line)
		if text == "" {
			text = "\n"
		}
		batch = append(batch, api.Event{Type: typ, Text: text, Timestamp: now})
	}
	flush := func() {
		if len(batch) > 0 {
			st.send(batch...)
			batch = nil
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
