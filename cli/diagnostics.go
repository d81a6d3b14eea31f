package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
)

// diagnosticDoc is the document of `osb diagnostics logs|events`: the
// server's descriptor in snake_case. Warnings is never null.
type diagnosticDoc struct {
	SandboxID     string     `json:"sandbox_id"`
	Kind          string     `json:"kind"`
	Scope         string     `json:"scope"`
	Delivery      string     `json:"delivery"`
	ContentType   string     `json:"content_type"`
	Truncated     bool       `json:"truncated"`
	Content       *string    `json:"content"`
	ContentURL    *string    `json:"content_url"`
	ContentLength *int64     `json:"content_length"`
	ExpiresAt     *time.Time `json:"expires_at"`
	Warnings      []string   `json:"warnings"`
}

func viewDiagnostic(d *api.DiagnosticContent) diagnosticDoc {
	doc := diagnosticDoc{
		SandboxID: d.SandboxID, Kind: d.Kind, Scope: d.Scope, Delivery: d.Delivery, ContentType: d.ContentType,
		Truncated: d.Truncated, Content: d.Content, ContentURL: optional(d.ContentURL),
		ContentLength: d.ContentLength, ExpiresAt: d.ExpiresAt, Warnings: d.Warnings,
	}
	if doc.Warnings == nil {
		doc.Warnings = []string{}
	}
	return doc
}

// diagnosticsCommand is `osb diagnostics`.
func (a *app) diagnosticsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "diagnostics",
		Aliases: []string{"diag"},
		Short:   "Read a sandbox's logs and events, as the server keeps them",
		Long: `Read what the server knows about a sandbox: the output of its main
process (logs) and what happened to it (events). These work when the
sandbox itself does not answer, which makes them the place to look when a
sandbox fails to start.

By default (-o raw) the content goes to stdout as it is, with a newline
added when it does not end in one, and notes (content cut short, the
server's warnings) go to stderr. -o json and -o yaml give the server's
whole descriptor.`,
	}
	cmd.AddCommand(
		a.diagnosticsKind("logs", "container", "Diagnostic Logs",
			"Show the logs of a sandbox's main process",
			"container (the main process's output), lifecycle (the server's record of the sandbox) or all; servers may offer more"),
		a.diagnosticsKind("events", "runtime", "Diagnostic Events",
			"Show what happened to a sandbox",
			"runtime (what the container engine reported), lifecycle (state changes and requests) or all; servers may offer more"),
	)
	return cmd
}

// diagnosticsKind is `osb diagnostics logs` or `osb diagnostics events`.
func (a *app) diagnosticsKind(kind, defScope, title, short, scopes string) *cobra.Command {
	var scope string
	cmd := formats(&cobra.Command{
		Use:   kind + " ID",
		Short: short,
		Long: short + `.

Output: -o raw (the default) writes the content to stdout as it is, with a
newline added only when it does not end in one, and notes (content cut
short, the server's warnings) to stderr as "Warning: ..." lines; for
content the server hands out by URL it writes the URL. -o table writes
the descriptor's fields, then the content; -o json and -o yaml write the
whole descriptor (sandbox_id, kind, scope, delivery, content_type,
truncated, content, content_url, content_length, expires_at, warnings).`,
		Example: fmt.Sprintf(`  osb diagnostics %s sb-123
  osb diagnostics %s sb-123 --scope all
  osb diagnostics %s sb-123 -o json`, kind, kind, kind),
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSandboxIDs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			if strings.TrimSpace(scope) == "" {
				return usagef(cmd, "--scope must not be empty")
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			get := c.Logs
			if kind == "events" {
				get = c.Events
			}
			d, err := get(cmd.Context(), args[0], scope)
			if err != nil {
				return err
			}
			doc := viewDiagnostic(d)
			p := a.printerFor(f)
			switch f {
			case formatRaw:
				if d.Truncated {
					p.warn("diagnostic content was truncated.")
				}
				for _, w := range d.Warnings {
					p.warn(w)
				}
				switch {
				case d.Content != nil:
					return writeText(p.out, *d.Content)
				case d.ContentURL != "":
					return writeText(p.out, d.ContentURL)
				}
				return errors.New("the server's answer has neither inline content nor a content URL")
			case formatTable:
				p.kv(title, diagnosticPairs(doc))
				if d.Content != nil && *d.Content != "" {
					fmt.Fprintln(p.out)
					return writeText(p.out, *d.Content)
				}
				return nil
			}
			return p.doc(doc, nil)
		},
	}, formatRaw, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&scope, "scope", "s", defScope, "what to show: "+scopes)
	cmd.RegisterFlagCompletionFunc("scope", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		if kind == "logs" {
			return []string{"container", "lifecycle", "all"}, cobra.ShellCompDirectiveNoFileComp
		}
		return []string{"runtime", "lifecycle", "all"}, cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

// diagnosticPairs are the descriptor's fields but the content, for the
// table.
func diagnosticPairs(d diagnosticDoc) [][2]string {
	pairs := [][2]string{
		{"sandbox_id", d.SandboxID},
		{"kind", d.Kind},
		{"scope", d.Scope},
		{"delivery", d.Delivery},
		{"content_type", d.ContentType},
		{"truncated", strconv.FormatBool(d.Truncated)},
	}
	if d.ContentLength != nil {
		pairs = append(pairs, [2]string{"content_length", strconv.FormatInt(*d.ContentLength, 10)})
	}
	if d.ContentURL != nil {
		pairs = append(pairs, [2]string{"content_url", *d.ContentURL})
	}
	if d.ExpiresAt != nil {
		pairs = append(pairs, [2]string{"expires_at", timeText(d.ExpiresAt)})
	}
	for _, w := range d.Warnings {
		pairs = append(pairs, [2]string{"warning", w})
	}
	return pairs
}

// writeText writes s, and a newline unless s is empty or ends in one.
func writeText(w io.Writer, s string) error {
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	_, err := io.WriteString(w, s)
	return err
}
