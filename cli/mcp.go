package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/sdk"
)

// EnvMCPToken is the environment variable holding the bearer token of
// `osb mcp --http`.
const EnvMCPToken = "OSB_MCP_TOKEN"

// MCPOptions is what `osb mcp` hands the MCP server: a client for the
// resolved connection, the sandbox defaults of the configuration, and
// where to serve.
type MCPOptions struct {
	// Client reaches the OpenSandbox server.
	Client *sdk.Client
	// DefaultImage and DefaultTimeout come from --image and --timeout,
	// else [defaults] of the configuration file. DefaultTimeout is zero
	// when unset and sdk.NoTimeout for "none".
	DefaultImage   string
	DefaultTimeout time.Duration
	// VaultCredentials are the secrets, by name, that the vault tools may
	// attach to sandboxes, read at start from --vault-credential
	// NAME=env:VAR or NAME=file:PATH. VaultHosts limits, by name, the
	// hosts a credential may be attached to (--vault-credential-hosts).
	VaultCredentials map[string]string
	VaultHosts       map[string][]string
	// Listener is where to serve streamable HTTP; nil means stdio on In
	// and Out.
	Listener net.Listener
	// Token is the bearer token HTTP clients must send; empty only with
	// --insecure.
	Token string
	// In and Out carry the protocol in stdio mode; Err is for people.
	In      io.Reader
	Out     io.Writer
	Err     io.Writer
	Verbose bool
	// Version is osb's version, reported to MCP clients.
	Version string
}

// ServeMCPFunc serves MCP until ctx is done or, on stdio, the client
// leaves.
type ServeMCPFunc func(ctx context.Context, opts MCPOptions) error

func (a *app) mcpCommand() *cobra.Command {
	var httpAddr, token, image, timeout string
	var vaultCreds, vaultHosts []string
	var insecure bool
	cmd := &cobra.Command{
		Use:   "mcp [--http ADDR]",
		Short: "Serve sandboxes as Model Context Protocol tools for AI agents",
		Long: `Serve the Model Context Protocol, so that an agent in any MCP client (Claude,
OpenAI Agents, Cursor, VS Code...) can create sandboxes, run commands and code,
and read and write files in them, with no code of its own.

By default osb mcp speaks MCP on stdin and stdout, as MCP clients expect of a
command they launch. With --http ADDR it serves streamable HTTP at
http://ADDR/mcp instead; every request must then carry
"Authorization: Bearer TOKEN". The token is --token, else $OSB_MCP_TOKEN, else
a random one printed on stderr at start. --insecure serves without a token
(only for a loopback address on a machine of your own).

The server, API key and defaults come from the same flags, environment and
~/.opensandbox/config.toml as every osb command: [defaults] image is the image
sandbox_create uses when the agent names none, [defaults] timeout its lifetime.
With --vault-credential NAME=env:VAR (or NAME=file:PATH), repeatable, the
agent can attach the credential NAME to a sandbox's outbound requests with
vault_attach, by name: the value is read once at start, held in memory and
sent only to the sandbox's credential vault; no tool ever returns it. Limit
where each may go with --vault-credential-hosts NAME=HOST[,HOST...]; without
it an agent that can widen the egress policy can send the credential to any
host.

See docs/mcp.md for the tools and how to register osb mcp with MCP clients.`,
		Example: `  osb mcp                                  # stdio, for a client that launches it
  claude mcp add opensandbox -- osb mcp --image opensandbox/code-interpreter
  OSB_MCP_TOKEN=$(openssl rand -hex 32) osb mcp --http 127.0.0.1:8765
  osb mcp --vault-credential github=env:GITHUB_TOKEN --vault-credential-hosts github=api.github.com`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if a.ServeMCP == nil {
				return fmt.Errorf("this osb was built without the MCP server")
			}
			if httpAddr == "" && (insecure || flagChanged(cmd.Flags(), "token")) {
				return usagef(cmd, "--token and --insecure go with --http")
			}
			opts := MCPOptions{In: a.In, Out: a.Out, Err: a.Err, Verbose: a.verbose, Version: clientVersion(),
				DefaultImage: first(image, a.set.DefaultImage)}
			if lifetime := first(timeout, a.set.DefaultTimeout); lifetime != "" {
				d, none, err := parseLifetime(lifetime)
				if err != nil {
					return usagef(cmd, "--timeout: %v", err)
				}
				opts.DefaultTimeout = d
				if none {
					opts.DefaultTimeout = sdk.NoTimeout
				}
			}
			creds, err := a.credentials(cmd, "--vault-credential", vaultCreds)
			if err != nil {
				return err
			}
			if len(creds) > 0 {
				opts.VaultCredentials = make(map[string]string, len(creds))
			}
			for _, c := range creds {
				if _, dup := opts.VaultCredentials[c.Name]; dup {
					return usagef(cmd, "--vault-credential %s is given twice", c.Name)
				}
				opts.VaultCredentials[c.Name] = c.Source.Value
			}
			if opts.VaultHosts, err = parseVaultHosts(cmd, vaultHosts, opts.VaultCredentials); err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			opts.Client = c
			// Serve anyway: the server may come up later, and each tool
			// call says so while it is down.
			hctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
			if _, err := c.Health(hctx); err != nil {
				fmt.Fprintf(a.Err, "osb mcp: warning: the OpenSandbox server does not answer (%v); tools will fail until it does\n", oneLine(err.Error()))
			}
			cancel()
			if httpAddr != "" {
				opts.Token = first(token, strings.TrimSpace(a.Getenv(EnvMCPToken)))
				if insecure {
					if opts.Token != "" {
						return usagef(cmd, "--insecure serves without a token, yet a token was given (--token or %s)", EnvMCPToken)
					}
				} else if opts.Token == "" {
					opts.Token = newToken()
					fmt.Fprintf(a.Err, "osb mcp: no --token or %s given; clients must send this one:\n  Authorization: Bearer %s\n", EnvMCPToken, opts.Token)
				}
				ln, err := net.Listen("tcp", httpAddr)
				if err != nil {
					return fmt.Errorf("listen on %s: %w", httpAddr, err)
				}
				defer ln.Close()
				opts.Listener = ln
				if !isLoopback(ln.Addr()) {
					fmt.Fprintf(a.Err, "osb mcp: warning: %s is reachable from other machines; anyone with the token controls your sandboxes\n", ln.Addr())
				}
				if insecure {
					fmt.Fprintln(a.Err, "osb mcp: warning: --insecure: any client that reaches this address controls your sandboxes")
				}
				fmt.Fprintf(a.Err, "osb mcp: serving MCP on http://%s/mcp\n", ln.Addr())
			}
			return a.ServeMCP(cmd.Context(), opts)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&httpAddr, "http", "", "serve streamable HTTP on ADDR (such as 127.0.0.1:8765) instead of stdio")
	fl.StringVar(&token, "token", "", "bearer token HTTP clients must send (env "+EnvMCPToken+"; default: a random one, printed)")
	fl.BoolVar(&insecure, "insecure", false, "serve HTTP without a token")
	fl.StringVarP(&image, "image", "i", "", "image of sandbox_create when the agent names none (default: defaults.image of the config)")
	fl.StringArrayVar(&vaultCreds, "vault-credential", nil, "a credential NAME=env:VAR or NAME=file:PATH the agent may attach to sandboxes by name, never seeing it (repeatable)")
	fl.StringArrayVar(&vaultHosts, "vault-credential-hosts", nil, "NAME=HOST[,HOST...]: the only hosts credential NAME may be attached to, names or *.suffix (repeatable)")
	fl.StringVarP(&timeout, "timeout", "t", "", "lifetime of sandboxes the agent creates without one, such as 30m, or none (default: defaults.timeout, else 10m)")
	return cmd
}

// parseVaultHosts reads --vault-credential-hosts NAME=HOST[,HOST...]
// for credentials of creds.
func parseVaultHosts(cmd *cobra.Command, specs []string, creds map[string]string) (map[string][]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := map[string][]string{}
	for _, s := range specs {
		name, list, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.TrimSpace(list) == "" {
			return nil, usagef(cmd, "invalid --vault-credential-hosts %q: want NAME=HOST[,HOST...]", s)
		}
		if _, known := creds[name]; !known {
			return nil, usagef(cmd, "--vault-credential-hosts %s: no --vault-credential %s", name, name)
		}
		for _, h := range strings.Split(list, ",") {
			if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
				out[name] = append(out[name], h)
			}
		}
	}
	return out, nil
}

// newToken returns 32 random bytes in hex.
func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// isLoopback reports whether addr is only reachable from this machine.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
