package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	gomcp "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/sdk"
)

// File read limits, in bytes.
const (
	defaultReadBytes = 100_000
	// maxReadBytes bounds one read: its text travels twice (as text and
	// as structured content) and JSON may escape a byte as six, which must
	// stay under the 16 MiB a client takes in one message.
	maxReadBytes = 1 << 20
	// maxListEntries bounds the entries file_list and file_search return.
	maxListEntries = 1000
)

// modelImageTypes are the image types returned to the model as images.
var modelImageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

type readInput struct {
	SandboxArg
	Path     string `json:"path" jsonschema:"absolute path of the file in the sandbox"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"byte offset to start reading at, to read a big file in parts"`
	Line     int64  `json:"line,omitempty" jsonschema:"read whole lines of a text file from this line (1 is the first); instead of offset"`
	Lines    int64  `json:"lines,omitempty" jsonschema:"read at most this many lines (from line, or from line 1); default: as many as max_bytes and max_output_chars hold"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"at most this many bytes are read; text and base64 are bounded by max_output_chars too"`
	Encoding string `json:"encoding,omitempty" jsonschema:"auto: text as text, PNG/JPEG/GIF/WebP as an image, other binary files described but not shown; text: always as text; base64: the bytes in base64"`
}

// ReadOutput is (part of) a file.
type ReadOutput struct {
	Path       string `json:"path"`
	Size       int64  `json:"size" jsonschema:"size of the whole file in bytes"`
	Offset     int64  `json:"offset"`
	BytesRead  int    `json:"bytes_read"`
	Encoding   string `json:"encoding" jsonschema:"text, base64, image (returned as image content) or binary (not returned)"`
	MIMEType   string `json:"mime_type"`
	Content    string `json:"content,omitempty"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"the file goes on after what was read"`
	NextOffset int64  `json:"next_offset,omitempty" jsonschema:"offset to read on from, when truncated"`
	Line       int64  `json:"line,omitempty" jsonschema:"for a read by lines: the first line read"`
	LinesRead  int64  `json:"lines_read,omitempty" jsonschema:"for a read by lines: how many lines content holds"`
	NextLine   int64  `json:"next_line,omitempty" jsonschema:"for a read by lines: the line to pass as line to read on, when more lines follow"`
}

type writeInput struct {
	SandboxArg
	Path     string `json:"path" jsonschema:"absolute path of the file; missing parent directories are created; an existing file is replaced"`
	Content  string `json:"content,omitempty" jsonschema:"the whole new content of the file"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (content is written as is) or base64 (content is decoded first, for binary files)"`
	Mode     string `json:"mode,omitempty" jsonschema:"permission bits in octal such as 644 or 755; default: an existing file keeps its own"`
}

// WriteOutput confirms a write.
type WriteOutput struct {
	Path         string `json:"path"`
	BytesWritten int    `json:"bytes_written"`
}

type listDirInput struct {
	SandboxArg
	Path   string `json:"path" jsonschema:"absolute path of the directory"`
	Depth  int    `json:"depth,omitempty" jsonschema:"levels to descend: 1 lists the directory's own entries"`
	Offset int    `json:"offset,omitempty" jsonschema:"entries to skip: next_offset of the previous call, to read the next page"`
}

type searchInput struct {
	SandboxArg
	Path    string `json:"path" jsonschema:"absolute path of the directory to search under"`
	Pattern string `json:"pattern" jsonschema:"glob matched against file names, such as *.py; with a / it is matched against the path under path, and ** crosses directories (src/**/*.go)"`
	Offset  int    `json:"offset,omitempty" jsonschema:"matches to skip: next_offset of the previous call, to read the next page"`
}

// FileEntry is one file or directory.
type FileEntry struct {
	Path       string    `json:"path"`
	Type       string    `json:"type" jsonschema:"file, directory, symlink or other"`
	Size       int64     `json:"size"`
	Mode       string    `json:"mode" jsonschema:"permission bits in octal"`
	ModifiedAt time.Time `json:"modified_at"`
}

// ListDirOutput is one page of the entries of a listing or search.
type ListDirOutput struct {
	Entries    []FileEntry `json:"entries" jsonschema:"this page's entries"`
	Total      int         `json:"total" jsonschema:"entries in the whole listing"`
	Offset     int         `json:"offset" jsonschema:"entries skipped before this page"`
	Truncated  bool        `json:"truncated,omitempty" jsonschema:"more entries follow this page"`
	NextOffset int         `json:"next_offset,omitempty" jsonschema:"pass as offset to read the next page, when truncated"`
}

type moveInput struct {
	SandboxArg
	Source      string `json:"source" jsonschema:"absolute path of the file or directory to move"`
	Destination string `json:"destination" jsonschema:"absolute path it gets; an existing file there is replaced"`
}

type deleteInput struct {
	SandboxArg
	Path      string `json:"path" jsonschema:"absolute path of the file or directory"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"must be true to delete a directory with everything in it"`
}

// checkPath rejects a path the sandbox would not read as meant.
func checkPath(name, p string) error {
	switch {
	case strings.TrimSpace(p) == "":
		return argErrorf("%s is empty", name)
	case !strings.HasPrefix(p, "/"):
		return argErrorf("%s %q is relative: give an absolute path, such as /tmp/%s", name, p, strings.TrimPrefix(p, "./"))
	case strings.ContainsRune(p, 0):
		return argErrorf("%s contains a NUL byte", name)
	}
	return nil
}

func (in readInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if in.Offset < 0 {
		return argErrorf("offset %d: must be 0 or more", in.Offset)
	}
	if in.byLines() {
		switch {
		case in.Line < 0 || in.Lines < 0:
			return argErrorf("line and lines must be 1 or more")
		case in.Offset != 0:
			return argErrorf("offset counts bytes and line counts lines: pass one of them, not both")
		case in.Encoding == "base64":
			return argErrorf("a read by lines is text: leave out encoding base64, or read by offset")
		}
	}
	return checkPath("path", in.Path)
}

func (in writeInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if _, err := parseMode(in.Mode); err != nil {
		return err
	}
	return checkPath("path", in.Path)
}

func (in listDirInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	return checkPath("path", in.Path)
}

func (in searchInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	return checkPath("path", in.Path)
}

func (in moveInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if err := checkPath("source", in.Source); err != nil {
		return err
	}
	return checkPath("destination", in.Destination)
}

func (in deleteInput) validate() error {
	if err := requireID(in.SandboxID); err != nil {
		return err
	}
	if err := checkPath("path", in.Path); err != nil {
		return err
	}
	if path.Clean(in.Path) == "/" {
		return argErrorf("refusing to delete /; kill the sandbox with sandbox_kill instead")
	}
	return nil
}

// parseMode reads octal permission bits ("644", "0755", "4755"); "" is 0.
func parseMode(s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 8, 32)
	if err != nil || n > 0o7777 {
		return 0, argErrorf("mode %q: want octal permission bits such as 644 or 755", s)
	}
	return uint32(n), nil
}

func (s *Server) addFileTools() {
	add(s, &gomcp.Tool{
		Name: "file_read",
		Description: `Read a file of a sandbox. Text comes back as text; PNG, JPEG, GIF and WebP images as images; other binary files are described unless encoding is base64.
At most max_bytes are read from offset, and text no longer than max_output_chars: for a bigger file the result says so and gives next_offset to read on.
To page through a text file by lines, pass line (1-based) and lines instead of offset: whole lines come back, and when more follow the result gives next_line to pass as line. To look for something in a large file, command_run with grep is often better.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Read file", ReadOnlyHint: true},
	}, s.readFile,
		enum("encoding", "auto", "text", "base64"), defaultValue("encoding", `"auto"`),
		between("max_bytes", 1, maxReadBytes), defaultValue("max_bytes", fmt.Sprint(defaultReadBytes)),
		between("offset", 0, 1<<53), between("line", 1, 1<<53), between("lines", 1, 1<<53))

	add(s, &gomcp.Tool{
		Name: "file_write",
		Description: `Write a file in a sandbox, replacing it whole if it exists (atomically: readers see the old or the new content, never a mix). Missing parent directories are created.
For binary content pass it in base64 with encoding base64. The content travels in the call itself, so keep it under a few megabytes; produce bigger data inside the sandbox (command_run) instead.`,
		Annotations: &gomcp.ToolAnnotations{Title: "Write file", DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.writeFile,
		enum("encoding", "text", "base64"), defaultValue("encoding", `"text"`))

	add(s, &gomcp.Tool{
		Name:        "file_list",
		Description: fmt.Sprintf("List a directory of a sandbox: each entry's type, size, mode, modification time and path. depth > 1 descends into subdirectories. Entries come in pages (at most %d, and as many as fit max_output_chars); a page that is not the last says so and gives next_offset to pass as offset.", maxListEntries),
		Annotations: &gomcp.ToolAnnotations{Title: "List directory", ReadOnlyHint: true},
	}, s.listDir, between("depth", 1, 20), defaultValue("depth", "1"), between("offset", 0, 1<<31))

	add(s, &gomcp.Tool{
		Name:        "file_search",
		Description: fmt.Sprintf("Find files under a directory of a sandbox by a glob on their names (*.py) or paths (src/**/test_*.py). Searches names, not contents: for contents use command_run with grep. Matches come in pages (at most %d, and as many as fit max_output_chars); a page that is not the last says so and gives next_offset to pass as offset.", maxListEntries),
		Annotations: &gomcp.ToolAnnotations{Title: "Search files", ReadOnlyHint: true},
	}, s.searchFiles, between("offset", 0, 1<<31))

	add(s, &gomcp.Tool{
		Name:        "file_move",
		Description: "Move or rename a file or directory in a sandbox. An existing file at the destination is replaced.",
		Annotations: &gomcp.ToolAnnotations{Title: "Move file", DestructiveHint: ptr(true)},
	}, func(ctx context.Context, in moveInput) (*gomcp.CallToolResult, DoneOutput, error) {
		sb, err := s.running(ctx, in.SandboxID)
		if err != nil {
			return nil, DoneOutput{}, err
		}
		if err := sb.Move(ctx, in.Source, in.Destination); err != nil {
			return nil, DoneOutput{}, err
		}
		return done("moved %s to %s", in.Source, in.Destination)
	})

	add(s, &gomcp.Tool{
		Name:        "file_delete",
		Description: "Delete a file, or with recursive true a directory and everything in it, in a sandbox. It cannot be undone.",
		Annotations: &gomcp.ToolAnnotations{Title: "Delete file", DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.deleteFile)
}

func (s *Server) readFile(ctx context.Context, in readInput) (*gomcp.CallToolResult, ReadOutput, error) {
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, ReadOutput{}, err
	}
	info, err := stat(ctx, sb, in.Path)
	if err != nil {
		return nil, ReadOutput{}, err
	}
	if info.Type == "directory" {
		return nil, ReadOutput{}, argErrorf("%s is a directory: list it with file_list", in.Path)
	}
	if in.byLines() {
		return readLines(ctx, sb, in, info)
	}
	limit := cmpInt(in.MaxBytes, defaultReadBytes)
	data, err := readRange(ctx, sb, in.Path, in.Offset, limit)
	if err != nil {
		return nil, ReadOutput{}, err
	}
	sizeUnknown := false
	if end := in.Offset + int64(len(data)); end > info.Size {
		// The size was a symbolic link's, not its target's: what was read
		// is all that is known, and a full read may have more after it.
		sizeUnknown = true
		info.Size = end
		if len(data) >= limit {
			info.Size = end + 1
		}
	}
	out := ReadOutput{Path: in.Path, Size: info.Size, Offset: in.Offset, MIMEType: http.DetectContentType(data)}
	enc := cmpOr(in.Encoding, "auto")
	kind := enc
	if enc == "auto" {
		switch {
		case modelImageTypes[out.MIMEType] && in.Offset == 0:
			kind = "image"
		case looksText(data):
			kind = "text"
		default:
			kind = "binary"
		}
	}
	// Text and base64 travel as text: the call's output budget bounds
	// them (an image goes as image content, whole).
	switch kind {
	case "text":
		data = data[:min(len(data), budget(ctx))]
	case "base64":
		data = data[:min(len(data), budget(ctx)/4*3)]
	}
	if kind == "text" {
		data = trimPartialRune(data, in.Offset+int64(len(data)) < info.Size)
	}
	out.BytesRead = len(data)
	if end := in.Offset + int64(len(data)); end < info.Size {
		out.Truncated, out.NextOffset = true, end
	}
	out.Encoding = kind
	switch kind {
	case "image":
		if out.Truncated {
			return nil, ReadOutput{}, argErrorf("%s is a %s image of %d bytes, more than max_bytes %d: pass max_bytes %d or more (at most %d)",
				in.Path, out.MIMEType, info.Size, limit, info.Size, maxReadBytes)
		}
		return &gomcp.CallToolResult{Content: []gomcp.Content{
			&gomcp.TextContent{Text: fmt.Sprintf("%s: %s image, %d bytes", in.Path, out.MIMEType, info.Size)},
			&gomcp.ImageContent{MIMEType: out.MIMEType, Data: data},
		}}, out, nil
	case "binary":
		return text(fmt.Sprintf("%s is a binary file (%d bytes, detected type %s) and was not returned. Pass encoding base64 to get its bytes (max_bytes at a time, from offset), or inspect it with command_run (file, head -c, xxd).",
			in.Path, info.Size, out.MIMEType)), out, nil
	case "base64":
		out.Content = base64.StdEncoding.EncodeToString(data)
	default:
		out.Content = strings.ToValidUTF8(string(data), "\uFFFD")
	}
	body := out.Content
	switch {
	case out.Truncated && sizeUnknown:
		body += fmt.Sprintf("\n[... the file may continue (it is reached through a symbolic link, whose size says nothing of it); call file_read with offset %d to read on ...]", out.NextOffset)
	case out.Truncated:
		body += fmt.Sprintf("\n[... file continues: %d more bytes; call file_read with offset %d to read on ...]", info.Size-out.NextOffset, out.NextOffset)
	}
	return text(body), out, nil
}

// byLines reports whether the read is by lines rather than by bytes.
func (in readInput) byLines() bool { return in.Line != 0 || in.Lines != 0 }

// readLines answers a file_read by lines: whole lines from in.Line, at
// most in.Lines of them and at most max_bytes, with next_line when more
// follow. One line more than asked is requested, so that the end of the
// file is told apart from the end of the window. A first line longer than
// max_bytes comes back cut (at a character boundary), and the read goes on
// at the line after it.
func readLines(ctx context.Context, sb *sdk.Sandbox, in readInput, info api.FileInfo) (*gomcp.CallToolResult, ReadOutput, error) {
	start := max(in.Line, 1)
	// Whole lines within max_bytes and within the call's output budget
	// (a character is at least a byte, so the bytes bound the characters).
	limit := min(cmpInt(in.MaxBytes, defaultReadBytes), budget(ctx))
	var ask int64 // 0: to the end of the file
	if in.Lines > 0 && in.Lines < 1<<62 {
		ask = in.Lines + 1
	}
	fr, err := sb.DownloadLines(ctx, in.Path, start, ask)
	if err != nil {
		return nil, ReadOutput{}, err
	}
	defer fr.Close()
	data, err := io.ReadAll(io.LimitReader(fr, int64(limit)+1))
	if err != nil {
		return nil, ReadOutput{}, fmt.Errorf("read %s: %w", in.Path, err)
	}
	// Keep whole lines within the budget and the count; a piece without
	// a newline is a whole line only when it ends the file.
	end, n := 0, int64(0)
	for end < len(data) && (in.Lines == 0 || n < in.Lines) {
		next := len(data)
		if i := bytes.IndexByte(data[end:], '\n'); i >= 0 {
			next = end + i + 1
		}
		if next > limit {
			break
		}
		end, n = next, n+1
	}
	more := end < len(data)
	out := ReadOutput{Path: in.Path, Size: info.Size, Line: start, Encoding: "text"}
	kept := data[:end]
	note := ""
	switch {
	case n == 0 && more:
		// The first line alone is longer than the budget.
		kept = trimPartialRune(data[:min(len(data), limit)], true)
		n = 1
		note = fmt.Sprintf("\n[... line %d is longer than %d bytes (max_bytes or max_output_chars) and was cut; call file_read with line %d to read on, or read the line by offset ...]", start, limit, start+1)
	case more:
		note = fmt.Sprintf("\n[... more lines follow; call file_read with line %d to read on ...]", start+n)
	case n == 0 && start > 1:
		note = fmt.Sprintf("[the file has fewer than %d lines: nothing to read from line %d]", start, start)
	}
	out.MIMEType = http.DetectContentType(kept)
	if cmpOr(in.Encoding, "auto") == "auto" && bytes.IndexByte(kept, 0) >= 0 {
		return text(fmt.Sprintf("%s is a binary file (%d bytes, detected type %s) and was not returned. Pass encoding base64 to get its bytes by offset, or inspect it with command_run (file, head -c, xxd).",
			in.Path, info.Size, out.MIMEType)), ReadOutput{Path: in.Path, Size: info.Size, Line: start, Encoding: "binary", MIMEType: out.MIMEType}, nil
	}
	out.Content = strings.ToValidUTF8(string(kept), "\uFFFD")
	out.BytesRead, out.LinesRead = len(kept), n
	if more {
		out.Truncated, out.NextLine = true, start+n
	}
	return text(out.Content + note), out, nil
}

// stat describes one path, with a not-found error that names it.
func stat(ctx context.Context, sb *sdk.Sandbox, p string) (api.FileInfo, error) {
	infos, err := sb.Stat(ctx, p)
	if err != nil {
		return api.FileInfo{}, err
	}
	info, ok := infos[p]
	if !ok {
		return api.FileInfo{}, fmt.Errorf("stat %s: the sandbox did not describe it", p)
	}
	return info, nil
}

// readRange reads at most limit bytes of a file from offset.
func readRange(ctx context.Context, sb *sdk.Sandbox, p string, offset int64, limit int) ([]byte, error) {
	fr, err := sb.DownloadRange(ctx, p, offset, int64(limit))
	var ae *sdk.APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		return nil, nil // offset at or past the end
	} else if err != nil {
		return nil, err
	}
	defer fr.Close()
	data, err := io.ReadAll(io.LimitReader(fr, int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return data, nil
}

// looksText reports whether data reads as text: UTF-8 (a character cut
// at the end aside) without NUL bytes.
func looksText(data []byte) bool {
	if bytes.IndexByte(data, 0) >= 0 {
		return false
	}
	return utf8.Valid(trimPartialRune(data, true))
}

// trimPartialRune drops an incomplete UTF-8 sequence at the end of data
// when more of the file follows it.
func trimPartialRune(data []byte, more bool) []byte {
	if !more {
		return data
	}
	for i := 1; i <= 3 && i <= len(data); i++ {
		b := data[len(data)-i]
		if utf8.RuneStart(b) {
			if !utf8.FullRune(data[len(data)-i:]) {
				return data[:len(data)-i]
			}
			break
		}
	}
	return data
}

func (s *Server) writeFile(ctx context.Context, in writeInput) (*gomcp.CallToolResult, WriteOutput, error) {
	data := []byte(in.Content)
	if in.Encoding == "base64" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(strings.TrimSpace(in.Content)); err != nil {
			return nil, WriteOutput{}, argErrorf("content is not valid base64: %v", err)
		}
	}
	mode, _ := parseMode(in.Mode)
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, WriteOutput{}, err
	}
	if err := sb.Upload(ctx, sdk.UploadFile{Path: in.Path, Content: bytes.NewReader(data), Mode: modeBits(mode)}); err != nil {
		return nil, WriteOutput{}, err
	}
	out := WriteOutput{Path: in.Path, BytesWritten: len(data)}
	return text(fmt.Sprintf("wrote %d bytes to %s", len(data), in.Path)), out, nil
}

func (s *Server) listDir(ctx context.Context, in listDirInput) (*gomcp.CallToolResult, ListDirOutput, error) {
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, ListDirOutput{}, err
	}
	infos, err := sb.ListDir(ctx, in.Path, cmpInt(in.Depth, 1))
	if err != nil {
		return nil, ListDirOutput{}, err
	}
	out, txt := listing(infos, in.Offset, budget(ctx), "file_list", "empty directory")
	return text(txt), out, nil
}

func (s *Server) searchFiles(ctx context.Context, in searchInput) (*gomcp.CallToolResult, ListDirOutput, error) {
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, ListDirOutput{}, err
	}
	infos, err := sb.Search(ctx, in.Path, in.Pattern)
	if err != nil {
		return nil, ListDirOutput{}, err
	}
	out, txt := listing(infos, in.Offset, budget(ctx), "file_search", "no files match")
	return text(txt), out, nil
}

// listing is the page of infos from offset that fits budget characters
// of text (at most maxListEntries), as structured content and as compact
// lines (type, mode, size, time, path; directories with a trailing /)
// ending in how to read the next page. The structured content holds the
// same page only.
func listing(infos []api.FileInfo, offset, budget int, tool, empty string) (ListDirOutput, string) {
	out := ListDirOutput{Entries: []FileEntry{}, Total: len(infos), Offset: offset}
	var b strings.Builder
	chars := 0
	const footerRoom = 200 // for the line saying how to read on
	for i := offset; i < len(infos); i++ {
		fi := infos[i]
		e := FileEntry{Path: fi.Path, Type: fi.Type, Size: fi.Size, Mode: fmt.Sprintf("%04d", fi.Mode), ModifiedAt: fi.ModifiedAt.UTC()}
		line := entryLine(e)
		n := utf8.RuneCountInString(line)
		if len(out.Entries) == maxListEntries || (len(out.Entries) > 0 && chars+n+footerRoom > budget) {
			out.Truncated, out.NextOffset = true, i
			break
		}
		out.Entries = append(out.Entries, e)
		b.WriteString(line)
		chars += n
	}
	switch {
	case len(infos) == 0:
		return out, "(" + empty + ")"
	case offset >= len(infos):
		return out, fmt.Sprintf("(offset %d is past the last of %d entries)", offset, len(infos))
	case out.Truncated:
		fmt.Fprintf(&b, "[entries %d to %d of %d; more: call %s with offset %d]", offset+1, out.NextOffset, out.Total, tool, out.NextOffset)
	case offset > 0:
		fmt.Fprintf(&b, "[entries %d to %d of %d: the last page]", offset+1, out.Total, out.Total)
	}
	return out, strings.TrimRight(b.String(), "\n")
}

// entryLine is one entry as a line of a listing.
func entryLine(e FileEntry) string {
	p := e.Path
	if e.Type == "directory" && !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return fmt.Sprintf("%-4s %s %10d %s %s\n", shortType(e.Type), e.Mode, e.Size, e.ModifiedAt.Format("2006-01-02 15:04"), p)
}

func shortType(t string) string {
	switch t {
	case "directory":
		return "dir"
	case "symlink":
		return "link"
	}
	return t
}

func (s *Server) deleteFile(ctx context.Context, in deleteInput) (*gomcp.CallToolResult, DoneOutput, error) {
	sb, err := s.running(ctx, in.SandboxID)
	if err != nil {
		return nil, DoneOutput{}, err
	}
	info, err := stat(ctx, sb, in.Path)
	if err != nil {
		return nil, DoneOutput{}, err
	}
	if info.Type == "directory" {
		if !in.Recursive {
			return nil, DoneOutput{}, argErrorf("%s is a directory: pass recursive true to delete it with everything in it", in.Path)
		}
		if err := sb.RemoveDir(ctx, in.Path); err != nil {
			return nil, DoneOutput{}, err
		}
		return done("deleted directory %s", in.Path)
	}
	if err := sb.Remove(ctx, in.Path); err != nil {
		return nil, DoneOutput{}, err
	}
	return done("deleted %s", in.Path)
}

// modeBits turns octal permission bits into a FileMode, setuid, setgid
// and sticky bits included.
func modeBits(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		fm |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= fs.ModeSticky
	}
	return fm
}
