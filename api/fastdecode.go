package api

import (
	"bytes"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeFast decodes the shape nearly every event of a stream has, the
// one AppendFrame writes for output: {"type":T[,"text":S],"timestamp":N}.
// It reports false for anything else, which the caller then decodes with
// encoding/json; it never accepts a line that encoding/json would read
// differently.
func decodeFast(line []byte) (Event, bool) {
	var ev Event
	rest, ok := bytes.CutPrefix(line, []byte(`{"type":`))
	if !ok {
		return ev, false
	}
	if ev.Type, rest, ok = cutJSONString(rest); !ok {
		return ev, false
	}
	if r, found := bytes.CutPrefix(rest, []byte(`,"text":`)); found {
		if ev.Text, rest, ok = cutJSONString(r); !ok {
			return ev, false
		}
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"timestamp":`)); !ok {
		return ev, false
	}
	end := 0
	if end < len(rest) && rest[end] == '-' {
		end++
	}
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	if string(rest[end:]) != "}" {
		return ev, false
	}
	ts, err := strconv.ParseInt(string(rest[:end]), 10, 64)
	if err != nil || (end > 1 && rest[0] == '0') || (end > 2 && rest[0] == '-' && rest[1] == '0') {
		return ev, false
	}
	ev.Timestamp = ts
	return ev, true
}

// cutJSONString reads a JSON string at the start of b and returns its
// value and the bytes after it.
func cutJSONString(b []byte) (string, []byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return "", nil, false
	}
	b = b[1:]
	end := bytes.IndexByte(b, '"')
	if end < 0 {
		return "", nil, false
	}
	body := b[:end]
	if bytes.IndexByte(body, '\\') >= 0 {
		return unquoteSlow(b)
	}
	for _, c := range body {
		if c < 0x20 {
			return "", nil, false
		}
	}
	if !utf8.Valid(body) {
		return "", nil, false
	}
	return string(body), b[end+1:], true
}

// unquoteSlow decodes a string body that contains escapes.
func unquoteSlow(b []byte) (string, []byte, bool) {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			if !utf8.Valid(out) {
				return "", nil, false
			}
			return string(out), b[i+1:], true
		case c < 0x20:
			return "", nil, false
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(b) {
			return "", nil, false
		}
		switch e := b[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'u':
			r, n := hex4(b[i+2:])
			if n < 0 {
				return "", nil, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
					if r2, n = hex4(b[i+2:]); n < 0 {
						return "", nil, false
					}
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					i += 6
					r = dec
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return "", nil, false
		}
		i += 2
	}
	return "", nil, false
}

func hex4(b []byte) (rune, int) {
	if len(b) < 4 {
		return 0, -1
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, -1
		}
	}
	return r, 4
}
