package bench

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

const expositionBefore = `# HELP claimflow_claim_batch_wait_seconds A claim's wait.
# TYPE claimflow_claim_batch_wait_seconds histogram
claimflow_claim_batch_wait_seconds_bucket{le="0.001"} 1
claimflow_claim_batch_wait_seconds_bucket{le="0.002"} 2
claimflow_claim_batch_wait_seconds_bucket{le="0.005"} 3
claimflow_claim_batch_wait_seconds_bucket{le="+Inf"} 3
claimflow_claim_batch_wait_seconds_sum 0.004
claimflow_claim_batch_wait_seconds_count 3
# TYPE temporal_local_activity_execution_latency_seconds histogram
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="0.001"} 0
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="0.002"} 4
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="0.005"} 4
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="+Inf"} 4
temporal_local_activity_execution_latency_seconds_sum{activity_type="ReserveSeats",workflow_type="EnrollmentBatch"} 0.006
temporal_local_activity_execution_latency_seconds_count{activity_type="ReserveSeats",workflow_type="EnrollmentBatch"} 4
# TYPE claimflow_claim_answer_seconds histogram
claimflow_claim_answer_seconds_bucket{le="0.001"} 10
claimflow_claim_answer_seconds_bucket{le="0.002"} 10
claimflow_claim_answer_seconds_bucket{le="0.005"} 10
claimflow_claim_answer_seconds_bucket{le="+Inf"} 10
claimflow_claim_answer_seconds_sum 0.001
claimflow_claim_answer_seconds_count 10
# TYPE claimflow_http_requests_total counter
claimflow_http_requests_total{route="/x"} 7
`

// After: the wait gained 8 claims, ReserveSeats 6 runs, PublishBatch is
// new, and the answers' count went down (the API restarted).
const expositionAfter = `# TYPE claimflow_claim_batch_wait_seconds histogram
claimflow_claim_batch_wait_seconds_bucket{le="0.001"} 1
claimflow_claim_batch_wait_seconds_bucket{le="0.002"} 4
claimflow_claim_batch_wait_seconds_bucket{le="0.005"} 9
claimflow_claim_batch_wait_seconds_bucket{le="+Inf"} 11
claimflow_claim_batch_wait_seconds_sum 0.05
claimflow_claim_batch_wait_seconds_count 11
# TYPE temporal_local_activity_execution_latency_seconds histogram
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="0.001"} 2
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="0.002"} 8
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="0.005"} 10
temporal_local_activity_execution_latency_seconds_bucket{activity_type="ReserveSeats",workflow_type="EnrollmentBatch",le="+Inf"} 10
temporal_local_activity_execution_latency_seconds_sum{activity_type="ReserveSeats",workflow_type="EnrollmentBatch"} 0.02
temporal_local_activity_execution_latency_seconds_count{activity_type="ReserveSeats",workflow_type="EnrollmentBatch"} 10
temporal_local_activity_execution_latency_seconds_bucket{activity_type="PublishBatch",workflow_type="EnrollmentBatch",le="0.001"} 3
temporal_local_activity_execution_latency_seconds_bucket{activity_type="PublishBatch",workflow_type="EnrollmentBatch",le="0.002"} 3
temporal_local_activity_execution_latency_seconds_bucket{activity_type="PublishBatch",workflow_type="EnrollmentBatch",le="0.005"} 3
temporal_local_activity_execution_latency_seconds_bucket{activity_type="PublishBatch",workflow_type="EnrollmentBatch",le="+Inf"} 3
temporal_local_activity_execution_latency_seconds_sum{activity_type="PublishBatch",workflow_type="EnrollmentBatch"} 0.0015
temporal_local_activity_execution_latency_seconds_count{activity_type="PublishBatch",workflow_type="EnrollmentBatch"} 3
# TYPE claimflow_claim_answer_seconds histogram
claimflow_claim_answer_seconds_bucket{le="0.001"} 1
claimflow_claim_answer_seconds_bucket{le="0.002"} 2
claimflow_claim_answer_seconds_bucket{le="0.005"} 2
claimflow_claim_answer_seconds_bucket{le="+Inf"} 2
claimflow_claim_answer_seconds_sum 0.002
claimflow_claim_answer_seconds_count 2
# TYPE claimflow_http_requests_total counter
claimflow_http_requests_total{route="/x"} 9
`

func parseText(t *testing.T, text string) histograms {
	t.Helper()
	h, err := parseHistograms(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestExpositionDiff(t *testing.T) {
	window := diffHistograms(parseText(t, expositionBefore), parseText(t, expositionAfter))
	if _, ok := window["claimflow_http_requests_total"]; ok {
		t.Error("a counter was read as a histogram")
	}
	tests := []struct {
		name, metric string
		filter       map[string]string
		wantCum      []float64
		wantCount    float64
	}{
		{"buckets diffed", "claimflow_claim_batch_wait_seconds", nil, []float64{0, 2, 6}, 8},
		{"one series of a family", "temporal_local_activity_execution_latency_seconds",
			map[string]string{"activity_type": "ReserveSeats"}, []float64{2, 4, 6}, 6},
		{"a series new in after counts whole", "temporal_local_activity_execution_latency_seconds",
			map[string]string{"activity_type": "PublishBatch"}, []float64{3, 3, 3}, 3},
		{"a filter matching both adds them up", "temporal_local_activity_execution_latency_seconds",
			map[string]string{"workflow_type": "EnrollmentBatch"}, []float64{5, 7, 9}, 9},
		{"a count that went down restarts", "claimflow_claim_answer_seconds", nil, []float64{1, 2, 2}, 2},
		{"no such series", "temporal_local_activity_execution_latency_seconds",
			map[string]string{"activity_type": "Nope"}, []float64{}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := window.merge(tc.metric, tc.filter)
			if h.count != tc.wantCount || !reflect.DeepEqual(h.cum, tc.wantCum) {
				t.Errorf("count %v cumulative %v, want %v %v", h.count, h.cum, tc.wantCount, tc.wantCum)
			}
		})
	}
}

func TestHistogramQuantile(t *testing.T) {
	bounds := []float64{0.001, 0.002, 0.005}
	tests := []struct {
		name  string
		cum   []float64
		count float64
		q     float64
		want  float64 // NaN: no observations
	}{
		{"inside the first bucket, from 0", []float64{3, 3, 3}, 3, 0.5, 0.0005},
		{"inside a middle bucket", []float64{0, 2, 6}, 8, 0.5, 0.0035},
		{"on a bound", []float64{2, 4, 6}, 6, 0.5, 0.0015},
		{"p95 late in a bucket", []float64{2, 4, 6}, 6, 0.95, 0.00455},
		{"empty buckets are stepped over", []float64{2, 2, 4}, 4, 0.75, 0.0035},
		{"beyond the last bound reads as it", []float64{0, 2, 6}, 8, 0.95, 0.005},
		{"no observations", []float64{0, 0, 0}, 0, 0.5, math.NaN()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := histogram{bounds: bounds, cum: tc.cum, count: tc.count}.quantile(tc.q)
			if math.IsNaN(tc.want) != math.IsNaN(got) || !math.IsNaN(got) && math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("q%v = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
	// Whole numbers (claims per batch): a bucket (a, b] holds a+1 … b.
	counts := histogram{bounds: []float64{1, 2, 3, 5}, cum: []float64{6, 8, 8, 10}, count: 10}
	for _, tc := range []struct{ q, want float64 }{{0.5, 1}, {0.7, 2}, {0.9, 4.5}, {1, 5}} {
		if got := counts.countQuantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("claims q%v = %v, want %v", tc.q, got, tc.want)
		}
	}
	// Bounds that differ between two series: each counts at its largest
	// bound not above the merged one.
	hs := histograms{"m": {
		{labels: map[string]string{"a": "1"}, bounds: []float64{0.001, 0.005}, cum: []float64{1, 2}, count: 2},
		{labels: map[string]string{"a": "2"}, bounds: []float64{0.002, 0.005}, cum: []float64{3, 4}, count: 4},
	}}
	if m := hs.merge("m", nil); !reflect.DeepEqual(m.bounds, []float64{0.001, 0.002, 0.005}) ||
		!reflect.DeepEqual(m.cum, []float64{1, 4, 6}) || m.count != 6 {
		t.Errorf("merged %+v", m)
	}
	// A filter value with "|" takes either: a batch run's and a desk's
	// series add up, another workflow type's stays out.
	typed := histograms{"m": {
		{labels: map[string]string{"workflow_type": "EnrollmentBatch"}, bounds: []float64{0.005}, cum: []float64{2}, count: 2},
		{labels: map[string]string{"workflow_type": "EnrollmentDesk"}, bounds: []float64{0.005}, cum: []float64{3}, count: 3},
		{labels: map[string]string{"workflow_type": "DeliverEvent"}, bounds: []float64{0.005}, cum: []float64{7}, count: 7},
	}}
	for _, tc := range []struct {
		filter string
		want   float64
	}{{enrollmentBatchType, 5}, {"EnrollmentBatch", 2}, {"Enrollment", 0}} {
		if m := typed.merge("m", map[string]string{"workflow_type": tc.filter}); m.count != tc.want {
			t.Errorf("workflow_type %q merged %v observations, want %v", tc.filter, m.count, tc.want)
		}
	}
}

func TestStageRowsNameTheirMetrics(t *testing.T) {
	rows := stageRows(diffHistograms(parseText(t, expositionBefore), parseText(t, expositionAfter)))
	byName := map[string]StageRow{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	wait := byName["batcher wait"]
	if wait.Metric != "claimflow_claim_batch_wait_seconds" || wait.Count != 8 || *wait.P50MS != 3.5 || *wait.P95MS != 5 {
		t.Errorf("batcher wait = %+v", wait)
	}
	reserve := byName["ReserveSeats (local activity)"]
	if reserve.Labels != `activity_type="ReserveSeats"` || reserve.Count != 6 || *reserve.P50MS != 1.5 || *reserve.P95MS != 4.55 {
		t.Errorf("ReserveSeats = %+v", reserve)
	}
	claims := byName["claims per batch"]
	if claims.Unit != "claims" || claims.P50 == nil || claims.P50MS != nil || claims.Count != 0 {
		t.Errorf("claims per batch = %+v", claims)
	}
	if len(rows) != len(stageSpecs) {
		t.Errorf("%d rows for %d specs", len(rows), len(stageSpecs))
	}
	client := clientRow([]Sample{
		{End: time.Second, Latency: 10 * time.Millisecond},
		{End: 2 * time.Second, Latency: 20 * time.Millisecond},
		{End: 2 * time.Second, Latency: time.Second, Outcome: OutcomeTimeout}, // no answer
		{End: 9 * time.Second, Latency: 90 * time.Millisecond},                // after the window
	}, time.Second, 3*time.Second)
	if client.Count != 2 || *client.P50MS != 15 {
		t.Errorf("client row = %+v", client)
	}
}

func TestHoldWindow(t *testing.T) {
	tests := []struct {
		name     string
		sc       Scenario
		from, to time.Duration
	}{
		{"the user's: the 3 min 20 s hold", UserScenario(), 30 * time.Second, 230 * time.Second},
		{"quick: the whole run holds", QuickScenario(), 0, 5 * time.Second},
		{"no hold: the whole arrival phase", ShapedScenario(100, 10*time.Second, 0, 5*time.Second), 0, 15 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if from, to := HoldWindow(tc.sc); from != tc.from || to != tc.to {
				t.Errorf("= [%s, %s], want [%s, %s]", from, to, tc.from, tc.to)
			}
		})
	}
}

// writeProc writes a /proc fixture: the machine's stat and io pressure,
// and one process.
func writeProc(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, body := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCPUSnapshotReadsProc(t *testing.T) {
	procFS = writeProc(t, map[string]string{
		// comm may hold spaces and parentheses; the times are fields 14-17
		// (120 30 5 -1: the negative cutime does not count).
		"42/stat":     "42 (a (b) c) S 7 42 42 0 -1 4194560 100 0 0 0 120 30 5 -1 20 0 9 0 5555 1000 50 18446744073709551615 1 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 1 1 1 1 1 1 1 0\n",
		"42/status":   "Name:\ta (b) c\nVmPeak:\t  900 kB\nVmRSS:\t  123456 kB\nThreads:\t12\n",
		"stat":        "cpu  100 5 50 800 20 3 2 11 7 0\ncpu0 100 5 50 800 20 3 2 11 7 0\nbtime 1\n",
		"pressure/io": "some avg10=0.10 avg60=0.32 avg300=1.38 total=1138000695\nfull avg10=0.10 avg60=0.24 avg300=0.89 total=865817225\n",
		"cpuinfo":     "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2596.140\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n",
	})
	t.Cleanup(func() { procFS = procfs.DefaultMountPoint })
	s, err := takeCPUSnapshot([]int{42}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{pid: 42, ppid: 7, comm: "a (b) c", ticks: 155, start: 5555}
	if got := s.procs[42]; got != want || s.group[42] != "a (b) c" {
		t.Errorf("process %+v in %q, want %+v", got, s.group[42], want)
	}
	// total = user+nice+system+idle+iowait+irq+softirq+steal, busy less
	// idle and iowait; /proc/stat counts in ticks, the snapshot in seconds.
	if !s.machineOK || !near(s.total, 9.91) || !near(s.busy, 1.71) || !near(s.steal, 0.11) {
		t.Errorf("machine busy %g (steal %g) of %g, ok %v", s.busy, s.steal, s.total, s.machineOK)
	}
	if !s.ioOK || s.ioStall != 1138000695 {
		t.Errorf("io stall %d, ok %v", s.ioStall, s.ioOK)
	}
	if kb, err := readRSS(42); err != nil || kb != 123456 {
		t.Errorf("rss = %d kB, %v", kb, err)
	}
	if _, err := readRSS(43); err == nil {
		t.Error("rss of a process that is not there")
	}
	if m := cpuModel(); m != "AMD EPYC" {
		t.Errorf("cpu model %q, want the fixture's", m)
	}

	// A kernel without pressure stall information: io stall unknown.
	procFS = writeProc(t, map[string]string{"stat": "cpu  1 0 0 1 0 0 0 0 0 0\n"})
	if s, err := takeCPUSnapshot(nil, 1); err != nil || s.ioOK || !s.machineOK {
		t.Errorf("without PSI: %+v, %v", s, err)
	}
	if m := cpuModel(); m != "" {
		t.Errorf("cpu model %q without /proc/cpuinfo, want none", m)
	}
}

func TestIOStall(t *testing.T) {
	a := cpuSnapshot{ioStall: 1_000_000, ioOK: true}
	b := cpuSnapshot{ioStall: 1_600_000, ioOK: true}
	if v := machineIOStall(a, b, 5); v == nil || *v != 0.12 {
		t.Errorf("0.6 s of stall in 5 s = %v, want 0.12", v)
	}
	for name, pair := range map[string][2]cpuSnapshot{
		"unread at the start": {{}, b},
		"counter went back":   {b, a},
	} {
		if v := machineIOStall(pair[0], pair[1], 5); v != nil {
			t.Errorf("%s: = %v, want nil", name, *v)
		}
	}
}

func TestCPURows(t *testing.T) {
	const self = 99
	proc := func(pid, ppid int, comm string, ticks uint64) procStat {
		return procStat{pid: pid, ppid: ppid, comm: comm, ticks: ticks, start: uint64(pid)}
	}
	snap := func(procs ...procStat) cpuSnapshot {
		m := map[int]procStat{}
		for _, p := range procs {
			m[p.pid] = p
		}
		return cpuSnapshot{procs: m, group: cpuGroups(m, []int{10, 20}, self)}
	}
	// 10 is claimflow with a temporal child; 20 a postmaster whose backend
	// 22 exits in the window (its 30 ticks reaped into 20's) and whose
	// backend 23 starts in it; 30 is no one's; 99 is the bench.
	a := snap(proc(10, 1, "claimflow", 1000), proc(11, 10, "temporal", 500),
		proc(20, 1, "postgres", 100), proc(21, 20, "postgres", 50), proc(22, 20, "postgres", 10),
		proc(30, 1, "other", 7), proc(self, 1, "claimflow-bench", 40))
	b := snap(proc(10, 1, "claimflow", 1300), proc(11, 10, "temporal", 700),
		proc(20, 1, "postgres", 100+30), proc(21, 20, "postgres", 60), proc(23, 20, "postgres", 15),
		proc(30, 1, "other", 900), proc(self, 1, "claimflow-bench", 140))
	got := cpuRows(a, b, 2.5, 2)
	want := []CPURow{
		{Process: "claimflow", PIDs: []int{10}, CPUS: 3, Share: 0.6},
		{Process: "temporal", PIDs: []int{11}, CPUS: 2, Share: 0.4},
		{Process: benchGroup, PIDs: []int{self}, CPUS: 1, Share: 0.2},
		// 130+60+15 − (100+50+10) = 45 ticks: 22's 20 ticks after a, 21's
		// 10, 23's 15.
		{Process: "postgres", PIDs: []int{20, 21, 23}, CPUS: 0.45, Share: 0.09},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows\n%+v\nwant\n%+v", got, want)
	}
	// The bench in a tree (the stack in the test process) is that row.
	procs := map[int]procStat{self: proc(self, 1, "claimflow.test", 1), 100: proc(100, self, "temporal", 1)}
	if g := cpuGroups(procs, []int{self}, self); g[self] != "claimflow.test + "+benchGroup || g[100] != "temporal" {
		t.Errorf("groups %v", g)
	}
}
