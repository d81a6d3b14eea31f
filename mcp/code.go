package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// Code run time limits, in seconds.
const (
	defaultCodeTimeout = 300
	maxCodeTimeout     = 3600
)

// maxImageBytes bounds one image returned to the model; model APIs
// refuse bigger ones. A call returns at most maxImages images and
// maxAllImageBytes in all, and its results' texts at most resultBudget
// times the output limit: one answer must fit the 16 MiB a client takes
// in one message, and a model's context.
const (
	maxImageBytes    = 5 << 20
	maxImages        = 8
	maxAllImageBytes = 8 << 20
	resultBudget     = 4
)

var codeLanguages = []string{sdk.LanguagePython, sdk.LanguageJavaScript, sdk.LanguageBash}

type codeInput struct {
	SandboxArg
	Code           string `json:"code" jsonschema:"the code to run, one cell: several lines, defining and calling as needed"`
	Language       string `json:"language,omitempty" jsonschema:"python, javascript, typescript, java, go or bash"`
	ContextID      string `json:"context_id,omitempty" jsonschema:"run in this context (from code_context_create); default: the language's default context, shared by every call without context_id"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"interrupt the run after this many seconds; the context stays usable"`
	MaxOutputChars int    `json:"max_output_chars,omitempty" jsonschema:"characters kept of stdout, of stderr and of each result; longer ones keep their first and last lines"`
}

// CodeOutput is the outcome of a code run. Images are returned as image
// content, not here.
type CodeOutput struct {
	ContextID      string       `json:"context_id"`
	ExecutionCount int          `json:"execution_count,omitempty"`
	Stdout         string       `json:"stdout"`
	Stderr         string       `json:"stderr"`
	Results        []CodeResult `json:"results"`
	Error          *CodeError   `json:"error,omitempty" jsonschema:"the exception the code raised, if any"`
	DurationMS     int64        `json:"duration_ms"`
}

// CodeResult is one displayed value: its text form and the MIME types
// it came in.
type CodeResult struct {
	Text      string   `json:"text,omitempty"`
	MIMETypes []string `json:"mime_types"`
}

// CodeError is an exception raised by the code.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback,omitempty"`
}

type contextCreateInput struct {
	SandboxArg
	Language string `json:"language" jsonschema:"python, javascript, typescript, java, go or bash"`
	Cwd      string `json:"cwd,omitempty" jsonschema:"working directory of the interpreter, created if missing"`
}

// ContextInfo is a code context.
type ContextInfo struct {
	ContextID string `json:"context_id"`
	Language  string `json:"language"`
	Cwd       string `json:"cwd,omitempty"`
}

type contextListInput struct {
	SandboxArg
	Language string `json:"language,omitempty" jsonschema:"only contexts of this language"`
}

// ContextList is the code contexts of a sandbox.
type ContextList struct {
	Contexts []ContextInfo `json:"contexts"`
}

type contextDeleteInput struct {
	SandboxArg
	ContextID string `json:"context_id" jsonschema:"id of the context to end"`
}

func (in codeInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if strings.TrimSpace(in.Code) == "" {
		return argErrorf("code is empty")
	}
	return nil
}

func (s *Server) addCodeTools() {
	add(s, &gomcp.Tool{
		Name: "code_run",
		Description: `Run code in a stateful interpreter in a sandbox, as in a notebook cell: variables, imports and functions stay for the next code_run in the same context.
Returns printed output, the value of the last expression, and the traceback of an exception. Plots (matplotlib plt.show(), a figure as last expression) and other PNG/JPEG images come back as images.
Languages: python (default), javascript, bash. Needs a sandbox whose image has the interpreters (such as opensandbox/code-interpreter).
For a fresh, separate interpreter create one with code_context_create and pass its context_id.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Run code", DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	}, s.runCode,
		enum("language", codeLanguages...), defaultValue("language", `"python"`),
		between("timeout_seconds", 1, maxCodeTimeout), defaultValue("timeout_seconds", fmt.Sprint(defaultCodeTimeout)))

	add(s, &gomcp.Tool{
		Name:        "code_context_create",
		Description: "Start a new, empty interpreter (code context) in a sandbox and return its context_id, for code_run. Use one per independent task so that their variables do not mix.",
		Annotations: &gomcp.ToolAnnotations{Title: "Create code context", DestructiveHint: ptr(false)},
	}, func(ctx context.Context, in contextCreateInput) (*gomcp.CallToolResult, ContextInfo, error) {
		sb, err := s.running(ctx, in.SandboxID)
		if err != nil {
			return nil, ContextInfo{}, err
		}
		cc, err := sb.CreateCodeContext(ctx, in.Language, in.Cwd)
		if err != nil {
			return nil, ContextInfo{}, err
		}
		return nil, ContextInfo{ContextID: cc.ID, Language: cc.Language, Cwd: cmpOr(cc.Cwd, in.Cwd)}, nil
	}, enum("language", codeLanguages...))

	add(s, &gomcp.Tool{
		Name:        "code_context_list",
		Description: "List the code contexts (interpreters) of a sandbox with their languages.",
		Annotations: &gomcp.ToolAnnotations{Title: "List code contexts", ReadOnlyHint: true},
	}, func(ctx context.Context, in contextListInput) (*gomcp.CallToolResult, ContextList, error) {
		sb, err := s.running(ctx, in.SandboxID)
		if err != nil {
			return nil, ContextList{}, err
		}
		list, err := sb.CodeContexts(ctx, in.Language)
		if err != nil {
			return nil, ContextList{}, err
		}
		out := ContextList{Contexts: make([]ContextInfo, 0, len(list))}
		for _, cc := range list {
			out.Contexts = append(out.Contexts, ContextInfo{ContextID: cc.ID, Language: cc.Language, Cwd: cc.Cwd})
		}
		return nil, out, nil
	}, enum("language", codeLanguages...))

	add(s, &gomcp.Tool{
		Name:        "code_context_delete",
		Description: "End a code context and free its interpreter; its variables are lost.",
		Annotations: &gomcp.ToolAnnotations{Title: "Delete code context", DestructiveHint: ptr(true), IdempotentHint: true},
	}, func(ctx context.Context, in contextDeleteInput) (*gomcp.CallToolResult, DoneOutput, error) {
		sb, err := s.running(ctx, in.SandboxID)
		if err != nil {
			return nil, DoneOutput{}, err
		}
		if err := sb.DeleteCodeContext(ctx, in.ContextID); err != nil {
			return nil, DoneOutput{}, err
		}
		return done("code context %s deleted", in.ContextID)
	})
}

func (s *Server) runCode(ctx context.Context, in codeInput) (*gomcp.CallToolResult, CodeOutput, error) {
	limit := cmpInt(in.MaxOutputChars, s.cfg.MaxOutput)
	timeout := time.Duration(cmpInt(in.TimeoutSeconds, defaultCodeTimeout)) * time.Second
	stdout, stderr := newClip(limit), newClip(limit)
	var id string
	opts := &sdk.CodeOptions{
		Context: &api.CodeContext{ID: in.ContextID, Language: cmpOr(in.Language, sdk.LanguagePython)},
		Stdout:  stdout, Stderr: stderr, Timeout: timeout,
		OnEvent: func(ev api.Event) {
			if ev.Type == api.EventInit {
				id = ev.Text
			}
		},
	}
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, CodeOutput{}, err
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	res, err := sb.RunCode(rctx, in.Code, opts)
	if err != nil {
		if id != "" && rctx.Err() != nil {
			s.interrupt(ctx, sb, id, sb.InterruptCode)
		}
		if errors.Is(err, sdk.ErrNotSupported) {
			return nil, CodeOutput{}, withHint(err, fmt.Sprintf("This sandbox's image lacks the %s interpreter: create a sandbox from an image that has it (such as opensandbox/code-interpreter).", opts.Context.Language))
		}
		return nil, CodeOutput{}, err
	}
	out := CodeOutput{ContextID: cmpOr(res.ID, id), ExecutionCount: res.ExecutionCount, Stdout: stdout.String(), Stderr: stderr.String(),
		Results: []CodeResult{}, DurationMS: time.Since(start).Milliseconds()}
	if res.Error != nil {
		out.Error = &CodeError{Name: res.Error.EName, Value: stripANSI(res.Error.EValue)}
		tb, _ := truncate(stripANSI(strings.Join(res.Error.Traceback, "\n")), limit)
		out.Error.Traceback = tb
	}
	var images []gomcp.Content
	var notes []string
	for _, r := range res.Results {
		cr, imgs, note := s.codeResult(r, limit)
		out.Results = append(out.Results, cr)
		images = append(images, imgs...)
		notes = append(notes, note...)
	}
	images, notes = capImages(images, notes)
	notes = capResultTexts(out.Results, limit, notes)
	content := append([]gomcp.Content{&gomcp.TextContent{Text: codeText(out, stdout.Truncated(), stderr.Truncated(), len(images), notes)}}, images...)
	return &gomcp.CallToolResult{Content: content}, out, nil
}

// codeResult turns one result event into its text, its images for the
// model, and notes on what could not be returned.
func (s *Server) codeResult(r map[string]any, limit int) (CodeResult, []gomcp.Content, []string) {
	var cr CodeResult
	var images []gomcp.Content
	var notes []string
	for mime := range r {
		cr.MIMETypes = append(cr.MIMETypes, mime)
	}
	slices.Sort(cr.MIMETypes)
	hasImage := false
	for _, mime := range cr.MIMETypes {
		switch {
		case modelImageTypes[mime]:
			b64, _ := r[mime].(string)
			data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
			switch {
			case err != nil:
				notes = append(notes, fmt.Sprintf("a %s result was not valid base64: %v", mime, err))
			case len(data) > maxImageBytes:
				notes = append(notes, fmt.Sprintf("a %s image of %d bytes is too big to return (limit %d); save it to a file and make it smaller", mime, len(data), maxImageBytes))
			default:
				images = append(images, &gomcp.ImageContent{MIMEType: mime, Data: data})
				hasImage = true
			}
		case strings.HasPrefix(mime, "image/"):
			notes = append(notes, fmt.Sprintf("a %s image was produced but cannot be shown; display it as PNG instead", mime))
			hasImage = true
		}
	}
	// An image's text ("<Figure size 640x480 with 1 Axes>") says nothing
	// the image does not.
	t, isText := r["text"].(string)
	if isText && strings.HasPrefix(t, "<") && strings.HasSuffix(t, " object>") {
		// A bare repr ("<IPython.core.display.HTML object>") says nothing;
		// a richer text of the same result does.
		for _, mime := range []string{"text/markdown", "text/html", "text/latex"} {
			if _, ok := r[mime].(string); ok {
				isText = false
				break
			}
		}
	}
	switch {
	case isText:
		if !hasImage {
			cr.Text, _ = truncate(stripANSI(t), limit)
		}
	default:
		if hasImage {
			break
		}
		for _, mime := range []string{"text/markdown", "text/html", "application/json", "text/latex"} {
			if v, ok := r[mime]; ok {
				str, isStr := v.(string)
				if !isStr {
					b, _ := json.Marshal(v)
					str = string(b)
				}
				cr.Text, _ = truncate(str, limit)
				break
			}
		}
	}
	if cr.MIMETypes == nil {
		cr.MIMETypes = []string{}
	}
	return cr, images, notes
}

// codeText is a code run's outcome as the model reads it.
func codeText(o CodeOutput, outTrunc, errTrunc bool, images int, notes []string) string {
	var b strings.Builder
	if o.Stdout != "" {
		section(&b, "stdout", o.Stdout, outTrunc)
	}
	section(&b, "stderr", o.Stderr, errTrunc)
	for _, r := range o.Results {
		if r.Text != "" {
			fmt.Fprintf(&b, "--- result ---\n%s\n", strings.TrimRight(r.Text, "\n"))
		}
	}
	if images > 0 {
		fmt.Fprintf(&b, "[%d image(s) attached]\n", images)
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "[%s]\n", n)
	}
	if o.Error != nil {
		fmt.Fprintf(&b, "--- error: %s: %s ---\n", o.Error.Name, o.Error.Value)
		if o.Error.Traceback != "" {
			fmt.Fprintf(&b, "%s\n", strings.TrimRight(o.Error.Traceback, "\n"))
		}
	}
	if b.Len() == 0 {
		b.WriteString("(no output)\n")
	}
	fmt.Fprintf(&b, "context_id: %s", o.ContextID)
	return b.String()
}

// capImages keeps the first images within maxImages and maxAllImageBytes,
// and says how many were left out.
func capImages(images []gomcp.Content, notes []string) ([]gomcp.Content, []string) {
	var kept []gomcp.Content
	total, dropped := 0, 0
	for _, c := range images {
		img, ok := c.(*gomcp.ImageContent)
		if !ok {
			continue
		}
		if len(kept) >= maxImages || total+len(img.Data) > maxAllImageBytes {
			dropped++
			continue
		}
		total += len(img.Data)
		kept = append(kept, c)
	}
	if dropped > 0 {
		notes = append(notes, fmt.Sprintf("%d more images were produced and not returned (at most %d images, %d MiB in all, per call): save them to files and read them with file_read", dropped, maxImages, maxAllImageBytes>>20))
	}
	return kept, notes
}

// capResultTexts empties the texts of the results beyond resultBudget
// times limit characters in all, and says how many.
func capResultTexts(results []CodeResult, limit int, notes []string) []string {
	total, dropped := 0, 0
	for i := range results {
		n := len(results[i].Text)
		if total+n > resultBudget*limit {
			if n > 0 {
				results[i].Text = ""
				dropped++
			}
			continue
		}
		total += n
	}
	if dropped > 0 {
		notes = append(notes, fmt.Sprintf("the texts of %d more results were left out (%d characters of results per call): print less, or write them to a file", dropped, resultBudget*limit))
	}
	return notes
}
