package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// clock is the driver's view of time; tests replace it to check the
// scheduling logic without waiting.
type clock interface {
	// Now is the offset since the run began.
	Now() time.Duration
	// SleepUntil returns at offset t or when ctx ends, whichever is first.
	SleepUntil(ctx context.Context, t time.Duration)
}

type wallClock struct{ start time.Time }

func (c wallClock) Now() time.Duration { return time.Since(c.start) }

func (c wallClock) SleepUntil(ctx context.Context, t time.Duration) {
	d := t - c.Now()
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

// lateAfter is how far behind its schedule an iteration may start before it
// counts as late: the load generator itself could not keep the rate (on a
// 2-core machine it competes with the system under test for CPU).
const lateAfter = 50 * time.Millisecond

// DriveStats is what the arrival scheduler did.
type DriveStats struct {
	// Scheduled iterations; Started + Dropped.
	Scheduled int `json:"scheduled"`
	Started   int `json:"started"`
	// Dropped iterations found every VU busy (k6's dropped_iterations).
	Dropped int `json:"dropped"`
	// Late iterations started more than 50 ms after their scheduled time.
	Late int `json:"late"`
	// MaxInFlight is the peak number of busy VUs.
	MaxInFlight int `json:"max_in_flight"`
	// Elapsed is from the first arrival until every started iteration ended.
	Elapsed time.Duration `json:"-"`
}

// driver runs iterations at the scenario's arrival rate on at most MaxVUs
// concurrent VUs. It never waits for a VU: an arrival that finds them all
// busy is dropped and reported, so slow answers cannot hide by slowing the
// offered load (the coordinated-omission trap of closed-loop generators).
type driver struct {
	sc    Scenario
	clock clock
	// iteration runs one iteration; vu is the VU slot it holds.
	iteration func(ctx context.Context, n int, scheduled time.Duration)
	// onDrop is told about each dropped arrival.
	onDrop func(scheduled time.Duration)

	inFlight atomic.Int64
	vus      int // VU goroutines run started (each lives for the run); only run touches it
	started  atomic.Int64
	dropped  atomic.Int64
	late     atomic.Int64
}

// InFlight is the number of busy VUs now.
func (d *driver) InFlight() int { return int(d.inFlight.Load()) }

// arrival is one scheduled iteration.
type arrival struct {
	n  int
	at time.Duration
}

// vu runs its first arrival, then every arrival handed to it, until work
// closes. Each iteration holds a slot, freed when it ends.
func (d *driver) vu(ctx context.Context, a arrival, work <-chan arrival, slots <-chan struct{}) {
	for ok := true; ok; a, ok = <-work {
		d.iteration(ctx, a.n, a.at)
		d.inFlight.Add(-1)
		<-slots
	}
}

// run schedules every arrival, then waits for the started iterations. A
// cancelled ctx stops scheduling; iterations see ctx and should end early.
func (d *driver) run(ctx context.Context) DriveStats {
	arrivals := NewArrivals(d.sc)
	slots := make(chan struct{}, d.sc.MaxVUs)
	work := make(chan arrival)
	var wg sync.WaitGroup
	var maxInFlight atomic.Int64
	stats := DriveStats{}
	for n := 0; ; n++ {
		at, ok := arrivals.Next()
		if !ok {
			break
		}
		stats.Scheduled++
		d.clock.SleepUntil(ctx, at)
		if ctx.Err() != nil {
			stats.Scheduled--
			break
		}
		if d.clock.Now()-at > lateAfter {
			d.late.Add(1)
		}
		select {
		case slots <- struct{}{}:
		default:
			d.dropped.Add(1)
			if d.onDrop != nil {
				d.onDrop(at)
			}
			continue
		}
		d.started.Add(1)
		cur := d.inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if cur <= m || maxInFlight.CompareAndSwap(m, cur) {
				break
			}
		}
		// An idle VU takes the arrival; without one, a new VU starts. VUs
		// live for the whole run, so a goroutine's stack, grown by its
		// first HTTP round trip, serves every later iteration too.
		select {
		case work <- arrival{n, at}:
		default:
			if d.vus < d.sc.MaxVUs {
				d.vus++
				wg.Go(func() { d.vu(ctx, arrival{n, at}, work, slots) })
			} else {
				// Every VU exists and one freed its slot: it is on its
				// way back for work.
				work <- arrival{n, at}
			}
		}
	}
	close(work)
	wg.Wait()
	stats.Started = int(d.started.Load())
	stats.Dropped = int(d.dropped.Load())
	stats.Late = int(d.late.Load())
	stats.MaxInFlight = int(maxInFlight.Load())
	stats.Elapsed = d.clock.Now()
	return stats
}
