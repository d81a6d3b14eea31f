package process

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/opensandbox/opensandbox/internal/testenv"
)

func sh(t testing.TB, s *Supervisor, script string) *Process {
	t.Helper()
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitState(t testing.TB, p *Process) ExitState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("process %d did not exit: %v", p.Pid(), err)
	}
	return st
}

func TestExitStates(t *testing.T) {
	s := NewSupervisor(false)
	tests := []struct {
		script string
		want   string
		code   int
	}{
		{"exit 0", "exit status 0", 0},
		{"exit 3", "exit status 3", 3},
		{"kill -KILL $$", "signal: killed", -1},
		{"kill -TERM $$", "signal: terminated", -1},
	}
	for _, tt := range tests {
		st := waitState(t, sh(t, s, tt.script))
		if st.String() != tt.want || st.Code != tt.code {
			t.Errorf("%q: state %q code %d, want %q code %d", tt.script, st, st.Code, tt.want, tt.code)
		}
	}
}

func TestStartErrors(t *testing.T) {
	s := NewSupervisor(false)
	if _, err := s.Start(Spec{Path: "/nonexistent", Args: []string{"x"}}); err == nil {
		t.Error("start of a missing executable succeeded")
	}
	if _, err := s.Start(Spec{Path: "/bin/true", Args: []string{"true"}, Dir: "/nonexistent"}); err == nil {
		t.Error("start in a missing directory succeeded")
	}
}

func TestSignalReachesWholeGroup(t *testing.T) {
	s := NewSupervisor(false)
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := sh(t, s, "sleep 100 & echo $! > "+pidFile+"; wait")
	var child int
	for deadline := time.Now().Add(5 * time.Second); child == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if child == 0 {
		t.Fatal("child pid never written")
	}
	p.Stop(time.Second)
	// The grandchild was in the group, so it got the signal too; it is
	// reparented and reaped by init (or this test's subreaper), so poll.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if !alive(child) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d survived Stop", child)
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func TestStopEscalatesToKill(t *testing.T) {
	s := NewSupervisor(false)
	p := sh(t, s, "trap '' TERM; while :; do sleep 0.05; done")
	time.Sleep(100 * time.Millisecond) // let the trap be set
	start := time.Now()
	p.Stop(200 * time.Millisecond)
	if st := p.State(); st.String() != "signal: killed" {
		t.Fatalf("state after Stop = %s, want signal: killed", st)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Stop took %v", d)
	}
}

func TestCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Log("not root: checking that a foreign uid is refused instead")
	}
	s := NewSupervisor(false)
	r, w, _ := os.Pipe()
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "id -u; id -g"}, Stdout: w,
		Cred: &syscall.Credential{Uid: 65534, Gid: 65534}})
	w.Close()
	if os.Geteuid() != 0 {
		if err == nil {
			t.Fatal("non-root start as another uid succeeded")
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, p)
	out := make([]byte, 64)
	n, _ := r.Read(out)
	if got := strings.Fields(string(out[:n])); len(got) != 2 || got[0] != "65534" || got[1] != "65534" {
		t.Fatalf("id = %q, want 65534 65534", got)
	}
}

// TestReapAll runs the reap-all scenario in a child test process, which
// becomes a subreaper: orphans must not stay zombies, and every
// supervised process must get its own exit status even while the reaper
// collects orphans concurrently.
func TestReapAll(t *testing.T) {
	if os.Getenv("PROCESS_TEST_REAP_ALL") == "1" {
		reapAllScenario(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReapAll$", "-test.v")
	cmd.Env = append(os.Environ(), "PROCESS_TEST_REAP_ALL=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reap-all scenario failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "scenario ok") {
		t.Fatalf("reap-all scenario did not run:\n%s", out)
	}
}

func reapAllScenario(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	s := NewSupervisor(true)
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each command leaves an orphan behind that exits a little later.
			p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", fmt.Sprintf("(sleep 0.%d; exit 9) & exit %d", i%5+1, i%100)}})
			if err != nil {
				errs <- err
				return
			}
			st := waitState(t, p)
			if st.Code != i%100 {
				errs <- fmt.Errorf("process %d: exit %d, want %d", i, st.Code, i%100)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Orphans() < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := s.Orphans(); got != n {
		t.Errorf("reaped %d orphans, want %d", got, n)
	}
	if z := zombieChildren(); len(z) > 0 {
		t.Errorf("zombie children left: %v", z)
	}
	fmt.Println("scenario ok")
}

func zombieChildren() []int {
	self := strconv.Itoa(os.Getpid())
	var zombies []int
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
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == self {
			zombies = append(zombies, pid)
		}
	}
	return zombies
}

// TestInheritedDescriptorsDoNotLeak: a descriptor this process inherited
// without close-on-exec must not reach the processes it starts.
func TestInheritedDescriptorsDoNotLeak(t *testing.T) {
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, w.Fd(), syscall.F_SETFD, 0); errno != 0 {
		t.Fatal(errno)
	}
	s := NewSupervisor(false)
	out, ow, _ := os.Pipe()
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "ls /proc/self/fd"}, Stdout: ow})
	ow.Close()
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, p)
	b := make([]byte, 4096)
	n, _ := out.Read(b)
	for _, fd := range strings.Fields(string(b[:n])) {
		if fd == strconv.Itoa(int(w.Fd())) {
			t.Fatalf("descriptor %d leaked into the child (its fds: %q)", w.Fd(), b[:n])
		}
	}
}

// readOOMScore reads a process's oom_score_adj.
func readOOMScore(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestChildOOMScore: every process started gets the score before it runs,
// so what it forks at once inherits it (with the score written after the
// exec instead, that child kept the old score in 7 to 9 runs of 20); a
// process of another user too; and the supervisor is back at its own
// score after every fork, with starts from many goroutines at once.
func TestChildOOMScore(t *testing.T) {
	own := readOOMScore(t, os.Getpid())
	if own == 1000 {
		t.Fatal("this test's own oom_score_adj is already 1000: the test would prove nothing")
	}
	s := NewSupervisor(false)
	var failures []error
	s.SetChildOOMScore(1000, func(pid int, err error) { failures = append(failures, err) })

	for range 20 {
		r, w, _ := os.Pipe()
		p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "sleep 30 & echo $!; wait"}, Stdout: w})
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		var child int
		_, err = fmt.Fscan(r, &child)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := readOOMScore(t, p.Pid()); got != 1000 {
			t.Errorf("started process: oom_score_adj %d, want 1000", got)
		}
		if got := readOOMScore(t, child); got != 1000 {
			t.Errorf("what it forked at once: oom_score_adj %d, want 1000", got)
		}
		p.Signal(syscall.SIGKILL)
		waitState(t, p)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				p, err := s.Start(Spec{Path: "/bin/true", Args: []string{"true"}})
				if err != nil {
					t.Error(err)
					return
				}
				<-p.Done()
			}
		}()
	}
	wg.Wait()
	if got := readOOMScore(t, os.Getpid()); got != own {
		t.Errorf("the supervisor's own oom_score_adj changed from %d to %d", own, got)
	}

	if os.Geteuid() == 0 {
		q, err := s.Start(Spec{Path: "/bin/sleep", Args: []string{"sleep", "30"},
			Cred: &syscall.Credential{Uid: 65534, Gid: 65534}})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Signal(syscall.SIGKILL)
		if got := readOOMScore(t, q.Pid()); got != 1000 {
			t.Errorf("process of uid 65534: oom_score_adj %d, want 1000", got)
		}
	}
	if len(failures) > 0 {
		t.Errorf("scores not set: %v", failures)
	}
}

// TestChildOOMScoreSignals: a process started with a raised score
// behaves as any other: its exit status is its own, a signal reaches it.
func TestChildOOMScoreSignals(t *testing.T) {
	s := NewSupervisor(false)
	s.SetChildOOMScore(1000, nil)
	if st := waitState(t, sh(t, s, "exit 7")); st.Code != 7 {
		t.Errorf("exit 7: %v", st)
	}
	p := sh(t, s, "sleep 30")
	p.Signal(syscall.SIGTERM)
	if st := waitState(t, p); st.Signal != syscall.SIGTERM {
		t.Errorf("after SIGTERM: %v", st)
	}
}

// TestChildOOMScoreFailureIsReported: a score the kernel refuses (out of
// range) leaves the process running and is reported.
func TestChildOOMScoreFailureIsReported(t *testing.T) {
	s := NewSupervisor(false)
	var failed int
	s.SetChildOOMScore(5000, func(pid int, err error) { failed = pid })
	p, err := s.Start(Spec{Path: "/bin/sleep", Args: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Signal(syscall.SIGKILL)
	if failed != p.Pid() {
		t.Errorf("failure reported for pid %d, want %d", failed, p.Pid())
	}
	if p.Exited() {
		t.Error("the process did not survive a failed score")
	}
}

// TestStartUnderSignalFlood: root in a sandbox may signal every process
// of it, all the time (kill -URG -1 in a loop); starts must still all
// finish. (A child that stopped for its tracer before its exec, as an
// earlier way of setting the score made it, would have frozen every start
// for good.) The test runs itself again as PID 1 of a new PID namespace,
// so that kill -1 reaches only what it started there.
func TestStartUnderSignalFlood(t *testing.T) {
	if os.Getenv("OSB_SIGNAL_FLOOD_CHILD") == "1" {
		signalFloodChild(t)
		return
	}
	testenv.MustHaveRoot(t)
	unshare := testenv.MustHaveCommand(t, "unshare")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, unshare, "--pid", "--fork", "--kill-child", "--mount-proc",
		os.Args[0], "-test.run=^TestStartUnderSignalFlood$", "-test.v")
	cmd.Env = append(os.Environ(), "OSB_SIGNAL_FLOOD_CHILD=1")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("starts froze under a signal flood:\n%s", out)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("%v\n%s", err, out)
	}
}

func signalFloodChild(t *testing.T) {
	if os.Getpid() != 1 {
		t.Fatalf("not PID 1 of a namespace of its own (pid %d)", os.Getpid())
	}
	s := NewSupervisor(true)
	s.SetChildOOMScore(1000, nil)
	flood, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "while :; do kill -URG -1; kill -WINCH -1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Signal(syscall.SIGKILL)
	for i := range 300 {
		done := make(chan error, 1)
		go func() {
			p, err := s.Start(Spec{Path: "/bin/true", Args: []string{"true"}})
			if err == nil {
				<-p.Done()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("start %d: %v", i, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("start %d did not finish under the flood", i)
		}
	}
}
