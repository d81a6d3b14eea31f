package execd

import (
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
)

// Threads. The Go runtime starts a new OS thread whenever a goroutine
// blocks in a system call and no idle thread is left, and it aborts the
// whole program ("failed to create new OS thread") when the kernel refuses
// one: which is what it does once the sandbox's processes have used up its
// pids limit, a fork bomb's doing, since every thread counts as a process.
// execd therefore makes every thread it can need at start, while pids are
// free (the runtime keeps idle threads for ever), and bounds what can hold
// a thread in a system call at once: forks (the process supervisor allows
// max(2, GOMAXPROCS) at a time), file-system requests (fileOps) and log
// writes (spoolWriters). Everything else blocks in the network poller,
// which holds no thread.

// fileOps bounds the file-system requests served at once (files,
// directories, archives, command logs); more wait for a turn. Each turn
// is a thread every sandbox keeps, and threads are processes to the
// host: at 32 turns, 500 sandboxes took 26,000 of the 32,768 pids a
// Linux host has by default, and creates failed.

const fileOps = 8

// ThreadsNeeded returns the most OS threads execd needs: one per
// processor running Go code, the bounded blocking calls above, and a few
// of the runtime's own (the system monitor, the signal handler, the
// template thread) with room to spare.
func ThreadsNeeded() int {
	procs := runtime.GOMAXPROCS(0)
	return procs + max(2, procs) + fileOps + spoolWriters + 4
}

// ReserveThreads has the runtime make OS threads until it has at least n,
// and returns how many the process has. n goroutines each lock themselves
// to a thread at the same time, so that n threads must exist (idle ones
// are taken first, then new ones made); then they unlock and end, leaving
// the threads idle in the runtime's pool, from which it takes a thread
// before it makes one.
func ReserveThreads(n int) int {
	release := make(chan struct{})
	var locked, ended sync.WaitGroup
	locked.Add(n)
	ended.Add(n)
	for range n {
		go func() {
			defer ended.Done()
			// A goroutine locked to its thread keeps it while it waits,
			// so the next one needs another.
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
	ended.Wait()
	return osThreads()
}

// osThreads returns the threads of this process as the kernel counts
// them, or as the runtime does where /proc cannot say.
func osThreads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					return n
				}
			}
		}
	}
	return pprof.Lookup("threadcreate").Count()
}

// gated serves h when one of the fileOps turns is free, waiting for one
// while the client is still there.
func (s *Server) gated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.takeFileOp(r) {
			return
		}
		defer s.releaseFileOp()
		h.ServeHTTP(w, r)
	})
}

// takeFileOp waits for a fileOps turn; false when the client left first.
func (s *Server) takeFileOp(r *http.Request) bool {
	select {
	case s.fileOps <- struct{}{}:
		return true
	case <-r.Context().Done():
		return false
	}
}

func (s *Server) releaseFileOp() { <-s.fileOps }
