// Package report prints and records the results of the benchmark
// harnesses under bench/: one table on stdout, and one JSON file and one
// PNG chart per harness and mode. Only the harnesses import it.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"
)

// Row is one measure, with the baseline measured in the same run.
type Row struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Value    float64 `json:"value"`
	P99      float64 `json:"p99,omitempty"`
	Baseline float64 `json:"baseline,omitempty"`
	BaseP99  float64 `json:"baseline_p99,omitempty"`
	BaseName string  `json:"baseline_name,omitempty"`
	// Ratio compares Value with Baseline as the harness's RatioNote says.
	Ratio  float64 `json:"ratio,omitempty"`
	Target string  `json:"target,omitempty"`
	// Met says whether the row meets its Target; nil when the row has no
	// target or could not be judged. Print and the chart add PASS or MISS.
	Met *bool `json:"met,omitempty"`
	// Missing, when set, says why this project's figure could not be
	// measured ("not available (pools answered 501)"); Value and P99 are
	// then meaningless and printed as this text.
	Missing string `json:"missing,omitempty"`
	Note    string `json:"note,omitempty"`
}

// Verdict is the target column: Target, then ": PASS" or ": MISS" when
// Met says.
func (row *Row) Verdict() string {
	if row.Met == nil {
		return row.Target
	}
	v := "MISS"
	if *row.Met {
		v = "PASS"
	}
	if row.Target == "" {
		return v
	}
	return row.Target + ": " + v
}

// Judge sets Met to ok and returns the row, for rows built in one
// expression.
func (row Row) Judge(ok bool) Row {
	row.Met = &ok
	return row
}

// FormatValue prints a figure with three significant digits, without an
// exponent: 0.424, 58.6, 1360.
func FormatValue(v float64) string {
	if v >= 1000 || v <= -1000 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// Ours is this project's figure as printed: "p50 (p99) unit", or the
// reason it is missing.
func (row *Row) Ours() string {
	if row.Missing != "" {
		return row.Missing
	}
	return pair(row.Value, row.P99, row.Unit)
}

// Base is the baseline's figure as printed, or "" without a baseline.
func (row *Row) Base() string {
	if row.BaseName == "" {
		return ""
	}
	return pair(row.Baseline, row.BaseP99, row.Unit)
}

func pair(v, p99 float64, unit string) string {
	if p99 != 0 {
		return FormatValue(v) + " (" + FormatValue(p99) + ") " + unit
	}
	return FormatValue(v) + " " + unit
}

// Report is the results of one harness run.
type Report struct {
	// Benchmark names the harness ("execd", "server", "cp"); it names the
	// JSON file too.
	Benchmark string
	// Subject heads the column of this project's figures.
	Subject string
	Mode    string
	// RatioNote explains the ratio column under the table.
	RatioNote string
	// RatioFormat prints a ratio; default "%.2f".
	RatioFormat string
	Rows        []Row
}

// Print writes the table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\n%s benchmark (%s), %s\n\n", r.Benchmark, r.Mode, time.Now().Format("2006-01-02 15:04"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measure\t%s\tbaseline\tratio\ttarget\tnote\n", r.Subject)
	fmt.Fprintln(tw, "-------\t------\t--------\t-----\t------\t----")
	ratioFormat := r.RatioFormat
	if ratioFormat == "" {
		ratioFormat = "%.2f"
	}
	for _, row := range r.Rows {
		base, ratio := "-", "-"
		if row.BaseName != "" {
			base = row.Base() + " [" + row.BaseName + "]"
			if row.Missing == "" {
				ratio = fmt.Sprintf(ratioFormat, row.Ratio)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", row.Name, row.Ours(), base, ratio, row.Verdict(), row.Note)
	}
	tw.Flush()
	if r.RatioNote != "" {
		fmt.Fprintln(w, "\nratio: "+r.RatioNote)
	}
}

// Write records the rows in dir as JSON and as a PNG chart:
// dir/BENCHMARK-MODE.json and dir/BENCHMARK-MODE.png.
func (r *Report) Write(dir string) error {
	if err := r.WriteJSON(dir); err != nil {
		return err
	}
	return r.WritePNG(dir)
}

// WriteJSON records the rows in dir/BENCHMARK-MODE.json.
func (r *Report) WriteJSON(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results directory: %w", err)
	}
	host, _ := os.Hostname()
	doc := map[string]any{"benchmark": r.Benchmark, "mode": r.Mode, "time": time.Now().UTC().Format(time.RFC3339), "host": host, "rows": r.Rows}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	path := filepath.Join(dir, r.Benchmark+"-"+r.Mode+".json")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	fmt.Println("results written to", path)
	return nil
}

// Percentile is the p-th (0..1) percentile of ds, in milliseconds.
func Percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[int(float64(len(s)-1)*p)].Microseconds()) / 1000
}

// Mean is the mean of ds in milliseconds; 0 when ds is empty.
func Mean(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Microseconds()) / 1000 / float64(len(ds))
}

// Finish ends a harness's run after its table is printed: the run time
// since start on stdout, the JSON and chart written to dir, and every
// error (write, failed steps) on stderr after the harness's name. It
// returns the process's exit status: 1 when anything failed.
func (r *Report) Finish(name, dir string, start time.Time, failed []error) int {
	fmt.Printf("run time %.0f s\n", time.Since(start).Seconds())
	if err := r.Write(dir); err != nil {
		failed = append(failed, err)
	}
	for _, err := range failed {
		fmt.Fprintln(os.Stderr, name+":", err)
	}
	if len(failed) > 0 {
		return 1
	}
	return 0
}
