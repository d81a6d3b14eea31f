package sandbox

import (
	"strings"
	"testing"
)

func TestParseQuantities(t *testing.T) {
	cpus := map[string]int64{"2": 2000, "0.5": 500, "500m": 500, "1.25": 1250, " 3 ": 3000, "0.001": 1}
	for in, want := range cpus {
		if got, err := ParseCPU(in); err != nil || got != want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1", "abc", "1e400", "m", "-5m", "NaN", "Inf", "0.0005", "2000000"} {
		if _, err := ParseCPU(bad); err == nil {
			t.Errorf("ParseCPU(%q) succeeded", bad)
		}
	}
	mems := map[string]int64{"512Mi": 512 << 20, "2Gi": 2 << 30, "1G": 1e9, "10000000": 1e7, "1.5Gi": 3 << 29, "1Ki": 1024}
	for in, want := range mems {
		if got, err := ParseMemory(in); err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1Gi", "1Xi", "512m", "9999999999Pi", "NaN", "1e9"} {
		if _, err := ParseMemory(bad); err == nil {
			t.Errorf("ParseMemory(%q) succeeded", bad)
		}
		if _, err := ParseStorage(bad); err == nil {
			t.Errorf("ParseStorage(%q) succeeded", bad)
		}
	}
	for in, want := range map[string]int64{"64Mi": 64 << 20, "10Gi": 10 << 30, "1G": 1e9, " 4096 ": 4096} {
		if got, err := ParseStorage(in); err != nil || got != want {
			t.Errorf("ParseStorage(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ParseStorage("10GB"); err == nil || !strings.Contains(err.Error(), "ephemeral-storage") {
		t.Errorf("ParseStorage(10GB) = %v, want an error naming ephemeral-storage", err)
	}
}

func FuzzParseQuantities(f *testing.F) {
	for _, s := range []string{"2", "500m", "1.5Gi", "1e3", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := ParseCPU(s); err == nil && n <= 0 {
			t.Fatalf("ParseCPU(%q) = %d", s, n)
		}
		if n, err := ParseMemory(s); err == nil && n <= 0 {
			t.Fatalf("ParseMemory(%q) = %d", s, n)
		}
		if n, err := ParseStorage(s); err == nil && n <= 0 {
			t.Fatalf("ParseStorage(%q) = %d", s, n)
		}
	})
}
