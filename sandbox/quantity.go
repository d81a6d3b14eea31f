package sandbox

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseCPU parses a CPU quantity as Kubernetes writes it ("2", "0.5",
// "500m") into thousandths of a CPU.
func ParseCPU(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if m, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("cpu %q: want a positive number of CPUs or millicores (\"2\", \"0.5\", \"500m\")", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0 && f <= 1e6) || math.Round(f*1000) < 1 {
		return 0, fmt.Errorf("cpu %q: want a positive number of CPUs or millicores (\"2\", \"0.5\", \"500m\")", s)
	}
	return int64(math.Round(f * 1000)), nil
}

var memoryUnits = []struct {
	suffix string
	factor float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// ParseMemory parses a memory quantity as Kubernetes writes it ("512Mi",
// "2Gi", "1G", "1000000") into bytes.
func ParseMemory(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, factor := s, 1.0
	for _, u := range memoryUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, factor = n, u.factor
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	bytes := f * factor
	if err != nil || !(f > 0 && bytes < 1<<62) {
		return 0, fmt.Errorf("memory %q: want a positive size such as \"512Mi\" or \"2Gi\"", s)
	}
	if bytes < 6<<20 {
		return 0, fmt.Errorf("memory %q: the engine needs at least 6Mi", s)
	}
	return int64(bytes), nil
}
