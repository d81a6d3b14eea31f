package main

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/opensandbox/opensandbox/bench/internal/benchkit"
)

// baselineLabel marks the containers this harness starts itself, the
// baselines, so that those of a run that was killed are removed by the
// next.
const baselineLabel = "osb-perfbench=1"

// docker runs the docker CLI (see benchkit.Docker).
func docker(ctx context.Context, args ...string) (string, error) {
	return benchkit.Docker(ctx, 5*time.Minute, args...)
}

// baselineRun is the baseline's create: `docker run -d` of the same
// image, command and limits as the sandboxes.
func baselineRun(ctx context.Context, image string) (string, error) {
	return docker(ctx, "run", "-d", "--label", baselineLabel, "--cpus", "0.5", "--memory", "256m", image, "sleep", "infinity")
}

// baselineCreateToCommand is the baseline of create to first command:
// `docker run -d`, then `docker exec true`. It returns the container's
// ID even on failure, when there is one.
func baselineCreateToCommand(ctx context.Context, image string) (string, error) {
	id, err := baselineRun(ctx, image)
	if err != nil {
		return "", err
	}
	_, err = docker(ctx, "exec", id, "true")
	return id, err
}

// removeContainers removes the containers, eight at a time: the docker
// CLI removes the IDs it is given in parallel, and Debian's dockerd 20.10
// has been seen to deadlock in its network code when fifty containers
// exit at once. Empty IDs are skipped. A wedged engine costs at most two
// minutes a batch.
func removeContainers(ids []string) {
	ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == "" })
	for batch := range slices.Chunk(ids, 8) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		exec.CommandContext(ctx, "docker", append([]string{"rm", "-f"}, batch...)...).Run()
		cancel()
	}
}

// removeLabelled removes every container with the label (key=value).
func removeLabelled(label string) {
	if out, err := docker(context.Background(), "ps", "-aq", "--filter", "label="+label); err == nil {
		removeContainers(strings.Fields(out))
	}
}

// removeLeftovers removes the containers of earlier runs that were
// killed: the baselines, and those of servers of this harness.
func removeLeftovers() {
	removeLabelled(baselineLabel)
	out, err := docker(context.Background(), "ps", "-a", "--filter", "label=opensandbox.scope", "--format", `{{.ID}} {{.Label "opensandbox.scope"}}`)
	if err != nil {
		return
	}
	var ids []string
	for _, line := range strings.Split(out, "\n") {
		if id, scope, ok := strings.Cut(line, " "); ok && strings.HasPrefix(scope, scopePrefix) {
			ids = append(ids, id)
		}
	}
	removeContainers(ids)
}
