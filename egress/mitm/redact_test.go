package mitm

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// chunkReader returns data in reads of the given sizes, cycling through
// them (a size of 0 counts as 1).
type chunkReader struct {
	data  []byte
	sizes []int
	i     int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.sizes) > 0 {
		n = max(1, r.sizes[r.i%len(r.sizes)])
		r.i++
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func redactStream(t testing.TB, in string, secrets []string, limit int64, sizes ...int) string {
	t.Helper()
	r := newRedactReader(&chunkReader{data: []byte(in), sizes: sizes}, secretSet(secrets), limit)
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(out)
}

func TestRedactReader(t *testing.T) {
	const s = "sk-SECRET"
	cases := []struct {
		name    string
		in      string
		secrets []string
		limit   int64
		sizes   []int
		want    string
	}{
		{"whole", "a sk-SECRET b", []string{s}, 1 << 20, []int{100}, "a [REDACTED] b"},
		{"byte by byte", "a sk-SECRET b sk-SECRET", []string{s}, 1 << 20, []int{1}, "a [REDACTED] b [REDACTED]"},
		{"split in the middle", "xx sk-SECRET yy", []string{s}, 1 << 20, []int{6, 100}, "xx [REDACTED] yy"},
		{"prefix at the end only", "tail sk-SEC", []string{s}, 1 << 20, []int{3}, "tail sk-SEC"},
		{"adjacent", s + s, []string{s}, 1 << 20, []int{4}, "[REDACTED][REDACTED]"},
		{"repeated first byte", "sssk-SECRET", []string{s}, 1 << 20, []int{2}, "ss[REDACTED]"},
		{"longest wins", "key-LONGSECRET", []string{"key-LONG", "key-LONGSECRET"}, 1 << 20, []int{5}, "[REDACTED]"},
		{"longer one still coming", "key-LONGSECRET", []string{"LONG", "key-LONGSECRET"}, 1 << 20, []int{8, 100}, "[REDACTED]"},
		{"empty secret ignored", "abc", []string{"", s}, 1 << 20, []int{1}, "abc"},
		{"no secrets", "abc sk-SECRET", nil, 1 << 20, []int{2}, "abc sk-SECRET"},
		{"limit passes the rest", s + "...." + s, []string{s}, 12, []int{3}, "[REDACTED]...." + s},
		{"secret across the limit", "...." + s, []string{s}, 8, []int{3}, "...." + s},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := redactStream(t, tc.in, tc.secrets, tc.limit, tc.sizes...); got != tc.want {
				t.Errorf("redact(%q, %q, limit %d, reads %v) = %q, want %q", tc.in, tc.secrets, tc.limit, tc.sizes, got, tc.want)
			}
		})
	}
}

// The redactor hands on at once what cannot be part of a secret, and
// holds back no more than len(longest)-1 bytes.
func TestRedactReaderPrompt(t *testing.T) {
	const s = "sk-SECRET"
	pr, pw := io.Pipe()
	r := newRedactReader(pr, []string{s}, 1<<20)
	buf := make([]byte, 100)
	for _, tc := range []struct{ write, want string }{
		{"data: one\n\n", "data: one\n\n"},
		{"data: sk-", "data: "}, // "sk-" could start the secret
		{"SECRET!\n\n", "[REDACTED]!\n\n"},
	} {
		go pw.Write([]byte(tc.write))
		n, err := r.Read(buf)
		if err != nil || string(buf[:n]) != tc.want {
			t.Fatalf("after writing %q read %q, %v; want %q", tc.write, buf[:n], err, tc.want)
		}
	}
	// All of "sk-SECRE" is held back until the X shows it is no secret.
	go func() {
		pw.Write([]byte("sk-SECRE"))
		pw.Write([]byte("X"))
	}()
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "sk-SECREX" {
		t.Fatalf("read %q, %v; want the held-back sk-SECRE and X", buf[:n], err)
	}
	pw.CloseWithError(errors.New("boom"))
	if _, err := r.Read(buf); err == nil || err.Error() != "boom" {
		t.Errorf("read after the source failed: %v, want boom", err)
	}
}

func TestRedactReaderIOTest(t *testing.T) {
	in := strings.Repeat("abc sk-SECRET def ", 5000)
	want := strings.ReplaceAll(in, "sk-SECRET", Redacted)
	r := newRedactReader(strings.NewReader(in), []string{"sk-SECRET"}, 1<<30)
	if err := iotest.TestReader(r, []byte(want)); err != nil {
		t.Error(err)
	}
}

func TestRedactHeader(t *testing.T) {
	h := map[string][]string{
		"Set-Cookie": {"a=sk-SECRET; Path=/", "b=1"},
		"X-Echo":     {"Bearer sk-SECRET sk-SECRET"},
	}
	redactHeader(h, []string{"", "sk-SECRET"})
	if got := h["Set-Cookie"][0]; got != "a=[REDACTED]; Path=/" {
		t.Errorf("Set-Cookie %q", got)
	}
	if got := h["Set-Cookie"][1]; got != "b=1" {
		t.Errorf("Set-Cookie %q", got)
	}
	if got := h["X-Echo"][0]; got != "Bearer [REDACTED] [REDACTED]" {
		t.Errorf("X-Echo %q", got)
	}
}

func TestIsText(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/plain; charset=utf-8":         true,
		"text/event-stream":                 true,
		"application/json":                  true,
		"application/problem+json":          true,
		"application/atom+xml":              true,
		"application/xml":                   true,
		"application/javascript":            true,
		"application/x-www-form-urlencoded": true,
		"":                                  true,
		"application/octet-stream":          false,
		"image/png":                         false,
		"application/grpc":                  false,
		"multipart/form-data; boundary=x":   false,
	} {
		if got := isText(ct); got != want {
			t.Errorf("isText(%q) = %v, want %v", ct, got, want)
		}
	}
}

// referenceRedact is the simple reference: scan the whole input, and at
// each position replace the longest secret that starts there.
func referenceRedact(in []byte, secrets []string) []byte {
	var out []byte
	for i := 0; i < len(in); {
		n := 0
		for _, s := range secrets {
			if s != "" && len(s) > n && bytes.HasPrefix(in[i:], []byte(s)) {
				n = len(s)
			}
		}
		if n > 0 {
			out = append(out, Redacted...)
			i += n
			continue
		}
		out = append(out, in[i])
		i++
	}
	return out
}

func FuzzRedactReader(f *testing.F) {
	f.Add([]byte("a sk-SECRET b"), "sk-SECRET", "", []byte{1, 2, 3})
	f.Add([]byte("sssk-SECRETsk-SECRET"), "sk-SECRET", "SECRET", []byte{4})
	f.Add([]byte("key-LONGSECRET LONG"), "LONG", "key-LONGSECRET", []byte{8, 1})
	f.Add([]byte("aaaaaaa"), "aa", "aaa", []byte{1})
	f.Add([]byte("data: x\n\ndata: y\n\n"), "\n\nd", "x", []byte{2, 7})
	f.Fuzz(func(t *testing.T, in []byte, s1, s2 string, sizes []byte) {
		if len(s1) > 64 || len(s2) > 64 || len(in) > 1<<16 {
			return
		}
		secrets := []string{s1, s2}
		sz := make([]int, len(sizes))
		for i, b := range sizes {
			sz[i] = int(b)
		}
		r := newRedactReader(&chunkReader{data: bytes.Clone(in), sizes: sz}, secretSet(secrets), 1<<30)
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		want := referenceRedact(in, secrets)
		if !bytes.Equal(got, want) {
			t.Fatalf("redact(%q, %q, reads %v) = %q, want %q", in, secrets, sz, got, want)
		}
		if s2 == "" && s1 != "" {
			if want := bytes.ReplaceAll(in, []byte(s1), []byte(Redacted)); !bytes.Equal(got, want) {
				t.Fatalf("redact(%q, %q) = %q, bytes.ReplaceAll gives %q", in, s1, got, want)
			}
		}
		if s := redactString(string(in), secrets); s != string(want) {
			t.Fatalf("redactString(%q, %q) = %q, want %q", in, secrets, s, want)
		}
	})
}
