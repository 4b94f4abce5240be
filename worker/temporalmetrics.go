package worker

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/internal/buckets"
)

// TemporalMetrics exposes the Temporal SDK's own metrics (workflow and
// activity task latencies, failures, poller and slot usage, …) to
// Prometheus. The SDK names a metric and adds tags as it goes, so the label
// set of one metric is only known at scrape time; a Collector, unlike
// pre-declared vectors, can pad missing labels then and never conflicts.
type TemporalMetrics struct {
	mu     sync.Mutex
	series map[string]*series // by name + sorted tags
}

var _ prometheus.Collector = (*TemporalMetrics)(nil)

type seriesKind int

const (
	kindCounter seriesKind = iota
	kindGauge
	kindTimer
)

// Timer buckets in seconds, from a fast local activity to a long poll: the
// API's latency histograms use the same bounds (internal/buckets).
var timerBuckets = buckets.Seconds()

type series struct {
	name   string
	kind   seriesKind
	labels map[string]string
	value  float64  // counter total or gauge value
	counts []uint64 // timer: per bucket, not cumulative
	count  uint64
	sum    float64
}

// NewTemporalMetrics returns an empty collector; pass Handler() to the SDK
// client and register the collector.
func NewTemporalMetrics() *TemporalMetrics {
	return &TemporalMetrics{series: map[string]*series{}}
}

// Handler is the client.MetricsHandler to set in client.Options.
func (m *TemporalMetrics) Handler() client.MetricsHandler {
	return handler{m: m, tags: map[string]string{}}
}

type (
	counterFunc func(int64)
	gaugeFunc   func(float64)
	timerFunc   func(time.Duration)
)

func (f counterFunc) Inc(d int64)          { f(d) }
func (f gaugeFunc) Update(v float64)       { f(v) }
func (f timerFunc) Record(d time.Duration) { f(d) }

type handler struct {
	m    *TemporalMetrics
	tags map[string]string
}

func (h handler) WithTags(tags map[string]string) client.MetricsHandler {
	merged := make(map[string]string, len(h.tags)+len(tags))
	for k, v := range h.tags {
		merged[k] = v
	}
	for k, v := range tags {
		merged[k] = v
	}
	return handler{m: h.m, tags: merged}
}

func (h handler) Counter(name string) client.MetricsCounter {
	s := h.m.get(name, kindCounter, h.tags)
	return counterFunc(func(d int64) {
		h.m.mu.Lock()
		s.value += float64(d)
		h.m.mu.Unlock()
	})
}

func (h handler) Gauge(name string) client.MetricsGauge {
	s := h.m.get(name, kindGauge, h.tags)
	return gaugeFunc(func(v float64) {
		h.m.mu.Lock()
		s.value = v
		h.m.mu.Unlock()
	})
}

func (h handler) Timer(name string) client.MetricsTimer {
	s := h.m.get(name, kindTimer, h.tags)
	return timerFunc(func(d time.Duration) {
		secs := d.Seconds()
		i, _ := slices.BinarySearch(timerBuckets, secs)
		h.m.mu.Lock()
		if i < len(timerBuckets) {
			s.counts[i]++
		}
		s.count++
		s.sum += secs
		h.m.mu.Unlock()
	})
}

func (m *TemporalMetrics) get(name string, kind seriesKind, tags map[string]string) *series {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(name)
	for _, k := range keys {
		b.WriteString("\x00" + k + "=" + tags[k])
	}
	id := b.String()
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.series[id]; ok {
		return s
	}
	s := &series{name: name, kind: kind, labels: tags}
	if kind == kindTimer {
		s.counts = make([]uint64, len(timerBuckets))
	}
	m.series[id] = s
	return s
}

// Describe sends nothing: the metric set grows at run time, which makes
// this an "unchecked" collector.
func (m *TemporalMetrics) Describe(chan<- *prometheus.Desc) {}

// Collect emits every series, each metric family with the union of the
// label names its series use (missing ones empty), as Prometheus requires.
func (m *TemporalMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	families := map[string][]*series{}
	for _, s := range m.series {
		families[s.name] = append(families[s.name], s)
	}
	for name, members := range families {
		labelSet := map[string]bool{}
		for _, s := range members {
			for k := range s.labels {
				labelSet[k] = true
			}
		}
		labelNames := make([]string, 0, len(labelSet))
		for k := range labelSet {
			labelNames = append(labelNames, sanitize(k))
		}
		slices.Sort(labelNames)
		metricName := sanitize(name)
		if !strings.HasPrefix(metricName, "temporal_") {
			metricName = "temporal_" + metricName
		}
		if members[0].kind == kindCounter && !strings.HasSuffix(metricName, "_total") {
			metricName += "_total"
		}
		if members[0].kind == kindTimer {
			metricName += "_seconds"
		}
		desc := prometheus.NewDesc(metricName, "Temporal SDK metric "+name+".", labelNames, nil)
		for _, s := range members {
			values := make([]string, len(labelNames))
			for k, v := range s.labels {
				if i, ok := slices.BinarySearch(labelNames, sanitize(k)); ok {
					values[i] = v
				}
			}
			var metric prometheus.Metric
			var err error
			switch s.kind {
			case kindCounter:
				metric, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, s.value, values...)
			case kindGauge:
				metric, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, s.value, values...)
			case kindTimer:
				buckets := make(map[float64]uint64, len(timerBuckets))
				var cumulative uint64
				for i, upper := range timerBuckets {
					cumulative += s.counts[i]
					buckets[upper] = cumulative
				}
				metric, err = prometheus.NewConstHistogram(desc, s.count, s.sum, buckets, values...)
			}
			if err == nil {
				ch <- metric
			}
		}
	}
}

// sanitize maps SDK names and tag keys onto Prometheus' alphabet.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			return r
		}
		return '_'
	}, s)
}
