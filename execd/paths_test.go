package execd

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func testLookup(name string) (string, bool) {
	v, ok := map[string]string{"HOME": "/home/me", "DIR": "data", "EMPTY": "", "ROOT": "/"}[name]
	return v, ok
}

func TestExpandPath(t *testing.T) {
	tests := []struct {
		in, want string
		err      error
	}{
		{"/abs/path", "/abs/path", nil},
		{"rel/path", "/work/rel/path", nil},
		{".", "/work", nil},
		{"~", "/root", nil},
		{"~/x/y", "/root/x/y", nil},
		{"~other/x", "/work/~other/x", nil},
		{"a/../b", "/work/b", nil},
		{"../../../../etc/passwd", "/etc/passwd", nil},
		{"/x//y/./z/", "/x/y/z", nil},
		{"$HOME/f", "/home/me/f", nil},
		{"${HOME}/f", "/home/me/f", nil},
		{"/srv/$DIR/x", "/srv/data/x", nil},
		{"/srv/${DIR}x", "/srv/datax", nil},
		{"price$5", "/work/price$5", nil},
		{"a$", "/work/a$", nil},
		{"$ROOT", "/", nil},
		{"/x/$EMPTY/y", "/x/y", nil},
		{"", "", errEmptyPath},
		{"$EMPTY", "", errEmptyPath},
		{"a\x00b", "", errNULInPath},
		{"$UNDEFINED/x", "", errUnsetVar},
		{"${UNDEFINED}", "", errUnsetVar},
		{"${HOME", "", errBadVariable},
		{"${}", "", errBadVariable},
		{"${1x}", "", errBadVariable},
	}
	for _, tt := range tests {
		got, err := expandPath(tt.in, "/root", "/work", testLookup)
		if !errors.Is(err, tt.err) || got != tt.want {
			t.Errorf("expandPath(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func FuzzExpandPath(f *testing.F) {
	for _, s := range []string{"/a/b", "~/x", "$HOME/${DIR}", "${", "a\x00", "../..", "$", "${HOME}${HOME}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := expandPath(p, "/root", "/work", testLookup)
		if err != nil {
			if got != "" {
				t.Fatalf("expandPath(%q) returned %q with error %v", p, got, err)
			}
			return
		}
		if !filepath.IsAbs(got) || filepath.Clean(got) != got || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("expandPath(%q) = %q: not a clean absolute path", p, got)
		}
		if !strings.ContainsAny(p, "$~") && got != filepath.Clean(filepath.Join("/work", p)) && got != filepath.Clean(p) {
			t.Fatalf("expandPath(%q) = %q changed a plain path", p, got)
		}
	})
}

func FuzzSplitWords(f *testing.F) {
	for _, s := range []string{`a 'b c' "d \"e\"" f\ g`, `x | y`, `'unterminated`, `"a\$b"`, `~x`, `a#b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := splitWords(s)
		if err != nil {
			return
		}
		// Quoting each word again and splitting gives the same words.
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, shellQuote(w))
		}
		again, err := splitWords(strings.Join(quoted, " "))
		if err != nil || strings.Join(again, "\x00") != strings.Join(words, "\x00") || len(again) != len(words) {
			t.Fatalf("splitWords(%q) = %q; requoted gives %q, %v", s, words, again, err)
		}
	})
}
