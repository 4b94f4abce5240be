package api

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimflow/claimflow/internal/store"
)

// defaultConfirmWaiters is MaxConfirmWaiters when Security leaves it 0.
const defaultConfirmWaiters = 1024

// settledHub fans the enrollment_settled notifications of one LISTEN
// connection (store.ListenSettled) out to the ?wait=confirmed requests
// waiting for them, and bounds how many may wait at once. The listener
// starts with the first waiter, so a process that never waits holds no
// connection for it.
type settledHub struct {
	max    int
	pool   *pgxpool.Pool
	onFail func(error)

	start  sync.Once
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	byID   map[string]map[chan struct{}]struct{}
	count  int
	closed bool
}

func newSettledHub(pool *pgxpool.Pool, max int, onFail func(error), reg prometheus.Registerer) *settledHub {
	if max <= 0 {
		max = defaultConfirmWaiters
	}
	h := &settledHub{max: max, pool: pool, onFail: onFail, byID: map[string]map[chan struct{}]struct{}{}}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "claimflow_confirm_waiters",
		Help: "?wait=confirmed requests waiting for their enrollment's confirmation.",
	}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(h.count)
	}))
	return h
}

// add registers a waiter for id; ok is false when MaxConfirmWaiters are
// already waiting (or the hub is closed). The channel receives when id
// may have settled: its notification came, or the listener (re)connected
// and notifications may have been missed.
func (h *settledHub) add(id string) (wake chan struct{}, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.count >= h.max || h.pool == nil {
		return nil, false
	}
	h.start.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		h.stop = cancel
		h.wg.Go(func() { store.ListenSettled(ctx, h.pool, h.wakeAll, h.settled, h.onFail) })
	})
	wake = make(chan struct{}, 1)
	if h.byID[id] == nil {
		h.byID[id] = map[chan struct{}]struct{}{}
	}
	h.byID[id][wake] = struct{}{}
	h.count++
	return wake, true
}

func (h *settledHub) remove(id string, wake chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.byID[id][wake]; !ok {
		return
	}
	delete(h.byID[id], wake)
	if len(h.byID[id]) == 0 {
		delete(h.byID, id)
	}
	h.count--
}

// settled wakes the waiters of id.
func (h *settledHub) settled(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for wake := range h.byID[id] {
		signal(wake)
	}
}

// wakeAll wakes every waiter, to re-read after the listener (re)connected.
func (h *settledHub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.byID {
		for wake := range set {
			signal(wake)
		}
	}
}

func signal(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default: // already signalled, not yet taken
	}
}

// close stops the listener; later waiters are refused.
func (h *settledHub) close() {
	h.mu.Lock()
	h.closed = true
	stop := h.stop
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
	h.wg.Wait()
}
