package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// supervise runs the worker and starts it again whenever it exits, until
// SIGTERM or SIGINT, which it passes on; then it returns the worker's exit
// code. The worker starts no processes of its own, and nothing else runs
// in the egress container, so there are no orphans to reap.
func supervise(self string) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	backoff := 50 * time.Millisecond
	for {
		cmd := exec.Command(self, "worker")
		if _, err := os.Stat("/proc/self/exe"); err == nil {
			cmd.Path = "/proc/self/exe"
		}
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "osb-egress: start the worker:", err)
			time.Sleep(time.Second)
			continue
		}
		started := time.Now()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-sigs:
			cmd.Process.Signal(syscall.SIGTERM)
			<-done
			return cmd.ProcessState.ExitCode()
		case <-done:
		}
		if time.Since(started) > 10*time.Second {
			backoff = 50 * time.Millisecond
		}
		fmt.Fprintf(os.Stderr, "osb-egress: the worker exited (%v); starting it again in %v\n", cmd.ProcessState, backoff)
		select {
		case <-sigs:
			return 1
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}
