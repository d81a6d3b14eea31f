package execd

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/api"
)

// TestReserveThreads: the threads are made at once and stay, idle, for
// the runtime to use instead of making new ones.
func TestReserveThreads(t *testing.T) {
	want := osThreads() + 20
	if got := ReserveThreads(want); got < want {
		t.Fatalf("ReserveThreads(%d): %d threads", want, got)
	}
	time.Sleep(50 * time.Millisecond)
	if n := osThreads(); n < want {
		t.Fatalf("%d threads alive after reserving %d: the runtime let them go", n, want)
	}
	if got := ReserveThreads(want - 5); got < want {
		t.Fatalf("a smaller reservation reports %d threads", got)
	}
}

// TestFileOpsAreGated: no more than fileOps file-system requests are
// served at once; the others wait their turn and are then served.
func TestFileOpsAreGated(t *testing.T) {
	s, c := newTestServer(t, nil)
	// Hold every turn, as fileOps slow requests would.
	for range fileOps {
		s.fileOps <- struct{}{}
	}
	done := make(chan int, 1)
	go func() {
		resp, _ := c.do(c.request(http.MethodGet, "/files/info?path=/", nil))
		done <- resp.StatusCode
	}()
	select {
	case code := <-done:
		t.Fatalf("a file request was served (%d) with every turn taken", code)
	case <-time.After(200 * time.Millisecond):
	}
	// Other routes do not wait, a command's status included.
	c.call(http.MethodGet, "/ping", nil, http.StatusOK, nil)
	id := c.stream("/command", api.RunCommandRequest{Command: "true"})[0].Text
	c.call(http.MethodGet, "/command/status/"+id, nil, http.StatusOK, nil)
	<-s.fileOps
	select {
	case code := <-done:
		if code != http.StatusOK {
			t.Fatalf("the waiting request got %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting request was not served when a turn came free")
	}
	for range fileOps - 1 {
		<-s.fileOps
	}
	// Many at once all get served.
	var wg sync.WaitGroup
	for range 3 * fileOps {
		wg.Go(func() { c.call(http.MethodGet, "/files/info?path=/", nil, http.StatusOK, nil) })
	}
	wg.Wait()
}
