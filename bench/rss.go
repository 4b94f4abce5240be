package bench

import (
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// rssSampler tracks the peak of the summed resident set size of some
// processes, read from /proc/PID/status (Linux only; elsewhere nothing is
// measured and the result is null).
type rssSampler struct {
	pids []int
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak int64 // kB
	seen bool
}

func startRSS(pids []int, every time.Duration) *rssSampler {
	s := &rssSampler{pids: pids, stop: make(chan struct{}), done: make(chan struct{})}
	if len(pids) == 0 {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stop:
				s.sample()
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	var sum int64
	ok := false
	for _, pid := range s.pids {
		kb, err := readRSS(pid)
		if err != nil {
			continue
		}
		sum += kb
		ok = true
	}
	if !ok {
		return
	}
	s.mu.Lock()
	s.seen = true
	s.peak = max(s.peak, sum)
	s.mu.Unlock()
}

// Stop ends sampling and returns the peak in MiB, or nil if no process
// could be read.
func (s *rssSampler) Stop() *float64 {
	select {
	case <-s.done:
	default:
		close(s.stop)
		<-s.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.seen {
		return nil
	}
	mb := round3(float64(s.peak) / 1024)
	return &mb
}

// RSSMiB returns VmRSS of pid in MiB (Linux only).
func RSSMiB(pid int) (float64, error) {
	kb, err := readRSS(pid)
	if err != nil {
		return 0, err
	}
	return round3(float64(kb) / 1024), nil
}

// readRSS returns VmRSS of pid in kB.
func readRSS(pid int) (int64, error) {
	fs, err := procfs.NewFS(procFS)
	if err != nil {
		return 0, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, err
	}
	return int64(st.VmRSS / 1024), nil
}
