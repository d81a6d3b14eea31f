// Package benchkit holds what every benchmark harness needs beside its
// measures: its mode, an interruptible context, the docker CLI and the
// median of timings.
package benchkit

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Docker runs the docker CLI within timeout (and ctx) and returns its
// output, trimmed; a failure carries the output.
func Docker(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// Median is the middle of ds (the upper one of an even count); ds is
// left as it was.
func Median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// Mode returns the settings of the mode named on the command line, or
// exits with status 2 naming the harness and the modes it knows.
func Mode[S any](harness, mode string, modes map[string]S) S {
	set, ok := modes[mode]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown mode %q (known: %s)\n", harness, mode, strings.Join(slices.Sorted(maps.Keys(modes)), ", "))
		os.Exit(2)
	}
	return set
}

// Interruptible returns a context that ends on the first Ctrl-C or
// SIGTERM, so the harness can clean up; a second one kills it at once.
func Interruptible() context.Context {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		cancel() // restores the default handling: the next signal kills
	}()
	return ctx
}
