package mitm

import (
	"bytes"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Redacted replaces a secret wherever the interceptor finds one in a
// response.
const Redacted = "[REDACTED]"

// readChunk is how much the redactor reads from its source at a time,
// and the size of the buffers of bufPool.
const readChunk = 32 << 10

// bufPool holds the buffers of response bodies in flight: the
// ReverseProxy's copy buffer and the redactor's.
var bufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, readChunk)
	return &b
}}

// getBuf returns an empty buffer with room for readChunk bytes.
func getBuf() []byte { return (*bufPool.Get().(*[]byte))[:0] }

// putBuf returns b to the pool unless it grew too large to keep.
func putBuf(b []byte) {
	if cap(b) >= readChunk && cap(b) <= 4*readChunk {
		b = b[:0]
		bufPool.Put(&b)
	}
}

// copyBuffers is the ReverseProxy's httputil.BufferPool.
type copyBuffers struct{}

func (copyBuffers) Get() []byte  { b := getBuf(); return b[:cap(b)] }
func (copyBuffers) Put(b []byte) { putBuf(b) }

// secretSet is the non-empty distinct secrets, longest first.
func secretSet(secrets []string) []string {
	out := make([]string, 0, len(secrets))
	for _, s := range secrets {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// redactString replaces every secret in s, scanning left to right and
// taking the longest secret where several start at the same place.
// secrets is as Binder.Secrets returns them; the common case, s holds
// none, costs no allocation.
func redactString(s string, secrets []string) string {
	if !containsAny(s, secrets) {
		return s
	}
	return string(redactAll([]byte(s), secretSet(secrets)))
}

func containsAny(s string, secrets []string) bool {
	for _, x := range secrets {
		if x != "" && strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// redactAll is the whole-input form of the streaming redactor: at each
// position the longest secret that starts there is replaced, else the
// byte is kept. secrets must be a secretSet.
func redactAll(b []byte, secrets []string) []byte {
	var out []byte
	sc := newScanner(secrets)
	i := 0
	for {
		j, n := sc.find(b, i)
		if j < 0 {
			return append(out, b[i:]...)
		}
		out = append(out, b[i:j]...)
		out = append(out, Redacted...)
		i = j + n
	}
}

// scanner finds secrets left to right in one buffer. It remembers where
// each secret occurs next, so a buffer is searched about once per
// secret, not once per match: an input full of secrets costs no more
// than one without.
type scanner struct {
	secrets []string // longest first
	next    []int    // per secret: where it occurs next; -1 nowhere; -2 not searched yet
}

func newScanner(secrets []string) *scanner {
	sc := &scanner{secrets: secrets, next: make([]int, len(secrets))}
	sc.reset()
	return sc
}

// reset forgets what was found, for a new buffer.
func (sc *scanner) reset() {
	for k := range sc.next {
		sc.next[k] = -2
	}
}

// find returns where in b, at or after i, the first secret starts, and
// its length, the longest one where several start there; -1 when there
// is none. Successive calls for one buffer must not move i backwards.
func (sc *scanner) find(b []byte, i int) (at, n int) {
	at = -1
	for k, s := range sc.secrets {
		p := sc.next[k]
		if p == -2 || p >= 0 && p < i {
			p = -1
			if j := bytes.Index(b[i:], []byte(s)); j >= 0 {
				p = i + j
			}
			sc.next[k] = p
		}
		if p >= 0 && (at < 0 || p < at) { // longest first: a tie keeps the longest
			at, n = p, len(s)
		}
	}
	return at, n
}

// redactHeader replaces every secret in h's values, in place. secrets
// is as Binder.Secrets returns them.
func redactHeader(h http.Header, secrets []string) {
	if len(secrets) == 0 {
		return
	}
	for _, vs := range h {
		for i, v := range vs {
			vs[i] = redactString(v, secrets)
		}
	}
}

// redactReader passes src through with every secret replaced by
// Redacted, for the first limit bytes of src; the rest passes unchanged.
// It returns whatever it can after each read of src, holding back only
// a tail that could be the start of a secret, so a stream's events
// still arrive one by one.
type redactReader struct {
	src     io.Reader
	secrets []string // longest first
	sc      *scanner
	limit   int64  // bytes of src still to scan; <= 0: pass through
	buf     []byte // read from src, not yet judged
	out     []byte // judged; out[off:] is not yet returned
	off     int
	err     error // src's error, once it returned one
}

// newRedactReader redacts secrets in the first limit bytes of src.
func newRedactReader(src io.Reader, secrets []string, limit int64) *redactReader {
	return &redactReader{src: src, secrets: secrets, sc: newScanner(secrets), limit: limit}
}

func (r *redactReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.limit <= 0 && len(r.buf) == 0 {
			return r.src.Read(p) // past the limit: pass through
		}
		r.fill()
	}
	n := copy(p, r.out[r.off:])
	r.off += n
	if r.off == len(r.out) {
		r.out, r.off = r.out[:0], 0
	}
	return n, nil
}

// fill reads once from src and moves what is safe to r.out.
func (r *redactReader) fill() {
	if r.limit > 0 {
		want := int(min(int64(readChunk), r.limit))
		if r.buf == nil {
			r.buf, r.out = getBuf(), getBuf()
		}
		r.buf = slices.Grow(r.buf, want)
		n, err := r.src.Read(r.buf[len(r.buf) : len(r.buf)+want])
		r.buf = r.buf[:len(r.buf)+n]
		r.limit -= int64(n)
		r.err = err
	}
	final := r.err != nil || r.limit <= 0
	r.out, r.buf = r.judge(r.out, r.buf, final)
}

// release returns the reader's buffers to the pool; the reader must not
// be used after.
func (r *redactReader) release() {
	if r.buf != nil {
		putBuf(r.buf)
		putBuf(r.out)
		r.buf, r.out, r.off = nil, nil, 0
	}
}

// judge appends to out the redacted form of buf's bytes that can be
// judged now and returns the rest of buf, the tail that could still
// become a secret. With final set every byte is judged.
func (r *redactReader) judge(out, buf []byte, final bool) ([]byte, []byte) {
	hold := len(buf)
	if !final {
		hold = r.holdFrom(buf, 0)
	}
	r.sc.reset()
	i := 0
	for {
		j, n := r.sc.find(buf, i)
		if j < 0 || j >= hold {
			// A secret starting at or after hold could still be longer
			// than what buf shows; the whole-input scan would take that
			// one, so wait for more.
			out = append(out, buf[i:hold]...)
			return out, buf[:copy(buf, buf[hold:])]
		}
		out = append(out, buf[i:j]...)
		out = append(out, Redacted...)
		i = j + n
		if i > hold {
			// The secret ran past where a partial one began.
			hold = r.holdFrom(buf, i)
		}
	}
}

// holdFrom returns the first position at or after i from which the end
// of buf is a proper prefix of some secret: what must wait for more
// input. len(buf) when there is none.
func (r *redactReader) holdFrom(buf []byte, i int) int {
	longest := 0
	if len(r.secrets) > 0 {
		longest = len(r.secrets[0])
	}
	for p := max(i, len(buf)-longest+1); p < len(buf); p++ {
		tail := buf[p:]
		for _, s := range r.secrets {
			if len(s) > len(tail) && string(tail) == s[:len(tail)] {
				return p
			}
		}
	}
	return len(buf)
}

// isText reports whether a response of this Content-Type is text the
// interceptor redacts: text/*, JSON, XML, JavaScript, form data, event
// streams. A missing or unreadable type counts as text.
func isText(contentType string) bool {
	if strings.TrimSpace(contentType) == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return true
	}
	typ, sub, _ := strings.Cut(mt, "/")
	switch {
	case typ == "text":
		return true
	case typ != "application":
		return false
	}
	switch sub {
	case "json", "xml", "javascript", "x-javascript", "ecmascript", "x-www-form-urlencoded", "x-ndjson", "jsonl":
		return true
	}
	return strings.HasSuffix(sub, "+json") || strings.HasSuffix(sub, "+xml")
}
