package mcp

import (
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

// String is the stream, or its head and tail around a note such as
// "[... 1234 characters omitted ...]". Invalid UTF-8 becomes U+FFFD.
func (c *clip) String() string {
	if !c.Truncated() {
		return strings.ToValidUTF8(string(c.head)+string(c.tail), "\uFFFD")
	}
	headN := c.max / 2
	h := firstRunes(c.head, headN)
	var t []byte
	if c.full {
		// Bytes were dropped between head and the ring: the tail comes
		// from the ring alone.
		ring := append(append([]byte(nil), c.tail[c.pos:]...), c.tail[:c.pos]...)
		t = lastRunes(ring, c.max-headN)
	} else {
		// Nothing was dropped: the tail may reach back into head when the
		// stream is barely longer than it.
		all := append(append([]byte(nil), c.head...), c.tail...)
		t = lastRunes(all[len(h):], c.max-headN)
	}
	omitted := max(0, c.runes-runeStarts(h)-runeStarts(t))
	return strings.ToValidUTF8(string(h), "\uFFFD") + omittedNote(omitted) + strings.ToValidUTF8(string(t), "\uFFFD")
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

// omittedNote is the marker put where characters were left out.
func omittedNote(n int) string {
	return fmt.Sprintf("\n[... %d characters omitted ...]\n", n)
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
