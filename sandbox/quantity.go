package sandbox

import (
	"fmt"
	"math/big"
	"regexp"
	"strings"
)

// Quantities are written as Kubernetes writes them.
var (
	cpuRE    = regexp.MustCompile(`^([0-9]{1,15}(?:\.[0-9]{1,9})?)(m?)$`)
	memoryRE = regexp.MustCompile(`^([0-9]{1,20}(?:\.[0-9]{1,9})?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$`)
)

// MaxCPUMillis bounds a CPU quantity (a million cores), so that runtimes
// can count it in nanocores.
const MaxCPUMillis int64 = 1e9

var memoryUnits = map[string]int64{
	"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
}

// ParseCPU parses a CPU quantity ("2", "0.5", "500m") into thousandths of
// a CPU. It must come to a positive whole number of millicores, at most
// MaxCPUMillis.
func ParseCPU(s string) (int64, error) {
	s = strings.TrimSpace(s)
	m := cpuRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("cpu %q: want cores (\"2\", \"0.5\") or millicores (\"500m\")", s)
	}
	r, _ := new(big.Rat).SetString(m[1])
	if m[2] == "" {
		r.Mul(r, big.NewRat(1000, 1))
	}
	if !r.IsInt() || r.Sign() <= 0 || !r.Num().IsInt64() || r.Num().Int64() > MaxCPUMillis {
		return 0, fmt.Errorf("cpu %q: want a positive amount in whole millicores, at most %d cores", s, MaxCPUMillis/1000)
	}
	return r.Num().Int64(), nil
}

// ParseMemory parses a memory quantity ("512Mi", "2Gi", "1G", "1000000")
// into bytes, rounded down. ("512m" would be thousandths of a byte, and
// is refused.)
func ParseMemory(s string) (int64, error) { return parseBytes("memory", s) }

// ParseStorage parses a disk quantity (Kubernetes' "ephemeral-storage")
// as ParseMemory parses memory: "10Gi", "512Mi", "1G", bytes.
func ParseStorage(s string) (int64, error) { return parseBytes("ephemeral-storage", s) }

// parseBytes parses a quantity of bytes; kind names it in errors.
func parseBytes(kind, s string) (int64, error) {
	s = strings.TrimSpace(s)
	m := memoryRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%s %q: want bytes with an optional unit (\"512Mi\", \"2Gi\", \"1G\", \"1000000\")", kind, s)
	}
	r, _ := new(big.Rat).SetString(m[1])
	r.Mul(r, new(big.Rat).SetInt64(memoryUnits[m[2]]))
	n := new(big.Int).Quo(r.Num(), r.Denom())
	if n.Sign() <= 0 || !n.IsInt64() {
		return 0, fmt.Errorf("%s %q: out of range", kind, s)
	}
	return n.Int64(), nil
}
