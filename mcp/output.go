package mcp

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// DefaultMaxOutput is how many characters of each output stream (stdout,
// stderr, logs, code results) a tool returns unless asked otherwise.
const DefaultMaxOutput = 20000

// Bounds of the max_output_chars argument.
const (
	minMaxOutput = 200
	maxMaxOutput = 200000
)

// clip collects a stream for a model: all of it up to max characters,
// else its first and last characters around a note saying how many were
// left out. It keeps at most 8*max bytes whatever the stream's size, so
// a command printing gigabytes costs no more memory than one printing a
// page. It is an io.Writer; String gives the result.
type clip struct {
	max   int
	head  []byte // the first 4*max bytes
	tail  []byte // a ring of the last 4*max bytes after head
	pos   int    // next write position in tail once it is full
	full  bool   // tail has wrapped
	runes int    // characters written, counting each byte that starts one
	bytes int64
	lines int64 // newlines written
	nul   bool  // a NUL byte was written
	// invalid: bytes that are not UTF-8 were written; carry holds the
	// start of a character whose end has not been written yet.
	invalid  bool
	carry    []byte
	replaced int // U+FFFD characters written
}

// newClip returns a clip keeping max characters; max <= 0 means
// DefaultMaxOutput.
func newClip(max int) *clip {
	if max <= 0 {
		max = DefaultMaxOutput
	}
	return &clip{max: max}
}

// Write never fails.
func (c *clip) Write(p []byte) (int, error) {
	n := len(p)
	c.bytes += int64(n)
	c.runes += runeStarts(p)
	c.lines += int64(bytes.Count(p, []byte{'\n'}))
	c.nul = c.nul || bytes.IndexByte(p, 0) >= 0
	c.checkText(p)
	// A U+FFFD split between two writes is missed: Binary's use of the
	// count is a heuristic anyway.
	c.replaced += bytes.Count(p, []byte("\uFFFD"))
	limit := 4 * c.max // a character is at most 4 bytes
	if room := limit - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	for len(p) > 0 {
		if !c.full {
			k := min(limit-len(c.tail), len(p))
			c.tail = append(c.tail, p[:k]...)
			p = p[k:]
			if len(c.tail) == limit {
				c.full, c.pos = true, 0
			}
			continue
		}
		k := copy(c.tail[c.pos:], p)
		p = p[k:]
		c.pos = (c.pos + k) % limit
	}
	return n, nil
}

// Truncated reports whether String leaves characters out.
func (c *clip) Truncated() bool { return c.runes > c.max || c.full }

// Binary reports whether the stream is not text: it has a NUL byte or
// bytes that are not UTF-8, wherever they were, dropped bytes included.
// Output that reached osb mcp through JSON had its invalid bytes replaced
// by U+FFFD already, so a stream of which 1% or more is U+FFFD counts as
// binary too.
// It describes the whole stream: call it once writing is done.
func (c *clip) Binary() bool {
	return c.nul || c.invalid || len(c.carry) > 0 || c.replaced > 0 && c.replaced*100 >= c.runes
}

// checkText follows the UTF-8 validity of the stream across writes; a
// character split between two writes is carried to the next.
func (c *clip) checkText(p []byte) {
	if c.invalid {
		return
	}
	if len(c.carry) > 0 {
		buf := append(c.carry, p[:min(len(p), utf8.UTFMax-len(c.carry))]...)
		if !utf8.FullRune(buf) {
			c.carry = buf
			return
		}
		r, size := utf8.DecodeRune(buf)
		if r == utf8.RuneError && size <= 1 {
			c.invalid = true
			return
		}
		p = p[size-len(c.carry):]
		c.carry = c.carry[:0]
	}
	whole := trimPartialRune(p, true)
	if !utf8.Valid(whole) {
		c.invalid = true
		return
	}
	c.carry = append(c.carry[:0], p[len(whole):]...)
}

// ring is the tail in order, once it has wrapped.
func (c *clip) ring() []byte {
	return append(append([]byte(nil), c.tail[c.pos:]...), c.tail[:c.pos]...)
}

// String is the stream, or its head and tail around a note such as
// "[... 1234 lines (56789 bytes) omitted ...]". The cuts fall at line
// boundaries, so that no fragment of a line is shown as if it were one;
// only a line longer than half the limit is cut inside, and the note then
// says so. A binary stream (see Binary) is described, not shown.
func (c *clip) String() string {
	if c.Binary() {
		return binaryNote(c.bytes)
	}
	if !c.Truncated() {
		return strings.ToValidUTF8(string(c.head)+string(c.tail), "\uFFFD")
	}
	headN := c.max / 2
	h := firstRunes(c.head, headN)
	clean := true
	if i := bytes.LastIndexByte(h, '\n'); i >= 0 {
		h = h[:i+1]
	} else {
		clean = false
	}
	var src []byte
	if c.full {
		// Bytes were dropped between head and the ring: the tail comes
		// from the ring alone.
		src = c.ring()
	} else {
		// Nothing was dropped: the tail may reach back into head when the
		// stream is barely longer than it.
		src = append(append([]byte(nil), c.head...), c.tail...)[len(h):]
	}
	t := lastRunes(src, c.max-headN)
	if start := len(src) - len(t); start == 0 || src[start-1] != '\n' {
		// t starts inside a line: start it at the next line.
		if i := bytes.IndexByte(t, '\n'); i >= 0 && i+1 < len(t) {
			t = t[i+1:]
		} else {
			clean = false
		}
	}
	omittedBytes := c.bytes - int64(len(h)) - int64(len(t))
	omittedLines := c.lines - int64(bytes.Count(h, []byte{'\n'})) - int64(bytes.Count(t, []byte{'\n'}))
	note := fmt.Sprintf("[... %d lines (%d bytes) omitted ...]\n", omittedLines, omittedBytes)
	if !clean {
		note = fmt.Sprintf("[... %d bytes omitted, across %d line breaks; a line longer than the limit was cut inside ...]\n", omittedBytes, omittedLines)
	}
	if len(h) > 0 && h[len(h)-1] != '\n' {
		note = "\n" + note
	}
	return strings.ToValidUTF8(string(h), "\uFFFD") + note + strings.ToValidUTF8(string(t), "\uFFFD")
}

// binaryNote describes output that is not text.
func binaryNote(n int64) string {
	return fmt.Sprintf("[binary output: not shown (not UTF-8 text; %d bytes received). Redirect it to a file (command > /tmp/out.bin) and read it with file_read encoding base64, or look at it with xxd or od]", n)
}

// runeStarts counts the bytes of b that start a character, as Write
// does.
func runeStarts(b []byte) int {
	n := 0
	for _, x := range b {
		if utf8.RuneStart(x) {
			n++
		}
	}
	return n
}

// firstRunes is the prefix of b holding n characters.
func firstRunes(b []byte, n int) []byte {
	i := 0
	for k := 0; k < n && i < len(b); k++ {
		_, size := utf8.DecodeRune(b[i:])
		i += size
	}
	return b[:i]
}

// lastRunes is the suffix of b holding n characters, counting each byte
// that starts one as clip.Write does.
func lastRunes(b []byte, n int) []byte {
	i := len(b)
	for k := 0; k < n && i > 0; {
		i--
		if utf8.RuneStart(b[i]) {
			k++
		}
	}
	return b[i:]
}

// truncate is clip for a string held whole.
func truncate(s string, max int) (string, bool) {
	c := newClip(max)
	c.Write([]byte(s))
	return c.String(), c.Truncated()
}

// ansiRE matches terminal colour and cursor sequences, which interpreter
// tracebacks carry and models cannot use.
var ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// stripANSI removes terminal escape sequences from s.
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	return ansiRE.ReplaceAllString(s, "")
}
