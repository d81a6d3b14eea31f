// Command opensandbox-server is the OpenSandbox lifecycle server: it
// creates sandboxes on a runtime (Docker) and serves the lifecycle API
// that the OpenSandbox SDKs and CLI speak.
//
//	opensandbox-server [--config PATH]             serve
//	opensandbox-server init-config PATH --example docker
//	opensandbox-server init-config PATH --from OLD.toml   convert the existing server's format
//	opensandbox-server gen-key
//	opensandbox-server gen-signing-key [--id a]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/ingress"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "opensandbox-server:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	m := &Main{}
	root := &cobra.Command{
		Use:   "opensandbox-server",
		Short: "The OpenSandbox lifecycle server",
		Long: `opensandbox-server creates sandboxes on a Docker engine and serves the
OpenSandbox lifecycle API (/v1) to the SDKs and the CLI.

The configuration is read from --config, else $SANDBOX_CONFIG_PATH, else
~/.sandbox.toml; write one with "opensandbox-server init-config".`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := m.Load(); err != nil {
				return err
			}
			return m.Run(cmd.Context())
		},
	}
	root.Flags().StringVar(&m.ConfigPath, "config", "", "configuration file (default $SANDBOX_CONFIG_PATH, else ~/.sandbox.toml)")
	root.Flags().BoolVar(&m.Insecure, "insecure", false, "accept requests without an API key (local experiments only)")
	root.Flags().StringVar(&m.Listen, "listen", "", "address to listen on, overriding server.listen")

	var example string
	var force bool
	var from string
	initConfig := &cobra.Command{
		Use:   "init-config PATH",
		Short: "Write a commented configuration that starts as is, with a fresh API key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != "" {
				notes, err := writeConverted(args[0], from, force)
				if err != nil {
					return err
				}
				for _, n := range notes {
					fmt.Fprintln(cmd.OutOrStdout(), "note:", n)
				}
			} else if err := writeExample(args[0], example, force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (its API key is in server.api_key)\nstart the server with: opensandbox-server --config %s\n", args[0], args[0])
			return nil
		},
	}
	initConfig.Flags().StringVar(&example, "example", "docker", "which example: docker or kubernetes")
	initConfig.Flags().StringVar(&from, "from", "", "convert this configuration of the existing OpenSandbox server (its ~/.sandbox.toml) instead of writing an example")
	initConfig.MarkFlagsMutuallyExclusive("from", "example")
	initConfig.Flags().BoolVar(&force, "force", false, "overwrite an existing file")

	genKeyCmd := &cobra.Command{
		Use:   "gen-key",
		Short: "Print a new random API key",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			fmt.Fprintln(cmd.OutOrStdout(), genKey())
		},
	}
	var keyID string
	genSigningKeyCmd := &cobra.Command{
		Use:   "gen-signing-key",
		Short: "Print a new ingress signing key (ID:BASE64) for [ingress] signing_keys",
		Long: `gen-signing-key prints a new key for the ingress gateway's access tokens
and signed links, in the "ID:BASE64" form [ingress] signing_keys and
osb-ingress take. The first key of the list signs and every key verifies:
to rotate, put a new key (with another id) first, and remove the old one
once the links it signed have expired.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(keyID) != 1 {
				return fmt.Errorf("--id %q: a key id is one character, 0-9 or a-z", keyID)
			}
			k, err := ingress.GenerateKey(keyID[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k)
			return nil
		},
	}
	genSigningKeyCmd.Flags().StringVar(&keyID, "id", "a", "the key's id: one character, 0-9 or a-z")
	versionCmd := &cobra.Command{
		Use:   "version",
		Short: "Print the server's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "opensandbox-server", version)
		},
	}
	root.AddCommand(initConfig, genKeyCmd, genSigningKeyCmd, versionCmd)
	return root
}
