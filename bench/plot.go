package bench

import (
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Colours of the plot's series.
var (
	colTarget   = color.RGBA{150, 150, 150, 255}
	colAnswered = color.RGBA{31, 119, 180, 255}
	colFailed   = color.RGBA{214, 39, 40, 255}
	colDropped  = color.RGBA{255, 127, 14, 255}
	colP50      = color.RGBA{44, 160, 44, 255}
	colP95      = color.RGBA{255, 127, 14, 255}
	colP99      = color.RGBA{214, 39, 40, 255}
)

type series struct {
	name  string
	color color.RGBA
	ys    []float64 // one value per second; NaN is a gap
}

// Size of one panel in the PNG.
const (
	panelWidth  = 12 * vg.Inch
	panelHeight = 3.5 * vg.Inch
	plotDPI     = 100
)

// WritePlot draws, for each result, throughput per second (answered,
// target, failed, dropped) and latency percentiles per second (p50, p95,
// p99) over the run, one pair of panels per arm, as a PNG.
func WritePlot(w io.Writer, results ...*Result) error {
	if len(results) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	var rows [][]*plot.Plot
	for _, r := range results {
		n := len(r.Timeline)
		target, answered, failed, dropped := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
		p50, p95, p99 := make([]float64, n), make([]float64, n), make([]float64, n)
		for i, s := range r.Timeline {
			target[i], answered[i], failed[i], dropped[i] = s.Target, float64(s.Requests), float64(s.Failed), float64(s.Dropped)
			p50[i], p95[i], p99[i] = s.P50, s.P95, s.P99
			if s.Requests == 0 { // no answer ended in this second: a gap, not 0 ms
				p50[i], p95[i], p99[i] = math.NaN(), math.NaN(), math.NaN()
			}
		}
		throughput, err := panel(r.Name+": requests per second", "per s", []series{
			{"target", colTarget, target}, {"answered", colAnswered, answered},
			{"failed", colFailed, failed}, {"dropped", colDropped, dropped},
		})
		if err != nil {
			return err
		}
		latency, err := panel(r.Name+": latency per second", "ms", []series{
			{"p50", colP50, p50}, {"p95", colP95, p95}, {"p99", colP99, p99},
		})
		if err != nil {
			return err
		}
		rows = append(rows, []*plot.Plot{throughput}, []*plot.Plot{latency})
	}
	img := vgimg.NewWith(vgimg.UseWH(panelWidth, vg.Length(len(rows))*panelHeight), vgimg.UseDPI(plotDPI))
	canvas := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1}
	for i, c := range plot.Align(rows, tiles, canvas) {
		rows[i][0].Draw(c[0])
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// panel is one chart of the series against seconds since the start. A
// series is drawn as lines between its defined points; a NaN breaks it.
func panel(title, unit string, ss []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time s"
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	for _, s := range ss {
		segs := segments(s.ys)
		for i, xys := range segs {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("plot %s: %w", s.name, err)
			}
			l.Color = s.color
			l.Width = vg.Points(1.5)
			p.Add(l)
			if i == 0 {
				p.Legend.Add(s.name, l)
			}
		}
	}
	p.Y.Max = max(p.Y.Max*1.25, 1) // room for the legend above the lines
	return p, nil
}

// segments splits ys into runs of defined points (x is the index), so a
// gap is a gap and not a line through it.
func segments(ys []float64) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for i, y := range ys {
		if math.IsNaN(y) || math.IsInf(y, 0) {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		cur = append(cur, plotter.XY{X: float64(i), Y: y})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
