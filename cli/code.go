package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// codeCommand is `osb code`: stateful interpreters in a sandbox.
func (a *app) codeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "code",
		Short: "Run code in stateful python, javascript, typescript, java, go and bash interpreters",
		Long: `Run code in a sandbox's code interpreter. A context is one interpreter whose
variables, imports and functions stay from one run to the next; without
--context-id, code runs in the language's default context.`,
	}
	ctxCmd := &cobra.Command{Use: "context", Short: "Create, list and delete code contexts"}
	ctxCmd.AddCommand(a.codeContextCreate(), a.codeContextList(), a.codeContextDelete(), a.codeContextDeleteAll())
	cmd.AddCommand(a.codeRun(), ctxCmd, a.codeInterrupt())
	return cmd
}

// codeRunDoc is the document of `osb code run -o json`.
type codeRunDoc struct {
	ContextID      string              `json:"context_id"`
	ExecutionCount int                 `json:"execution_count"`
	Stdout         string              `json:"stdout"`
	Stderr         string              `json:"stderr"`
	Results        []map[string]any    `json:"results"`
	Error          *api.ExecutionError `json:"error"`
	ElapsedMS      int64               `json:"elapsed_ms"`
}

// imageTypes are the MIME types of results that osb saves as files.
var imageTypes = map[string]string{"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}

func (a *app) codeRun() *cobra.Command {
	var (
		language, code, file, contextID, saveDir string
		timeout                                  time.Duration
	)
	cmd := formats(&cobra.Command{
		Use:   "run ID [-l LANGUAGE] [-c CODE | -f FILE]",
		Short: "Run code and stream its output; results and plots come back too",
		Long: `Run code in a code context of a sandbox. The code comes from -c, from -f
(a file, or - for stdin), or from stdin. Output streams as it is produced;
the value of the last expression is printed after it. Images (a plot shown
with plt.show(), a figure as the last expression) are saved with --save DIR,
else listed on stderr.

osb exits 0 when the code ran without error, 1 when it raised (the
traceback goes to stderr), 130 when interrupted with Ctrl-C (the run is
interrupted in the sandbox too).`,
		Example: `  osb code run sb-1 -c 'x = 6 * 7; x'
  osb code run sb-1 -l javascript -c 'const v = [1,2,3].map(n => n * 2); v'
  osb code run sb-1 -f analysis.py --save ./plots
  echo 'import sys; print(sys.version)' | osb code run sb-1`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			src, err := a.codeSource(cmd, code, file)
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			opts := &sdk.CodeOptions{Context: &api.CodeContext{ID: contextID, Language: language}}
			if timeout > 0 {
				opts.Timeout = timeout
			}
			raw := f == formatRaw
			if raw {
				opts.Stdout, opts.Stderr = a.Out, a.Err
			}
			st, err := sb.StreamCode(cmd.Context(), src, opts)
			if err != nil {
				return err
			}
			saved := 0
			res, drainErr := drainCode(st, opts, func(ev api.Event) {
				if ev.Type != api.EventResult || !raw {
					return
				}
				saved += a.showResult(ev.Results, saveDir, saved)
			})
			if cmd.Context().Err() != nil {
				ictx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 5*time.Second)
				defer cancel()
				sb.InterruptCode(ictx, st.ID())
				return &exitError{code: 130, msg: "interrupted; the run in context " + st.ID() + " was interrupted too"}
			}
			if drainErr != nil {
				return drainErr
			}
			if !raw {
				doc := codeRunDoc{ContextID: res.ID, ExecutionCount: res.ExecutionCount, Stdout: res.Stdout, Stderr: res.Stderr,
					Results: res.Results, Error: res.Error, ElapsedMS: res.Elapsed.Milliseconds()}
				if doc.Results == nil {
					doc.Results = []map[string]any{}
				}
				if saveDir != "" {
					for i, r := range res.Results {
						a.saveImages(r, saveDir, i+1)
					}
				}
				if err := a.printerFor(f).doc(doc, nil); err != nil {
					return err
				}
				if res.Error != nil {
					return &exitError{code: 1}
				}
				return nil
			}
			if res.Error != nil {
				tb := strings.Join(res.Error.Traceback, "\n")
				if tb == "" {
					tb = res.Error.EName + ": " + res.Error.EValue
				}
				fmt.Fprintln(a.Err, strings.TrimRight(tb, "\n"))
				return &exitError{code: 1, msg: oneLine(res.Error.EName + ": " + res.Error.EValue)}
			}
			return nil
		},
	}, formatRaw, formatJSON, formatYAML)
	fl := cmd.Flags()
	fl.StringVarP(&language, "language", "l", sdk.LanguagePython, "python, javascript, typescript, java, go or bash")
	fl.StringVarP(&code, "code", "c", "", "the code to run")
	fl.StringVarP(&file, "file", "f", "", "a file with the code to run (- for stdin)")
	fl.StringVar(&contextID, "context-id", "", "run in this context (default: the language's default context)")
	fl.Var(&durationValue{d: &timeout}, "timeout", "interrupt the run after this long, such as 30s")
	fl.StringVar(&saveDir, "save", "", "save image results (plots) into this directory")
	cmd.MarkFlagsMutuallyExclusive("code", "file")
	return cmd
}

// drainCode reads a code stream to its end, passing each event to on.
func drainCode(st *sdk.Stream, opts *sdk.CodeOptions, on func(api.Event)) (*sdk.Execution, error) {
	for {
		ev, err := st.Next()
		if err == io.EOF {
			return st.Result(), nil
		}
		if err != nil {
			return st.Result(), err
		}
		switch ev.Type {
		case api.EventStdout:
			if opts.Stdout != nil {
				io.WriteString(opts.Stdout, ev.Text)
			}
		case api.EventStderr:
			if opts.Stderr != nil {
				io.WriteString(opts.Stderr, ev.Text)
			}
		}
		on(ev)
	}
}

// codeSource reads the code to run from -c, -f or stdin.
func (a *app) codeSource(cmd *cobra.Command, code, file string) (string, error) {
	switch {
	case flagChanged(cmd.Flags(), "code"):
		if strings.TrimSpace(code) == "" {
			return "", usagef(cmd, "-c: the code is empty")
		}
		return code, nil
	case file != "" && file != "-":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("read code: %w", err)
		}
		return string(b), nil
	}
	if f, ok := a.In.(*os.File); ok && isTerminal(f) && file == "" {
		fmt.Fprintln(a.Err, "Reading code from stdin (Ctrl-D to run it):")
	}
	b, err := io.ReadAll(a.In)
	if err != nil {
		return "", fmt.Errorf("read code from stdin: %w", err)
	}
	if strings.TrimSpace(string(b)) == "" {
		return "", usagef(cmd, "no code: give -c CODE, -f FILE, or code on stdin")
	}
	return string(b), nil
}

// showResult prints a result's text on stdout (unless it is an image's)
// and saves or lists its images; it returns how many images it saved.
func (a *app) showResult(r map[string]any, dir string, savedBefore int) int {
	hasImage := false
	for mime := range imageTypes {
		if _, ok := r[mime]; ok {
			hasImage = true
		}
	}
	// An image's text ("<Figure size 640x480 with 1 Axes>") says nothing
	// the image does not.
	if text, ok := r["text"].(string); ok && !hasImage {
		fmt.Fprint(a.Out, text)
		if !strings.HasSuffix(text, "\n") {
			fmt.Fprintln(a.Out)
		}
	}
	if dir != "" {
		return a.saveImages(r, dir, savedBefore+1)
	}
	var kinds []string
	for mime := range r {
		if _, ok := imageTypes[mime]; ok {
			kinds = append(kinds, mime)
		}
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		fmt.Fprintf(a.Err, "[%s result: --save DIR keeps it]\n", k)
	}
	return 0
}

// saveImages writes the image results of r into dir as result-N.EXT and
// says so on stderr; it returns how many it wrote.
func (a *app) saveImages(r map[string]any, dir string, n int) int {
	saved := 0
	for mime, ext := range imageTypes {
		v, ok := r[mime].(string)
		if !ok {
			continue
		}
		data := []byte(v)
		if mime != "image/svg+xml" {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				fmt.Fprintf(a.Err, "Warning: a %s result is not valid base64: %v\n", mime, err)
				continue
			}
			data = b
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintf(a.Err, "Warning: %v\n", err)
			return saved
		}
		path := filepath.Join(dir, fmt.Sprintf("result-%d%s", n+saved, ext))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			fmt.Fprintf(a.Err, "Warning: %v\n", err)
			continue
		}
		fmt.Fprintf(a.Err, "[%s saved to %s]\n", mime, path)
		saved++
	}
	return saved
}

// contextDoc is a code context as osb prints it.
type contextDoc struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
}

func (a *app) codeContextCreate() *cobra.Command {
	var language, cwd string
	cmd := formats(&cobra.Command{
		Use:   "create ID -l LANGUAGE",
		Short: "Start a new interpreter; its id is for code run --context-id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			cc, err := c.Sandbox(args[0]).CreateCodeContext(cmd.Context(), language, cwd)
			if err != nil {
				return err
			}
			doc := contextDoc{cc.ID, cc.Language, cc.Cwd}
			p := a.printerFor(f)
			return p.doc(doc, func() {
				p.kv("Code Context Created", [][2]string{{"id", doc.ID}, {"language", doc.Language}, {"cwd", doc.Cwd}})
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&language, "language", "l", sdk.LanguagePython, "python, javascript, typescript, java, go or bash")
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory of the interpreter (created if missing)")
	return cmd
}

func (a *app) codeContextList() *cobra.Command {
	var language string
	cmd := formats(&cobra.Command{
		Use:   "list ID [-l LANGUAGE]",
		Short: "List the code contexts of a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			list, err := c.Sandbox(args[0]).CodeContexts(cmd.Context(), language)
			if err != nil {
				return err
			}
			docs := make([]contextDoc, 0, len(list))
			rows := make([][]string, 0, len(list))
			for _, cc := range list {
				docs = append(docs, contextDoc{cc.ID, cc.Language, cc.Cwd})
				rows = append(rows, []string{cc.ID, cc.Language})
			}
			p := a.printerFor(f)
			return p.doc(docs, func() {
				p.table("Code Contexts", []string{"ID", "LANGUAGE"}, rows, "No code contexts.", nil)
			})
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&language, "language", "l", "", "only this language")
	return cmd
}

// deletedRow is one row of a delete.
type deletedRow struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

func (a *app) codeContextDelete() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "delete ID CONTEXT_ID...",
		Short: "End code contexts and free their interpreters",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			sb := c.Sandbox(args[0])
			rows := []deletedRow{}
			var failed []error
			for _, id := range args[1:] {
				if err := sb.DeleteCodeContext(cmd.Context(), id); err != nil {
					failed = append(failed, err)
					continue
				}
				rows = append(rows, deletedRow{id, "deleted"})
			}
			p := a.printerFor(f)
			table := make([][]string, len(rows))
			for i, r := range rows {
				table[i] = []string{r.ID, r.Status}
			}
			if len(rows) > 0 || f != formatTable {
				p.doc(rows, func() { p.table("Deleted Code Contexts", []string{"ID", "STATUS"}, table, "", nil) })
			}
			return joinErrors(failed)
		},
	}, formatTable, formatJSON, formatYAML)
}

func (a *app) codeContextDeleteAll() *cobra.Command {
	var language string
	cmd := formats(&cobra.Command{
		Use:   "delete-all ID -l LANGUAGE",
		Short: "End every code context of a language",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.Sandbox(args[0]).DeleteCodeContexts(cmd.Context(), language); err != nil {
				return err
			}
			a.printerFor(f).success("Deleted every " + language + " context of " + args[0])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
	cmd.Flags().StringVarP(&language, "language", "l", "", "the language whose contexts end")
	cmd.MarkFlagRequired("language")
	return cmd
}

func (a *app) codeInterrupt() *cobra.Command {
	return formats(&cobra.Command{
		Use:   "interrupt ID CONTEXT_ID",
		Short: "Interrupt the code running in a context; the context stays usable",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := a.format(cmd, "")
			if err != nil {
				return err
			}
			c, err := a.sdkClient()
			if err != nil {
				return err
			}
			if err := c.Sandbox(args[0]).InterruptCode(cmd.Context(), args[1]); err != nil {
				return err
			}
			a.printerFor(f).success("Interrupted: " + args[1])
			return nil
		},
	}, formatTable, formatJSON, formatYAML)
}
