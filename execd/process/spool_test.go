package process

import (
	"bytes"
	"os"
	"testing"
)

func TestSpool(t *testing.T) {
	dir := t.TempDir()
	s, err := NewSpool(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("hello "))
	s.Write([]byte("world"))
	var b bytes.Buffer
	if start, n, err := s.WriteRange(&b, 6, s.Size()); err != nil || start != 6 || n != 5 || b.String() != "world" {
		t.Fatalf("WriteRange(6, end) = %d, %d, %v, %q", start, n, err, b.String())
	}
	b.Reset()
	if _, n, _ := s.WriteRange(&b, -3, 100); n != 11 || b.String() != "hello world" {
		t.Fatalf("WriteRange(-3, 100) = %d, %q", n, b.String())
	}
	// The spool is anonymous: nothing shows up in its directory.
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("spool left %d names in its directory", len(entries))
	}
	s.Close()
	if _, err := s.Write([]byte("x")); err == nil {
		t.Fatal("Write after Close succeeded")
	}
}

func TestSpoolFallsBackToMemory(t *testing.T) {
	s, err := NewSpool("/nonexistent-directory", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("in memory"))
	var b bytes.Buffer
	s.WriteRange(&b, 0, s.Size())
	if b.String() != "in memory" {
		t.Fatalf("got %q", b.String())
	}
}

// FuzzSpool checks the bounded spool against a model that keeps
// everything: what it returns is always the tail of the stream it holds.
func FuzzSpool(f *testing.F) {
	f.Add([]byte("0123456789abcdefghij"), uint8(7), uint8(3), int64(2), int64(15))
	f.Fuzz(func(t *testing.T, data []byte, capacity, step uint8, from, to int64) {
		capN := int64(capacity%40) + 1
		n := int(step%20) + 1
		s, err := NewSpool(t.TempDir(), capN)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var all []byte
		for i := 0; i < len(data); i += n {
			chunk := data[i:min(i+n, len(data))]
			if m, err := s.Write(chunk); err != nil || m != len(chunk) {
				t.Fatalf("Write: %d, %v", m, err)
			}
			all = append(all, chunk...)
		}
		var b bytes.Buffer
		start, got, err := s.WriteRange(&b, from, to)
		if err != nil {
			t.Fatal(err)
		}
		size := int64(len(all))
		wantTo := min(to, size)
		wantFrom := max(from, size-capN, 0)
		if wantFrom >= wantTo {
			if got != 0 {
				t.Fatalf("WriteRange(%d, %d) returned %d bytes, want none", from, to, got)
			}
			return
		}
		if start != wantFrom || !bytes.Equal(b.Bytes(), all[wantFrom:wantTo]) {
			t.Fatalf("WriteRange(%d, %d) = %d, %q; want %d, %q", from, to, start, b.Bytes(), wantFrom, all[wantFrom:wantTo])
		}
	})
}
