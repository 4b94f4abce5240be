package bench

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSummarizeDisk(t *testing.T) {
	msd := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	for _, tc := range []struct {
		name                     string
		took                     []float64 // ms, at 1 s, 2 s, …
		p50, max                 float64
		over50, over100, over250 int
		stalls                   []DiskStall
	}{
		{name: "none", stalls: []DiskStall{}},
		{name: "all quick", took: []float64{0.2, 0.1, 0.3}, p50: 0.2, max: 0.3, stalls: []DiskStall{}},
		{name: "a threshold is not over it", took: []float64{50, 100, 250}, p50: 100, max: 250, over50: 2, over100: 1,
			stalls: []DiskStall{{AtS: 2, Ms: 100}, {AtS: 3, Ms: 250}}},
		{name: "stalls in order, each counted once per threshold",
			took: []float64{0.2, 60, 0.3, 300, 120}, p50: 60, max: 300, over50: 3, over100: 2, over250: 1,
			stalls: []DiskStall{{AtS: 2, Ms: 60}, {AtS: 4, Ms: 300}, {AtS: 5, Ms: 120}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var at, took []time.Duration
			for i, v := range tc.took {
				at, took = append(at, time.Duration(i+1)*time.Second), append(took, msd(v))
			}
			r := summarizeDisk(at, took)
			if r.Flushes != len(tc.took) || r.Flush.P50 != tc.p50 || r.Flush.Max != tc.max {
				t.Errorf("flushes %d p50 %v max %v, want %d, %v, %v", r.Flushes, r.Flush.P50, r.Flush.Max, len(tc.took), tc.p50, tc.max)
			}
			if r.Over50 != tc.over50 || r.Over100 != tc.over100 || r.Over250 != tc.over250 {
				t.Errorf("over 50/100/250 = %d/%d/%d, want %d/%d/%d", r.Over50, r.Over100, r.Over250, tc.over50, tc.over100, tc.over250)
			}
			if !reflect.DeepEqual(r.Stalls, tc.stalls) {
				t.Errorf("stalls = %v, want %v", r.Stalls, tc.stalls)
			}
		})
	}
}

// TestDiskFloorOnThisDisk writes to the real disk under a test directory:
// every paced slot is either flushed or missed, the figures are ordered,
// and the file is gone afterwards.
func TestDiskFloorOnThisDisk(t *testing.T) {
	dir := t.TempDir()
	r, err := DiskFloor(context.Background(), DiskOptions{Dir: dir, Rate: 100, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Flushes+r.Missed != 100 || r.Flushes == 0 {
		t.Errorf("%d flushes + %d missed slots, want 100 slots with some flushed", r.Flushes, r.Missed)
	}
	f := r.Flush
	if !(f.Min > 0 && f.Min <= f.P50 && f.P50 <= f.P99 && f.P99 <= r.P999 && r.P999 <= f.Max) {
		t.Errorf("figures out of order: %+v, p99.9 %v", f, r.P999)
	}
	if r.BlockBytes != 8<<10 || r.Rate != 100 || r.DurationS != 1 || r.Dir != dir {
		t.Errorf("options not reported: %+v", r)
	}
	if len(r.Stalls) != r.Over50 {
		t.Errorf("%d stalls listed, %d over 50 ms", len(r.Stalls), r.Over50)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the disk floor left %v behind", left)
	}
	var out strings.Builder
	WriteDiskTable(&out, r)
	if !strings.Contains(out.String(), "| 100.0 |") {
		t.Errorf("table lacks the rate:\n%s", out.String())
	}

	if _, err := DiskFloor(context.Background(), DiskOptions{Dir: dir + "/nosuch", Rate: 100, Duration: time.Second}); err == nil || !strings.Contains(err.Error(), "--dir") {
		t.Errorf("a missing directory: %v, want an error naming --dir", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := DiskFloor(ctx, DiskOptions{Dir: dir, Rate: 1, Duration: time.Minute}); err != context.Canceled {
		t.Errorf("a cancelled run: %v, want context.Canceled", err)
	}
}
