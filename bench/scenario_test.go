package bench

import (
	"math"
	"testing"
	"time"
)

func TestUserScenarioSchedulesTheK6Count(t *testing.T) {
	sc := UserScenario()
	// ½·2000·30 + 2000·200 + ½·2000·10
	const want = 30_000 + 400_000 + 10_000
	if got := sc.Expected(); got != want {
		t.Fatalf("Expected() = %d, want %d", got, want)
	}
	if got := sc.Duration(); got != 240*time.Second {
		t.Fatalf("Duration() = %s, want 4m0s", got)
	}
	a := NewArrivals(sc)
	var (
		n        int
		prev     time.Duration = -1
		inRamp15 int           // first half of the ramp
		inHold   int
		inDown   int
	)
	for {
		at, ok := a.Next()
		if !ok {
			break
		}
		if at < prev {
			t.Fatalf("arrival %d at %s goes back in time (previous %s)", n, at, prev)
		}
		prev = at
		switch {
		case at < 15*time.Second:
			inRamp15++
		case at >= 30*time.Second && at < 230*time.Second:
			inHold++
		case at >= 230*time.Second:
			inDown++
		}
		n++
	}
	if n != want {
		t.Fatalf("arrivals = %d, want %d", n, want)
	}
	if prev > sc.Duration() {
		t.Fatalf("last arrival at %s, after the scenario's end", prev)
	}
	// ∫0..15 of 2000·t/30 = 7500; the hold is exactly 400 000; the ramp
	// down ½·2000·10 = 10 000. Boundaries may shift one arrival.
	for _, c := range []struct {
		name      string
		got, want int
	}{{"first 15 s of the ramp", inRamp15, 7500}, {"hold", inHold, 400_000}, {"ramp down", inDown, 10_000}} {
		if d := c.got - c.want; d < -1 || d > 1 {
			t.Errorf("%s: %d arrivals, want %d ± 1", c.name, c.got, c.want)
		}
	}
}

func TestConstantRateIsEvenlySpaced(t *testing.T) {
	sc := QuickScenario() // 50/s from the start for 5 s
	a := NewArrivals(sc)
	for k := range 250 {
		at, ok := a.Next()
		if !ok {
			t.Fatalf("schedule ended after %d arrivals, want 250", k)
		}
		want := time.Duration(k) * 20 * time.Millisecond
		if d := at - want; d < -time.Microsecond || d > time.Microsecond {
			t.Fatalf("arrival %d at %s, want %s", k, at, want)
		}
	}
	if _, ok := a.Next(); ok {
		t.Fatal("more than 250 arrivals for 50/s over 5 s")
	}
}

func TestRateAtFollowsTheStages(t *testing.T) {
	sc := UserScenario()
	for _, c := range []struct {
		at   time.Duration
		want float64
	}{
		{0, 0}, {15 * time.Second, 1000}, {30 * time.Second, 2000}, {100 * time.Second, 2000},
		{235 * time.Second, 1000}, {240 * time.Second, 0}, {time.Hour, 0},
	} {
		if got := sc.RateAt(c.at); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("RateAt(%s) = %g, want %g", c.at, got, c.want)
		}
	}
}

func TestShapedScenarioAndValidate(t *testing.T) {
	sc := ShapedScenario(300, 10*time.Second, 60*time.Second, 5*time.Second)
	if got, want := sc.Expected(), 1500+18000+750; got != want {
		t.Fatalf("Expected() = %d, want %d", got, want)
	}
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
	flat := ShapedScenario(100, 0, 3*time.Second, 0)
	if flat.StartRate != 100 || flat.Expected() != 300 {
		t.Fatalf("no ramp should start at the rate: %+v schedules %d", flat, flat.Expected())
	}
	bad := []Scenario{
		{},
		{Stages: []Stage{{Duration: 0, Target: 10}}, MaxVUs: 1},
		{Stages: []Stage{{Duration: time.Second, Target: -1}}, MaxVUs: 1},
		{Stages: []Stage{{Duration: time.Second, Target: 10}}, MaxVUs: 0},
		{Stages: []Stage{{Duration: time.Second, Target: 0}}, MaxVUs: 1},
	}
	for i, b := range bad {
		if b.Validate() == nil {
			t.Errorf("scenario %d %+v validated", i, b)
		}
	}
}

func TestOffsetOfInvertsTheIntegral(t *testing.T) {
	for _, c := range []struct{ r0, r1, d float64 }{{0, 2000, 30}, {2000, 2000, 200}, {2000, 0, 10}, {5, 7, 3}} {
		total := (c.r0 + c.r1) / 2 * c.d
		for _, n := range []float64{0, 1, total / 3, total / 2, total - 1} {
			tt := offsetOf(n, c.r0, c.r1, c.d)
			got := c.r0*tt + (c.r1-c.r0)*tt*tt/(2*c.d)
			if math.Abs(got-n) > 1e-6*max(1, n) {
				t.Errorf("stage %v: offsetOf(%g) = %g whose integral is %g", c, n, tt, got)
			}
		}
	}
}
