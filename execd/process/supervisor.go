package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Supervisor starts processes and collects their exit status.
//
// In reap-all mode (execd as PID 1 or as a child subreaper) it reaps every
// child that exits, its own and orphans reparented to it, from one SIGCHLD
// loop, and hands each status to the Process that waits for it. Forks and
// the reaping loop are mutually excluded, so a child can never be reaped
// before its Process is registered. In the other mode each Process waits
// for its own pid only, which leaves the rest of the program's children
// alone (tests run that way in-process).
type Supervisor struct {
	reapAll bool

	// forkMu is held for reading across fork+register and for writing while
	// reaping, so the reaper never sees a pid that is not registered yet.
	forkMu sync.RWMutex
	// forks bounds the forks under way. A fork blocks its OS thread until
	// the child has exec'd, and the Go runtime keeps every thread it ever
	// made: 200 commands started at once would leave 200 idle threads.
	forks chan struct{}

	mu      sync.Mutex
	waiting map[int]*Process
	live    map[*Process]struct{}

	// orphans counts reaped children that no Process waited for.
	orphans int64

	// childOOM is the oom_score_adj every started process gets, unless
	// raiseOOM is false; oomError hears of a score that could not be set.
	// Both are set before the first Start.
	raiseOOM bool
	childOOM int
	oomError func(pid int, err error)
	// ownOOM is this process's own score, which it goes back to after
	// each fork; oomMu makes each fork's raise and return one step.
	ownOOM int
	oomMu  sync.Mutex
}

// NewSupervisor returns a supervisor. With reapAll set it installs a SIGCHLD
// handler and reaps every child of this process; only a program that owns
// all of its children (execd's main) may set it.
func NewSupervisor(reapAll bool) *Supervisor {
	closeInheritedOnExec()
	s := &Supervisor{
		reapAll: reapAll,
		forks:   make(chan struct{}, max(2, runtime.GOMAXPROCS(0))),
		waiting: make(map[int]*Process),
		live:    make(map[*Process]struct{}),
	}
	if reapAll {
		ch := make(chan os.Signal, 16)
		signal.Notify(ch, syscall.SIGCHLD)
		go func() {
			s.reap()
			for range ch {
				s.reap()
			}
		}()
	}
	return s
}

// closeInheritedOnExec marks every descriptor above stderr close-on-exec.
// Whatever this process inherited from its own parent (a CI runner's pipe,
// a terminal's extra descriptors) would otherwise leak into every process
// it starts; its own descriptors are close-on-exec already.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

// reap collects every exited child without blocking.
func (s *Supervisor) reap() {
	s.forkMu.Lock()
	defer s.forkMu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		s.mu.Lock()
		p := s.waiting[pid]
		delete(s.waiting, pid)
		if p == nil {
			s.orphans++
		}
		s.mu.Unlock()
		if p != nil {
			p.finish(ws)
		}
	}
}

// SetChildOOMScore makes every process the supervisor starts get adj
// (-1000 to 1000) as its oom_score_adj before it runs any instruction of
// its program, so that the kernel's OOM killer takes the processes execd
// started, and whatever they start, before execd itself. onError, when not
// nil, hears of a process whose score could not be set; the process runs
// anyway. Call it before the first Start.
//
// A child inherits its parent's score when it is forked. So for the
// moment of each fork the supervisor raises its own score to adj, and
// goes back to its own right after: raising a score needs no privilege,
// nor does going back to one the process held. (The process's score is
// shared by all its threads, so forks take turns for that moment.) Should
// the raise fail, the child's score is written right after its exec
// instead, and a program that forks at once may leave children at the
// supervisor's score; that gives them nothing a process could not take
// itself, by lowering its own score back to the minimum it inherited,
// which is the supervisor's.
func (s *Supervisor) SetChildOOMScore(adj int, onError func(pid int, err error)) {
	own, err := ReadOOMScore(0)
	if err != nil && onError != nil {
		onError(os.Getpid(), err)
	}
	s.raiseOOM, s.childOOM, s.oomError, s.ownOOM = err == nil, adj, onError, own
}

// forkExec starts a process, giving it the child OOM score when one is
// set (see SetChildOOMScore).
func (s *Supervisor) forkExec(path string, args []string, attr *syscall.ProcAttr) (pid int, oomErr, err error) {
	if !s.raiseOOM {
		pid, err = syscall.ForkExec(path, args, attr)
		return pid, nil, err
	}
	s.oomMu.Lock()
	raised := setOOMScore(os.Getpid(), s.childOOM)
	pid, err = syscall.ForkExec(path, args, attr)
	if raised == nil {
		if back := setOOMScore(os.Getpid(), s.ownOOM); back != nil {
			oomErr = fmt.Errorf("go back to its own oom_score_adj %d after a fork: %w", s.ownOOM, back)
		}
	}
	s.oomMu.Unlock()
	if err == nil && raised != nil {
		// The child has the supervisor's score: set its own now.
		oomErr = errors.Join(raised, setOOMScore(pid, s.childOOM))
	}
	return pid, oomErr, err
}

// setOOMScore writes adj to /proc/pid/oom_score_adj. A process that has
// exited already is not an error.
func setOOMScore(pid, adj int) error {
	path := "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
	fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err == nil {
		_, err = syscall.Write(fd, []byte(strconv.Itoa(adj)))
		syscall.Close(fd)
	}
	if err == nil || err == syscall.ESRCH || err == syscall.ENOENT {
		return nil
	}
	return &os.PathError{Op: "set oom_score_adj", Path: path, Err: err}
}

// ReadOOMScore returns the oom_score_adj of process pid (0: this process).
func ReadOOMScore(pid int) (int, error) {
	path := "/proc/self/oom_score_adj"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/oom_score_adj"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// Orphans returns how many children were reaped that no Process waited
// for: orphaned grandchildren reparented to execd.
func (s *Supervisor) Orphans() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.orphans
}

// Spec describes a process to start.
type Spec struct {
	// Path is the executable; Args is the full argv, Args[0] included.
	Path string
	Args []string
	Dir  string
	Env  []string
	// Cred, when set, runs the process as that user.
	Cred *syscall.Credential
	// Stdin, Stdout and Stderr are the child's standard files; nil means
	// /dev/null. The caller closes its copies after Start.
	Stdin, Stdout, Stderr *os.File
	// ExtraFiles become the child's descriptors 3, 4, ...
	ExtraFiles []*os.File
	// Setsid starts a new session instead of a new process group, with
	// Stdin as its controlling terminal when Ctty is set.
	Setsid bool
	Ctty   bool
}

// Process is a started process, the leader of its own process group.
type Process struct {
	pid  int
	sup  *Supervisor
	done chan struct{}

	// state is written once, before done is closed.
	state ExitState
}

// Start forks and executes spec. The process leads a new process group (or
// session), so Signal reaches everything it starts.
func (s *Supervisor) Start(spec Spec) (*Process, error) {
	var devnull *os.File
	files := append([]*os.File{spec.Stdin, spec.Stdout, spec.Stderr}, spec.ExtraFiles...)
	for i, f := range files {
		if f != nil {
			continue
		}
		if devnull == nil {
			var err error
			if devnull, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
				return nil, err
			}
			defer devnull.Close()
		}
		files[i] = devnull
	}
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	attr := &syscall.ProcAttr{
		Dir:   spec.Dir,
		Env:   spec.Env,
		Files: fds,
		Sys: &syscall.SysProcAttr{
			Setpgid:    !spec.Setsid,
			Setsid:     spec.Setsid,
			Setctty:    spec.Setsid && spec.Ctty,
			Ctty:       0,
			Credential: spec.Cred,
		},
	}
	p := &Process{sup: s, done: make(chan struct{})}

	s.forks <- struct{}{}
	s.forkMu.RLock()
	pid, oomErr, err := s.forkExec(spec.Path, spec.Args, attr)
	if err == nil {
		p.pid = pid
		s.mu.Lock()
		s.waiting[pid] = p
		s.live[p] = struct{}{}
		s.mu.Unlock()
	}
	s.forkMu.RUnlock()
	<-s.forks
	runtime.KeepAlive(files) // their descriptors were used by number
	if err != nil {
		return nil, &os.PathError{Op: "exec", Path: spec.Path, Err: err}
	}
	if oomErr != nil && s.oomError != nil {
		s.oomError(pid, oomErr)
	}
	if !s.reapAll {
		go p.waitOwn()
	}
	return p, nil
}

// waitOwn waits for p's pid alone (not reap-all mode).
func (p *Process) waitOwn() {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(p.pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			// Someone else reaped it; the status is unknown.
			ws = syscall.WaitStatus(0xff << 8)
		}
		break
	}
	p.sup.mu.Lock()
	delete(p.sup.waiting, p.pid)
	p.sup.mu.Unlock()
	p.finish(ws)
}

func (p *Process) finish(ws syscall.WaitStatus) {
	st := ExitState{Code: ws.ExitStatus()}
	if ws.Signaled() {
		st.Code = -1
		st.Signal = ws.Signal()
		st.CoreDump = ws.CoreDump()
	}
	p.state = st
	p.sup.mu.Lock()
	delete(p.sup.live, p)
	p.sup.mu.Unlock()
	close(p.done)
}

// Pid returns the process id, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Done is closed when the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// State returns the exit state. It is only meaningful after Done.
func (p *Process) State() ExitState {
	<-p.done
	return p.state
}

// Wait waits for the process to exit or ctx to end.
func (p *Process) Wait(ctx context.Context) (ExitState, error) {
	select {
	case <-p.done:
		return p.state, nil
	case <-ctx.Done():
		return ExitState{}, ctx.Err()
	}
}

// Signal sends sig to the process's whole group. Signalling a group whose
// members have all gone is not an error.
func (p *Process) Signal(sig syscall.Signal) error { return SignalGroup(p.pid, sig) }

// SignalGroup sends sig to the process group pgid. A group with no members
// left is not an error.
func SignalGroup(pgid int, sig syscall.Signal) error {
	err := syscall.Kill(-pgid, sig)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}

// Stop asks the group to end with SIGTERM, and SIGKILLs it if the leader
// has not exited after grace. It returns when the leader has exited.
func (p *Process) Stop(grace time.Duration) {
	if p.Exited() {
		p.Signal(syscall.SIGKILL) // leftovers of the group, if any
		return
	}
	p.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Live returns the processes started and not yet exited.
func (s *Supervisor) Live() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps := make([]*Process, 0, len(s.live))
	for p := range s.live {
		ps = append(ps, p)
	}
	return ps
}

// ExitState is how a process ended.
type ExitState struct {
	// Code is the exit status, or -1 when a signal killed the process.
	Code     int
	Signal   syscall.Signal
	CoreDump bool
}

// String describes the state the way Go's os.ProcessState does, which is
// what OpenSandbox clients show: "exit status 3", "signal: killed".
func (s ExitState) String() string {
	if s.Code == -1 && s.Signal != 0 {
		str := "signal: " + s.Signal.String()
		if s.CoreDump {
			str += " (core dumped)"
		}
		return str
	}
	return "exit status " + strconv.Itoa(s.Code)
}

// Success reports a zero exit status.
func (s ExitState) Success() bool { return s.Code == 0 }
