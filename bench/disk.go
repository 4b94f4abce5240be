package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// The disk's floor: how long a durable write takes on the disk under a
// directory with nothing of claimflow running. Every claim's answer waits
// for Postgres to flush its WAL (twice: the reservation's commit and the
// confirmation's), so a flush that stalls holds every claim in flight for
// as long. A paced writer appends a block and fdatasyncs it, the way
// Postgres's WAL does at each commit, into a file allocated first (as
// Postgres zero-fills a WAL segment), so each timed flush writes data only.

// DiskStallMs is the flush time from which the disk floor lists a flush as a
// stall: far above the median flush, and a fifth of the capacity
// objective's p95.
const DiskStallMs = 50

// DiskOptions describe a disk-floor run.
type DiskOptions struct {
	Dir      string        // where the file is written (the data dir's disk)
	Rate     float64       // flushes a second
	Duration time.Duration // how long to write
	Block    int           // bytes per write; 8 KiB, a WAL page
	Ring     int           // bytes of the file; writes wrap around (16 MiB, a WAL segment)
	Progress io.Writer     // a line every 10 s; nil for none
}

// DiskStall is one flush over DiskStallMs.
type DiskStall struct {
	AtS float64 `json:"at_s"` // seconds from the first timed write
	Ms  float64 `json:"ms"`
}

// DiskResult is a disk-floor run.
type DiskResult struct {
	Dir        string  `json:"dir"`
	Rate       float64 `json:"rate"`
	DurationS  float64 `json:"duration_s"`
	BlockBytes int     `json:"block_bytes"`
	Flushes    int     `json:"flushes"`
	// Missed counts the paced slots that passed while a flush was under
	// way; the writer does not catch up on them (a stalled disk is not
	// offered a burst afterwards).
	// Flushes + Missed = Rate × Duration.
	Missed  int            `json:"missed_slots"`
	Flush   LatencySummary `json:"flush_ms"`
	P999    float64        `json:"p99_9_ms"`
	Over50  int            `json:"over_50ms"`
	Over100 int            `json:"over_100ms"`
	Over250 int            `json:"over_250ms"`
	Stalls  []DiskStall    `json:"stalls"` // every flush over DiskStallMs, in order
}

// DiskFloor writes and flushes at o.Rate for o.Duration and reports how
// long the flushes took. The file is removed afterwards.
func DiskFloor(ctx context.Context, o DiskOptions) (DiskResult, error) {
	if o.Rate <= 0 || o.Duration <= 0 {
		return DiskResult{}, errors.New("disk floor: rate and duration must be positive")
	}
	if o.Block <= 0 {
		o.Block = 8 << 10
	}
	if o.Ring < o.Block {
		o.Ring = 16 << 20
	}
	f, err := os.CreateTemp(o.Dir, ".claimflow-bench-disk-*")
	if err != nil {
		return DiskResult{}, fmt.Errorf("disk floor: create the file in %s (is --dir a directory on the disk to measure?): %w", o.Dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	slots := o.Ring / o.Block
	block := make([]byte, o.Block)
	for range slots { // allocate the file first: the timed flushes write data only
		if _, err := f.Write(block); err != nil {
			return DiskResult{}, fmt.Errorf("disk floor: allocate %s: %w", f.Name(), err)
		}
	}
	if err := f.Sync(); err != nil {
		return DiskResult{}, fmt.Errorf("disk floor: flush the allocated file: %w", err)
	}
	for i := range block {
		block[i] = byte(i)
	}

	interval := time.Duration(float64(time.Second) / o.Rate)
	start := time.Now()
	nextProgress := start.Add(10 * time.Second)
	var at, took []time.Duration
	missed, stalls := 0, 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	total := int(math.Ceil(o.Duration.Seconds() * o.Rate))
	for slot := 0; slot < total; slot++ {
		due := start.Add(time.Duration(slot) * interval)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return DiskResult{}, ctx.Err()
			case <-timer.C:
			}
		}
		t := time.Now()
		if _, err := f.WriteAt(block, int64(len(at)%slots)*int64(o.Block)); err != nil {
			return DiskResult{}, fmt.Errorf("disk floor: write: %w", err)
		}
		if err := fdatasync(f); err != nil {
			return DiskResult{}, fmt.Errorf("disk floor: fdatasync: %w", err)
		}
		done := time.Now()
		at, took = append(at, t.Sub(start)), append(took, done.Sub(t))
		if ms(done.Sub(t)) > DiskStallMs {
			stalls++
		}
		// Slots that passed during this flush are skipped, not made up.
		if next := start.Add(time.Duration(slot+1) * interval); done.After(next) {
			skip := min(int(done.Sub(next)/interval)+1, total-1-slot)
			missed += skip
			slot += skip
		}
		if o.Progress != nil && done.After(nextProgress) {
			nextProgress = nextProgress.Add(10 * time.Second)
			fmt.Fprintf(o.Progress, "disk: %.0fs, %d flushes, %d over %d ms\n",
				done.Sub(start).Seconds(), len(took), stalls, DiskStallMs)
		}
	}
	r := summarizeDisk(at, took)
	r.Dir, r.Rate, r.DurationS, r.BlockBytes, r.Missed = o.Dir, o.Rate, round3(o.Duration.Seconds()), o.Block, missed
	return r, nil
}

// summarizeDisk derives the figures from each flush's start (from the
// run's start) and duration.
func summarizeDisk(at, took []time.Duration) DiskResult {
	r := DiskResult{Flushes: len(took), Stalls: []DiskStall{}}
	values := make([]float64, len(took))
	for i, d := range took {
		v := ms(d)
		values[i] = v
		if v > DiskStallMs {
			r.Stalls = append(r.Stalls, DiskStall{AtS: round3(at[i].Seconds()), Ms: round3(v)})
		}
		r.Over50 += b2i(v > 50)
		r.Over100 += b2i(v > 100)
		r.Over250 += b2i(v > 250)
	}
	r.Flush = Summarize(values) // sorts values
	r.P999 = round3(Percentile(values, 99.9))
	return r
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// WriteDiskTable prints the disk floor as a Markdown table and its stalls.
func WriteDiskTable(w io.Writer, r DiskResult) {
	fmt.Fprintln(w, "| flushes | a second | missed slots | p50 | p90 | p99 | p99.9 | max | over 50 / 100 / 250 ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	fmt.Fprintf(w, "| %d | %s | %d | %s | %s | %s | %s | %s | %d / %d / %d |\n", r.Flushes, f1(r.Rate), r.Missed,
		fmtMS(r.Flush.P50), fmtMS(r.Flush.P90), fmtMS(r.Flush.P99), fmtMS(r.P999), fmtMS(r.Flush.Max), r.Over50, r.Over100, r.Over250)
	if len(r.Stalls) == 0 {
		return
	}
	fmt.Fprintf(w, "\nflushes over %d ms (seconds from the start: ms):", DiskStallMs)
	for _, s := range r.Stalls {
		fmt.Fprintf(w, " %.1f: %.0f;", s.AtS, s.Ms)
	}
	fmt.Fprintln(w)
}
