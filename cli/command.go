package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// interruptTimeout bounds the stop of a remote command after Ctrl-C:
// execd sends SIGTERM, waits up to 3 s, then SIGKILL.
const interruptTimeout = 10 * time.Second

// exitCodeHelp is the part of the help of the commands that pass on the
// remote process's exit code.
const exitCodeHelp = `osb exits with the remote process's exit code: 0 on success, N after
"exit N", 128+N when signal N killed it (137 for SIGKILL, 143 for
SIGTERM), 1 when it could not start, 130 after Ctrl-C. (The Python osb
exits 1 for every failure; scripts that test for 1 should test for
non-zero.)`

// commandCommand is `osb command`.
func (a *app) commandCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "command",
		Aliases: []string{"cmd"},
		Short:   "Run commands in a sandbox, follow background ones, keep shell sessions",
	}
	session := &cobra.Command{
		Use:   "session",
		Short: "Persistent bash sessions: variables, functions and the directory carry over from run to run",
	}
	session.AddCommand(a.sessionCreate(), a.sessionRun(), a.sessionDelete())
	cmd.AddCommand(a.commandRun(false), a.commandStatus(), a.commandLogs(), a.commandInterrupt(), session)
	return cmd
}

// execCommand is `osb exec`, the older CLI's shortcut for `osb command
// run`.
func (a *app) execCommand() *cobra.Command {
	return a.commandRun(true)
}

// sandboxByID returns a handle on the sandbox id; nothing is asked of the
// server until it is used.
func (a *app) sandboxByID(id string) (*sdk.Sandbox, error) {
	c, err := a.sdkClient()
	if err != nil {
		return nil, err
	}
	return c.Sandbox(id), nil
}

// modeFormat is the output format of a command whose formats depend on
// how it runs: def when -o is not given, else one of allowed, else an
// error that says what mode offers which.
func (a *app) modeFormat(cmd *cobra.Command, mode, def string, allowed ...string) (string, error) {
	f, err := a.format(cmd, def)
	if err != nil {
		return "", err
	}
	if !slices.Contains(allowed, f) {
		return "", fmt.Errorf("%s does not offer -o %s %s; it offers: %s", cmd.CommandPath(), f, mode, strings.Join(allowed, ", "))
	}
	return f, nil
}

// payload returns the words of a command line joined for the sandbox's
// shell, each word quoted to stay one argument; it is a usage error when
// there are none.
func payload(cmd *cobra.Command, words []string) (string, error) {
	if len(words) == 0 {
		return "", usagef(cmd, "missing the command to run: give it after --, as in %s ID -- ls -l", cmd.CommandPath())
	}
	return sdk.ShellQuote(words...), nil
}

// backgroundDoc is the document of `osb command run -d`.
type backgroundDoc struct {
	ExecutionID string `json:"execution_id"`
	SandboxID   string `json:"sandbox_id"`
	Mode        string `json:"mode"`
}

// commandRun is `osb command run`, or `osb exec` when alias is set.
func (a *app) commandRun(alias bool) *cobra.Command {
	var (
		background bool
		workdir    string
		timeout    time.Duration
		env        []string
	)
	cmd := formats(&cobra.Command{
		Use:   "run ID [flags] -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox, streaming its output, and exit with its exit code",
		Long: `Run a command in a sandbox. Its stdout and stderr are streamed to osb's
as they arrive. The words after -- are quoted for the sandbox's shell,
each staying one argument, so write "sh -c '...'" for pipes, variables
and redirections. Flags may come before or after ID, but not after --.

` + exitCodeHelp + `

With -d the command runs detached: osb prints its execution id and
returns; follow it with "osb command status", "osb command logs" and
"osb command interrupt". Ctrl-C stops a foreground command in the
sandbox too.

Foreground output is -o raw only; -d offers table, json and yaml.
There is no --argv: execd always runs the command through its shell.`,
		Example: `  osb command run sb-1 -- ls -l /workspace
  osb command run sb-1 -w /workspace -e DEBUG=1 -- python3 app.py
  osb command run sb-1 -- sh -c 'echo $HOME; exit 3'; echo "exit code $?"
  osb command run sb-1 -t 30s -- ./slow-test.sh
  osb command run sb-1 -d -o json -- python3 -m http.server 8000`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef(cmd, "missing the sandbox ID")
			}
			def, allowed, mode := formatRaw, []string{formatRaw}, "in the foreground (use -d for table, json or yaml)"
			if background {
				def, allowed, mode = formatTable, []string{formatTable, formatJSON, formatYAML}, "with -d"
			}
			f, err := a.modeFormat(cmd, mode, def, allowed...)
			if err != nil {
				return err
			}
			command, err := payload(cmd, args[1:])
			if err != nil {
				return err
			}
			envs, err := parseKeyValues(cmd, "--env", env)
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			opts := sdk.RunOptions{Cwd: workdir, Env: envs, Timeout: timeout}
			if background {
				id, err := sb.RunBackground(cmd.Context(), command, &opts)
				if err != nil {
					return err
				}
				doc := backgroundDoc{ExecutionID: id, SandboxID: sb.ID, Mode: "background"}
				p := a.printerFor(f)
				return p.doc(doc, func() {
					p.kv("Background Command Started", [][2]string{
						{"execution_id", doc.ExecutionID}, {"sandbox_id", doc.SandboxID}, {"mode", doc.Mode}})
				})
			}
			opts.Stdout, opts.Stderr = a.Out, a.Err
			ex, err := a.runForeground(cmd.Context(), sb, command, &opts)
			if err != nil {
				return err
			}
			return executionExit(ex)
		},
	}, formatRaw, formatTable, formatJSON, formatYAML)
	if alias {
		cmd.Use = "exec ID [flags] -- COMMAND [ARG...]"
		cmd.Short = "Run a command in a sandbox (the same as osb command run)"
		cmd.Hidden = true
	}
	fl := cmd.Flags()
	fl.BoolVarP(&background, "background", "d", false, "start the command detached and print its execution id")
	fl.StringVarP(&workdir, "workdir", "w", "", "working directory of the command (must exist)")
	fl.VarP(&durationValue{d: &timeout}, "timeout", "t", "kill the command (SIGKILL) after this long, such as 30s or 5m (default: no limit)")
	fl.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for the command (repeatable)")
	return cmd
}

// runForeground runs command in sb to its end, streaming its output as
// opts says. When ctx is cancelled (Ctrl-C) it stops the command in the
// sandbox and ends osb with exit code 130.
func (a *app) runForeground(ctx context.Context, sb *sdk.Sandbox, command string, opts *sdk.RunOptions) (*sdk.Execution, error) {
	var id string
	opts.OnEvent = func(ev api.Event) {
		if ev.Type == api.EventInit && id == "" {
			id = ev.Text
		}
	}
	ex, err := sb.Run(ctx, command, opts)
	if ctx.Err() == nil {
		return ex, err
	}
	if id == "" {
		return nil, &exitError{code: 130, msg: "interrupted"}
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), interruptTimeout)
	defer cancel()
	if err := sb.Interrupt(ictx, id); err != nil && !errors.Is(err, sdk.ErrServer) {
		// A server error means the command had already ended.
		return nil, &exitError{code: 130, msg: "interrupted, but stopping the command failed: " + oneLine(err.Error())}
	}
	return nil, &exitError{code: 130, msg: "interrupted; command " + id + " stopped"}
}

// linuxSignals numbers the signals by the names Go gives them on Linux,
// which is how execd reports them ("signal: killed").
var linuxSignals = map[string]int{
	"hangup": 1, "interrupt": 2, "quit": 3, "illegal instruction": 4,
	"trace/breakpoint trap": 5, "aborted": 6, "bus error": 7,
	"floating point exception": 8, "killed": 9, "user defined signal 1": 10,
	"segmentation fault": 11, "user defined signal 2": 12, "broken pipe": 13,
	"alarm clock": 14, "terminated": 15,
}

// signalNames are the usual names of the numbers above.
var signalNames = map[int]string{1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP",
	6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV",
	12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM"}

// signalRE finds a signal's name in execd's descriptions of an ending,
// such as "signal: killed" or "the session's shell exited (signal:
// segmentation fault (core dumped)); ...".
var signalRE = regexp.MustCompile(`signal: ([a-z][a-z0-9/ ]*[a-z0-9])`)

// signalIn returns the first signal named in texts, or "".
func signalIn(texts ...string) string {
	for _, t := range texts {
		if m := signalRE.FindStringSubmatch(t); m != nil {
			return m[1]
		}
	}
	return ""
}

// remoteExit is osb's ending for a remote process that ended with code:
// nil for 0, the code itself when positive, 128+N after signal N (with a
// line saying so), 1 with the reason otherwise.
func remoteExit(code int, signal, reason string) error {
	switch {
	case code == 0:
		return nil
	case code > 0:
		return &exitError{code: code}
	case signal != "":
		if n, ok := linuxSignals[signal]; ok {
			return &exitError{code: 128 + n, msg: fmt.Sprintf("command killed by signal %s (%s)", signalNames[n], signal)}
		}
		return &exitError{code: 1, msg: "command killed by signal: " + signal}
	}
	if reason == "" {
		reason = "the command failed"
	}
	return &exitError{code: 1, msg: oneLine(reason)}
}

// executionExit is osb's ending for a finished foreground execution.
func executionExit(ex *sdk.Execution) error {
	if ex.Error == nil {
		return nil
	}
	signal := strings.TrimSuffix(ex.Signal(), " (core dumped)")
	if signal == "" && ex.ExitCode == -1 {
		signal = signalIn(ex.Error.Traceback...)
	}
	reason := ex.Error.EValue
	if _, err := strconv.Atoi(reason); err == nil || reason == "" {
		reason = strings.Join(ex.Error.Traceback, "; ")
	}
	if ex.Error.EName != api.ErrorNameCommand && ex.Error.EName != "" {
		reason = ex.Error.EName + ": " + reason
	}
	return remoteExit(ex.ExitCode, signal, reason)
}

// statusExit is osb's ending for a finished command, from its status.
func statusExit(st *api.CommandStatus) error {
	if st.ExitCode == nil {
		return nil
	}
	return remoteExit(*st.ExitCode, signalIn(st.Error), st.Error)
}

// commandStatusDoc is the document of `osb command status`.
type commandStatusDoc struct {
	ID         string     `json:"id"`
	Content    string     `json:"content"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code"`
	Error      *string    `json:"error"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// viewCommandStatus is st as osb prints it: nulls for what is unknown,
// times in UTC.
func viewCommandStatus(st *api.CommandStatus) commandStatusDoc {
	d := commandStatusDoc{ID: st.ID, Content: st.Content, Running: st.Running, ExitCode: st.ExitCode,
		Error: optional(st.Error), StartedAt: st.StartedAt.UTC()}
	if st.FinishedAt != nil {
		t := st.FinishedAt.UTC()
		d.FinishedAt = &t
	}
	return d
}

// commandStatus is `osb command status`.
func (a *app) commandStatus() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "status ID EXECUTION_ID",
		Short: "Show whether a command runs, and how it ended",
		Long: `Show a command's state: running or not, its exit code (-1 when a signal
killed it) and the error execd reports, such as "signal: killed".`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			st, err := sb.CommandStatus(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			doc := viewCommandStatus(st)
			p := a.printerFor(f)
			return p.doc(doc, func() {
				code := ""
				if doc.ExitCode != nil {
					code = strconv.Itoa(*doc.ExitCode)
				}
				p.kv("Command Status", [][2]string{
					{"id", doc.ID}, {"content", doc.Content}, {"running", strconv.FormatBool(doc.Running)},
					{"exit_code", code}, {"error", st.Error},
					{"started_at", timeText(&doc.StartedAt)}, {"finished_at", timeText(doc.FinishedAt)},
				})
			})
		},
	}, formatTable, formatJSON, formatYAML)
}

// logsDoc is the document of `osb command logs`.
type logsDoc struct {
	Content string `json:"content"`
	Cursor  int64  `json:"cursor"`
}

// commandLogs is `osb command logs`.
func (a *app) commandLogs() *cobra.Command {
	var (
		cursor int64
		follow bool
	)
	cmd := formats(&cobra.Command{
		Use:   "logs ID EXECUTION_ID",
		Short: "Show a background command's output (stdout and stderr interleaved)",
		Long: `Show the output of a background command (started with -d) from byte
offset --cursor; the document's cursor is where to continue next time.
-o raw prints the output exactly as it is.

--follow prints the output as it comes until the command ends, then
exits with the command's exit code (as "osb command run" does). Ctrl-C
stops following; the command goes on.`,
		Example: `  osb command logs sb-1 EXEC_ID -o raw
  osb command logs sb-1 EXEC_ID --cursor 1024 -o json
  osb command logs sb-1 EXEC_ID --follow`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if follow && flagChanged(cmd.Flags(), "cursor") {
				return usagef(cmd, "--cursor and --follow cannot be used together")
			}
			if cursor < 0 {
				return usagef(cmd, "--cursor must not be negative")
			}
			var f string
			var err error
			if follow {
				f, err = a.modeFormat(cmd, "with --follow", formatRaw, formatRaw)
			} else {
				f, err = a.format(cmd, "")
			}
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if follow {
				st, err := sb.FollowLogs(cmd.Context(), args[1], a.Out, 0)
				if err != nil {
					if cmd.Context().Err() != nil {
						return &exitError{code: 130, msg: "interrupted; command " + args[1] + " goes on"}
					}
					return err
				}
				return statusExit(st)
			}
			data, next, err := sb.CommandLogs(cmd.Context(), args[1], cursor)
			if err != nil {
				return err
			}
			doc := logsDoc{Content: string(data), Cursor: next}
			p := a.printerFor(f)
			if f == formatRaw {
				_, err := a.Out.Write(data)
				return err
			}
			return p.doc(doc, func() {
				fmt.Fprintln(p.out, p.style(styleBold, "Command Logs"))
				text := doc.Content
				if text != "" && !strings.HasSuffix(text, "\n") {
					text += "\n"
				}
				fmt.Fprint(p.out, text)
			})
		},
	}, formatTable, formatJSON, formatYAML, formatRaw)
	cmd.Flags().Int64Var(&cursor, "cursor", 0, "byte offset to start from (the cursor of an earlier call)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print output as it comes until the command ends; exit with its exit code")
	return cmd
}

// commandInterrupt is `osb command interrupt`.
func (a *app) commandInterrupt() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "interrupt ID EXECUTION_ID",
		Short: "Stop a running command: SIGTERM to its process group, SIGKILL after 3s",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Interrupt(cmd.Context(), args[1]); err != nil {
				return err
			}
			a.printerFor(f).success("Interrupted: " + args[1])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}

// sessionDoc is the document of `osb command session create`.
type sessionDoc struct {
	SandboxID        string  `json:"sandbox_id"`
	SessionID        string  `json:"session_id"`
	WorkingDirectory *string `json:"working_directory"`
}

// sessionCreate is `osb command session create`.
func (a *app) sessionCreate() *cobra.Command {
	var workdir string
	cmd := formats(&cobra.Command{
		Use:   "create ID",
		Short: "Start a shell session",
		Long: `Start a shell session in a sandbox and print its id. Each
"osb command session run" then runs in the same bash: variables,
functions, aliases and the working directory the previous run left are
still there.`,
		Example: `  S=$(osb command session create sb-1 -w /workspace -o json | jq -r .session_id)
  osb command session run sb-1 $S -- export STAGE=2
  osb command session run sb-1 $S -- cd src
  osb command session run sb-1 $S -- sh -c 'echo $STAGE; pwd'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			ss, err := sb.CreateSession(cmd.Context(), workdir)
			if err != nil {
				return err
			}
			doc := sessionDoc{SandboxID: sb.ID, SessionID: ss.ID, WorkingDirectory: optional(workdir)}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Session Created", [][2]string{
					{"sandbox_id", doc.SandboxID}, {"session_id", doc.SessionID}, {"working_directory", workdir}})
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "the session's starting directory (created if missing)")
	return cmd
}

// sessionRun is `osb command session run`.
func (a *app) sessionRun() *cobra.Command {
	var (
		workdir string
		timeout time.Duration
	)
	cmd := formats(&cobra.Command{
		Use:   "run ID SESSION_ID [flags] -- COMMAND [ARG...]",
		Short: "Run a command in a shell session, streaming its output",
		Long: `Run a command in a shell session. The words after -- are quoted for the
shell as "osb command run" does; the output (stdout and stderr merged,
as a terminal shows them) is streamed to stdout.

` + exitCodeHelp + `

Ctrl-C stops following the run but leaves the session as it is (the
run goes on in it); "osb command session delete" stops it.`,
		Example: `  osb command session run sb-1 $S -- cd /tmp
  osb command session run sb-1 $S -t 1m -- make test`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef(cmd, "want ID SESSION_ID -- COMMAND")
			}
			if _, err := a.format(cmd, ""); err != nil {
				return err
			}
			command, err := payload(cmd, args[2:])
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			ss := sb.Session(args[1])
			opts := sdk.SessionRunOptions{Cwd: workdir, Timeout: timeout, Stdout: a.Out}
			ex, err := ss.Run(cmd.Context(), command, &opts)
			if cmd.Context().Err() != nil {
				return &exitError{code: 130, msg: "interrupted; the run goes on in session " + ss.ID}
			}
			if err != nil {
				return err
			}
			return executionExit(ex)
		},
	}, formatRaw)
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "run in this directory (must exist); the session keeps the directory the run ends in")
	cmd.Flags().VarP(&durationValue{d: &timeout}, "timeout", "t", "interrupt the run after this long, such as 30s (default: execd's limit)")
	return cmd
}

// sessionDelete is `osb command session delete`.
func (a *app) sessionDelete() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "delete ID SESSION_ID",
		Short: "End a shell session and whatever runs in it",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			sb, err := a.sandboxByID(args[0])
			if err != nil {
				return err
			}
			if err := sb.Session(args[1]).Delete(cmd.Context()); err != nil {
				return err
			}
			a.printerFor(f).success("Deleted session: " + args[1])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}
