package process

import (
	"bytes"
	"testing"
)

func TestRing(t *testing.T) {
	r := NewRing(8)
	if data, start := r.Since(0); data != nil || start != 0 {
		t.Fatalf("empty ring: Since(0) = %q, %d", data, start)
	}
	r.Write([]byte("abc"))
	r.Write([]byte("defgh"))
	if data, start := r.Since(0); string(data) != "abcdefgh" || start != 0 {
		t.Fatalf("full ring: Since(0) = %q, %d", data, start)
	}
	r.Write([]byte("ij"))
	if data, start := r.Since(0); string(data) != "cdefghij" || start != 2 {
		t.Fatalf("after wrap: Since(0) = %q, %d; want cdefghij, 2", data, start)
	}
	if data, start := r.Since(7); string(data) != "hij" || start != 7 {
		t.Fatalf("Since(7) = %q, %d", data, start)
	}
	if data, start := r.Since(10); data != nil || start != 10 {
		t.Fatalf("Since(end) = %q, %d", data, start)
	}
	r.Write([]byte("0123456789AB"))
	if data, start := r.Since(0); string(data) != "456789AB" || start != 14 || r.Total() != 22 {
		t.Fatalf("after oversized write: Since(0) = %q, %d, total %d", data, start, r.Total())
	}
}

// FuzzRing checks the ring against a model that keeps everything.
func FuzzRing(f *testing.F) {
	f.Add([]byte("hello world, this is a ring"), uint8(5), uint8(3), int64(4))
	f.Fuzz(func(t *testing.T, data []byte, size, step uint8, since int64) {
		cap := int(size%32) + 1
		n := int(step%16) + 1
		r := NewRing(cap)
		var all []byte
		for i := 0; i < len(data); i += n {
			chunk := data[i:min(i+n, len(data))]
			r.Write(chunk)
			all = append(all, chunk...)
		}
		got, start := r.Since(since)
		oldest := int64(max(0, len(all)-cap))
		wantStart := min(max(since, oldest), int64(len(all)))
		if start != wantStart {
			t.Fatalf("Since(%d) start = %d, want %d", since, start, wantStart)
		}
		if !bytes.Equal(got, all[wantStart:]) && !(len(got) == 0 && int(wantStart) == len(all)) {
			t.Fatalf("Since(%d) = %q, want %q", since, got, all[wantStart:])
		}
	})
}
