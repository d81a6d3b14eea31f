package report

import (
	"bytes"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleReport() *Report {
	return &Report{
		Benchmark: "perf", Subject: "opensandbox", Mode: "quick",
		RatioNote: "how many times better than the baseline", RatioFormat: "%.2fx",
		Rows: []Row{
			Row{Name: "create to first command, cold, p50 (p99)", Unit: "ms", Value: 180, P99: 240,
				Baseline: 250, BaseP99: 300, BaseName: "docker run -d + docker exec", Ratio: 1.39, Target: "not slower"}.Judge(true),
			Row{Name: "create to first command, pooled, p50 (p99)", Unit: "ms", Missing: "not available (pools answered 501)",
				Baseline: 250, BaseP99: 300, BaseName: "docker run -d + docker exec", Target: "p50 < 50 ms"},
			Row{Name: "100 concurrent creates, pooled: wall (p99)", Unit: "ms", Value: 900, P99: 700,
				Baseline: 20000, BaseName: "docker run -d", Ratio: 22, Target: "p99 < 500 ms"}.Judge(false),
			{Name: "server RSS", Unit: "MB", Value: 18.3},
			{Name: "a name far too long for its column " + strings.Repeat("and longer ", 20) + "\u2264 non-ASCII", Unit: "MB/s", Value: 0},
		},
	}
}

func TestChart(t *testing.T) {
	r := sampleReport()
	var buf bytes.Buffer
	if err := r.Chart(&buf); err != nil {
		t.Fatalf("Chart: %v", err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("the chart does not decode as PNG: %v", err)
	}
	b := img.Bounds()
	if b.Dx() != chartWidth || b.Dy() < len(r.Rows)*rowHeight || b.Dy() > 2000 {
		t.Fatalf("chart is %dx%d; want %d wide and %d to 2000 high", b.Dx(), b.Dy(), chartWidth, len(r.Rows)*rowHeight)
	}
	// The first row's bars are drawn in their colours: the baseline's
	// spans the whole bar area (it is the row's largest figure).
	top := headHeight
	if got := rgba(img, barLeft+2, top+6+barHeight/2); got != colorOurs {
		t.Errorf("first row, ours: pixel %v, want %v", got, colorOurs)
	}
	if got := rgba(img, barLeft+barMax-2, top+rowHeight-8-barHeight/2); got != colorBaseP99 {
		t.Errorf("first row, baseline p99: pixel %v, want %v", got, colorBaseP99)
	}
	// A row without figures of ours draws no bar of ours.
	second := top + rowHeight
	if got := rgba(img, barLeft+barMax/2, second+6+2); got == colorOurs || got == colorOursP99 {
		t.Errorf("a missing row has a bar of ours")
	}
}

// rgba is the colour of img at (x, y).
func rgba(img image.Image, x, y int) color.RGBA {
	return color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
}

func TestChartEmpty(t *testing.T) {
	var buf bytes.Buffer
	r := &Report{Benchmark: "empty", Mode: "quick"}
	if err := r.Chart(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&buf); err != nil {
		t.Fatalf("decode: %v", err)
	}
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	r := sampleReport()
	if err := r.Write(dir); err != nil {
		t.Fatalf("Write: %v", err)
	}
	f, err := os.Open(filepath.Join(dir, "perf-quick.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil || cfg.Width != chartWidth {
		t.Fatalf("perf-quick.png: %+v, %v", cfg, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "perf-quick.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct{ Rows []Row }
	if err := json.Unmarshal(data, &doc); err != nil || len(doc.Rows) != len(r.Rows) {
		t.Fatalf("perf-quick.json: %d rows, %v", len(doc.Rows), err)
	}
	if doc.Rows[0].Met == nil || !*doc.Rows[0].Met || doc.Rows[1].Missing == "" {
		t.Errorf("the JSON lost met or missing: %+v", doc.Rows[:2])
	}
}

func TestPrint(t *testing.T) {
	var buf bytes.Buffer
	sampleReport().Print(&buf)
	out := buf.String()
	for _, want := range []string{
		"180 (240) ms", "not slower: PASS", "not available (pools answered 501)", "p99 < 500 ms: MISS", "20000 ms [docker run -d]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestFormatValue(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0.4242, "0.424"}, {58.64, "58.6"}, {1362.4, "1362"}, {20000, "20000"}, {0, "0"}} {
		if got := FormatValue(c.v); got != c.want {
			t.Errorf("FormatValue(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}
