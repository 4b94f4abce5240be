// Package bench drives claimflow, and a transactional-outbox peer built the
// way the user built their services, with the user's own load scenario, and
// measures both the same way: a k6-like HTTP summary, stage latencies from the
// database timestamps, and an exactly-once audit of the events on Kafka.
package bench

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Stage moves the arrival rate linearly from the previous stage's target
// (the scenario's StartRate for the first stage) to Target iterations per second over Duration, as a
// k6 ramping-arrival-rate stage does.
type Stage struct {
	Duration time.Duration
	Target   float64
}

// Scenario is an open-model load: iterations arrive at the stages' rate
// whether or not earlier ones have finished. Each iteration occupies one of
// at most MaxVUs virtual users for its request(s) and then Sleep; an arrival
// that finds every VU busy is dropped, as k6 counts dropped_iterations.
type Scenario struct {
	// StartRate is the rate at offset 0 (k6's startRate).
	StartRate float64
	Stages    []Stage
	Sleep     time.Duration
	MaxVUs    int
}

// UserScenario is the k6 scenario the user judged their designs with: ramp
// 0 → 2,000/s over 30 s, hold 2,000/s for 3 min 20 s, ramp down over 10 s,
// each VU enrolling then sleeping 1 s.
func UserScenario() Scenario {
	return Scenario{
		Stages: []Stage{
			{Duration: 30 * time.Second, Target: 2000},
			{Duration: 200 * time.Second, Target: 2000},
			{Duration: 10 * time.Second, Target: 0},
		},
		Sleep:  time.Second,
		MaxVUs: 5000,
	}
}

// QuickScenario is a small run for CI: 50/s for 5 s.
func QuickScenario() Scenario {
	return Scenario{
		StartRate: 50,
		Stages:    []Stage{{Duration: 5 * time.Second, Target: 50}},
		Sleep:     time.Second,
		MaxVUs:    200,
	}
}

// ShapedScenario builds ramp → hold → rampdown stages at rate; a zero
// duration leaves its stage out (without a ramp the run starts at rate).
func ShapedScenario(rate float64, ramp, hold, rampdown time.Duration) Scenario {
	s := Scenario{Sleep: time.Second, MaxVUs: 5000}
	if ramp <= 0 {
		s.StartRate = rate
	}
	if ramp > 0 {
		s.Stages = append(s.Stages, Stage{Duration: ramp, Target: rate})
	}
	if hold > 0 {
		s.Stages = append(s.Stages, Stage{Duration: hold, Target: rate})
	}
	if rampdown > 0 {
		s.Stages = append(s.Stages, Stage{Duration: rampdown, Target: 0})
	}
	return s
}

// Duration is the scheduled length of the arrival phase.
func (s Scenario) Duration() time.Duration {
	var d time.Duration
	for _, st := range s.Stages {
		d += st.Duration
	}
	return d
}

// Expected is the number of arrivals the stages schedule.
func (s Scenario) Expected() int {
	return int(math.Ceil(s.total() - 1e-9))
}

func (s Scenario) total() float64 {
	var n float64
	from := s.StartRate
	for _, st := range s.Stages {
		n += (from + st.Target) / 2 * st.Duration.Seconds()
		from = st.Target
	}
	return n
}

// RateAt is the scheduled arrival rate at offset t.
func (s Scenario) RateAt(t time.Duration) float64 {
	from := s.StartRate
	var begin time.Duration
	for _, st := range s.Stages {
		if t < begin+st.Duration {
			frac := float64(t-begin) / float64(st.Duration)
			return from + (st.Target-from)*frac
		}
		begin += st.Duration
		from = st.Target
	}
	return 0
}

// String describes the stages the way k6 users write them.
func (s Scenario) String() string {
	parts := make([]string, len(s.Stages))
	for i, st := range s.Stages {
		parts[i] = fmt.Sprintf("%s→%g/s", st.Duration, st.Target)
	}
	return fmt.Sprintf("start %g/s, stages [%s], sleep %s, max %d VUs", s.StartRate, strings.Join(parts, ", "), s.Sleep, s.MaxVUs)
}

// Validate rejects scenarios that would schedule nothing or never end.
func (s Scenario) Validate() error {
	if len(s.Stages) == 0 {
		return fmt.Errorf("the scenario has no stages")
	}
	for i, st := range s.Stages {
		if st.Duration <= 0 {
			return fmt.Errorf("stage %d has duration %s; it must be positive", i+1, st.Duration)
		}
		if st.Target < 0 || math.IsNaN(st.Target) || math.IsInf(st.Target, 0) {
			return fmt.Errorf("stage %d has target %g/s; it must be a finite rate >= 0", i+1, st.Target)
		}
	}
	if s.StartRate < 0 || math.IsNaN(s.StartRate) || math.IsInf(s.StartRate, 0) {
		return fmt.Errorf("start rate %g/s must be a finite rate >= 0", s.StartRate)
	}
	if s.MaxVUs < 1 {
		return fmt.Errorf("max VUs must be at least 1")
	}
	if s.Sleep < 0 {
		return fmt.Errorf("sleep must not be negative")
	}
	if s.Expected() == 0 {
		return fmt.Errorf("the scenario schedules no iteration")
	}
	return nil
}

// Arrivals yields the scheduled start offsets of every iteration. The k-th
// iteration (k = 0, 1, ...) starts when the integral of the rate reaches k,
// computed in closed form per stage, so the schedule does not drift however
// late the caller asks.
type Arrivals struct {
	stages []Stage
	i      int     // current stage
	begin  float64 // seconds at which stage i begins
	from   float64 // rate at which stage i begins
	before float64 // arrivals scheduled before stage i
	k      int     // next iteration
}

// NewArrivals returns the schedule of s.
func NewArrivals(s Scenario) *Arrivals {
	return &Arrivals{stages: s.Stages, from: s.StartRate}
}

// Next returns the start offset of the next iteration, or false once the
// stages are over.
func (a *Arrivals) Next() (time.Duration, bool) {
	for a.i < len(a.stages) {
		st := a.stages[a.i]
		d := st.Duration.Seconds()
		inStage := (a.from + st.Target) / 2 * d
		n := float64(a.k) - a.before
		if n < inStage-1e-9 {
			a.k++
			return time.Duration((a.begin + offsetOf(n, a.from, st.Target, d)) * float64(time.Second)), true
		}
		a.begin += d
		a.before += inStage
		a.from = st.Target
		a.i++
	}
	return 0, false
}

// offsetOf solves r0·t + (r1−r0)·t²/(2d) = n for t in [0, d]. The form
// 2n / (r0 + √(r0² + 4an)) stays exact when a is 0 or r0 is 0.
func offsetOf(n, r0, r1, d float64) float64 {
	if n <= 0 {
		return 0
	}
	a := (r1 - r0) / (2 * d)
	disc := r0*r0 + 4*a*n
	if disc < 0 {
		disc = 0
	}
	t := 2 * n / (r0 + math.Sqrt(disc))
	return min(max(t, 0), d)
}
