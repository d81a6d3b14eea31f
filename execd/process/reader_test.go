package process

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
)

// collect starts a Reader on r and returns a function that waits for it
// and returns what it read.
func collect(t *testing.T, r *os.File, idleAfter time.Duration, idle func()) (*Reader, func() string) {
	t.Helper()
	var mu sync.Mutex
	var buf bytes.Buffer
	rd := NewReader(r, func(b []byte) {
		mu.Lock()
		buf.Write(b)
		mu.Unlock()
	}, idleAfter, idle)
	done := make(chan error, 1)
	go func() { done <- rd.Run() }()
	return rd, func() string {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("reader did not stop")
		}
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

func TestReaderEOF(t *testing.T) {
	r, w, _ := os.Pipe()
	_, wait := collect(t, r, 0, nil)
	w.WriteString("hello")
	w.Close()
	if got := wait(); got != "hello" {
		t.Fatalf("read %q", got)
	}
}

// TestReaderFinishWithLeftoverWriter is the case of a command that exits
// while a background child still holds its stdout: Finish must return
// everything written so far, at once, without waiting for EOF.
func TestReaderFinishWithLeftoverWriter(t *testing.T) {
	s := NewSupervisor(false)
	r, w, _ := os.Pipe()
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "sleep 30 & echo last words"}, Stdout: w})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer p.Signal(9)
	rd, wait := collect(t, r, 0, nil)
	<-p.Done()
	start := time.Now()
	rd.Finish()
	if got := wait(); got != "last words\n" {
		t.Fatalf("read %q", got)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Finish took %v", d)
	}
}

func TestReaderFinishDrainsLargeBacklog(t *testing.T) {
	r, w, _ := os.Pipe()
	data := bytes.Repeat([]byte("0123456789abcdef"), 4000) // below the 64 KiB pipe buffer
	w.Write(data)
	rd, wait := collect(t, r, 0, nil)
	rd.Finish()
	if got := wait(); got != string(data) {
		t.Fatalf("read %d bytes, want %d", len(got), len(data))
	}
	w.Close()
}

func TestReaderSync(t *testing.T) {
	r, w, _ := os.Pipe()
	defer w.Close()
	var mu sync.Mutex
	var buf bytes.Buffer
	rd := NewReader(r, func(b []byte) {
		mu.Lock()
		buf.Write(b)
		mu.Unlock()
	}, 0, nil)
	go rd.Run()
	for i := 0; i < 200; i++ {
		w.WriteString("x")
		rd.Sync()
		mu.Lock()
		n := buf.Len()
		mu.Unlock()
		if n != i+1 {
			t.Fatalf("after Sync %d: %d bytes read", i, n)
		}
	}
	rd.Finish()
	<-rd.Done()
}

func TestReaderIdle(t *testing.T) {
	r, w, _ := os.Pipe()
	idle := make(chan struct{}, 10)
	_, wait := collect(t, r, 30*time.Millisecond, func() { idle <- struct{}{} })
	w.WriteString("prompt> ")
	select {
	case <-idle:
	case <-time.After(5 * time.Second):
		t.Fatal("no idle callback after output paused")
	}
	select {
	case <-idle:
		t.Fatal("second idle callback without new output")
	case <-time.After(100 * time.Millisecond):
	}
	w.Close()
	wait()
}

// TestReaderKeepsPipeOpenAfterFinish: a background job of a command that
// has exited keeps writing to the pipe; it must not get SIGPIPE, and what
// it writes reaches the tail.
func TestReaderKeepsPipeOpenAfterFinish(t *testing.T) {
	s := NewSupervisor(false)
	dir := t.TempDir()
	r, w, _ := os.Pipe()
	p, err := s.Start(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "(sleep 0.2; echo late; touch " + dir + "/alive) & echo early"}, Stdout: w})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	tail := make(chan string, 4)
	rd, wait := collect(t, r, 0, nil)
	rd.Tail = func(b []byte) { tail <- string(b) }
	<-p.Done()
	rd.Finish()
	if got := wait(); got != "early\n" {
		t.Fatalf("before the exit: %q", got)
	}
	select {
	case got := <-tail:
		if got != "late\n" {
			t.Fatalf("tail %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the background job's output never reached the tail")
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(dir + "/alive"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background job died after its write")
		}
	}
}
