// Package cli is the osb command: sandboxes, commands, files, terminals
// and copies from a shell, for people and for scripts. It talks to
// servers only through package sdk. cmd/osb runs it.
//
// Exit codes: 0 success; 1 a failure (the server's or the sandbox's
// error, a bad value, a missing file); 2 a usage error (unknown command
// or flag, missing argument). `osb command run` and `osb shell` exit with
// the remote process's exit code instead.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/opensandbox/opensandbox/sdk"
)

// Version is osb's version, set at build time with
// -ldflags "-X github.com/opensandbox/opensandbox/cli.Version=..." (make
// build stamps `git describe`). Left "dev", osb reports the commit it was
// built from instead (see clientVersion).
var Version = "dev"

// Streams are the standard streams and environment the command uses,
// and the parts of osb that cmd/osb plugs in.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
	// Getenv reads the environment; default os.Getenv.
	Getenv func(string) string
	// ServeMCP serves `osb mcp`. cmd/osb sets it to package mcp's server,
	// so that package cli, a user of the SDK, does not depend on it; nil
	// makes `osb mcp` fail with a message.
	ServeMCP ServeMCPFunc
}

// app is one run of osb: its streams, its resolved settings and the
// client built from them.
type app struct {
	Streams
	global  globalFlags
	set     settings
	client  *sdk.Client
	verbose bool
}

// globalFlags are the flags every command takes.
type globalFlags struct {
	apiKey         string
	domain         string
	protocol       string
	requestTimeout string
	useProxy       bool
	noUseProxy     bool
	configPath     string
	noColor        bool
	output         string
}

// Run runs osb with args (without the program name) and returns the exit
// code.
func Run(ctx context.Context, args []string, s Streams) int {
	if s.Getenv == nil {
		s.Getenv = os.Getenv
	}
	if s.In == nil {
		s.In = os.Stdin
	}
	a := &app{Streams: s}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(s.In)
	root.SetOut(s.Out)
	root.SetErr(s.Err)
	err := root.ExecuteContext(ctx)
	if a.client != nil {
		a.client.Close()
	}
	return a.exit(err)
}

// exit prints err on one line and returns the exit code it calls for.
func (a *app) exit(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			a.errorLine(ee.msg)
		}
		return ee.code
	}
	code := 1
	var ue *usageError
	if errors.As(err, &ue) {
		code = 2
	}
	if errors.Is(err, context.Canceled) {
		a.errorLine("interrupted")
		return 130
	}
	a.errorLine(oneLine(err.Error()))
	if code == 2 && ue.cmd != "" {
		fmt.Fprintf(a.Err, "Run '%s --help' for usage.\n", ue.cmd)
	}
	return code
}

// errorLine prints "Error: msg", in red on a terminal.
func (a *app) errorLine(msg string) {
	p := a.printerFor("")
	fmt.Fprintln(a.Err, p.paint(colorRed, "Error:")+" "+msg)
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// usageError is a mistake in how osb was called: exit code 2.
type usageError struct {
	cmd string // the command path, for the hint
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf(format, args...)}
}

// exitError ends osb with a given code, after printing msg if any.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// rootCommand builds the command tree.
func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "osb",
		Short: "OpenSandbox: sandboxes for AI agents, from your shell",
		Long: `osb creates sandboxes on an OpenSandbox server and works inside them:
commands, sessions, terminals, files and copies.

Connection settings come from flags, then the OPEN_SANDBOX_* environment
variables, then ~/.opensandbox/config.toml ("osb config init" writes one).`,
		Version:           clientVersion(),
		SilenceUsage:      true,
		SilenceErrors:     true,
		DisableAutoGenTag: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			// Cobra checks these after this hook, as plain errors; here
			// they become usage errors (exit 2).
			if err := cmd.ValidateRequiredFlags(); err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			if err := cmd.ValidateFlagGroups(); err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			if isCompletionCommand(cmd) || !cmd.HasParent() {
				return nil // completions, and the root's help
			}
			return a.resolve(cmd)
		},
	}
	root.SetVersionTemplate("osb {{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{cmd: cmd.CommandPath(), err: err}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.global.apiKey, "api-key", "", "API key of the server (env OPEN_SANDBOX_API_KEY)")
	pf.StringVar(&a.global.domain, "domain", "", "server as host:port or URL (env OPEN_SANDBOX_DOMAIN; default localhost:8080)")
	pf.StringVar(&a.global.protocol, "protocol", "", "http or https (env OPEN_SANDBOX_PROTOCOL)")
	pf.StringVar(&a.global.requestTimeout, "request-timeout", "", "timeout of each request, seconds or a duration (env OPEN_SANDBOX_REQUEST_TIMEOUT; default 30)")
	pf.BoolVar(&a.global.useProxy, "use-server-proxy", false, "reach sandboxes through the server (env OPEN_SANDBOX_USE_SERVER_PROXY)")
	pf.BoolVar(&a.global.noUseProxy, "no-use-server-proxy", false, "reach sandboxes directly, whatever the environment or config say")
	pf.StringVar(&a.global.configPath, "config", "", "configuration file (default ~/.opensandbox/config.toml)")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "explain failures in more detail")
	pf.BoolVar(&a.global.noColor, "no-color", false, "plain output: no colour, no symbols")
	pf.StringVarP(&a.global.output, "output", "o", "", "output format: table, json, yaml or raw (which ones a command offers: see its help)")
	root.MarkFlagsMutuallyExclusive("use-server-proxy", "no-use-server-proxy")

	root.AddCommand(
		a.sandboxCommand(),
		a.snapshotCommand(),
		a.poolCommand(),
		a.egressCommand(),
		a.vaultCommand(),
		a.configCommand(),
		a.commandCommand(),
		a.fileCommand(),
		a.execCommand(),
		a.shellCommand(),
		a.cpCommand(),
		a.diagnosticsCommand(),
		a.codeCommand(),
		a.mcpCommand(),
		a.versionCommand(),
	)
	setArgsUsage(root)
	a.setIDCompletion(root)
	return root
}

// setIDCompletion completes the sandbox id of every command under cmd
// whose first argument is one ("run ID ...") and that completes nothing
// else.
func (a *app) setIDCompletion(cmd *cobra.Command) {
	if f := strings.Fields(cmd.Use); len(f) > 1 && f[1] == "ID" && cmd.ValidArgsFunction == nil {
		cmd.ValidArgsFunction = a.completeSandboxIDs
	}
	for _, c := range cmd.Commands() {
		a.setIDCompletion(c)
	}
}

// setArgsUsage makes argument-count errors of cmd and its children usage
// errors.
func setArgsUsage(cmd *cobra.Command) {
	if v := cmd.Args; v != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := v(c, args); err != nil {
				return &usageError{cmd: c.CommandPath(), err: err}
			}
			return nil
		}
	}
	if cmd.Run == nil && cmd.RunE == nil {
		// A group: an unknown subcommand is a usage error, no
		// subcommand prints the help.
		cmd.Args = func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &usageError{cmd: c.CommandPath(), err: fmt.Errorf("unknown command %q for %q", args[0], c.CommandPath())}
			}
			return nil
		}
		cmd.RunE = func(c *cobra.Command, args []string) error { return c.Help() }
	}
	for _, c := range cmd.Commands() {
		setArgsUsage(c)
	}
}

// sdkClient returns the client for the resolved settings, made once.
func (a *app) sdkClient() (*sdk.Client, error) {
	if a.client != nil {
		return a.client, nil
	}
	c, err := sdk.NewClient(sdk.Config{
		Domain:         a.set.Domain,
		APIKey:         a.set.APIKey,
		Protocol:       a.set.Protocol,
		RequestTimeout: a.set.RequestTimeout,
		UseServerProxy: a.set.UseServerProxy,
		UserAgent:      "osb/" + clientVersion(),
	})
	if err != nil {
		return nil, err
	}
	a.client = c
	return c, nil
}

// flagChanged reports whether a flag was given on the command line.
func flagChanged(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}
