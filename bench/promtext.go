package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// histogram is one series of a Prometheus histogram: its labels, its
// finite upper bounds ascending with their cumulative counts, and its
// total count (the +Inf bucket).
type histogram struct {
	labels map[string]string
	bounds []float64
	cum    []float64
	count  float64
}

// histograms are the histogram series of one or more scrapes, by family
// name (without the _bucket/_count/_sum suffixes).
type histograms map[string][]histogram

// parseHistograms reads the histograms of a text exposition; other metric
// types are skipped.
func parseHistograms(r io.Reader) (histograms, error) {
	h, _, err := parseMetrics(r)
	return h, err
}

// scalars are the gauges and counters of a scrape, each family's series
// added up, and each summary's _sum and _count.
type scalars map[string]float64

// parseMetrics reads the histograms and the scalars of a text exposition.
func parseMetrics(r io.Reader) (histograms, scalars, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, nil, err
	}
	sc := scalars{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_GAUGE:
				sc[name] += m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				sc[name] += m.GetCounter().GetValue()
			case dto.MetricType_SUMMARY:
				sc[name+"_sum"] += m.GetSummary().GetSampleSum()
				sc[name+"_count"] += float64(m.GetSummary().GetSampleCount())
			}
		}
	}
	out := histograms{}
	for name, f := range families {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			s := histogram{labels: map[string]string{}, count: float64(h.GetSampleCount())}
			for _, lp := range m.GetLabel() {
				s.labels[lp.GetName()] = lp.GetValue()
			}
			for _, b := range h.GetBucket() {
				if math.IsInf(b.GetUpperBound(), +1) {
					continue // the count
				}
				s.bounds = append(s.bounds, b.GetUpperBound())
				s.cum = append(s.cum, float64(b.GetCumulativeCount()))
			}
			out[name] = append(out[name], s)
		}
	}
	return out, sc, nil
}

// scrapeMetrics GETs url and parses its histograms and scalars.
func scrapeMetrics(ctx context.Context, c *http.Client, url string) (histograms, scalars, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, nil, fmt.Errorf("GET %s answered %d", url, resp.StatusCode)
	}
	h, sc, err := parseMetrics(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return h, sc, nil
}

// labelKey identifies a series within its family.
func labelKey(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "\x00" + labels[k] + "\x00")
	}
	return b.String()
}

// diffHistograms is what after observed since before, series by series: a
// series new in after counts whole, and so does one whose count went down
// (its process restarted).
func diffHistograms(before, after histograms) histograms {
	out := histograms{}
	for name, series := range after {
		prev := map[string]histogram{}
		for _, s := range before[name] {
			prev[labelKey(s.labels)] = s
		}
		for _, s := range series {
			d := histogram{labels: s.labels, bounds: s.bounds, cum: slices.Clone(s.cum), count: s.count}
			if p, ok := prev[labelKey(s.labels)]; ok && p.count <= s.count {
				d.count -= p.count
				for i, b := range d.bounds {
					d.cum[i] -= cumulativeAt(p, b)
				}
			}
			out[name] = append(out[name], d)
		}
	}
	return out
}

// cumulativeAt is how many observations of s were at most bound: the
// cumulative count of its largest bound not above bound (exact when the
// bounds agree).
func cumulativeAt(s histogram, bound float64) float64 {
	i := sort.SearchFloat64s(s.bounds, bound)
	if i < len(s.bounds) && s.bounds[i] == bound {
		return s.cum[i]
	}
	if i == 0 {
		return 0
	}
	return s.cum[i-1]
}

// matches says whether labels hold every pair of filter.
func matches(labels, filter map[string]string) bool {
	for k, v := range filter {
		if !slices.Contains(strings.Split(v, "|"), labels[k]) {
			return false
		}
	}
	return true
}

// merge adds up the series of family name whose labels hold filter, over
// the union of their bounds.
func (hs histograms) merge(name string, filter map[string]string) histogram {
	var picked []histogram
	var bounds []float64
	for _, s := range hs[name] {
		if matches(s.labels, filter) {
			picked = append(picked, s)
			bounds = append(bounds, s.bounds...)
		}
	}
	slices.Sort(bounds)
	out := histogram{bounds: slices.Compact(bounds)}
	out.cum = make([]float64, len(out.bounds))
	for _, s := range picked {
		out.count += s.count
		for i, b := range out.bounds {
			out.cum[i] += cumulativeAt(s, b)
		}
	}
	return out
}

// quantile estimates the q-quantile (0..1) of h the way PromQL's
// histogram_quantile does: find the bucket the q·count-th observation falls
// in and interpolate linearly inside it (from 0 for the first bucket). An
// observation beyond the last finite bound reads as that bound. No
// observations give NaN.
func (h histogram) quantile(q float64) float64 { return h.interpolate(q, 0) }

// countQuantile is quantile for whole-number observations (claims per
// batch): bucket (a, b] holds a+1 … b, so a bucket "≤ 1" reads as 1, not
// as somewhere between 0 and 1.
func (h histogram) countQuantile(q float64) float64 { return h.interpolate(q, 1) }

// interpolate finds the q-quantile's bucket and interpolates between its
// lower bound (the previous bound plus step, at most its own) and its
// upper bound.
func (h histogram) interpolate(q, step float64) float64 {
	if h.count <= 0 || len(h.bounds) == 0 {
		return math.NaN()
	}
	rank := q * h.count
	prevBound, prevCum := 0.0, 0.0
	for i, b := range h.bounds {
		if h.cum[i] >= rank && h.cum[i] > prevCum {
			lo := min(prevBound+step, b)
			if i == 0 && b <= 0 {
				return b
			}
			return lo + (b-lo)*(rank-prevCum)/(h.cum[i]-prevCum)
		}
		prevBound, prevCum = b, h.cum[i]
	}
	return h.bounds[len(h.bounds)-1]
}
