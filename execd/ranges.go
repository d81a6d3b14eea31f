package execd

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteRange is the part [start, start+length) of a file; length is at
// least 1 and the range lies inside the file it was parsed against.
type byteRange struct {
	start, length int64
}

// last is the offset of the range's last byte.
func (r byteRange) last() int64 { return r.start + r.length - 1 }

// errRangeNotSatisfiable is returned by parseRange when the header is well
// formed but none of its ranges overlaps the file.
var errRangeNotSatisfiable = errors.New("range not satisfiable")

// errInvalidRange is wrapped by the errors parseRange returns for a
// header that is not a valid byte-ranges specifier.
var errInvalidRange = errors.New("invalid range")

// parseRange parses a Range header value (RFC 9110, section 14.1.2) for a
// file of size bytes and returns the ranges to serve, in request order,
// clamped to the file: "a-b", "a-" and the suffix form "-n". An empty
// header returns no ranges and no error, as does a specifier whose list
// holds only empty elements.
//
// Ranges that start at or past the end of the file are dropped; when none
// remains the error is errRangeNotSatisfiable. A malformed header gives an
// error wrapping errInvalidRange. Overlapping ranges are kept as asked.
//
// It accepts what net/http's ServeContent accepts, with differences that
// follow the RFC: the unit name is case-insensitive; positions are plain
// digits (no sign); a position too large for int64 lies past any file
// rather than being an error; a zero-length suffix ("-0") is
// unsatisfiable rather than an empty range; and a range that starts past
// the end of the file must still be well formed ("50-x" is invalid, not
// skipped).
func parseRange(header string, size int64) ([]byteRange, error) {
	if header == "" {
		return nil, nil
	}
	unit, set, ok := strings.Cut(header, "=")
	if !ok || !strings.EqualFold(unit, "bytes") {
		return nil, fmt.Errorf("%w %q: want bytes=first-last", errInvalidRange, header)
	}
	var ranges []byteRange
	unsatisfiable := false
	for spec := range strings.SplitSeq(set, ",") {
		spec = trimOWS(spec)
		if spec == "" {
			continue
		}
		first, last, ok := strings.Cut(spec, "-")
		if !ok {
			return nil, fmt.Errorf("%w %q: no '-' in %q", errInvalidRange, header, spec)
		}
		first, last = trimOWS(first), trimOWS(last)
		if first == "" {
			n, ok := parseDigits(last)
			if !ok {
				return nil, fmt.Errorf("%w %q: bad suffix length in %q", errInvalidRange, header, spec)
			}
			n = min(n, size)
			if n == 0 {
				unsatisfiable = true
				continue
			}
			ranges = append(ranges, byteRange{start: size - n, length: n})
			continue
		}
		start, ok := parseDigits(first)
		if !ok {
			return nil, fmt.Errorf("%w %q: bad first position in %q", errInvalidRange, header, spec)
		}
		end := int64(math.MaxInt64)
		if last != "" {
			if end, ok = parseDigits(last); !ok || end < start {
				return nil, fmt.Errorf("%w %q: bad last position in %q", errInvalidRange, header, spec)
			}
		}
		if start >= size {
			unsatisfiable = true
			continue
		}
		end = min(end, size-1)
		ranges = append(ranges, byteRange{start: start, length: end - start + 1})
	}
	if len(ranges) == 0 && unsatisfiable {
		return nil, errRangeNotSatisfiable
	}
	return ranges, nil
}

// parseDigits reads one or more ASCII digits; a value over MaxInt64 is
// MaxInt64.
func parseDigits(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil { // only a range error is left
		return math.MaxInt64, true
	}
	return n, true
}

// trimOWS removes the optional white space (spaces and tabs) that HTTP
// allows around list elements.
func trimOWS(s string) string { return strings.Trim(s, " \t") }

// formatRanges writes ranges back as a Range header in absolute form.
func formatRanges(ranges []byteRange) string {
	var b strings.Builder
	b.WriteString("bytes=")
	for i, r := range ranges {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(r.start, 10))
		b.WriteByte('-')
		b.WriteString(strconv.FormatInt(r.last(), 10))
	}
	return b.String()
}
