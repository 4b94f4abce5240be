package bench

import (
	"strings"
	"testing"
	"time"
)

func TestJudgeWindow(t *testing.T) {
	o := DefaultCapacity()
	ok := func(n int, lat time.Duration, status int) []capSample {
		out := make([]capSample, n)
		for i := range out {
			out[i] = capSample{latency: lat, status: status}
		}
		return out
	}
	join := func(parts ...[]capSample) []capSample {
		var out []capSample
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, tc := range []struct {
		name             string
		samples          []capSample
		started, dropped int
		broken           string
	}{
		{"all 201 fast", ok(100, 20*time.Millisecond, 201), 100, 0, ""},
		{"409 and 202 count as decided", join(ok(50, 20*time.Millisecond, 409), ok(50, 20*time.Millisecond, 202)), 100, 0, ""},
		{"one 503", join(ok(99, 20*time.Millisecond, 201), ok(1, 20*time.Millisecond, 503)), 100, 0, "5xx"},
		{"one timeout", join(ok(99, 20*time.Millisecond, 201), []capSample{{outcome: OutcomeTimeout}}), 100, 0, "timeout or connection error"},
		{"one never answered", ok(99, 20*time.Millisecond, 201), 100, 0, "timeout or connection error"},
		{"one dropped", ok(100, 20*time.Millisecond, 201), 100, 1, "dropped iterations"},
		{"p95 over the limit", join(ok(90, 20*time.Millisecond, 201), ok(10, 300*time.Millisecond, 201)), 100, 0, "p95 above 250ms"},
		{"p95 at the limit holds", join(ok(96, 20*time.Millisecond, 201), ok(4, 300*time.Millisecond, 201)), 100, 0, ""},
		{"two 429 of 100", join(ok(98, 20*time.Millisecond, 201), ok(2, 5*time.Millisecond, 429)), 100, 0, "fewer than 99 % decided on the first try"},
		{"one 429 of 100 holds", join(ok(99, 20*time.Millisecond, 201), ok(1, 5*time.Millisecond, 429)), 100, 0, ""},
		{"nothing arrived", nil, 0, 0, "no arrivals"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := judgeWindow(0, tc.samples, tc.started, tc.dropped, 0, o)
			if got.BrokenBy != tc.broken {
				t.Errorf("broken by %q, want %q (%+v)", got.BrokenBy, tc.broken, got)
			}
		})
	}
}

func TestCapacityStaircase(t *testing.T) {
	o := DefaultCapacity()
	o.MaxRate = 1000
	rates := o.rates()
	if want := []float64{500, 750, 1000}; len(rates) != len(want) || rates[0] != want[0] || rates[2] != want[2] {
		t.Fatalf("rates %v, want %v", rates, want)
	}
	sc := o.scenario(len(rates))
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
	if sc.Duration() != 45*time.Second {
		t.Errorf("duration %s, want 45s", sc.Duration())
	}
	// Count the arrivals that fall in each step: each must be the step's
	// rate × 15 s, give or take the 1 ms join.
	counts := make([]int, len(rates))
	a := NewArrivals(sc)
	for {
		at, ok := a.Next()
		if !ok {
			break
		}
		counts[int(at/o.StepDuration)]++
	}
	for i, r := range rates {
		want := int(r * o.StepDuration.Seconds())
		if d := counts[i] - want; d < -1 || d > 1 {
			t.Errorf("step %g/s: %d arrivals, want %d", r, counts[i], want)
		}
	}
	if got, want := o.maxVUs(), 10_000; got != want {
		t.Errorf("max VUs %d, want MaxRate × Timeout = %d", got, want)
	}
}

func TestBrokenStepShowsEachWindowsStages(t *testing.T) {
	table := func(wait, busy float64, claimflowCPU float64) *StageTable {
		return &StageTable{WindowS: 5, CPUs: 2,
			Stages: []StageRow{
				{Name: "batcher wait", Count: 100, P50MS: ptr(10), P95MS: ptr(wait)},
				{Name: "claims per batch", Count: 5, Unit: "claims", P50: ptr(20), P95: ptr(40)},
				{Name: "ReserveSeats (local activity)", Count: 0, P50MS: ptr(0), P95MS: ptr(0)},
			},
			CPU:                 []CPURow{{Process: "claimflow", CPUS: 2 * 5 * claimflowCPU, Share: claimflowCPU}},
			MachineBusyShare:    ptr(busy),
			MachineStealShare:   ptr(0.02),
			MachineIOStallShare: ptr(busy / 8),
		}
	}
	c := &Capacity{Options: capacityEcho{Window: 5}, Claimflow: &CapacityArm{Name: "claimflow", MaxHeldRPS: 500, Steps: []CapacityStep{
		{RateRPS: 500, Held: true, Windows: []CapacityWindow{{FromS: 0, P95: 80, Stages: table(20, 0.5, 0.3)}}},
		{RateRPS: 750, BrokenBy: "p95 above 250ms", Windows: []CapacityWindow{
			{FromS: 5, P95: 90, Stages: table(21, 0.6, 0.31)},
			{FromS: 10, P95: 381, BrokenBy: "p95 above 250ms", Stages: table(312, 0.97, 0.35)},
			{FromS: 15, P95: 95}, // its reading missed
		}},
	}}}
	var b strings.Builder
	WriteCapacityTable(&b, c)
	out := b.String()
	for _, want := range []string{
		"where the 750/s step's time went",
		"5–10 ", "10–15*", "15–20 ", // the last window's reading missed: its span still shows
		"batcher wait", "312", // the broken window's stage
		"claims per batch", "40.0",
		"CPU claimflow", "35%",
		"machine busy", "97%", "of it steal", "2%",
		"waiting for the disk", "12%", // 0.97 / 8 in the broken window
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "where the 500/s step") {
		t.Errorf("a held step is shown as broken:\n%s", out)
	}
	// A stage with nothing counted, and a window without a reading, show a
	// dash, not a zero.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "ReserveSeats") && strings.Contains(line, " 0") {
			t.Errorf("an empty stage shows a figure: %q", line)
		}
		if strings.Contains(line, "batcher wait") && !strings.HasSuffix(strings.TrimSpace(line), "—") {
			t.Errorf("the window without a reading shows a figure: %q", line)
		}
	}
}

func TestCPUPerClaim(t *testing.T) {
	cpu := func(rows ...CPURow) *StageTable { return &StageTable{WindowS: 5, CPUs: 2, CPU: rows} }
	tests := []struct {
		name string
		step CapacityStep
		want map[string]float64
	}{
		{"windows summed, arrivals summed", CapacityStep{RateRPS: 2000, Windows: []CapacityWindow{
			{Arrivals: 10000, Stages: cpu(CPURow{Process: "claimflow", CPUS: 3}, CPURow{Process: "postgres", CPUS: 2})},
			{Arrivals: 10000, Stages: cpu(CPURow{Process: "claimflow", CPUS: 3.4}, CPURow{Process: "postgres", CPUS: 1.6})},
		}}, map[string]float64{"claimflow": 0.32, "postgres": 0.18}},
		{"a window without a reading counts neither its CPU nor its arrivals", CapacityStep{RateRPS: 1000, Windows: []CapacityWindow{
			{Arrivals: 5000, Stages: cpu(CPURow{Process: "claimflow", CPUS: 2})},
			{Arrivals: 5000},
		}}, map[string]float64{"claimflow": 0.4}},
		{"no reading at all", CapacityStep{RateRPS: 500, Windows: []CapacityWindow{{Arrivals: 2500}}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, got := cpuPerClaim(tc.step)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for p, v := range tc.want {
				if d := got[p] - v; d > 1e-9 || d < -1e-9 {
					t.Errorf("%s: %v ms per claim, want %v", p, got[p], v)
				}
			}
		})
	}
	var b strings.Builder
	writeCPUPerClaim(&b, []CapacityStep{tests[0].step, tests[2].step})
	out := b.String()
	for _, want := range []string{"CPU ms per claim", "claimflow", "postgres", "2000", "0.320", "0.180"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "  500 ") {
		t.Errorf("a step without readings has a row:\n%s", out)
	}
}
