// Package benchkit holds what every benchmark harness needs beside its
// measures: the docker CLI and the median of timings.
package benchkit

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
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
