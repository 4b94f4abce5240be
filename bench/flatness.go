package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"gonum.org/v1/gonum/stat"
)

// Flatness judges a run with --growth by the full scenario's flatness
// target, and adds the trend over the whole hold that tells growth from
// the window-to-window noise the target's two windows also see.
type Flatness struct {
	// BaseP95MS is the client's p95 over the 30 s that begin 30 s after the
	// ramp (the hold's start); LastP95MS over the hold's last 30 s; Ratio
	// is Last ÷ Base, flat within 0.8–1.2.
	BaseFromS float64 `json:"base_from_s"`
	BaseP95MS float64 `json:"base_p95_ms"`
	LastFromS float64 `json:"last_from_s"`
	LastP95MS float64 `json:"last_p95_ms"`
	Ratio     float64 `json:"ratio"`
	// P99OverP50 is the run's summary's (latency_ms), flat at 3 or less.
	P99OverP50 float64 `json:"p99_over_p50"`
	// TrendPctPerMin is the least-squares slope of the growth intervals'
	// client p95 from the base window's start to the hold's end, per
	// minute, as a share of their mean: what grows with the work done
	// grows here in every run, where noise takes either sign from run to
	// run.
	TrendPctPerMin float64 `json:"trend_pct_per_min"`
	// ThirdsP95MS are the medians of those intervals' p95 in each third of
	// that span.
	ThirdsP95MS []float64 `json:"thirds_p95_ms"`
	Intervals   int       `json:"intervals"`
	// StealMaxPct is the most of an interval's CPU time the virtual
	// machine's host took, and StealP95Corr the correlation of the
	// intervals' steal with their p95 (0 where steal was not read).
	StealMaxPct  float64 `json:"steal_max_pct"`
	StealP95Corr float64 `json:"steal_p95_corr"`
}

// flatWindow is the length of the two windows the target compares.
const flatWindow = 30 * time.Second

// flatness is nil when the hold is too short for the two windows apart;
// run is the run's latency summary, which it does not compute again.
func flatness(samples []Sample, run LatencySummary, rows []GrowthRow, holdFrom, holdTo time.Duration) *Flatness {
	base, last := holdFrom+flatWindow, holdTo-flatWindow
	if last < base+flatWindow {
		return nil
	}
	f := &Flatness{
		BaseFromS: base.Seconds(), BaseP95MS: *clientRow(samples, base, base+flatWindow).P95MS,
		LastFromS: last.Seconds(), LastP95MS: *clientRow(samples, last, holdTo).P95MS,
	}
	if f.BaseP95MS > 0 {
		f.Ratio = round3(f.LastP95MS / f.BaseP95MS)
	}
	if run.P50 > 0 {
		f.P99OverP50 = round3(run.P99 / run.P50)
	}
	var xs, ys, steal []float64
	for _, r := range rows {
		if r.FromS >= base.Seconds() && r.ToS <= holdTo.Seconds()+0.5 && r.Answers > 0 {
			xs = append(xs, (r.FromS+r.ToS)/2)
			ys = append(ys, r.ClientP95MS)
			if r.MachineStealShare != nil {
				steal = append(steal, *r.MachineStealShare*100)
			}
		}
	}
	if len(steal) == len(ys) && len(ys) >= 3 {
		f.StealMaxPct = round3(slices.Max(steal))
		if c := stat.Correlation(ys, steal, nil); !math.IsNaN(c) {
			f.StealP95Corr = round3(c)
		}
	}
	f.Intervals = len(ys)
	if len(ys) < 3 {
		return f
	}
	_, slope := stat.LinearRegression(xs, ys, nil, false)
	if mean := stat.Mean(ys, nil); mean > 0 {
		f.TrendPctPerMin = round3(slope * 60 / mean * 100)
	}
	// The last third takes what len(ys)/3 leaves over.
	n := len(ys) / 3
	for _, part := range [][]float64{ys[:n], ys[n : 2*n], ys[2*n:]} {
		part = slices.Sorted(slices.Values(part))
		f.ThirdsP95MS = append(f.ThirdsP95MS, round3(stat.Quantile(0.5, stat.Empirical, part, nil)))
	}
	return f
}

// Flat is the target's check: the last 30 s p95 within 20 % of the base
// window's, and p99 at most 3 × p50.
func (f *Flatness) Flat() bool {
	return f.Ratio >= 0.8 && f.Ratio <= 1.2 && f.P99OverP50 <= 3
}

// writeFlatness prints the check under the growth table.
func writeFlatness(w io.Writer, f *Flatness) {
	verdict := "not flat"
	if f.Flat() {
		verdict = "flat"
	}
	fmt.Fprintf(w, "  flatness: p95 %.1f ms over the hold's last 30 s (from %.0f s) ÷ %.1f ms over 30–60 s after the ramp (from %.0f s) = %.2f (within 0.8–1.2); p99 ÷ p50 %.2f (≤ 3): %s\n",
		f.LastP95MS, f.LastFromS, f.BaseP95MS, f.BaseFromS, f.Ratio, f.P99OverP50, verdict)
	if len(f.ThirdsP95MS) == 3 {
		fmt.Fprintf(w, "  trend of the %d intervals' p95 from %.0f s to the hold's end: %+.1f %% of their mean a minute; medians by third %.1f / %.1f / %.1f ms\n",
			f.Intervals, f.BaseFromS, f.TrendPctPerMin, f.ThirdsP95MS[0], f.ThirdsP95MS[1], f.ThirdsP95MS[2])
		fmt.Fprintf(w, "  the host's steal over those intervals: at most %.1f %%; its correlation with their p95 %.2f\n", f.StealMaxPct, f.StealP95Corr)
	}
}
