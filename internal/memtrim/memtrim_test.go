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

// TestTrimsAfterABurstNotDuringIt runs the trimmer on this test process's
// own runtime: while a goroutine allocates it must not trim; once the
// burst's garbage is collected and the process is quiet it must, once.
func TestTrimsAfterABurstNotDuringIt(t *testing.T) {
	var trims atomic.Int64
	var busy atomic.Bool
	var trimmedWhileBusy atomic.Bool
	tr := newTrimmer(Options{Every: 50 * time.Millisecond, QuietBytesPerSecond: 4 << 20, MinFree: 16 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, tr, func() {
			if busy.Load() {
				trimmedWhileBusy.Store(true)
			}
			trims.Add(1)
			debug.FreeOSMemory() // the real trim: a second one would mean it freed nothing
		})
	}()

	// A live heap of 64 MiB, as a running service has, so the runtime's
	// heap goal (and what its own scavenger keeps) is well above the free
	// heap the test makes.
	live := garbage(64)
	// The burst: a large heap freed at once, so there is free heap to
	// return all through it, then 100 MiB/s and more of short-lived
	// garbage for 600 ms.
	busy.Store(true)
	sink = garbage(48)
	sink = nil
	runtime.GC()
	for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); {
		for range 4 {
			sink = append(sink, make([]byte, 128<<10))
		}
		if len(sink) > 64 {
			sink = nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	// The burst ends leaving its heap free but mapped.
	sink = garbage(48)
	busy.Store(false)
	sink = nil
	runtime.GC()

	deadline := time.Now().Add(5 * time.Second)
	for trims.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a quiet process trims once, not every period
	cancel()
	<-done
	runtime.KeepAlive(live)
	if trimmedWhileBusy.Load() {
		t.Fatal("trimmed while the process was allocating")
	}
	if n := trims.Load(); n != 1 {
		t.Fatalf("trims = %d, want 1 after the burst", n)
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
