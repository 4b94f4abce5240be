package consumer

import (
	"context"
	"sync"
)

// merger runs one call over the items of concurrent callers: the
// partitions' batches share a lookup, a webhook request and an INSERT
// instead of each paying its own round trip and commit. A caller that finds
// no call under way goes at once with its own items, so a quiet consumer
// waits for nothing; callers that arrive meanwhile queue, and when the call
// returns the first of them runs the queued items together (up to max), on
// its own context.
type merger[T, R any] struct {
	// fn runs one merged call. Its result is handed to every caller with
	// the offset of that caller's items in the merged slice.
	fn  func(ctx context.Context, items []T) (R, error)
	max int

	mu    sync.Mutex
	busy  bool
	queue []*mergeCall[T, R]
}

type mergeCall[T, R any] struct {
	items []T
	// lead receives the group this caller is to run; done closes when its
	// items' call returned.
	lead chan []*mergeCall[T, R]
	done chan struct{}
	res  R
	off  int
	err  error
}

func newMerger[T, R any](max int, fn func(ctx context.Context, items []T) (R, error)) *merger[T, R] {
	return &merger[T, R]{fn: fn, max: max}
}

// do runs fn over items, alone or merged with other callers' items, and
// returns the merged call's result and where items start in it. A queued
// caller waits for the call under way, which its own context bounds.
func (m *merger[T, R]) do(ctx context.Context, items []T) (res R, off int, err error) {
	c := &mergeCall[T, R]{items: items, lead: make(chan []*mergeCall[T, R], 1), done: make(chan struct{})}
	m.mu.Lock()
	if !m.busy {
		m.busy = true
		m.mu.Unlock()
		m.run(ctx, []*mergeCall[T, R]{c})
	} else {
		m.queue = append(m.queue, c)
		m.mu.Unlock()
		select {
		case group := <-c.lead:
			m.run(ctx, group)
		case <-c.done:
		}
	}
	<-c.done
	return c.res, c.off, c.err
}

// run makes one call for group, answers its callers, then passes the turn
// to the next queued group or frees the merger.
func (m *merger[T, R]) run(ctx context.Context, group []*mergeCall[T, R]) {
	var all []T
	if len(group) == 1 {
		all = group[0].items
	} else {
		for _, c := range group {
			all = append(all, c.items...)
		}
	}
	res, err := m.fn(ctx, all)
	off := 0
	for _, c := range group {
		c.res, c.off, c.err = res, off, err
		off += len(c.items)
		close(c.done)
	}
	m.mu.Lock()
	if len(m.queue) == 0 {
		m.busy = false
		m.mu.Unlock()
		return
	}
	n, size := 1, len(m.queue[0].items)
	for n < len(m.queue) && size+len(m.queue[n].items) <= m.max {
		size += len(m.queue[n].items)
		n++
	}
	next := m.queue[:n:n]
	m.queue = append([]*mergeCall[T, R](nil), m.queue[n:]...)
	m.mu.Unlock()
	next[0].lead <- next
}
