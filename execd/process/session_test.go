package process

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSignalSession(t *testing.T) {
	s := NewSupervisor(false)
	r, w, _ := os.Pipe()
	// With job control on, the background job gets a process group of its
	// own, out of reach of a signal to the shell's group.
	p, err := s.Start(Spec{Path: "/bin/bash", Args: []string{"bash", "-c", "set -m; sleep 100 & echo $!; wait"}, Stdout: w, Setsid: true})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	job, _ := strconv.Atoi(strings.TrimSpace(line))
	if sid, _ := sessionOf(job); sid != p.Pid() {
		t.Fatalf("job %d is in session %d, want %d", job, sid, p.Pid())
	}
	p.Signal(syscall.SIGKILL) // the shell's group only
	<-p.Done()
	if !alive(job) {
		t.Fatal("the job died with its shell's group; the test proves nothing")
	}
	if n := SignalSession(p.Pid(), syscall.SIGKILL); n != 1 {
		t.Fatalf("signalled %d processes, want 1", n)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(job); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("job %d survived", job)
		}
	}
}
