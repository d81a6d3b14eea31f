package execd

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/execd/process"
)

// TestStreamHoldsItsBudget: a producer that outruns the writer waits once
// the queue holds streamBudget, and goes on when the writer takes it; one
// batch larger than the budget passes when nothing else is queued.
func TestStreamHoldsItsBudget(t *testing.T) {
	st := newOutputStream()
	line := api.Event{Type: api.EventStdout, Text: strings.Repeat("x", 1000)}
	var sent atomic.Int64
	go func() {
		for range 10_000 {
			st.send(line)
			sent.Add(1)
		}
		st.close()
	}()
	perEvent := int64(eventCost(&line))
	waitFor(t, "the producer to stop", func() bool {
		n := sent.Load()
		time.Sleep(20 * time.Millisecond)
		return n > 0 && sent.Load() == n
	})
	st.mu.Lock()
	queued := st.cost
	st.mu.Unlock()
	if queued > streamBudget || int64(queued) < streamBudget-perEvent {
		t.Fatalf("producer stopped with %d queued; budget %d", queued, streamBudget)
	}
	if n := sent.Load(); n*perEvent > streamBudget {
		t.Fatalf("%d events sent past a budget of %d events", n, streamBudget/perEvent)
	}
	var total int
	var batches [][]api.Event
	for ended := false; !ended; {
		<-st.ready
		batches, ended = st.take(batches)
		for _, b := range batches {
			total += len(b)
		}
	}
	if total != 10_000 {
		t.Fatalf("writer got %d events, want 10000", total)
	}

	big := newOutputStream()
	huge := api.Event{Type: api.EventResult, Results: map[string]any{"image/png": strings.Repeat("A", 2*streamBudget)}}
	done := make(chan struct{})
	go func() { big.send(huge); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a single event over the budget waits for ever on an empty stream")
	}
}

// TestStreamDetachReleasesProducers: once the client is gone, a waiting
// producer returns and later sends are dropped, so the process's output
// is drained, not held.
func TestStreamDetachReleasesProducers(t *testing.T) {
	st := newOutputStream()
	line := api.Event{Type: api.EventStdout, Text: strings.Repeat("x", 4096)}
	done := make(chan struct{})
	go func() {
		for range 1000 {
			st.send(line)
		}
		close(done)
	}()
	time.Sleep(50 * time.Millisecond)
	st.detach()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the producer still waits after the client left")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.queue) != 0 || st.cost != 0 {
		t.Fatalf("%d events (%d bytes) kept after the client left", len(st.queue), st.cost)
	}
}

// TestCommandLongLineIsChunked: a line of 1 MiB and a bit comes as events
// of at most process.MaxLine bytes that add up to it, and the line after
// it as an event of its own.
func TestCommandLongLineIsChunked(t *testing.T) {
	_, tc := newTestServer(t, nil)
	const n = 1<<20 + 5
	evs := tc.stream("/command", api.RunCommandRequest{Command: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; echo; echo after", n)})
	var pieces []string
	for _, ev := range evs {
		if ev.Type == api.EventStdout {
			pieces = append(pieces, ev.Text)
		}
	}
	if len(pieces) < 2 || pieces[len(pieces)-1] != "after" {
		t.Fatalf("%d stdout events, the last %.20q", len(pieces), pieces[len(pieces)-1])
	}
	line := pieces[:len(pieces)-1]
	if want := (n + process.MaxLine - 1) / process.MaxLine; len(line) != want {
		t.Errorf("the line came in %d events, want %d", len(line), want)
	}
	total := 0
	for i, p := range line {
		if len(p) > process.MaxLine {
			t.Errorf("piece %d is %d bytes, over %d", i, len(p), process.MaxLine)
		}
		if strings.Trim(p, "x") != "" {
			t.Errorf("piece %d holds more than the line", i)
		}
		total += len(p)
	}
	if total != n {
		t.Errorf("pieces add up to %d bytes, want %d", total, n)
	}
}

// TestCommandStalledClientBoundsMemory: a command printing one endless
// line to a client that stops reading is held back on its pipe, and execd
// holds no more than a few stream budgets meanwhile (before the bound, a
// queue of 64 half-megabyte pieces kept 34 MiB of heap in use here, and a
// process's RSS grows to about twice that).
func TestCommandStalledClientBoundsMemory(t *testing.T) {
	s, tc := newTestServer(t, nil)
	resp, err := tc.hc.Do(tc.request(http.MethodPost, "/command", api.RunCommandRequest{Command: "head -c 64000000 /dev/zero | tr '\\0' x"}))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := api.NewEventDecoder(resp.Body)
	init, err := dec.Next()
	if err != nil || init.Type != api.EventInit {
		t.Fatalf("first event %+v, %v", init, err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	// The client reads nothing more. The writer of the line (tr) must end
	// up blocked on its pipe, its written byte count still.
	c := s.commands.get(init.Text)
	var writer int
	waitFor(t, "tr to start", func() bool {
		writer = groupMember(c.proc.Pid(), "tr")
		return writer != 0
	})
	var stuckAt int64
	waitFor(t, "tr to be held back", func() bool {
		a := writtenBytes(t, writer)
		time.Sleep(200 * time.Millisecond)
		b := writtenBytes(t, writer)
		stuckAt = b
		return a == b
	})
	if stuckAt >= 64_000_000 {
		t.Fatal("tr wrote everything: nothing held it back")
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 8<<20 {
		t.Errorf("heap grew by %d MiB while the client stalled", grew>>20)
	}
	t.Logf("tr held back after %d MB; heap in use %d → %d KiB", stuckAt/1e6, before.HeapInuse>>10, after.HeapInuse>>10)

	// Reading again lets it finish, in pieces of MaxLine.
	got := int64(0)
	for {
		ev, err := dec.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == api.EventStdout {
			if len(ev.Text) > process.MaxLine {
				t.Fatalf("a piece of %d bytes", len(ev.Text))
			}
			got += int64(len(ev.Text))
		}
	}
	if got != 64_000_000 {
		t.Errorf("read %d bytes of the line, want 64000000", got)
	}
}

// groupMember returns the pid of the process named comm in process group
// pgid, or 0.
func groupMember(pgid int, comm string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		j := bytes.IndexByte(b, '(')
		if i < 0 || j < 0 || string(b[j+1:i]) != comm {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) > 2 && string(f[2]) == strconv.Itoa(pgid) {
			return pid
		}
	}
	return 0
}

// writtenBytes returns the bytes process pid has written (wchar).
func writtenBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no wchar in /proc/%d/io", pid)
	return 0
}
