package mcp

import (
	"strings"
	"testing"
	"unicode/utf8"
)

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
		{"one over", "0123456789a", 10, "01234" + omittedNote(1) + "6789a", true},
		{"long", strings.Repeat("a", 5) + strings.Repeat("-", 100) + strings.Repeat("z", 5), 10,
			"aaaaa" + omittedNote(100) + "zzzzz", true},
		{"odd max", "abcdefghij", 5, "ab" + omittedNote(5) + "hij", true},
		// Characters, not bytes: a 3-byte character counts once and is
		// never cut in half.
		{"multibyte", strings.Repeat("€", 12), 10, strings.Repeat("€", 5) + omittedNote(2) + strings.Repeat("€", 5), true},
		{"invalid utf8", "ab\xffcd", 10, "ab\uFFFDcd", false},
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
// bounded, and the result is the stream's start and end around the
// number of characters left out.
func TestClipStream(t *testing.T) {
	var whole strings.Builder
	for i := range 200000 {
		whole.WriteString("line ")
		whole.WriteString(strings.Repeat("é", i%7))
		whole.WriteString("\n")
	}
	s := whole.String()
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
	total := utf8.RuneCountInString(s)
	head, tail := firstRunesString(s, 500), lastRunesString(s, 500)
	want := head + omittedNote(total-1000) + tail
	if got != want {
		t.Fatalf("clip of %d characters:\n got %q...%q\nwant %q...%q", total, got[:40], got[len(got)-40:], want[:40], want[len(want)-40:])
	}
	if wholeGot, _ := truncate(s, 1000); wholeGot != got {
		t.Fatal("streamed and whole truncation differ")
	}
}

func firstRunesString(s string, n int) string { return string([]rune(s)[:n]) }
func lastRunesString(s string, n int) string {
	r := []rune(s)
	return string(r[len(r)-n:])
}

// FuzzClip checks the promises of clip on any input and write pattern:
// short output is unchanged, long output is a prefix and a suffix of the
// input around a note, within the limit.
func FuzzClip(f *testing.F) {
	f.Add("hello, world", 5, 3)
	f.Add(strings.Repeat("ab€", 100), 7, 11)
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
		valid := strings.ToValidUTF8(s, "\uFFFD")
		if !c.Truncated() {
			if got != valid {
				t.Fatalf("untruncated %q became %q", s, got)
			}
			return
		}
		i := strings.Index(got, "\n[... ")
		j := strings.Index(got, " characters omitted ...]\n")
		if i < 0 || j < i {
			t.Fatalf("no note in %q", got)
		}
		head, tail := got[:i], got[j+len(" characters omitted ...]\n"):]
		if !strings.HasPrefix(valid, head) || !strings.HasSuffix(valid, tail) {
			t.Fatalf("%q is not a head and tail of %q", got, s)
		}
		if utf8.ValidString(s) && utf8.RuneCountInString(head)+utf8.RuneCountInString(tail) > max {
			t.Fatalf("kept %d+%d characters, max %d", utf8.RuneCountInString(head), utf8.RuneCountInString(tail), max)
		}
	})
}

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
