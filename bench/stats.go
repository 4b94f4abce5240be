package bench

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Percentile returns the p-th percentile (0..100) of sorted values by linear
// interpolation between the closest ranks, the way Postgres's
// percentile_cont does, so HTTP and stage figures use one definition.
// It returns 0 for no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, n-1)
	frac := rank - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}

// LatencySummary is k6's http_req_duration line, in milliseconds.
type LatencySummary struct {
	Avg float64 `json:"avg"`
	Min float64 `json:"min"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Summarize computes a LatencySummary of values in milliseconds; values is
// sorted in place.
func Summarize(values []float64) LatencySummary {
	if len(values) == 0 {
		return LatencySummary{}
	}
	slices.Sort(values)
	var sum float64
	for _, v := range values {
		sum += v
	}
	return LatencySummary{
		Avg: round3(sum / float64(len(values))),
		Min: round3(values[0]),
		P50: round3(Percentile(values, 50)),
		P90: round3(Percentile(values, 90)),
		P95: round3(Percentile(values, 95)),
		P99: round3(Percentile(values, 99)),
		Max: round3(values[len(values)-1]),
	}
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// Outcome classifies one HTTP attempt.
type Outcome uint8

const (
	// OutcomeStatus: the server answered; Sample.Status holds the code.
	OutcomeStatus Outcome = iota
	// OutcomeTimeout: no answer within the request timeout.
	OutcomeTimeout
	// OutcomeConn: the connection failed (refused, reset, closed early).
	OutcomeConn
)

// Sample is one HTTP attempt: when it ended (offset from the start of the
// run), how long it took, and how it ended.
type Sample struct {
	End     time.Duration
	Latency time.Duration
	Status  int
	Outcome Outcome
}

// Failed reports whether the attempt counts as a failed request: a 5xx, a
// timeout, a connection error, or any answer other than 2xx/409 (409 is the
// expected "course full / already enrolled" answer, as the user's k6 checks
// counted it).
func (s Sample) Failed() bool {
	if s.Outcome != OutcomeStatus {
		return true
	}
	return !(s.Status >= 200 && s.Status < 300) && s.Status != 409
}

// Recorder collects samples and per-iteration events from many VUs.
type Recorder struct {
	mu      sync.Mutex
	samples []Sample
	dropped []time.Duration // scheduled offsets of dropped iterations
}

// Add records one attempt.
func (r *Recorder) Add(s Sample) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
}

// Drop records an iteration that found no free VU.
func (r *Recorder) Drop(at time.Duration) {
	r.mu.Lock()
	r.dropped = append(r.dropped, at)
	r.mu.Unlock()
}

// Snapshot copies what was recorded so far.
func (r *Recorder) Snapshot() ([]Sample, []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.samples), slices.Clone(r.dropped)
}

// since returns the samples that ended at or after from, without copying
// the older ones; for the live progress line.
func (r *Recorder) since(from time.Duration) []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.samples, from, func(s Sample, t time.Duration) int {
		return cmpDuration(s.End, t)
	})
	// Samples are appended roughly in End order; a few out of order at the
	// boundary only blur one progress line.
	return slices.Clone(r.samples[i:])
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// HTTPSummary is the k6-like part of a result.
type HTTPSummary struct {
	Requests    int            `json:"requests"`
	AchievedRPS float64        `json:"achieved_rps"`
	OKRPS       float64        `json:"ok_rps"`
	Status      map[string]int `json:"status"`
	Failures    Failures       `json:"failures"`
	FailureRate float64        `json:"failure_rate"`
	Latency     LatencySummary `json:"latency_ms"`
}

// Failures counts failed attempts by kind.
type Failures struct {
	Server  int `json:"5xx"`
	Timeout int `json:"timeout"`
	Conn    int `json:"conn"`
	// Other counts answers that are neither 2xx, 409 nor 5xx (a 404 or
	// 400 means the harness or the API is broken).
	Other int `json:"other"`
}

// Total is the number of failed attempts.
func (f Failures) Total() int { return f.Server + f.Timeout + f.Conn + f.Other }

// SummarizeHTTP folds samples into the k6-like summary; elapsed is the
// wall time the requests were sent over.
func SummarizeHTTP(samples []Sample, elapsed time.Duration) HTTPSummary {
	h := HTTPSummary{Requests: len(samples), Status: map[string]int{}}
	lat := make([]float64, 0, len(samples))
	ok := 0
	for _, s := range samples {
		lat = append(lat, ms(s.Latency))
		switch s.Outcome {
		case OutcomeTimeout:
			h.Failures.Timeout++
			h.Status["timeout"]++
			continue
		case OutcomeConn:
			h.Failures.Conn++
			h.Status["conn_error"]++
			continue
		}
		h.Status[strconv.Itoa(s.Status)]++
		switch {
		case s.Status >= 500:
			h.Failures.Server++
		case s.Failed():
			h.Failures.Other++
		default:
			ok++
		}
	}
	if len(samples) > 0 {
		h.FailureRate = round6(float64(h.Failures.Total()) / float64(len(samples)))
	}
	if elapsed > 0 {
		h.AchievedRPS = round3(float64(len(samples)) / elapsed.Seconds())
		h.OKRPS = round3(float64(ok) / elapsed.Seconds())
	}
	h.Latency = Summarize(lat)
	return h
}

func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Second is one point of the timeline: what ended in [T, T+1s).
type Second struct {
	T        int     `json:"t"`
	Target   float64 `json:"target_rps"`
	Requests int     `json:"requests"`
	Failed   int     `json:"failed"`
	Dropped  int     `json:"dropped"`
	P50      float64 `json:"p50_ms"`
	P95      float64 `json:"p95_ms"`
	P99      float64 `json:"p99_ms"`
}

// Timeline buckets samples and drops by second, for the plot and --json.
func Timeline(samples []Sample, dropped []time.Duration, sc Scenario) []Second {
	last := int(sc.Duration() / time.Second)
	for _, s := range samples {
		last = max(last, int(s.End/time.Second))
	}
	out := make([]Second, last+1)
	lat := make([][]float64, last+1)
	for i := range out {
		out[i].T = i
		out[i].Target = round3(sc.RateAt(time.Duration(i)*time.Second + time.Second/2))
	}
	for _, s := range samples {
		i := int(s.End / time.Second)
		if i < 0 {
			continue
		}
		out[i].Requests++
		if s.Failed() {
			out[i].Failed++
		}
		lat[i] = append(lat[i], ms(s.Latency))
	}
	for _, d := range dropped {
		if i := int(d / time.Second); i >= 0 && i <= last {
			out[i].Dropped++
		}
	}
	for i := range out {
		slices.Sort(lat[i])
		out[i].P50 = round3(Percentile(lat[i], 50))
		out[i].P95 = round3(Percentile(lat[i], 95))
		out[i].P99 = round3(Percentile(lat[i], 99))
	}
	return out
}
