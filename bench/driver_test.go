package bench

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock jumps to every scheduled time at once, optionally arriving
// behind schedule, so the driver's logic is tested without waiting.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Duration
	behind time.Duration
}

func (c *fakeClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) SleepUntil(_ context.Context, t time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t+c.behind > c.now {
		c.now = t + c.behind
	}
}

// blockingIterations start and then hold their VU until released.
type blockingIterations struct {
	release chan struct{}
	mu      sync.Mutex
	started []int
}

func (b *blockingIterations) run(ctx context.Context, n int, _ time.Duration) {
	b.mu.Lock()
	b.started = append(b.started, n)
	b.mu.Unlock()
	<-b.release
}

func TestDriverDropsArrivalsWhenEveryVUIsBusy(t *testing.T) {
	sc := Scenario{StartRate: 10, Stages: []Stage{{Duration: 2 * time.Second, Target: 10}}, MaxVUs: 3}
	it := &blockingIterations{release: make(chan struct{})}
	var mu sync.Mutex
	var drops []time.Duration
	d := &driver{sc: sc, clock: &fakeClock{}, iteration: it.run, onDrop: func(at time.Duration) {
		mu.Lock()
		drops = append(drops, at)
		mu.Unlock()
	}}
	done := make(chan DriveStats)
	go func() { done <- d.run(context.Background()) }()
	// Every arrival is scheduled before any iteration can finish: the
	// driver never waits for a VU, so it reaches the end of the schedule
	// with three VUs busy and seventeen arrivals dropped.
	for d.started.Load()+d.dropped.Load() < 20 {
		time.Sleep(time.Millisecond)
	}
	if got := d.InFlight(); got != 3 {
		t.Fatalf("in flight = %d, want 3", got)
	}
	close(it.release)
	st := <-done
	if st.Scheduled != 20 || st.Started != 3 || st.Dropped != 17 || st.MaxInFlight != 3 || st.Late != 0 {
		t.Fatalf("stats = %+v, want 20 scheduled, 3 started, 17 dropped, 3 max in flight, 0 late", st)
	}
	if len(drops) != 17 || drops[0] != 300*time.Millisecond {
		t.Fatalf("drops = %v, want 17 starting at the 4th arrival (300ms)", drops)
	}
	if len(it.started) != 3 {
		t.Fatalf("started iterations %v", it.started)
	}
}

func TestDriverRunsEveryArrivalWhenVUsSuffice(t *testing.T) {
	sc := QuickScenario()
	sc.MaxVUs = sc.Expected()
	it := &blockingIterations{release: make(chan struct{})}
	close(it.release)
	d := &driver{sc: sc, clock: &fakeClock{}, iteration: it.run}
	st := d.run(context.Background())
	if st.Scheduled != 250 || st.Started != 250 || st.Dropped != 0 {
		t.Fatalf("stats = %+v", st)
	}
	seen := map[int]bool{}
	for _, n := range it.started {
		seen[n] = true
	}
	if len(seen) != 250 {
		t.Fatalf("%d distinct iteration numbers, want 250", len(seen))
	}
}

func TestDriverCountsLateStarts(t *testing.T) {
	sc := Scenario{StartRate: 10, Stages: []Stage{{Duration: time.Second, Target: 10}}, MaxVUs: 100}
	it := &blockingIterations{release: make(chan struct{})}
	close(it.release)
	d := &driver{sc: sc, clock: &fakeClock{behind: lateAfter + time.Millisecond}, iteration: it.run}
	if st := d.run(context.Background()); st.Late != 10 || st.Started != 10 {
		t.Fatalf("stats = %+v, want all 10 late", st)
	}
	d = &driver{sc: sc, clock: &fakeClock{behind: lateAfter}, iteration: it.run}
	if st := d.run(context.Background()); st.Late != 0 {
		t.Fatalf("stats = %+v, want none late at exactly the threshold", st)
	}
}

func TestDriverStopsSchedulingWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sc := QuickScenario()
	it := &blockingIterations{release: make(chan struct{})}
	close(it.release)
	d := &driver{sc: sc, clock: &fakeClock{}, iteration: it.run}
	if st := d.run(ctx); st.Started != 0 || st.Scheduled != 0 {
		t.Fatalf("stats after cancel = %+v", st)
	}
}

func TestPickSpreadsCoursesAndCyclesStudents(t *testing.T) {
	e := &enroller{courses: []string{"a", "b", "c", "d"}, students: 10}
	perCourse := map[string]int{}
	for n := range 4000 {
		c, s := e.pick(n)
		perCourse[c]++
		if want := "s" + itoa(n%10); s != want {
			t.Fatalf("pick(%d) student %s, want %s", n, s, want)
		}
	}
	for c, k := range perCourse {
		if k < 800 || k > 1200 {
			t.Errorf("course %s got %d of 4000 iterations", c, k)
		}
	}
}

func TestDriverReusesVUs(t *testing.T) {
	sc := Scenario{StartRate: 100, Stages: []Stage{{Duration: 2 * time.Second, Target: 100}}, MaxVUs: 3}
	var mu sync.Mutex
	ran := 0
	// Arrivals come a little apart in real time, so iterations end between
	// them and their VUs are free again.
	d := &driver{sc: sc, clock: &pacedClock{gap: 200 * time.Microsecond}, iteration: func(context.Context, int, time.Duration) {
		mu.Lock()
		ran++
		mu.Unlock()
	}}
	st := d.run(context.Background())
	if st.Scheduled != 200 || st.Started+st.Dropped != 200 || ran != st.Started {
		t.Fatalf("stats = %+v, %d ran", st, ran)
	}
	if st.Started <= sc.MaxVUs {
		t.Fatalf("only %d iterations started: the test needs more than the %d VUs", st.Started, sc.MaxVUs)
	}
	if got := d.vus; got < 1 || got > sc.MaxVUs {
		t.Fatalf("%d VU goroutines for %d iterations, want 1 to %d reused", got, st.Started, sc.MaxVUs)
	}
}

// pacedClock is a fakeClock that sleeps gap of real time on every wait.
type pacedClock struct {
	fakeClock
	gap time.Duration
}

func (c *pacedClock) SleepUntil(ctx context.Context, t time.Duration) {
	time.Sleep(c.gap)
	c.fakeClock.SleepUntil(ctx, t)
}
