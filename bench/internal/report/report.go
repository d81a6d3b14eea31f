// Package report prints and records the results of the benchmark
// harnesses under bench/: one table on stdout and one JSON file per
// harness and mode. Only the harnesses import it.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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
	Note   string  `json:"note,omitempty"`
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
		ours := fmt.Sprintf("%.3g %s", row.Value, row.Unit)
		if row.P99 != 0 {
			ours = fmt.Sprintf("%.3g (%.3g) %s", row.Value, row.P99, row.Unit)
		}
		base, ratio := "-", "-"
		if row.BaseName != "" {
			base = fmt.Sprintf("%.3g %s [%s]", row.Baseline, row.Unit, row.BaseName)
			if row.BaseP99 != 0 {
				base = fmt.Sprintf("%.3g (%.3g) %s [%s]", row.Baseline, row.BaseP99, row.Unit, row.BaseName)
			}
			ratio = fmt.Sprintf(ratioFormat, row.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", row.Name, ours, base, ratio, row.Target, row.Note)
	}
	tw.Flush()
	if r.RatioNote != "" {
		fmt.Fprintln(w, "\nratio: "+r.RatioNote)
	}
}

// WriteJSON records the rows in dir/BENCHMARK-MODE.json.
func (r *Report) WriteJSON(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	host, _ := os.Hostname()
	doc := map[string]any{"benchmark": r.Benchmark, "mode": r.Mode, "time": time.Now().UTC().Format(time.RFC3339), "host": host, "rows": r.Rows}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, r.Benchmark+"-"+r.Mode+".json")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return err
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
