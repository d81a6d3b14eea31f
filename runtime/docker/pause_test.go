package docker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/opensandbox/opensandbox/sandbox"
)

// TestPauseKeepsProcesses: a paused sandbox's processes are frozen, not
// restarted: after resume a counter carries on from where it stopped.
func TestPauseKeepsProcesses(t *testing.T) {
	rt := newTestRuntime(t, nil)
	ctx := context.Background()
	id := start(t, rt, sandbox.Spec{})
	mustRun(t, rt, id, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done) >/dev/null 2>&1 &
echo $! > /tmp/pid`)
	time.Sleep(300 * time.Millisecond)
	pid := mustRun(t, rt, id, "cat /tmp/pid")
	if err := rt.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := rt.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(mustRun(t, rt, id, "cat /tmp/n"))
	if got := mustRun(t, rt, id, "cat /tmp/pid; kill -0 $(cat /tmp/pid) && echo alive"); got != pid+"\nalive" {
		t.Fatalf("counter process after resume: %q, want %s alive", got, pid)
	}
	// Running 1.3 s at 20 per second would pass 26; frozen for 1 s, it
	// cannot have gone much past 6 plus the time before and after.
	if n < 3 || n > 20 {
		t.Fatalf("counter at %d after 0.3 s running and 1 s paused", n)
	}
}
