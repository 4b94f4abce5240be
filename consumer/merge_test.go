package consumer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// gatedFn records each merged call's items and holds the first call until
// release is closed, so that the test can queue callers behind it.
type gatedFn struct {
	mu      sync.Mutex
	calls   [][]int
	started chan struct{}
	release chan struct{}
	err     error
}

func newGatedFn() *gatedFn {
	return &gatedFn{started: make(chan struct{}, 16), release: make(chan struct{})}
}

func (g *gatedFn) fn(_ context.Context, items []int) ([]int, error) {
	g.mu.Lock()
	g.calls = append(g.calls, slices.Clone(items))
	first := len(g.calls) == 1
	g.mu.Unlock()
	g.started <- struct{}{}
	if first {
		<-g.release
	}
	// The result is per item, so a caller reads its own part by offset.
	out := make([]int, len(items))
	for i, x := range items {
		out[i] = 10 * x
	}
	return out, g.err
}

func (g *gatedFn) callSizes() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var n []int
	for _, c := range g.calls {
		n = append(n, len(c))
	}
	return n
}

// waitQueued waits until n callers queue behind the call under way.
func waitQueued(t *testing.T, m *merger[int, []int], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		q := len(m.queue)
		m.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestMerger(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		// first runs alone and holds the merger; queued arrive meanwhile.
		first  []int
		queued [][]int
		err    error
		// wantCalls is the size of each call fn saw, in order.
		wantCalls []int
	}{
		{name: "a caller alone goes at once", max: 10, first: []int{1, 2}, wantCalls: []int{2}},
		{name: "callers that wait go together", max: 10, first: []int{1},
			queued: [][]int{{2, 3}, {4}, {5, 6, 7}}, wantCalls: []int{1, 6}},
		{name: "a merged call stays within max", max: 4, first: []int{1},
			queued: [][]int{{2, 3}, {4, 5}, {6, 7}}, wantCalls: []int{1, 4, 2}},
		{name: "a batch above max still goes, alone", max: 2, first: []int{1},
			queued: [][]int{{2, 3, 4}, {5}}, wantCalls: []int{1, 3, 1}},
		{name: "an error reaches every caller of the call", max: 10, first: []int{1},
			queued: [][]int{{2}, {3}}, err: errors.New("database down"), wantCalls: []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGatedFn()
			g.err = tc.err
			m := newMerger(tc.max, g.fn)
			type answer struct {
				res []int
				err error
			}
			answers := make([]answer, 1+len(tc.queued))
			var wg sync.WaitGroup
			call := func(i int, items []int) {
				wg.Go(func() {
					res, off, err := m.do(context.Background(), items)
					answers[i] = answer{res[off : off+len(items)], err}
				})
			}
			call(0, tc.first)
			<-g.started
			for i, items := range tc.queued {
				call(i+1, items)
				waitQueued(t, m, i+1)
			}
			close(g.release)
			wg.Wait()

			if got := g.callSizes(); !slices.Equal(got, tc.wantCalls) {
				t.Errorf("calls of sizes %v, want %v", got, tc.wantCalls)
			}
			for i, items := range append([][]int{tc.first}, tc.queued...) {
				want := make([]int, len(items))
				for j, x := range items {
					want[j] = 10 * x
				}
				if !slices.Equal(answers[i].res, want) {
					t.Errorf("caller %d got %v, want its own results %v", i, answers[i].res, want)
				}
				if !errors.Is(answers[i].err, tc.err) {
					t.Errorf("caller %d got error %v, want %v", i, answers[i].err, tc.err)
				}
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.busy || len(m.queue) != 0 {
				t.Errorf("merger left busy=%v with %d queued", m.busy, len(m.queue))
			}
		})
	}
}
