package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

// flatRun is a run of answers, 10 a second over [0, end), whose latency at
// second t is lat(t), and growth rows of 10 s that hold their p95.
func flatRun(end time.Duration, lat func(t float64) float64) ([]Sample, []GrowthRow) {
	var samples []Sample
	var rows []GrowthRow
	for from := time.Duration(0); from < end; from += 10 * time.Second {
		var win []Sample
		for i := range 100 {
			at := from + time.Duration(i)*100*time.Millisecond
			win = append(win, Sample{End: at, Outcome: OutcomeStatus, Latency: time.Duration(lat(at.Seconds()) * float64(time.Millisecond))})
		}
		samples = append(samples, win...)
		c := clientRow(win, from, from+10*time.Second)
		rows = append(rows, GrowthRow{FromS: from.Seconds(), ToS: (from + 10*time.Second).Seconds(), Answers: int(c.Count), ClientP95MS: *c.P95MS})
	}
	return samples, rows
}

func TestFlatness(t *testing.T) {
	for _, tc := range []struct {
		name             string
		holdFrom, holdTo time.Duration
		lat              func(t float64) float64
		wantRatio        float64
		wantTrend        float64 // % a minute, ± 1
		wantVerdict      string
		wantNil          bool
	}{
		{name: "steady", holdFrom: 30 * time.Second, holdTo: 230 * time.Second,
			lat: func(float64) float64 { return 40 }, wantRatio: 1, wantTrend: 0, wantVerdict: ": flat"},
		{
			// 40 ms at 60 s growing by 0.2 ms a second: 68 ms at 200 s, a
			// ratio of 1.6 and a trend of 12 ms a minute over a mean of 58.
			name: "growing", holdFrom: 30 * time.Second, holdTo: 230 * time.Second,
			lat:       func(t float64) float64 { return 40 + 0.2*math.Max(0, t-60) },
			wantRatio: 1.61, wantTrend: 12.0 / 57.9 * 100, wantVerdict: ": not flat",
		},
		{
			// A wave: high in the middle, back at the end. The two windows
			// agree, and the trend says nothing grew.
			name: "wave", holdFrom: 30 * time.Second, holdTo: 590 * time.Second,
			lat:       func(t float64) float64 { return 40 + 30*math.Sin(math.Pi*(t-60)/530) },
			wantRatio: 1.0, wantTrend: 0, wantVerdict: ": flat",
		},
		{name: "hold too short", holdFrom: 30 * time.Second, holdTo: 100 * time.Second,
			lat: func(float64) float64 { return 40 }, wantNil: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			samples, rows := flatRun(tc.holdTo+10*time.Second, tc.lat)
			f := flatness(samples, SummarizeHTTP(samples, tc.holdTo).Latency, rows, tc.holdFrom, tc.holdTo)
			if tc.wantNil {
				if f != nil {
					t.Fatalf("flatness = %+v, want nil for a %v hold", f, tc.holdTo-tc.holdFrom)
				}
				return
			}
			if f == nil {
				t.Fatal("flatness = nil")
			}
			if f.BaseFromS != (tc.holdFrom+flatWindow).Seconds() || f.LastFromS != (tc.holdTo-flatWindow).Seconds() {
				t.Errorf("windows from %v s and %v s, want 30 s after the hold's start and 30 s before its end", f.BaseFromS, f.LastFromS)
			}
			if math.Abs(f.Ratio-tc.wantRatio) > 0.05*tc.wantRatio {
				t.Errorf("ratio %v, want about %v", f.Ratio, tc.wantRatio)
			}
			if math.Abs(f.TrendPctPerMin-tc.wantTrend) > 1.5 {
				t.Errorf("trend %v %% a minute, want about %v", f.TrendPctPerMin, tc.wantTrend)
			}
			if len(f.ThirdsP95MS) != 3 {
				t.Fatalf("thirds %v, want 3", f.ThirdsP95MS)
			}
			if f.StealMaxPct != 0 || f.StealP95Corr != 0 {
				t.Errorf("steal %v %%, correlation %v, from rows that read none", f.StealMaxPct, f.StealP95Corr)
			}
			var out bytes.Buffer
			writeFlatness(&out, f)
			if !strings.Contains(out.String(), tc.wantVerdict+"\n") {
				t.Errorf("printed %q, want the verdict %q", out.String(), tc.wantVerdict)
			}
		})
	}
}

func TestCPUPerAnswer(t *testing.T) {
	row := func(from float64, answers int, cf, pg float64) GrowthRow {
		return GrowthRow{FromS: from, ToS: from + 10, Answers: answers,
			CPU: []CPURow{{Process: "claimflow", CPUS: cf}, {Process: "postgres", CPUS: pg}}}
	}
	rows := []GrowthRow{row(0, 1000, 1, 0.5), row(10, 1000, 2, 0.5), row(20, 2000, 3, 1), row(30, 4000, 8, 2),
		{FromS: 40, ToS: 50, Answers: 100}} // no CPU reading
	for _, tc := range []struct {
		name     string
		from, to float64
		want     map[string]float64
	}{
		{"the first 30 s", 0, 30, map[string]float64{"claimflow": 1.5, "postgres": 0.5}},
		{"one interval", 30, 40, map[string]float64{"claimflow": 2, "postgres": 0.5}},
		{"a window with no CPU reading", 40, 50, nil},
		{"only the intervals whole inside", 5, 25, map[string]float64{"claimflow": 2, "postgres": 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := cpuPerAnswer(rows, tc.from, tc.to)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for part, v := range tc.want {
				if math.Abs(got[part]-v) > 1e-9 {
					t.Errorf("%s: %v ms an answer, want %v", part, got[part], v)
				}
			}
		})
	}
}

// TestFlatnessNamesSteal: intervals whose p95 follows the host's steal
// show it in the correlation.
func TestFlatnessNamesSteal(t *testing.T) {
	stealAt := func(t float64) float64 {
		if t >= 300 && t < 400 {
			return 0.12
		}
		return 0.005
	}
	samples, rows := flatRun(600*time.Second, func(t float64) float64 { return 40 + 1000*stealAt(t) })
	for i := range rows {
		rows[i].MachineStealShare = ptr(stealAt(rows[i].FromS))
	}
	f := flatness(samples, SummarizeHTTP(samples, 600*time.Second).Latency, rows, 30*time.Second, 590*time.Second)
	if f == nil || f.StealMaxPct != 12 || f.StealP95Corr < 0.95 {
		t.Fatalf("flatness %+v, want steal at most 12 %% and a correlation near 1", f)
	}
	var out bytes.Buffer
	writeFlatness(&out, f)
	if !strings.Contains(out.String(), "at most 12.0 %; its correlation with their p95 1.00") {
		t.Errorf("printed %q", out.String())
	}
}
