package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/guptarohit/asciigraph"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"stallfree/stall"
)

// The what-if of `cachectl analyze` drawn: stall and epoch time per epoch
// against the cache's size, one line per policy, as a terminal chart
// (asciigraph) and, with --svg, as a picture (gonum/plot).

// whatIfPolicies are the policies the model predicts. On storage bound by
// its bandwidth clairvoyant reads what MinIO reads, only earlier, so their
// lines coincide (stall.Model.Predict says why).
var whatIfPolicies = []string{"minio", "clairvoyant"}

// chartSteps is how many cache sizes each curve has (0 to 100%).
const chartSteps = 51

type curve struct {
	policy        string
	stall, epoch  []float64
	cacheFraction []float64
}

func whatIfCurves(m stall.Model) []curve {
	var out []curve
	for _, p := range whatIfPolicies {
		c := curve{policy: p}
		for i := range chartSteps {
			fr := float64(i) / (chartSteps - 1)
			s := m.Predict(p, fr)
			c.cacheFraction = append(c.cacheFraction, fr)
			c.stall = append(c.stall, s.StallSeconds)
			c.epoch = append(c.epoch, s.EpochSeconds)
		}
		out = append(out, c)
	}
	return out
}

// drawWhatIf writes the two terminal charts (stall, epoch time) to w, in
// colour with a legend when colour is set (w a terminal, not cachectl's
// safeWriter, which would show the escape codes as text; the chart holds
// only numbers and policy names cachectl made), else plain, the policies
// named in a line.
func drawWhatIf(w io.Writer, m stall.Model, colour bool) {
	curves := whatIfCurves(m)
	for _, metric := range []struct {
		title string
		of    func(curve) []float64
	}{
		{"stall per epoch (s)", func(c curve) []float64 { return c.stall }},
		{"epoch time (s)", func(c curve) []float64 { return c.epoch }},
	} {
		var series [][]float64
		var legends []string
		for _, c := range curves {
			series = append(series, metric.of(c))
			legends = append(legends, c.policy)
		}
		fmt.Fprintln(w)
		opts := []asciigraph.Option{asciigraph.Height(10), asciigraph.Width(chartSteps), asciigraph.Precision(2),
			asciigraph.Caption(metric.title + " vs cache size")}
		if colour {
			opts = append(opts, asciigraph.SeriesColors(asciigraph.Blue, asciigraph.Red), asciigraph.SeriesLegends(legends...))
		}
		fmt.Fprintln(w, asciigraph.PlotMany(series, opts...))
		if !colour {
			fmt.Fprintf(w, "%12sone line each: %s\n", "", strings.Join(legends, ", "))
		}
		fmt.Fprintf(w, "%12s0%%%s100%% of %s cached\n", "", strings.Repeat(" ", chartSteps-6), humanize.IBytes(uint64(max(m.Bytes, 0))))
	}
	fmt.Fprintln(w, "(clairvoyant reads what MinIO reads, only ahead of the loader: on storage bound by its bandwidth the lines coincide)")
}

// writeWhatIfSVG writes the same chart as an SVG picture to path.
func writeWhatIfSVG(path string, m stall.Model, dataset string) error {
	p := plot.New()
	p.Title.Text = "What-if for " + dataset + ": stall and epoch time vs cache size"
	p.X.Label.Text = "cache (% of the dataset, " + humanize.IBytes(uint64(max(m.Bytes, 0))) + ")"
	p.Y.Label.Text = "seconds per epoch"
	p.Add(plotter.NewGrid())
	colors := []color.Color{color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 214, G: 39, B: 40, A: 255}}
	for i, c := range whatIfCurves(m) {
		for _, metric := range []struct {
			name   string
			ys     []float64
			dashed bool
		}{{"stall", c.stall, false}, {"epoch", c.epoch, true}} {
			pts := make(plotter.XYs, len(metric.ys))
			for k, y := range metric.ys {
				pts[k] = plotter.XY{X: 100 * c.cacheFraction[k], Y: y}
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color, l.Width = colors[i%len(colors)], vg.Points(1.5+float64(i))
			if metric.dashed {
				l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			p.Add(l)
			p.Legend.Add(c.policy+" "+metric.name, l)
		}
	}
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = math.Max(p.Y.Max, 1e-3)
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "svg")
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--svg: %w", err)
	}
	if _, err := wt.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("--svg: %w", err)
	}
	return f.Close()
}
