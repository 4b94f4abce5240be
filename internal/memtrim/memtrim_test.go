package memtrim

import (
	"context"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

func TestTrimmerDecides(t *testing.T) {
	const mib = 1 << 20
	o := Options{QuietBytesPerSecond: 2 * mib, MinFree: 32 * mib}
	for _, tc := range []struct {
		name    string
		prev    *sample // nil: the first sample
		now     sample
		elapsed time.Duration
		want    bool
	}{
		{"first sample never trims", nil, sample{allocated: 0, free: 500 * mib}, 10 * time.Second, false},
		{"quiet with much free heap", &sample{allocated: 100 * mib}, sample{allocated: 101 * mib, free: 200 * mib}, 10 * time.Second, true},
		{"quiet with little free heap", &sample{allocated: 100 * mib}, sample{allocated: 101 * mib, free: 31 * mib}, 10 * time.Second, false},
		{"busy with much free heap", &sample{allocated: 100 * mib}, sample{allocated: 400 * mib, free: 200 * mib}, 10 * time.Second, false},
		{"just below the quiet rate", &sample{allocated: 0}, sample{allocated: 19 * mib, free: 64 * mib}, 10 * time.Second, true},
		{"just above the quiet rate", &sample{allocated: 0}, sample{allocated: 21 * mib, free: 64 * mib}, 10 * time.Second, false},
		{"no time elapsed", &sample{allocated: 0}, sample{allocated: 0, free: 64 * mib}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrimmer(o)
			if tc.prev != nil {
				tr.next(*tc.prev, 0)
			}
			if got := tr.next(tc.now, tc.elapsed); got != tc.want {
				t.Fatalf("next = %v, want %v", got, tc.want)
			}
		})
	}
}

var sink [][]byte

// TestDecidesOnThisRuntime feeds the trimmer samples of this test
// process's own runtime, with the elapsed time given so a stalled
// goroutine cannot change the answer: with free heap to return it must
// not trim while the process allocates, must trim once it is quiet, and
// must not trim again once the free heap is returned.
func TestDecidesOnThisRuntime(t *testing.T) {
	const period = time.Second
	tr := newTrimmer(Options{QuietBytesPerSecond: 4 << 20, MinFree: 16 << 20})
	// A live heap, as a running service has, keeps the runtime's heap goal
	// (and what its own scavenger keeps) above the free heap made below.
	live := garbage(64)
	tr.next(read(), 0)

	// Busy: a large heap freed, then 96 MiB more allocated in the period.
	sink = garbage(48)
	sink = nil
	runtime.GC()
	for range 12 {
		sink = garbage(8)
	}
	sink = nil
	runtime.GC()
	before, s := tr.last, read()
	if s.free < 16<<20 {
		t.Fatalf("the test made only %d MiB of free heap", s.free>>20)
	}
	if tr.next(s, period) {
		t.Fatalf("trims while allocating %d MiB/s", (s.allocated-before.allocated)>>20)
	}

	// Quiet: nothing allocated since; the free heap is still there.
	if !tr.next(read(), period) {
		t.Fatal("does not trim a quiet process holding free heap")
	}
	debug.FreeOSMemory()
	if s := read(); tr.next(s, period) {
		t.Fatalf("trims again after the free heap was returned (%d MiB free)", s.free>>20)
	}
	runtime.KeepAlive(live)
}

// TestRunTrimsOnceWhenQuiet runs the loop itself on this runtime: free heap
// and no allocation, so it trims, once.
func TestRunTrimsOnceWhenQuiet(t *testing.T) {
	live := garbage(64)
	sink = garbage(48)
	sink = nil
	runtime.GC()
	var trims atomic.Int64
	tr := newTrimmer(Options{Every: 20 * time.Millisecond, QuietBytesPerSecond: 4 << 20, MinFree: 16 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, tr, func() {
			trims.Add(1)
			debug.FreeOSMemory() // the real trim: a second one would mean it freed nothing
		})
	}()
	for deadline := time.Now().Add(10 * time.Second); trims.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	runtime.KeepAlive(live)
	if n := trims.Load(); n != 1 {
		t.Fatalf("trims = %d, want 1", n)
	}
}

// garbage allocates n MiB in 1 MiB slices.
func garbage(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, 1<<20)
		out[i][0] = 1
	}
	return out
}
