package process

import (
	"bytes"
	"os"
	"testing"
)

func TestSpool(t *testing.T) {
	dir := t.TempDir()
	s, err := NewSpool(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("hello "))
	s.Write([]byte("world"))
	var b bytes.Buffer
	if n, err := s.WriteRange(&b, 6, s.Size()); err != nil || n != 5 || b.String() != "world" {
		t.Fatalf("WriteRange(6, end) = %d, %v, %q", n, err, b.String())
	}
	b.Reset()
	if n, _ := s.WriteRange(&b, -3, 100); n != 11 || b.String() != "hello world" {
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
	s, err := NewSpool("/nonexistent-directory")
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
