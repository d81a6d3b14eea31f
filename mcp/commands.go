package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// Command time limits, in seconds.
const (
	defaultCommandTimeout = 120
	maxCommandTimeout     = 3600
	maxLogsWait           = 300
)

type runInput struct {
	SandboxArg
	Command        string            `json:"command" jsonschema:"shell command line, run with sh -c: pipes, redirections, && and ; work"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory, which must exist; default: the sandbox's"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this command"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds"`
	MaxOutputChars int               `json:"max_output_chars,omitempty" jsonschema:"output budget in characters: stdout and stderr are each cut to it, keeping their first and last lines around a note of the lines and bytes left out, and an answer with both long is cut to it as a whole the same way"`
}

// RunOutput is how a command ended and what it printed.
type RunOutput struct {
	ExitCode        int    `json:"exit_code" jsonschema:"0 for success; -1 when killed by a signal or not started"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	StdoutBinary    bool   `json:"stdout_binary,omitempty" jsonschema:"stdout is not text (NUL bytes or not UTF-8) and is described, not shown: redirect it to a file and read it with file_read"`
	StderrBinary    bool   `json:"stderr_binary,omitempty" jsonschema:"stderr is not text and is described, not shown"`
	TimedOut        bool   `json:"timed_out,omitempty" jsonschema:"the command was killed because timeout_seconds passed"`
	Signal          string `json:"signal,omitempty" jsonschema:"the signal that killed the command, when one did"`
	Error           string `json:"error,omitempty" jsonschema:"why the command could not run, when it could not"`
	DurationMS      int64  `json:"duration_ms"`
}

type startInput struct {
	SandboxArg
	Command        string            `json:"command" jsonschema:"shell command line, run with sh -c in the background"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory, which must exist"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this command"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default: no limit"`
}

// StartOutput names a background command.
type StartOutput struct {
	CommandID string `json:"command_id"`
}

type logsInput struct {
	SandboxArg
	CommandID      string `json:"command_id" jsonschema:"id returned by command_start"`
	Cursor         int64  `json:"cursor,omitempty" jsonschema:"byte offset in the output to read from: 0 for all of it, or next_cursor of the previous call for what is new"`
	WaitSeconds    int    `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds for the command to end before reading; 0 reads at once"`
	MaxOutputChars int    `json:"max_output_chars,omitempty" jsonschema:"output budget: characters of output kept; longer output keeps its first and last lines around a note of the lines and bytes left out"`
}

// LogsOutput is a background command's output and state.
type LogsOutput struct {
	CommandID  string `json:"command_id"`
	Running    bool   `json:"running"`
	ExitCode   *int   `json:"exit_code,omitempty" jsonschema:"set once the command has ended"`
	Error      string `json:"error,omitempty"`
	Output     string `json:"output" jsonschema:"stdout and stderr as they were interleaved"`
	Truncated  bool   `json:"truncated,omitempty"`
	Binary     bool   `json:"binary,omitempty" jsonschema:"the output is not text (NUL bytes or not UTF-8) and is described, not shown"`
	NextCursor int64  `json:"next_cursor" jsonschema:"pass as cursor to read only newer output"`
}

type stopInput struct {
	SandboxArg
	CommandID string `json:"command_id" jsonschema:"id returned by command_start"`
}

func (in runInput) validate() error   { return checkCommand(in.SandboxID, in.Command, in.Env) }
func (in startInput) validate() error { return checkCommand(in.SandboxID, in.Command, in.Env) }

func checkCommand(id, command string, env map[string]string) error {
	if err := requireID(id); err != nil {
		return err
	}
	if strings.TrimSpace(command) == "" {
		return argErrorf("command is empty")
	}
	for k := range env {
		if k == "" || strings.Contains(k, "=") {
			return argErrorf("env name %q: must be non-empty and without '='", k)
		}
	}
	return nil
}

func (in logsInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if in.Cursor < 0 {
		return argErrorf("cursor %d: must be 0 or more", in.Cursor)
	}
	return nil
}

func (s *Server) addCommandTools() {
	add(s, &gomcp.Tool{
		Name: "command_run",
		Description: `Run a shell command in a sandbox and wait for it to end. Returns its exit code, stdout and stderr.
Each call is a new shell: cd and variables do not carry over (use cwd and env, or chain with &&). Stdin is empty: a command that reads input gets end-of-file at once.
Output longer than max_output_chars keeps its first and last lines with a note of how many lines and bytes were left out; redirect big output to a file and read parts of it with file_read. Binary output (not UTF-8 text) is described by its size, not shown.
For servers and other long-running work use command_start instead.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Run command", DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, s.runCommand,
		between("timeout_seconds", 1, maxCommandTimeout), defaultValue("timeout_seconds", fmt.Sprint(defaultCommandTimeout)))

	add(s, &gomcp.Tool{
		Name: "command_start",
		Description: `Start a shell command in the background in a sandbox and return its command_id at once, without waiting for it.
Use it for servers, watchers and long builds. Read its output and exit code with command_logs; stop it with command_stop.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Start background command", DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, s.startCommand, between("timeout_seconds", 1, 7*24*3600))

	add(s, &gomcp.Tool{
		Name: "command_logs",
		Description: `Read the output (stdout and stderr interleaved) of a command started with command_start, and whether it still runs or its exit code.
Pass next_cursor back as cursor to get only new output. wait_seconds waits for the command to end first (useful for builds).`,
		Annotations: &gomcp.ToolAnnotations{Title: "Read command logs", ReadOnlyHint: true},
	}, s.commandLogs,
		between("wait_seconds", 0, maxLogsWait), between("cursor", 0, 1<<53))

	add(s, &gomcp.Tool{
		Name:        "command_stop",
		Description: "Stop a command started with command_start: SIGTERM to it and its children, SIGKILL if they linger.",
		Annotations: &gomcp.ToolAnnotations{Title: "Stop background command", DestructiveHint: ptr(true), IdempotentHint: true},
	}, func(ctx context.Context, in stopInput) (*gomcp.CallToolResult, DoneOutput, error) {
		sb, err := s.running(ctx, in.SandboxID)
		if err != nil {
			return nil, DoneOutput{}, err
		}
		if err := sb.Interrupt(ctx, in.CommandID); err != nil {
			// Stopping a command that has ended is done, not a failure; an
			// unknown id is the model's to fix, not a server failure to
			// retry.
			var ae *sdk.APIError
			if errors.As(err, &ae) && strings.Contains(ae.Message, "is not running") {
				return done("command %s had already ended; command_logs shows its exit code", in.CommandID)
			}
			if errors.As(err, &ae) && strings.Contains(ae.Message, "no such session") {
				return nil, DoneOutput{}, argErrorf("no command %s in sandbox %s: use the command_id that command_start returned", in.CommandID, in.SandboxID)
			}
			return nil, DoneOutput{}, err
		}
		return done("stop signal sent to command %s; command_logs shows when it has ended", in.CommandID)
	})
}

func (s *Server) runCommand(ctx context.Context, in runInput) (*gomcp.CallToolResult, RunOutput, error) {
	timeout := time.Duration(cmpInt(in.TimeoutSeconds, defaultCommandTimeout)) * time.Second
	stdout, stderr := newClip(cmpInt(in.MaxOutputChars, s.cfg.MaxOutput)), newClip(cmpInt(in.MaxOutputChars, s.cfg.MaxOutput))
	var id string
	opts := &sdk.RunOptions{Cwd: in.Cwd, Env: in.Env, Timeout: timeout, Stdout: stdout, Stderr: stderr,
		OnEvent: func(ev api.Event) {
			if ev.Type == api.EventInit {
				id = ev.Text
			}
		}}
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, RunOutput{}, err
	}
	start := time.Now()
	// The sandbox kills the command at its timeout; the margin only
	// guards against a sandbox that stops answering.
	rctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	res, err := sb.Run(rctx, in.Command, opts)
	if err != nil {
		if id != "" && rctx.Err() != nil {
			s.interrupt(ctx, sb, id, sb.Interrupt)
		}
		return nil, RunOutput{}, err
	}
	out := RunOutput{ExitCode: res.ExitCode, Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutTruncated: stdout.Truncated(), StderrTruncated: stderr.Truncated(),
		StdoutBinary: stdout.Binary(), StderrBinary: stderr.Binary(), Signal: res.Signal(),
		DurationMS: time.Since(start).Milliseconds()}
	if res.ExitCode == -1 && time.Since(start) >= timeout {
		out.TimedOut = true
	}
	if res.Error != nil && res.Error.EName != api.ErrorNameCommand && res.ExitCode != -1 {
		out.Error = res.Error.EValue
	} else if res.Error != nil && res.ExitCode == -1 && out.Signal == "" {
		out.Error = strings.Join(res.Error.Traceback, "\n")
		if out.Error == "" {
			out.Error = res.Error.EValue
		}
	}
	return text(runText(out, timeout)), out, nil
}

// interrupt stops a command or a code run (stop is the sandbox's
// Interrupt or InterruptCode) whose caller has gone, so that it does not
// run on unseen.
func (s *Server) interrupt(ctx context.Context, sb *sdk.Sandbox, id string, stop func(context.Context, string) error) {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := stop(ictx, id); err != nil {
		s.log.Debug("interrupt abandoned run", "sandbox", sb.ID, "run", id, "err", err)
	}
}

// runText is a command's outcome as the model reads it.
func runText(o RunOutput, timeout time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit code: %d", o.ExitCode)
	switch {
	case o.TimedOut:
		fmt.Fprintf(&b, " (killed: timed out after %v; pass a larger timeout_seconds, or use command_start)", timeout)
	case o.Signal != "":
		fmt.Fprintf(&b, " (killed by signal: %s)", o.Signal)
	}
	fmt.Fprintf(&b, "; took %v\n", (time.Duration(o.DurationMS) * time.Millisecond).Round(time.Millisecond))
	if o.Error != "" {
		fmt.Fprintf(&b, "error: %s\n", o.Error)
	}
	section(&b, "stdout", o.Stdout, o.StdoutTruncated && !o.StdoutBinary)
	section(&b, "stderr", o.Stderr, o.StderrTruncated && !o.StderrBinary)
	return strings.TrimRight(b.String(), "\n")
}

// section writes one output stream under a header; an empty one is
// named as such so that the model knows it was not lost.
func section(b *strings.Builder, name, body string, truncated bool) {
	if body == "" {
		if name == "stdout" {
			fmt.Fprintf(b, "%s: (empty)\n", name)
		}
		return
	}
	note := ""
	if truncated {
		note = " (truncated: first and last lines kept)"
	}
	fmt.Fprintf(b, "--- %s%s ---\n%s", name, note, body)
	if !strings.HasSuffix(body, "\n") {
		b.WriteByte('\n')
	}
}

func (s *Server) startCommand(ctx context.Context, in startInput) (*gomcp.CallToolResult, StartOutput, error) {
	opts := &sdk.RunOptions{Cwd: in.Cwd, Env: in.Env, Timeout: time.Duration(in.TimeoutSeconds) * time.Second}
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, StartOutput{}, err
	}
	id, err := sb.RunBackground(ctx, in.Command, opts)
	if err != nil {
		return nil, StartOutput{}, err
	}
	return text(fmt.Sprintf("started in the background: command_id %s. Read its output with command_logs; stop it with command_stop.", id)),
		StartOutput{CommandID: id}, nil
}

func (s *Server) commandLogs(ctx context.Context, in logsInput) (*gomcp.CallToolResult, LogsOutput, error) {
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, LogsOutput{}, err
	}
	st, err := sb.CommandStatus(ctx, in.CommandID)
	if err != nil {
		return nil, LogsOutput{}, err
	}
	if st.Running && in.WaitSeconds > 0 {
		deadline := time.Now().Add(time.Duration(in.WaitSeconds) * time.Second)
		for st.Running && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return nil, LogsOutput{}, ctx.Err()
			case <-time.After(min(250*time.Millisecond, time.Until(deadline))):
			}
			if st, err = sb.CommandStatus(ctx, in.CommandID); err != nil {
				return nil, LogsOutput{}, err
			}
		}
	}
	// The status was read first: output written before the command ended
	// is then certain to be in these logs.
	// Streamed into the clip, which keeps only its head and tail: a log
	// of any size costs the clip's bound in memory.
	c := newClip(cmpInt(in.MaxOutputChars, s.cfg.MaxOutput))
	hb := &holdBack{w: c}
	next, err := sb.CommandLogsTo(ctx, in.CommandID, in.Cursor, hb)
	if err != nil {
		return nil, LogsOutput{}, err
	}
	if st.Running && len(hb.pending) > 0 {
		// A character cut by the end of what was written so far: the next
		// read starts at it, and gets it whole.
		next -= int64(len(hb.pending))
	} else {
		c.Write(hb.pending)
	}
	out := LogsOutput{CommandID: in.CommandID, Running: st.Running, ExitCode: st.ExitCode, Error: st.Error,
		Output: c.String(), Truncated: c.Truncated(), Binary: c.Binary(), NextCursor: next}
	var b strings.Builder
	if out.Running {
		b.WriteString("status: running")
	} else {
		b.WriteString("status: ended")
		if out.ExitCode != nil {
			fmt.Fprintf(&b, ", exit code %d", *out.ExitCode)
		}
		if out.Error != "" {
			fmt.Fprintf(&b, " (%s)", out.Error)
		}
	}
	fmt.Fprintf(&b, "; next_cursor %d\n", out.NextCursor)
	if out.Output == "" {
		b.WriteString("output: (none new)")
	} else {
		section(&b, "output", out.Output, out.Truncated && !out.Binary)
	}
	return text(strings.TrimRight(b.String(), "\n")), out, nil
}

func cmpInt(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// holdBack passes bytes on to w, except a UTF-8 sequence begun and not
// finished at the end of what it was given so far, kept in pending.
type holdBack struct {
	w       io.Writer
	pending []byte
}

func (h *holdBack) Write(p []byte) (int, error) {
	data := append(h.pending, p...)
	whole := trimPartialRune(data, true)
	h.pending = append([]byte(nil), data[len(whole):]...)
	if _, err := h.w.Write(whole); err != nil {
		return 0, err
	}
	return len(p), nil
}
