package process

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// splitAll feeds chunks to a Lines and returns the lines, the final
// partial line flushed.
func splitAll(chunks ...string) []string {
	var l Lines
	var out []string
	emit := func(b []byte) { out = append(out, string(b)) }
	for _, c := range chunks {
		l.Write([]byte(c), emit)
	}
	l.Flush(true, emit)
	return out
}

func TestLines(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   []string
	}{
		{"one line", []string{"hello\n"}, []string{"hello"}},
		{"no terminator", []string{"hello"}, []string{"hello"}},
		{"empty lines", []string{"a\n\nb\n"}, []string{"a", "", "b"}},
		{"crlf", []string{"a\r\nb\r\n"}, []string{"a", "b"}},
		{"lone cr", []string{"50%\r100%\r\n"}, []string{"50%", "100%"}},
		{"crlf split across chunks", []string{"a\r", "\nb\n"}, []string{"a", "b"}},
		{"cr then cr", []string{"a\r", "\rb"}, []string{"a", "", "b"}},
		{"line split across chunks", []string{"hel", "lo\nwor", "ld\n"}, []string{"hello", "world"}},
		{"only newline", []string{"\n"}, []string{""}},
		{"lf cr", []string{"a\n\rb"}, []string{"a", "", "b"}},
		{"nothing", []string{""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := splitAll(tt.chunks...)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
				t.Errorf("split %q = %q, want %q", tt.chunks, got, tt.want)
			}
		})
	}
}

func TestLinesLongLineIsCutAtCharacterBoundary(t *testing.T) {
	long := strings.Repeat("é", MaxLine) // two bytes each
	got := splitAll(long[:MaxLine+1], long[MaxLine+1:]+"\n")
	if strings.Join(got, "") != long {
		t.Fatal("pieces do not add up to the line")
	}
	for i, piece := range got {
		if len(piece) > MaxLine {
			t.Errorf("piece %d is %d bytes, more than MaxLine", i, len(piece))
		}
		if !utf8.ValidString(piece) {
			t.Errorf("piece %d cuts a character", i)
		}
	}
}

// TestLinesLongLineInPieces: however a long line arrives (whole with its
// end, in chunks, or ended in a later chunk), no piece is over MaxLine and
// the pieces add up to the line.
func TestLinesLongLineInPieces(t *testing.T) {
	line := strings.Repeat("ab€", MaxLine) // 5 bytes a repetition
	for _, chunks := range [][]string{
		{line + "\n"},
		{line[:MaxLine-2], line[MaxLine-2:] + "\nnext\n"},
		{line[:1000], line[1000 : 3*MaxLine], line[3*MaxLine:], "\r\n"},
	} {
		var got []string
		var l Lines
		emit := func(b []byte) { got = append(got, string(b)) }
		for _, c := range chunks {
			l.Write([]byte(c), emit)
		}
		l.Flush(true, emit)
		if got[len(got)-1] == "next" {
			got = got[:len(got)-1]
		}
		if strings.Join(got, "") != line {
			t.Fatalf("chunks of %d: pieces do not add up to the line", len(chunks[0]))
		}
		for i, piece := range got {
			if len(piece) > MaxLine || !utf8.ValidString(piece) {
				t.Fatalf("chunks of %d: piece %d is %d bytes (valid UTF-8: %v)", len(chunks[0]), i, len(piece), utf8.ValidString(piece))
			}
		}
		if want := (len(line) + MaxLine - 1) / MaxLine; len(got) > want+1 {
			t.Errorf("chunks of %d: %d pieces for %d bytes", len(chunks[0]), len(got), len(line))
		}
	}
}

func TestLinesFlushKeepsHalfCharacter(t *testing.T) {
	var l Lines
	var out []string
	emit := func(b []byte) { out = append(out, string(b)) }
	euro := "€" // three bytes
	l.Write([]byte("price "+euro[:2]), emit)
	l.Flush(false, emit)
	l.Write([]byte(euro[2:]+"5\n"), emit)
	if len(out) != 2 || out[0] != "price " || out[1] != euro+"5" {
		t.Errorf("got %q, want [\"price \" \"€5\"]", out)
	}
}

// referenceSplit is the obvious implementation Lines must agree with.
func referenceSplit(s string) []string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	if s == "" {
		return nil
	}
	lines := strings.Split(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func FuzzLines(f *testing.F) {
	f.Add("a\r\nb\rc\n\nd", uint8(3))
	f.Add("\r\r\n\n", uint8(1))
	f.Fuzz(func(t *testing.T, s string, step uint8) {
		if strings.Contains(s, "\x00") || len(s) > MaxLine {
			return
		}
		n := int(step%16) + 1
		var chunks []string
		for i := 0; i < len(s); i += n {
			chunks = append(chunks, s[i:min(i+n, len(s))])
		}
		got := splitAll(chunks...)
		want := referenceSplit(s)
		if len(got) != len(want) {
			t.Fatalf("split %q in chunks of %d: %q, want %q", s, n, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("split %q in chunks of %d: %q, want %q", s, n, got, want)
			}
		}
	})
}

func BenchmarkLines(b *testing.B) {
	line := strings.Repeat("x", 75) + "\n"
	chunk := []byte(strings.Repeat(line, (64<<10)/len(line)))
	var l Lines
	n := 0
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		l.Write(chunk, func(line []byte) { n += len(line) })
	}
	if n == 0 || bytes.Count(chunk, []byte{'\n'}) == 0 {
		b.Fatal("no lines")
	}
}
