package lifecycle

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/opensandbox/opensandbox/api"
)

// Page sizes of the list routes.
const (
	defaultPageSize = 20
	maxPageSize     = 200
)

// parseMetadataFilter parses the metadata filter of GET /sandboxes, which
// is itself form-encoded ("k1=v1&k2=v2", decoded once already as a query
// value): each "&"-separated segment must hold "=", keys and values are
// unescaped again ("+" is a space), an empty value is allowed and the last
// of duplicate keys wins. The empty string is no filter (an empty map).
func parseMetadataFilter(s string) (map[string]string, error) {
	out := map[string]string{}
	if s == "" {
		return out, nil
	}
	for seg := range strings.SplitSeq(s, "&") {
		k, v, ok := strings.Cut(seg, "=")
		if !ok {
			return nil, invalid(codeMetadataFormat, "metadata filter %q: segment %q is not key=value", s, seg)
		}
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, invalid(codeMetadataFormat, "metadata filter %q: key %q: %v", s, k, err)
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, invalid(codeMetadataFormat, "metadata filter %q: value %q: %v", s, v, err)
		}
		out[key] = val
	}
	return out, nil
}

// matchesMetadata reports whether md holds every pair of filter.
func matchesMetadata(md, filter map[string]string) bool {
	for k, want := range filter {
		if got, ok := md[k]; !ok || got != want {
			return false
		}
	}
	return true
}

// stateFilter holds the lower-cased states of the repeated state query
// parameter; blank values are ignored, and no values means any state.
type stateFilter map[string]bool

// parseStates returns the filter of the values of a repeated state
// parameter.
func parseStates(values []string) stateFilter {
	f := stateFilter{}
	for _, v := range values {
		if v = strings.TrimSpace(v); v != "" {
			f[strings.ToLower(v)] = true
		}
	}
	return f
}

// match reports whether state passes the filter, case-insensitively.
func (f stateFilter) match(state string) bool {
	return len(f) == 0 || f[strings.ToLower(state)]
}

// parsePage reads page (>= 1, default 1) and pageSize (1 to 200, default
// 20) from the query.
func parsePage(q url.Values) (page, size int, err error) {
	page, size = 1, defaultPageSize
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, 0, invalid(codeInvalidParameter, "page %q: want an integer of at least 1", v)
		}
		page = n
	}
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			return 0, 0, invalid(codeInvalidParameter, "pageSize %q: want an integer from 1 to %d", v, maxPageSize)
		}
		size = n
	}
	return page, size, nil
}

// paginate returns page (1-based) of items, size per page, and its
// description: totalPages = ceil(totalItems/size), hasNextPage = page <
// totalPages; a page past the end is empty, with the same totals.
func paginate[T any](items []T, page, size int) ([]T, api.PaginationInfo) {
	total := len(items)
	pages := (total + size - 1) / size
	info := api.PaginationInfo{Page: page, PageSize: size, TotalItems: total, TotalPages: pages, HasNextPage: page < pages}
	if page > pages {
		return []T{}, info
	}
	start := (page - 1) * size
	end := min(start+size, total)
	return items[start:end], info
}
