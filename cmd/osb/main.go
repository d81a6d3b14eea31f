// Command osb is the OpenSandbox command line: see package cli, or run
// osb --help.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/opensandbox/opensandbox/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
