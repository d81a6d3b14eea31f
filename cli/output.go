package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"golang.org/x/term"
)

// Output formats.
const (
	formatTable = "table"
	formatJSON  = "json"
	formatYAML  = "yaml"
	formatRaw   = "raw"
)

var allFormats = []string{formatTable, formatJSON, formatYAML, formatRaw}

// Annotation keys of a command's output formats.
const (
	annFormats       = "osb.formats"
	annDefaultFormat = "osb.format.default"
)

// formats declares the output formats a command offers, the first being
// its default.
func formats(cmd *cobra.Command, offered ...string) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annFormats] = strings.Join(offered, ",")
	cmd.Annotations[annDefaultFormat] = offered[0]
	return cmd
}

// format returns the output format asked for with -o, checked against
// what cmd offers; def overrides the command's default when not "".
func (a *app) format(cmd *cobra.Command, def string) (string, error) {
	f := strings.ToLower(a.global.output)
	if f == "" {
		f = def
		if f == "" {
			f = cmd.Annotations[annDefaultFormat]
		}
		return f, nil
	}
	if !slices.Contains(allFormats, f) {
		return "", usagef(cmd, "invalid output format %q: want table, json, yaml or raw", a.global.output)
	}
	offered := strings.Split(cmd.Annotations[annFormats], ",")
	if !slices.Contains(offered, f) {
		return "", fmt.Errorf("%s does not offer -o %s; it offers: %s", cmd.CommandPath(), f, strings.Join(offered, ", "))
	}
	return f, nil
}

// printer writes a command's results in one format.
type printer struct {
	out, err io.Writer
	format   string
	color    bool // ANSI colours and symbols on stdout
	errColor bool // the same on stderr
}

// printerFor returns a printer for format ("" for messages only).
func (a *app) printerFor(format string) *printer {
	enabled := !a.global.noColor && a.set.colorSetting() && a.Getenv("NO_COLOR") == "" && a.Getenv("TERM") != "dumb"
	return &printer{
		out: a.Out, err: a.Err, format: format,
		color:    enabled && isTerminal(a.Out),
		errColor: enabled && isTerminal(a.Err),
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// ANSI styles.
const (
	colorRed    = "31"
	colorGreen  = "32"
	colorYellow = "33"
	colorBlue   = "34"
	colorCyan   = "36"
	styleBold   = "1"
	styleDim    = "2"
)

// paint styles s for stderr when colours are on there.
func (p *printer) paint(style, s string) string {
	if !p.errColor {
		return s
	}
	return "\x1b[" + style + "m" + s + "\x1b[0m"
}

// style styles s for stdout when colours are on there.
func (p *printer) style(style, s string) string {
	if !p.color || s == "" {
		return s
	}
	return "\x1b[" + style + "m" + s + "\x1b[0m"
}

// doc writes v as JSON or YAML; for table and raw, table is called.
func (p *printer) doc(v any, table func()) error {
	switch p.format {
	case formatJSON:
		return p.json(v)
	case formatYAML:
		return p.yaml(v)
	}
	table()
	return nil
}

// json writes v indented, one trailing newline.
func (p *printer) json(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = p.out.Write(append(b, '\n'))
	return err
}

// yaml writes v as YAML: the JSON field names, keys sorted, block style.
func (p *printer) yaml(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var generic any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&generic); err != nil {
		return err
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(yamlValue(generic)); err != nil {
		return err
	}
	enc.Close()
	_, err = p.out.Write(buf.Bytes())
	return err
}

// yamlValue turns json.Number into int64 or float64 so YAML shows them
// as numbers.
func yamlValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = yamlValue(e)
		}
	case []any:
		for i, e := range t {
			t[i] = yamlValue(e)
		}
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		f, _ := t.Float64()
		return f
	}
	return v
}

// table writes a titled table; rows hold one cell per header, and
// cellStyle (when set) styles a cell once it is padded. Only the empty
// message is written for no rows.
func (p *printer) table(title string, headers []string, rows [][]string, empty string, cellStyle func(col int, cell string) string) {
	if len(rows) == 0 {
		p.info(empty)
		return
	}
	if title != "" {
		fmt.Fprintln(p.out, p.style(styleBold, title))
	}
	widths := make([]int, len(headers))
	for i, h := range headers {
		widths[i] = utf8.RuneCountInString(h)
	}
	for _, r := range rows {
		for i, c := range r {
			if c == "" {
				r[i] = "-"
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(r[i]))
		}
	}
	line := func(cells []string, style func(int, string) string) {
		var b strings.Builder
		for i, c := range cells {
			last := i == len(cells)-1
			if !last {
				c += strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			}
			if style != nil {
				c = style(i, c)
			}
			b.WriteString(c)
			if !last {
				b.WriteString("  ")
			}
		}
		fmt.Fprintln(p.out, strings.TrimRight(b.String(), " "))
	}
	line(headers, func(_ int, c string) string { return p.style(styleBold, c) })
	for _, r := range rows {
		var style func(int, string) string
		if cellStyle != nil && p.color {
			style = cellStyle
		}
		line(r, style)
	}
}

// kv writes a titled list of key: value lines.
func (p *printer) kv(title string, pairs [][2]string) {
	if title != "" {
		if p.color {
			fmt.Fprintln(p.out, p.style(colorGreen, "✓")+" "+p.style(styleBold, title))
		} else {
			fmt.Fprintln(p.out, title)
		}
	}
	width := 0
	for _, kv := range pairs {
		width = max(width, len(kv[0]))
	}
	for _, kv := range pairs {
		v := kv[1]
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(p.out, "  %-*s  %s\n", width+1, kv[0]+":", v)
	}
}

// statusDoc is a message as a JSON or YAML document.
type statusDoc struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// success reports that something was done.
func (p *printer) success(msg string) {
	switch p.format {
	case formatJSON, formatYAML:
		p.doc(statusDoc{"ok", msg}, nil)
	default:
		if p.color {
			fmt.Fprintln(p.out, p.style(colorGreen, "✓")+" "+msg)
		} else {
			fmt.Fprintln(p.out, "OK: "+msg)
		}
	}
}

// info reports a neutral fact.
func (p *printer) info(msg string) {
	switch p.format {
	case formatJSON, formatYAML:
		p.doc(statusDoc{"info", msg}, nil)
	default:
		if p.color {
			fmt.Fprintln(p.out, p.style(colorBlue, "i")+" "+msg)
		} else {
			fmt.Fprintln(p.out, "INFO: "+msg)
		}
	}
}

// warn reports something the user should know, on stderr (as a document
// on stdout for JSON and YAML).
func (p *printer) warn(msg string) {
	switch p.format {
	case formatJSON, formatYAML:
		p.doc(statusDoc{"warning", msg}, nil)
	default:
		fmt.Fprintln(p.err, p.paint(colorYellow, "Warning:")+" "+msg)
	}
}

// state colours a sandbox or snapshot state (padding kept).
func (p *printer) state(s string) string {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "running", "ready", "healthy":
		return p.style(colorGreen, s)
	case "pending", "creating", "pausing", "stopping":
		return p.style(colorYellow, s)
	case "paused":
		return p.style(colorBlue, s)
	case "failed", "error", "unhealthy":
		return p.style(colorRed, s)
	case "terminated", "deleting":
		return p.style(styleDim, s)
	}
	return s
}
