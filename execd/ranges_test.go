package execd

import (
	"bytes"
	"errors"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
)

func TestParseRange(t *testing.T) {
	r := func(start, length int64) byteRange { return byteRange{start, length} }
	tests := []struct {
		header string
		size   int64
		want   []byteRange
		err    error
	}{
		{"", 10, nil, nil},
		{"bytes=0-0", 10, []byteRange{r(0, 1)}, nil},
		{"bytes=0-9", 10, []byteRange{r(0, 10)}, nil},
		{"bytes=0-100", 10, []byteRange{r(0, 10)}, nil},
		{"bytes=3-", 10, []byteRange{r(3, 7)}, nil},
		{"bytes=-3", 10, []byteRange{r(7, 3)}, nil},
		{"bytes=-30", 10, []byteRange{r(0, 10)}, nil},
		{"bytes=9-9", 10, []byteRange{r(9, 1)}, nil},
		{"BYTES=1-1", 10, []byteRange{r(1, 1)}, nil},
		{"bytes=1-2, 4-5 ,, -1", 10, []byteRange{r(1, 2), r(4, 2), r(9, 1)}, nil},
		{"bytes= 1 - 2", 10, []byteRange{r(1, 2)}, nil},
		{"bytes=5-5,1-1", 10, []byteRange{r(5, 1), r(1, 1)}, nil},
		{"bytes=0-1,0-1", 10, []byteRange{r(0, 2), r(0, 2)}, nil},
		{"bytes=10-,2-3", 10, []byteRange{r(2, 2)}, nil},
		{"bytes=0-99999999999999999999", 10, []byteRange{r(0, 10)}, nil},
		{"bytes=-99999999999999999999", 10, []byteRange{r(0, 10)}, nil},
		{"bytes=", 10, nil, nil},
		{"bytes=,", 10, nil, nil},
		{"bytes=10-", 10, nil, errRangeNotSatisfiable},
		{"bytes=10-20,30-", 10, nil, errRangeNotSatisfiable},
		{"bytes=-0", 10, nil, errRangeNotSatisfiable},
		{"bytes=0-", 0, nil, errRangeNotSatisfiable},
		{"bytes=-5", 0, nil, errRangeNotSatisfiable},
		{"bytes=99999999999999999999-", 10, nil, errRangeNotSatisfiable},
		{"bytes 0-1", 10, nil, errInvalidRange},
		{"items=0-1", 10, nil, errInvalidRange},
		{"bytes=1", 10, nil, errInvalidRange},
		{"bytes=-", 10, nil, errInvalidRange},
		{"bytes=2-1", 10, nil, errInvalidRange},
		{"bytes=+1-2", 10, nil, errInvalidRange},
		{"bytes=1-+2", 10, nil, errInvalidRange},
		{"bytes=--1", 10, nil, errInvalidRange},
		{"bytes=0x1-2", 10, nil, errInvalidRange},
		{"bytes=1-2,x", 10, nil, errInvalidRange},
		{"bytes=1-2-3", 10, nil, errInvalidRange},
		{"bytes=50-,2-1", 10, nil, errInvalidRange},
	}
	for _, tt := range tests {
		got, err := parseRange(tt.header, tt.size)
		if !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseRange(%q, %d) = %v, %v; want %v, %v", tt.header, tt.size, got, err, tt.want, tt.err)
		}
	}
}

// rangeAnswer is what a client sees of a range request: the status and,
// for 206, each part's Content-Range and bytes.
type rangeAnswer struct {
	status int
	parts  []string // "Content-Range: body"
}

// serveRange answers header for content as http.ServeContent does.
func serveRange(t *testing.T, header string, content []byte) rangeAnswer {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	if header != "" {
		req.Header.Set("Range", header)
	}
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(rec, req, "", time.Time{}, bytes.NewReader(content))
	a := rangeAnswer{status: rec.Code}
	if rec.Code != http.StatusPartialContent {
		return a
	}
	mt, params, _ := mime.ParseMediaType(rec.Header().Get("Content-Type"))
	if mt != "multipart/byteranges" {
		return rangeAnswer{a.status, []string{rec.Header().Get("Content-Range") + ": " + rec.Body.String()}}
	}
	mr := multipart.NewReader(rec.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return a
		}
		if err != nil {
			t.Fatalf("ServeContent(%q) multipart: %v", header, err)
		}
		data, _ := io.ReadAll(p)
		a.parts = append(a.parts, p.Header.Get("Content-Range")+": "+string(data))
	}
}

// serveParsed answers header the way download does: parseRange decides
// errors, and ServeContent serves the canonical form of what it accepted.
func serveParsed(t *testing.T, header string, content []byte) rangeAnswer {
	ranges, err := parseRange(header, int64(len(content)))
	switch {
	case errors.Is(err, errRangeNotSatisfiable) && len(content) == 0:
		return serveRange(t, "", content)
	case err != nil:
		return rangeAnswer{status: http.StatusRequestedRangeNotSatisfiable}
	case len(ranges) == 0:
		return serveRange(t, "", content)
	}
	return serveRange(t, formatRanges(ranges), content)
}

// knownDifference reports whether header uses one of the forms where
// parseRange deliberately differs from net/http (see its doc comment), or
// characters HTTP header values cannot carry.
func knownDifference(header string, size int64) bool {
	if strings.ContainsAny(header, "+\r\n\v\f") {
		return true // signed numbers; white space net/textproto trims
	}
	if len(header) >= 6 && strings.EqualFold(header[:6], "bytes=") && header[:6] != "bytes=" {
		return true // unit case
	}
	digits := 0
	for _, c := range header {
		if unicode.IsDigit(c) {
			if digits++; digits > 18 {
				return true // beyond int64
			}
		} else {
			digits = 0
		}
	}
	_, set, _ := strings.Cut(header, "=")
	for spec := range strings.SplitSeq(set, ",") {
		first, last, ok := strings.Cut(strings.Trim(spec, " \t"), "-")
		first, last = strings.Trim(first, " \t"), strings.Trim(last, " \t")
		if strings.HasPrefix(last, "-") {
			return true // signed numbers
		}
		if ok && first == "" {
			if n, ok := parseDigits(last); ok && (n == 0 || size == 0) {
				return true // empty suffix range
			}
		}
		if start, ok := parseDigits(first); ok && start >= size && last != "" {
			if end, ok := parseDigits(last); !ok || end < start {
				return true // net/http skips a range past the end unchecked
			}
		}
	}
	return false
}

func FuzzParseRange(f *testing.F) {
	for _, seed := range []string{
		"", "bytes=0-0", "bytes=0-", "bytes=-5", "bytes=1-2,3-4", "bytes=5-2", "bytes=, ,0-1",
		"bytes=100-", "bytes=-0", "bytes=0-1,0-1,0-1", "bytes=99999999999999999999-", "Bytes=1-",
		"bytes=+1-2", "bytes=1 - 2", "lines=0-1", "bytes=-1,-1", "bytes=0-9223372036854775807",
	} {
		f.Add(seed, uint16(10))
	}
	f.Fuzz(func(t *testing.T, header string, size16 uint16) {
		size := int64(size16 % 512)
		ranges, err := parseRange(header, size)
		if err != nil {
			if ranges != nil || !(errors.Is(err, errInvalidRange) || errors.Is(err, errRangeNotSatisfiable)) {
				t.Fatalf("parseRange(%q, %d) = %v, %v", header, size, ranges, err)
			}
		}
		for _, r := range ranges {
			if r.start < 0 || r.length < 1 || r.start > size-r.length {
				t.Fatalf("parseRange(%q, %d): range %+v is outside the file", header, size, r)
			}
		}
		if len(ranges) > 0 {
			again, err := parseRange(formatRanges(ranges), size)
			if err != nil || !reflect.DeepEqual(again, ranges) {
				t.Fatalf("canonical form %q of %q parses to %v, %v", formatRanges(ranges), header, again, err)
			}
		}
		// Also check the huge-file arithmetic.
		for _, r := range must(parseRange(header, math.MaxInt64)) {
			if r.start < 0 || r.length < 1 || r.start > math.MaxInt64-r.length {
				t.Fatalf("parseRange(%q, MaxInt64): range %+v overflows", header, r)
			}
		}
		if knownDifference(header, size) {
			return
		}
		content := bytes.Repeat([]byte("0123456789"), int(size/10)+1)[:size]
		got, want := serveParsed(t, header, content), serveRange(t, header, content)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Range %q on %d bytes:\nexecd    %+v\nnet/http %+v", header, size, got, want)
		}
	})
}

func must(r []byteRange, _ error) []byteRange { return r }
