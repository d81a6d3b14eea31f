// Package testwait gives tests that wait on sandbox progress a deadline
// scaled to how fast this machine starts a container right now, and makes
// a wait that runs out say what the thing waited on was doing.
//
// The pace is the time a cold `docker run --rm --pull never -p
// 127.0.0.1::8080 IMAGE true` of a local image takes (a published port, as
// sandboxes have: the engine's port and firewall work is often what a
// busy machine makes slow), measured once per test binary, the first time a
// deadline is asked for. A wait may take Factor times the pace per sandbox
// start it covers, and never less than Floor. Before a wait gives up it
// measures the pace again, since the machine may have become busier since
// the first measure (other tests, other builds), and goes on waiting if
// the new pace allows more time. Only tests import it.
package testwait

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// Factor is how many cold container starts a wait for one sandbox
	// start may take.
	Factor = 10
	// Floor is the shortest deadline of a wait for one sandbox start.
	Floor = 10 * time.Second
	// Image is the local image whose cold start sets the pace; make images
	// builds it. It is never pulled.
	Image = "opensandbox/busybox"
	// measureTimeout bounds one measure; an engine slower than that gives
	// this pace, which already makes the deadline 20 minutes long.
	measureTimeout = 2 * time.Minute
)

// measure starts one container and reports how long it took. Tests of the
// package replace it.
var measure = measureDocker

// floor is Floor; tests of the package shorten it.
var floor = Floor

var (
	mu       sync.Mutex
	measured bool
	pace     time.Duration
	paceErr  error // why the last measure failed; pace is then Floor/Factor
)

func measureDocker() (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), measureTimeout)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "docker", "run", "--rm", "--pull", "never", "-p", "127.0.0.1::8080", Image, "true").CombinedOutput()
	d := time.Since(start)
	if ctx.Err() != nil {
		return measureTimeout, nil // the engine is that slow: that is the pace
	}
	if err != nil {
		return 0, fmt.Errorf("docker run %s: %v: %s", Image, err, strings.TrimSpace(string(out)))
	}
	return d, nil
}

// remeasure measures the pace and keeps it for later waits.
func remeasure() (time.Duration, error) {
	d, err := measure()
	if err != nil || d <= 0 {
		d = floor / Factor
	}
	mu.Lock()
	defer mu.Unlock()
	measured, pace, paceErr = true, d, err
	return d, err
}

// Pace returns how long a cold container start takes on this machine,
// measured the first time it is asked for and again by a wait about to
// give up. Without a Docker engine it is Floor/Factor.
func Pace() time.Duration {
	mu.Lock()
	if measured {
		defer mu.Unlock()
		return pace
	}
	mu.Unlock()
	d, _ := remeasure() // parallel first callers may each measure: harmless
	return d
}

// Timeout returns how long a wait for one sandbox start may take:
// Factor × Pace, at least Floor.
func Timeout() time.Duration { return deadlineFor(1, Pace()) }

// TimeoutN returns how long a wait covering n sandbox starts may take
// (n creates at once, a create and then a restart...): n × Timeout.
func TimeoutN(n int) time.Duration { return deadlineFor(n, Pace()) }

func deadlineFor(n int, p time.Duration) time.Duration {
	return time.Duration(max(n, 1)) * max(floor, Factor*p)
}

// Wait describes one wait.
type Wait struct {
	// What is waited for, for the failure message: "sandbox X to be Running".
	What string
	// Starts is how many sandbox starts the wait covers; default 1.
	Starts int
	// Describe returns what the thing waited on was doing (its status,
	// events, log, container state); it is called once, when the wait
	// runs out. Optional.
	Describe func() string
	// Every is the polling interval; default 50 ms.
	Every time.Duration
}

// Until polls cond until it returns true, for at most Starts × Timeout;
// then it measures the pace again and goes on while the new pace allows.
// When the wait runs out it fails t with the time waited, the paces and
// Describe's answer. cond may itself fail t (a sandbox that failed
// instead of starting). It returns how long the wait took.
func (w Wait) Until(t testing.TB, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	if err := w.poll(start, cond); err != nil {
		var desc string
		if w.Describe != nil {
			desc = "\n" + w.Describe()
		}
		t.Fatalf("%v%s", err, desc)
	}
	return time.Since(start)
}

// poll does Until's work and returns why it gave up.
func (w Wait) poll(start time.Time, cond func() bool) error {
	first := Pace()
	deadline := start.Add(deadlineFor(w.Starts, first))
	every := w.Every
	if every <= 0 {
		every = 50 * time.Millisecond
	}
	remeasured := false
	for {
		if cond() {
			return nil
		}
		if time.Now().Before(deadline) {
			time.Sleep(every)
			continue
		}
		if remeasured {
			break
		}
		remeasured = true
		if now, _ := remeasure(); start.Add(deadlineFor(w.Starts, now)).After(deadline) {
			deadline = start.Add(deadlineFor(w.Starts, now))
		}
	}
	mu.Lock()
	now, err := pace, paceErr
	mu.Unlock()
	note := ""
	if err != nil {
		note = fmt.Sprintf(" (pace unmeasured: %v)", err)
	}
	return fmt.Errorf("timed out after %v waiting for %s (cold container start took %v at first, %v at the end%s; deadline %d × pace × %d starts, at least %v)",
		time.Since(start).Round(time.Millisecond), w.What, first.Round(time.Millisecond), now.Round(time.Millisecond), note, Factor, max(w.Starts, 1), floor)
}

// Until waits for one sandbox start's worth of time: Wait{What: what,
// Describe: describe}.Until(t, cond).
func Until(t testing.TB, what string, cond func() bool, describe func() string) time.Duration {
	t.Helper()
	return Wait{What: what, Describe: describe}.Until(t, cond)
}

// Containers describes the containers that match the docker ps filters
// (e.g. "label=opensandbox.scope=S", "name=osb-ID"): their state as the
// engine has it and the tail of their output. It is meant for Describe.
func Containers(filters ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{"ps", "-aq", "--no-trunc"}
	for _, f := range filters {
		args = append(args, "--filter", f)
	}
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("docker ps %v: %v: %s", filters, err, out)
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		return fmt.Sprintf("no container matches %v", filters)
	}
	var b strings.Builder
	for _, id := range ids {
		st, err := exec.CommandContext(ctx, "docker", "inspect", "--format",
			"{{.Name}} {{json .State}}", id).CombinedOutput()
		if err != nil {
			fmt.Fprintf(&b, "container %.12s: inspect: %v: %s\n", id, err, st)
			continue
		}
		fmt.Fprintf(&b, "container %s", st)
		logs, _ := exec.CommandContext(ctx, "docker", "logs", "--tail", "20", id).CombinedOutput()
		fmt.Fprintf(&b, "  output (tail):\n%s\n", indent(string(logs)))
	}
	return b.String()
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (none)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
