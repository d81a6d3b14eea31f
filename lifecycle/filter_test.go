package lifecycle

import (
	"errors"
	"maps"
	"net/url"
	"testing"

	"github.com/opensandbox/opensandbox/api"
	"github.com/opensandbox/opensandbox/internal/httpx"
)

func TestParseMetadataFilter(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string // nil: malformed
	}{
		{"", map[string]string{}},
		{"k=v", map[string]string{"k": "v"}},
		{"k1=v1&k2=v2", map[string]string{"k1": "v1", "k2": "v2"}},
		{"k=", map[string]string{"k": ""}},
		{"=v", map[string]string{"": "v"}},
		{"k=a=b", map[string]string{"k": "a=b"}},
		{"k=1&k=2", map[string]string{"k": "2"}},
		{"k=a+b", map[string]string{"k": "a b"}},
		{"k=a%2Bb", map[string]string{"k": "a+b"}},
		{"example.com%2Fteam=ml", map[string]string{"example.com/team": "ml"}},
		{"k=%26%3D", map[string]string{"k": "&="}},
		{"k", nil},
		{"k=v&", nil},
		{"&k=v", nil},
		{"a=1&&b=2", nil},
		{"k=%zz", nil},
		{"%=v", nil},
		{"k=%", nil},
	}
	for _, tt := range tests {
		got, err := parseMetadataFilter(tt.in)
		if tt.want == nil {
			var he *httpx.Error
			if !errors.As(err, &he) || he.Code != "INVALID_METADATA_FORMAT" || he.Status != 400 {
				t.Errorf("parseMetadataFilter(%q) = %v, %v; want INVALID_METADATA_FORMAT", tt.in, got, err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("parseMetadataFilter(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// FuzzMetadataFilter feeds arbitrary filters to the parser: it never
// panics, refuses only with INVALID_METADATA_FORMAT, and what it accepts
// survives encoding the way the SDKs do and parsing again.
func FuzzMetadataFilter(f *testing.F) {
	for _, s := range []string{"", "k=v", "a=1&b=2", "k=a+b%2B", "k", "a=1&&b=2", "k=%zz", "=", "k=v&k=w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseMetadataFilter(s)
		if err != nil {
			var he *httpx.Error
			if !errors.As(err, &he) || he.Code != codeMetadataFormat || he.Status != 400 {
				t.Fatalf("parseMetadataFilter(%q): %#v, want INVALID_METADATA_FORMAT", s, err)
			}
			return
		}
		v := url.Values{}
		for k, val := range got {
			v.Set(k, val)
		}
		again, err := parseMetadataFilter(v.Encode())
		if err != nil || !maps.Equal(got, again) {
			t.Fatalf("parse(%q) = %v; encoded %q parses to %v, %v", s, got, v.Encode(), again, err)
		}
	})
}

func TestPaginate(t *testing.T) {
	items := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	tests := []struct {
		total, page, size int
		first, n          int
		info              api.PaginationInfo
	}{
		{0, 1, 20, 0, 0, api.PaginationInfo{Page: 1, PageSize: 20, TotalItems: 0, TotalPages: 0, HasNextPage: false}},
		{0, 3, 20, 0, 0, api.PaginationInfo{Page: 3, PageSize: 20, TotalItems: 0, TotalPages: 0, HasNextPage: false}},
		{1, 1, 20, 0, 1, api.PaginationInfo{Page: 1, PageSize: 20, TotalItems: 1, TotalPages: 1, HasNextPage: false}},
		{20, 1, 20, 0, 20, api.PaginationInfo{Page: 1, PageSize: 20, TotalItems: 20, TotalPages: 1, HasNextPage: false}},
		{21, 1, 20, 0, 20, api.PaginationInfo{Page: 1, PageSize: 20, TotalItems: 21, TotalPages: 2, HasNextPage: true}},
		{21, 2, 20, 20, 1, api.PaginationInfo{Page: 2, PageSize: 20, TotalItems: 21, TotalPages: 2, HasNextPage: false}},
		{21, 3, 20, 0, 0, api.PaginationInfo{Page: 3, PageSize: 20, TotalItems: 21, TotalPages: 2, HasNextPage: false}},
		{5, 2, 1, 1, 1, api.PaginationInfo{Page: 2, PageSize: 1, TotalItems: 5, TotalPages: 5, HasNextPage: true}},
		{5, 5, 1, 4, 1, api.PaginationInfo{Page: 5, PageSize: 1, TotalItems: 5, TotalPages: 5, HasNextPage: false}},
		{400, 2, 200, 200, 200, api.PaginationInfo{Page: 2, PageSize: 200, TotalItems: 400, TotalPages: 2, HasNextPage: false}},
		{3, int(^uint(0) >> 1), 200, 0, 0, api.PaginationInfo{Page: int(^uint(0) >> 1), PageSize: 200, TotalItems: 3, TotalPages: 1, HasNextPage: false}},
	}
	for _, tt := range tests {
		got, info := paginate(items(tt.total), tt.page, tt.size)
		if got == nil || len(got) != tt.n || (tt.n > 0 && got[0] != tt.first) || info != tt.info {
			t.Errorf("paginate(%d items, page %d, size %d) = %v, %+v; want %d from %d, %+v", tt.total, tt.page, tt.size, got, info, tt.n, tt.first, tt.info)
		}
	}
}

func TestParsePage(t *testing.T) {
	tests := []struct {
		q          string
		page, size int
		ok         bool
	}{
		{"", 1, 20, true},
		{"page=3&pageSize=200", 3, 200, true},
		{"pageSize=1", 1, 1, true},
		{"page=0", 0, 0, false},
		{"pageSize=0", 0, 0, false},
		{"pageSize=201", 0, 0, false},
		{"page=abc", 0, 0, false},
		{"page=1e3", 0, 0, false},
		{"page=99999999999999999999", 0, 0, false},
	}
	for _, tt := range tests {
		q, _ := url.ParseQuery(tt.q)
		page, size, err := parsePage(q)
		if (err == nil) != tt.ok || (tt.ok && (page != tt.page || size != tt.size)) {
			t.Errorf("parsePage(%q) = %d, %d, %v", tt.q, page, size, err)
		}
	}
}

func TestStateFilter(t *testing.T) {
	f := parseStates([]string{"running", " PAUSED ", ""})
	for state, want := range map[string]bool{"Running": true, "Paused": true, "RUNNING": true, "Pending": false, "": false} {
		if f.match(state) != want {
			t.Errorf("match(%q) = %v", state, !want)
		}
	}
	if all := parseStates(nil); !all.match("Anything") {
		t.Error("no states must match every state")
	}
	if blank := parseStates([]string{" "}); !blank.match("Running") {
		t.Error("blank states must be ignored")
	}
}
