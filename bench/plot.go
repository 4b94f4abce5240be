package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"strconv"
)

// Colours of the plot's series.
var (
	colBackground = color.RGBA{255, 255, 255, 255}
	colAxis       = color.RGBA{40, 40, 40, 255}
	colGrid       = color.RGBA{225, 225, 225, 255}
	colTarget     = color.RGBA{150, 150, 150, 255}
	colAnswered   = color.RGBA{31, 119, 180, 255}
	colFailed     = color.RGBA{214, 39, 40, 255}
	colDropped    = color.RGBA{255, 127, 14, 255}
	colP50        = color.RGBA{44, 160, 44, 255}
	colP95        = color.RGBA{255, 127, 14, 255}
	colP99        = color.RGBA{214, 39, 40, 255}
)

type series struct {
	name  string
	color color.RGBA
	ys    []float64
}

const (
	plotWidth   = 1200
	panelHeight = 300
	marginLeft  = 90
	marginRight = 20
	marginTop   = 40
	marginBot   = 40
)

// WritePlot draws, for each result, throughput per second (answered,
// target, failed, dropped) and latency percentiles per second (p50, p95,
// p99) over the run, one pair of panels per arm, as a PNG.
func WritePlot(w io.Writer, results ...*Result) error {
	if len(results) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	height := len(results) * 2 * (panelHeight + marginTop + marginBot)
	img := image.NewRGBA(image.Rect(0, 0, plotWidth, height))
	draw.Draw(img, img.Bounds(), &image.Uniform{colBackground}, image.Point{}, draw.Src)
	y := 0
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
		drawPanel(img, y, r.Name+": requests per second", "/S", []series{
			{"target", colTarget, target}, {"answered", colAnswered, answered},
			{"failed", colFailed, failed}, {"dropped", colDropped, dropped},
		})
		y += panelHeight + marginTop + marginBot
		drawPanel(img, y, r.Name+": latency per second", "MS", []series{
			{"p50", colP50, p50}, {"p95", colP95, p95}, {"p99", colP99, p99},
		})
		y += panelHeight + marginTop + marginBot
	}
	return png.Encode(w, img)
}

// drawPanel draws one chart whose plot area starts marginTop below top.
func drawPanel(img *image.RGBA, top int, title, unit string, ss []series) {
	x0, x1 := marginLeft, plotWidth-marginRight
	y0, y1 := top+marginTop, top+marginTop+panelHeight // y1 is the x axis
	n := 0
	ymax := 0.0
	for _, s := range ss {
		n = max(n, len(s.ys))
		for _, v := range s.ys {
			if !math.IsNaN(v) {
				ymax = max(ymax, v)
			}
		}
	}
	ymax = niceCeil(ymax)
	xmax := max(n-1, 1)
	px := func(i int) int { return x0 + int(math.Round(float64(i)*float64(x1-x0)/float64(xmax))) }
	py := func(v float64) int { return y1 - int(math.Round(v/ymax*float64(y1-y0))) }

	// Grid and y labels: five steps.
	for k := 0; k <= 5; k++ {
		v := ymax * float64(k) / 5
		y := py(v)
		hline(img, x0, x1, y, colGrid)
		label := formatTick(v)
		drawText(img, x0-8-textWidth(label), y-textHeight/2, label, colAxis)
	}
	drawText(img, 8, y0-textHeight-6, unit, colAxis)
	// x ticks: about ten, on whole seconds.
	step := max(1, niceStep(float64(xmax)/10))
	for i := 0; i <= xmax; i += step {
		x := px(i)
		vline(img, x, y1, y1+5, colAxis)
		label := strconv.Itoa(i)
		drawText(img, x-textWidth(label)/2, y1+9, label, colAxis)
	}
	drawText(img, x1-textWidth("TIME S"), y1+9+textHeight+4, "time s", colAxis)
	hline(img, x0, x1, y1, colAxis)
	vline(img, x0, y0, y1, colAxis)

	for _, s := range ss {
		for i := range s.ys {
			switch {
			case math.IsNaN(s.ys[i]):
			case i > 0 && !math.IsNaN(s.ys[i-1]):
				line(img, px(i-1), py(s.ys[i-1]), px(i), py(s.ys[i]), s.color)
			default: // first point after a gap
				line(img, px(i), py(s.ys[i]), px(i), py(s.ys[i]), s.color)
			}
		}
	}
	// Title and legend above the panel.
	drawText(img, x0, top+10, title, colAxis)
	lx := x0 + textWidth(title) + 40
	for _, s := range ss {
		for d := range 3 {
			hline(img, lx, lx+24, top+10+textHeight/2-1+d, s.color)
		}
		drawText(img, lx+30, top+10, s.name, colAxis)
		lx += 30 + textWidth(s.name) + 24
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// niceStep rounds v to 1, 2 or 5 times a power of ten.
func niceStep(v float64) int {
	return int(niceCeil(v))
}

func formatTick(v float64) string {
	switch {
	case v >= 10000:
		return strconv.FormatFloat(v/1000, 'f', -1, 64) + "K"
	case v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

// line draws a 2-pixel-thick segment (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		img.Set(x0, y0, c)
		img.Set(x0, y0+1, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}
