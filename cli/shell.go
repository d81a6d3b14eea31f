package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/opensandbox/opensandbox/sdk"
)

// shellCommand is `osb shell`: an interactive terminal in a sandbox.
func (a *app) shellCommand() *cobra.Command {
	var cwd string
	cmd := &cobra.Command{
		Use:   "shell ID [-- COMMAND [ARG...]]",
		Short: "Open an interactive terminal in a sandbox",
		Long: `Open an interactive terminal in a sandbox: bash, or COMMAND when given, on a
pseudo-terminal the size of yours, which follows when your window is resized.
Keys go to the sandbox as typed (Ctrl-C interrupts the remote program).

osb exits with the remote shell's exit code. Input from a pipe works too:
end of input ends the shell as Ctrl-D would.`,
		Example: `  osb shell 3f0c2a4e
  osb shell 3f0c2a4e --cwd /workspace
  osb shell 3f0c2a4e -- python3`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			opts := sdk.TerminalOptions{Cwd: cwd}
			if len(args) > 1 {
				opts.Command = sdk.ShellQuote(args[1:]...)
			}
			return a.runShell(cmd.Context(), c.Sandbox(args[0]), opts)
		},
	}
	cmd.Flags().StringVarP(&cwd, "cwd", "w", "", "working directory of the shell")
	return cmd
}

// runShell attaches the local terminal (or stdin and stdout) to a new
// terminal in sb until the remote process exits.
func (a *app) runShell(ctx context.Context, sb *sdk.Sandbox, opts sdk.TerminalOptions) error {
	inFile, inIsTTY := a.In.(*os.File)
	inIsTTY = inIsTTY && term.IsTerminal(int(inFile.Fd()))
	outFile, _ := a.Out.(*os.File)
	if outFile != nil && term.IsTerminal(int(outFile.Fd())) {
		if w, h, err := term.GetSize(int(outFile.Fd())); err == nil {
			opts.Cols, opts.Rows = w, h
		}
	}
	t, err := sb.OpenTerminal(ctx, opts)
	if err != nil {
		return err
	}
	defer t.Kill(context.WithoutCancel(ctx)) // the session ends with osb

	if inIsTTY {
		state, err := term.MakeRaw(int(inFile.Fd()))
		if err != nil {
			return fmt.Errorf("set the terminal to raw mode: %w", err)
		}
		defer term.Restore(int(inFile.Fd()), state)
	}

	// Window size changes follow the local terminal.
	if outFile != nil && !opts.Pipe {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer func() {
			signal.Stop(winch) // no more sends after this returns
			close(winch)
		}()
		go func() {
			for range winch {
				if w, h, err := term.GetSize(int(outFile.Fd())); err == nil {
					t.Resize(w, h)
				}
			}
		}()
	}

	// Keys go up. At the end of piped input, Ctrl-D ends the shell; it is
	// repeated until the shell has gone, as a Ctrl-D that arrives before
	// the shell reads its terminal can be lost when the shell switches the
	// terminal to raw mode.
	go func() {
		_, err := io.Copy(t, a.In)
		if err != nil || inIsTTY {
			return
		}
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for range 120 {
			if _, err := t.Write([]byte{4}); err != nil {
				return
			}
			select {
			case <-t.Done():
				return
			case <-tick.C:
			}
		}
	}()
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(a.Out, t)
		copied <- err
	}()

	select {
	case err = <-copied:
	case <-ctx.Done():
		return ctx.Err()
	}
	code, werr := t.Wait()
	if werr != nil {
		if err == nil || errors.Is(err, io.EOF) {
			err = werr
		}
		return err
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}
