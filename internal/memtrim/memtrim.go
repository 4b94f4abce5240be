// Package memtrim hands the heap a burst left behind back to the operating
// system once the process has gone quiet.
//
// After a burst, Go keeps the freed heap mapped for the next one: its heap
// goal follows the largest live heap of the last cycle, and its scavenger
// returns only what lies well above that goal, slowly. For a service whose
// load comes in bursts (a course opens, coupons drop) that means the
// resident set stays at the burst's peak through the quiet hours between.
// Run watches two runtime metrics: how much the process allocated in the
// last period (work going on) and how much free heap it still holds. When
// the first is small and the second large, it returns the free heap at once
// (debug.FreeOSMemory). Under load it does nothing: the allocation rate is
// high, and the freed heap is what the next cycle reuses.
package memtrim

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Defaults of Options.
const (
	// DefaultEvery is how often Run looks.
	DefaultEvery = 10 * time.Second
	// DefaultQuietBytesPerSecond is the allocation rate below which the
	// process counts as quiet: an idle claimflow process (pollers, metrics
	// scrapes) allocates well under 1 MiB/s, one under load tens of MiB/s.
	DefaultQuietBytesPerSecond = 2 << 20
	// DefaultMinFree is the free heap worth returning: below it a trim is
	// not worth the forced collection it costs.
	DefaultMinFree = 32 << 20
)

// Options tune Run; zero fields take the defaults.
type Options struct {
	Every               time.Duration
	QuietBytesPerSecond uint64
	MinFree             uint64
	// Log, when set, gets a line per trim.
	Log *slog.Logger
}

// sample is what Run reads of the runtime each period.
type sample struct {
	allocated uint64 // cumulative bytes allocated on the heap
	free      uint64 // heap mapped, free, and not yet returned to the OS
}

// trimmer decides, period by period, whether to return the free heap.
type trimmer struct {
	o    Options
	last sample
	have bool
}

func newTrimmer(o Options) *trimmer {
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.QuietBytesPerSecond == 0 {
		o.QuietBytesPerSecond = DefaultQuietBytesPerSecond
	}
	if o.MinFree == 0 {
		o.MinFree = DefaultMinFree
	}
	return &trimmer{o: o}
}

// next takes this period's sample, elapsed after the last one, and says
// whether to trim now.
func (t *trimmer) next(s sample, elapsed time.Duration) bool {
	prev, had := t.last, t.have
	t.last, t.have = s, true
	if !had || elapsed <= 0 {
		return false
	}
	rate := float64(s.allocated-prev.allocated) / elapsed.Seconds()
	return rate < float64(t.o.QuietBytesPerSecond) && s.free >= t.o.MinFree
}

var names = [...]string{"/gc/heap/allocs:bytes", "/memory/classes/heap/free:bytes"}

func read() sample {
	ms := make([]metrics.Sample, len(names))
	for i, n := range names {
		ms[i].Name = n
	}
	metrics.Read(ms)
	var s sample
	if ms[0].Value.Kind() == metrics.KindUint64 {
		s.allocated = ms[0].Value.Uint64()
	}
	if ms[1].Value.Kind() == metrics.KindUint64 {
		s.free = ms[1].Value.Uint64()
	}
	return s
}

// Run trims until ctx ends.
func Run(ctx context.Context, o Options) { run(ctx, newTrimmer(o), debug.FreeOSMemory) }

func run(ctx context.Context, t *trimmer, free func()) {
	tick := time.NewTicker(t.o.Every)
	defer tick.Stop()
	last := time.Now()
	t.next(read(), 0)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s := read()
			if t.next(s, now.Sub(last)) {
				free()
				// What the trim itself allocated must not look like work.
				t.last = read()
				if t.o.Log != nil {
					t.o.Log.InfoContext(ctx, "returned idle heap to the OS", "free_mib", s.free>>20)
				}
			}
			last = now
		}
	}
}
