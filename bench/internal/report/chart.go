package report

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The chart's geometry, in pixels. basicfont.Face7x13 advances 7 pixels
// a character.
const (
	chartWidth = 1280
	charWidth  = 7
	margin     = 12
	headHeight = 64  // title and legend
	footHeight = 30  // the ratio note
	rowHeight  = 52  // one row: two bars, or two lines of label
	labelWidth = 440 // the column of row names, from the left margin
	barLeft    = margin + labelWidth + 10
	barMax     = 470 // the longest bar of a row
	barHeight  = 16
)

var (
	colorOurs      = color.RGBA{31, 119, 180, 255}
	colorOursP99   = color.RGBA{160, 198, 226, 255}
	colorBase      = color.RGBA{255, 127, 14, 255}
	colorBaseP99   = color.RGBA{255, 196, 140, 255}
	colorText      = color.RGBA{20, 20, 20, 255}
	colorDim       = color.RGBA{110, 110, 110, 255}
	colorPass      = color.RGBA{0, 128, 0, 255}
	colorMiss      = color.RGBA{200, 0, 0, 255}
	colorSeparator = color.RGBA{225, 225, 225, 255}
)

// WritePNG draws the chart of the rows into dir/BENCHMARK-MODE.png.
func (r *Report) WritePNG(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results directory: %w", err)
	}
	path := filepath.Join(dir, r.Benchmark+"-"+r.Mode+".png")
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := r.Chart(f); err != nil {
		f.Close()
		return fmt.Errorf("chart %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	fmt.Println("chart written to", path)
	return nil
}

// Chart encodes the rows as a PNG image: per row, a horizontal bar for
// this project's figure and one for the baseline's, each labelled with
// its value. Every row has its own linear scale (its rows' units
// differ), on which the longest bar, p99 included, spans the bar area;
// the lighter end of a bar runs from p50 to p99. The row's ratio and its
// verdict (PASS in green, MISS in red) sit under its name.
func (r *Report) Chart(w io.Writer) error {
	height := headHeight + rowHeight*max(len(r.Rows), 1) + footHeight
	img := image.NewRGBA(image.Rect(0, 0, chartWidth, height))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	c := canvas{img}

	title := fmt.Sprintf("%s benchmark (%s), %s", r.Benchmark, r.Mode, time.Now().Format("2006-01-02 15:04"))
	c.text(margin, 20, title, colorText, chartWidth-2*margin)
	subject := r.Subject
	if subject == "" {
		subject = "this project"
	}
	x := margin
	c.box(x, 32, 12, 12, colorOurs)
	x += 18
	x = c.text(x, 43, subject, colorText, 300) + 16
	c.box(x, 32, 12, 12, colorBase)
	x += 18
	x = c.text(x, 43, "baseline", colorText, 100) + 16
	c.text(x, 43, "lighter end of a bar: p50 to p99; each row on its own linear scale", colorDim, chartWidth-x-margin)

	ratioFormat := r.RatioFormat
	if ratioFormat == "" {
		ratioFormat = "%.2f"
	}
	for i, row := range r.Rows {
		c.row(headHeight+i*rowHeight, &row, ratioFormat)
	}
	if r.RatioNote != "" {
		c.text(margin, height-10, "ratio: "+r.RatioNote, colorDim, chartWidth-2*margin)
	}
	return png.Encode(w, img)
}

// canvas draws boxes and text on an image.
type canvas struct {
	img *image.RGBA
}

// row draws one row whose top edge is at y.
func (c canvas) row(y int, row *Row, ratioFormat string) {
	c.box(margin, y+rowHeight-1, chartWidth-2*margin, 1, colorSeparator)
	c.text(margin, y+19, row.Name, colorText, labelWidth)
	var verdict []string
	if row.BaseName != "" && row.Missing == "" {
		verdict = append(verdict, "ratio "+fmt.Sprintf(ratioFormat, row.Ratio))
	}
	if v := row.Verdict(); v != "" {
		verdict = append(verdict, "target "+v)
	}
	shade := colorDim
	if row.Met != nil && *row.Met {
		shade = colorPass
	} else if row.Met != nil {
		shade = colorMiss
	}
	c.text(margin, y+37, strings.Join(verdict, ", "), shade, labelWidth)

	scale := 0.0
	if row.Missing == "" {
		scale = max(row.Value, row.P99)
	}
	if row.BaseName != "" {
		scale = max(scale, row.Baseline, row.BaseP99)
	}
	top := y + 6
	if row.BaseName == "" {
		top = y + 16 // one bar: centre it
	}
	if row.Missing != "" {
		c.text(barLeft, top+12, row.Missing, colorDim, chartWidth-barLeft-margin)
	} else {
		c.bar(top, row.Value, row.P99, scale, colorOurs, colorOursP99, row.Ours())
	}
	if row.BaseName != "" {
		c.bar(y+rowHeight-barHeight-8, row.Baseline, row.BaseP99, scale, colorBase, colorBaseP99, row.Base()+" "+row.BaseName)
	}
}

// bar draws a bar of v (solid) and p99 (lighter, when beyond v) on the
// given scale, then its label.
func (c canvas) bar(top int, v, p99, scale float64, solid, light color.Color, label string) {
	length := func(x float64) int {
		if scale <= 0 || x <= 0 {
			return 0
		}
		return max(1, int(x/scale*barMax+0.5))
	}
	end := length(v)
	if p := length(p99); p > end {
		c.box(barLeft+end, top, p-end, barHeight, light)
		end = p
	}
	c.box(barLeft, top, length(v), barHeight, solid)
	x := barLeft + end + 6
	c.text(x, top+12, label, colorText, chartWidth-x-margin)
}

// box fills a rectangle.
func (c canvas) box(x, y, w, h int, col color.Color) {
	if w <= 0 || h <= 0 {
		return
	}
	draw.Draw(c.img, image.Rect(x, y, x+w, y+h), image.NewUniform(col), image.Point{}, draw.Src)
}

// text writes s with its baseline at y, cut to fit in width pixels, and
// returns the x where it ends. Characters the font lacks become '?'.
func (c canvas) text(x, y int, s string, col color.Color, width int) int {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return '?'
		}
		return r
	}, s)
	if n := width / charWidth; len(s) > n {
		if n < 4 {
			return x
		}
		s = s[:n-3] + "..."
	}
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
	return d.Dot.X.Round()
}
