// Command osb-egress enforces the outbound policy of one sandbox. It runs
// in the sandbox's network namespace with CAP_NET_ADMIN (the sandbox's own
// processes never have it) and serves the egress API on port 18080:
//
//	osb-egress            supervise: run the worker, start it again if it dies
//	osb-egress worker     program the firewall, serve DNS, the proxy and the API
//	osb-egress --version
//
// The supervisor is the container's PID 1: it reaps orphans, forwards
// SIGTERM and SIGINT, and restarts a worker that exits or is killed. The
// namespace's rules live in the kernel, so while a worker restarts the
// sandbox stays filtered: redirected connections find nothing listening
// and fail. The worker reads its settings from the environment (egress.md
// §6, and OPENSANDBOX_EGRESS_DNS_UPSTREAMS, OPENSANDBOX_EGRESS_ALWAYS_DENY,
// OPENSANDBOX_EGRESS_ALWAYS_ALLOW), and the policy in force from its
// policy file when there is one.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	args := os.Args[1:]
	switch {
	case len(args) == 1 && (args[0] == "--version" || args[0] == "-version"):
		fmt.Println("osb-egress", version)
		return
	case len(args) == 1 && args[0] == "worker":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		cfg, err := configFromEnv(os.Getenv)
		if err == nil {
			err = run(ctx, cfg)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "osb-egress:", err)
			os.Exit(1)
		}
	case len(args) == 0:
		os.Exit(supervise(os.Args[0]))
	default:
		fmt.Fprintln(os.Stderr, "usage: osb-egress [worker | --version]")
		os.Exit(2)
	}
}
