// Command osb is the OpenSandbox command line: see package cli, or run
// osb --help. `osb mcp` serves package mcp's tools.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/opensandbox/opensandbox/cli"
	"github.com/opensandbox/opensandbox/mcp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, ServeMCP: serveMCP})
	stop()
	os.Exit(code)
}

// serveMCP runs the MCP server for `osb mcp`, on stdio or on the
// listener osb opened.
func serveMCP(ctx context.Context, o cli.MCPOptions) error {
	level := slog.LevelWarn
	if o.Verbose {
		level = slog.LevelDebug
	}
	var creds map[string]mcp.VaultCredential
	for name, value := range o.VaultCredentials {
		if creds == nil {
			creds = make(map[string]mcp.VaultCredential, len(o.VaultCredentials))
		}
		creds[name] = mcp.VaultCredential{Value: value, Hosts: o.VaultHosts[name]}
	}
	s, err := mcp.New(mcp.Config{
		Client:           o.Client,
		DefaultImage:     o.DefaultImage,
		DefaultTimeout:   o.DefaultTimeout,
		VaultCredentials: creds,
		Version:          o.Version,
		Logger:           slog.New(slog.NewTextHandler(o.Err, &slog.HandlerOptions{Level: level})),
	})
	if err != nil {
		return err
	}
	if o.Listener == nil {
		return s.ServeStdio(ctx, o.In, o.Out)
	}
	return s.ServeStreamable(ctx, o.Listener, o.Token)
}
