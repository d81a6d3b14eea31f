package mcp

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// lines is "1\n2\n...n\n", as seq prints it.
func lines(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

func TestTruncate(t *testing.T) {
	cases := []struct {
		name      string
		in        string
		max       int
		want      string
		truncated bool
	}{
		{"empty", "", 10, "", false},
		{"short", "hello", 10, "hello", false},
		{"exact", "0123456789", 10, "0123456789", false},
		// seq 1 20 with room for 10 characters: whole lines only, never
		// a fragment that looks like another number.
		{"lines", lines(1, 20), 10, "1\n2\n[... 17 lines (44 bytes) omitted ...]\n20\n", true},
		{"lines cut back", "aaaa\nbbbbbbbbbbbbbbbbbbbbbbbb\ncc\ndd\n", 10, "aaaa\n[... 2 lines (28 bytes) omitted ...]\ndd\n", true},
		// One line longer than the limit: cut inside, and said so.
		{"one long line", strings.Repeat("a", 5) + strings.Repeat("-", 100) + strings.Repeat("z", 5), 10,
			"aaaaa\n[... 100 bytes omitted, across 0 line breaks; a line longer than the limit was cut inside ...]\nzzzzz", true},
		// Characters, not bytes: a 3-byte character counts once and is
		// never cut in half.
		{"multibyte", strings.Repeat("€€\n", 8), 10, "€€\n[... 6 lines (42 bytes) omitted ...]\n€€\n", true},
		{"invalid utf8", "ab\xffcd", 10, binaryNote(5), false},
		{"nul", "ab\x00cd", 10, binaryNote(5), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, tr := truncate(c.in, c.max)
			if got != c.want || tr != c.truncated {
				t.Errorf("truncate(%q, %d) = %q, %v; want %q, %v", c.in, c.max, got, tr, c.want, c.truncated)
			}
		})
	}
}

// TestClipStream writes a big stream in uneven pieces: memory stays
// bounded, and the result is the stream's first and last whole lines
// around the number of lines and bytes left out.
func TestClipStream(t *testing.T) {
	s := lines(1, 200000)
	c := newClip(1000)
	for rest := s; rest != ""; {
		n := min(len(rest), 1+len(rest)%4093)
		c.Write([]byte(rest[:n]))
		rest = rest[n:]
	}
	if len(c.head)+len(c.tail) > 8*1000 {
		t.Fatalf("clip keeps %d bytes for max 1000", len(c.head)+len(c.tail))
	}
	got := c.String()
	// The first 500 characters are lines 1 to 152 (9*2 + 90*3 + 53*4);
	// the last 500 a part of line 199929, then lines 199930 to 200000.
	head, tail := lines(1, 152), lines(199930, 200000)
	want := head + fmt.Sprintf("[... %d lines (%d bytes) omitted ...]\n", 200000-152-71, len(s)-len(head)-len(tail)) + tail
	if got != want {
		t.Fatalf("clip:\n got %q...%q\nwant %q...%q", got[:40], got[len(got)-80:], want[:40], want[len(want)-80:])
	}
	if wholeGot, _ := truncate(s, 1000); wholeGot != got {
		t.Fatal("streamed and whole truncation differ")
	}
}

// TestClipBinary: output that is not text is described by its size, with
// a hint, instead of being shown as replacement characters.
func TestClipBinary(t *testing.T) {
	c := newClip(100)
	c.Write([]byte("text first\n"))
	c.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
	c.Write(make([]byte, 5000))
	got := c.String()
	if !c.Binary() || !strings.Contains(got, "5019 bytes received") || !strings.Contains(got, "file_read") || strings.ContainsRune(got, '\uFFFD') {
		t.Fatalf("binary stream: %q", got)
	}
	// Invalid bytes replaced on the way (JSON carries only UTF-8) still
	// read as binary; a stray replacement character in text does not.
	c = newClip(100)
	c.Write([]byte("ELF" + strings.Repeat("\uFFFDa", 50)))
	if !c.Binary() {
		t.Fatal("output of replacement characters read as text")
	}
	c = newClip(100)
	c.Write([]byte(strings.Repeat("a log line\n", 100) + "\uFFFD\n"))
	if c.Binary() {
		t.Fatal("text with one replacement character read as binary")
	}
	// A character cut by the limit is not binary.
	c = newClip(10)
	c.Write([]byte(strings.Repeat("é", 100)))
	if c.Binary() {
		t.Fatal("UTF-8 text read as binary")
	}
}

// FuzzClip checks the promises of clip on any input and write pattern:
// short output is unchanged, long output is a prefix and a suffix of the
// input around a note, within the limit, cut at line boundaries unless
// the note says otherwise; binary input is described.
func FuzzClip(f *testing.F) {
	f.Add("hello, world", 5, 3)
	f.Add(strings.Repeat("ab€", 100), 7, 11)
	f.Add(strings.Repeat("ab\n€", 100), 7, 11)
	f.Add("\xff\xfe\x00abc", 2, 1)
	f.Fuzz(func(t *testing.T, s string, max, chunk int) {
		max = 1 + abs(max)%300
		chunk = 1 + abs(chunk)%50
		c := newClip(max)
		for rest := s; rest != ""; {
			n := min(len(rest), chunk)
			c.Write([]byte(rest[:n]))
			rest = rest[n:]
		}
		got := c.String()
		if !utf8.ValidString(got) {
			t.Fatalf("invalid UTF-8 out: %q", got)
		}
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			if got != binaryNote(int64(len(s))) {
				t.Fatalf("binary %q became %q", s, got)
			}
			return
		}
		if !c.Truncated() {
			if got != s {
				t.Fatalf("untruncated %q became %q", s, got)
			}
			return
		}
		m := noteRE.FindStringSubmatchIndex(got)
		if m == nil {
			t.Fatalf("no note in %q", got)
		}
		head, tail := got[:m[0]], got[m[1]:]
		clean := strings.Contains(got[m[0]:m[1]], " lines (")
		if !clean {
			head = strings.TrimSuffix(head, "\n") // the note's own line break
		}
		if !strings.HasPrefix(s, head) || !strings.HasSuffix(s, tail) {
			t.Fatalf("%q is not a head and tail of %q", got, s)
		}
		if utf8.RuneCountInString(head)+utf8.RuneCountInString(tail) > max {
			t.Fatalf("kept %d+%d characters, max %d", utf8.RuneCountInString(head), utf8.RuneCountInString(tail), max)
		}
		if clean {
			if head != "" && !strings.HasSuffix(head, "\n") || tail != "" && s[len(s)-len(tail)-1] != '\n' {
				t.Fatalf("%q: a cut inside a line not said in the note", got)
			}
		}
	})
}

var noteRE = regexp.MustCompile(`\[\.\.\. \d+ (lines \(\d+ bytes\)|bytes omitted, across \d+ line breaks;[^]]*)[^]]*\]\n`)

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

func TestStripANSI(t *testing.T) {
	in := "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero\x1b[?25h"
	if got := stripANSI(in); got != "ZeroDivisionError: division by zero" {
		t.Errorf("stripANSI = %q", got)
	}
}

// TestHoldBack: a character cut by the end of the input waits, whole
// characters pass.
func TestHoldBack(t *testing.T) {
	var b strings.Builder
	h := &holdBack{w: &b}
	h.Write([]byte("caf\xc3"))
	if b.String() != "caf" || string(h.pending) != "\xc3" {
		t.Fatalf("after a cut: %q, pending %q", b.String(), h.pending)
	}
	h.Write([]byte("\xa9 ok"))
	if b.String() != "café ok" || len(h.pending) != 0 {
		t.Fatalf("after the rest: %q, pending %q", b.String(), h.pending)
	}
}
