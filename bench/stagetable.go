package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

// StageTable is where an enrollment answer's time goes during the hold: the
// claimflow metrics' histograms diffed between the hold's start and end,
// with each stage's p50/p95, and the CPU each process used over the same
// window.
type StageTable struct {
	WindowS float64 `json:"window_s"`
	// Metrics are the /metrics URLs scraped; Note says why the stages are
	// missing, when they are.
	Metrics []string   `json:"metrics"`
	Note    string     `json:"note,omitempty"`
	Stages  []StageRow `json:"stages"`
	CPU     []CPURow   `json:"cpu"`
	// CPUs is the number the shares divide by; MachineBusyShare is the
	// whole machine's busy share from /proc/stat (null if unreadable), and
	// MachineStealShare the part of it the virtual machine's host took.
	// MachineIOStallShare is the share of the window in which some task
	// waited for the disk (/proc/pressure/io "some"; null without PSI).
	CPUs int `json:"cpus"`
	// CPUModel is the CPUs' model as /proc/cpuinfo names it: a virtual
	// machine's host can change between sittings, and the latencies with it.
	CPUModel            string   `json:"cpu_model,omitempty"`
	MachineBusyShare    *float64 `json:"machine_busy_share"`
	MachineStealShare   *float64 `json:"machine_steal_share"`
	MachineIOStallShare *float64 `json:"machine_io_stall_share"`
}

// StageRow is one stage: the histogram it is read from (metric and label
// filter; series that match are added up), how many observations fell in
// the window, and their p50/p95 in milliseconds, or, for the claims per
// batch, in claims (p50/p95, unit "claims").
type StageRow struct {
	Name   string   `json:"name"`
	Metric string   `json:"metric"`
	Labels string   `json:"labels"`
	Count  uint64   `json:"count"`
	P50MS  *float64 `json:"p50_ms,omitempty"`
	P95MS  *float64 `json:"p95_ms,omitempty"`
	Unit   string   `json:"unit,omitempty"`
	P50    *float64 `json:"p50,omitempty"`
	P95    *float64 `json:"p95,omitempty"`
}

// stageSpec is a row of the table as read from a histogram.
type stageSpec struct {
	name, metric string
	labels       [][2]string // in the order printed
	claims       bool        // counts claims, not seconds
}

// clientStage is the row of the bench's own samples.
const clientStage = "client-observed (bench samples)"

// enrollmentBatchType names the workflow types that decide batches, as the
// SDK tags their metrics: a batch run, or a desk (ENROLL_MODE=desk; "|"
// separates the values a filter takes).
const enrollmentBatchType = "EnrollmentBatch|EnrollmentDesk"

// stageSpecs are the table's rows from metrics, in the order an answer
// goes through them. The names and labels are those claimflow's /metrics
// serves (the API's histograms, and the Temporal SDK's timers as
// worker.TemporalMetrics exports them: "_seconds" added).
var stageSpecs = []stageSpec{
	{name: "batcher wait", metric: "claimflow_claim_batch_wait_seconds"},
	{name: "claims per batch", metric: "claimflow_claim_batch_claims", claims: true},
	{name: "batch update round trip", metric: "claimflow_claim_batch_call_seconds"},
	// A batch goes to a desk's run as an update (its workflow type is not
	// known to the SDK: "none"), by Update-With-Start when no run is there.
	{name: "  its update request", metric: "temporal_long_request_latency_seconds",
		labels: [][2]string{{"operation", "UpdateWorkflowExecution|ExecuteMultiOperation"}, {"workflow_type", "none|" + enrollmentBatchType}}},
	{name: "workflow task schedule-to-start", metric: "temporal_workflow_task_schedule_to_start_latency_seconds",
		labels: [][2]string{{"workflow_type", enrollmentBatchType}}},
	{name: "workflow task execution", metric: "temporal_workflow_task_execution_latency_seconds",
		labels: [][2]string{{"workflow_type", enrollmentBatchType}}},
	{name: "ReserveSeats (local activity)", metric: "temporal_local_activity_execution_latency_seconds",
		labels: [][2]string{{"activity_type", workflows.ReserveSeats.Name}}},
	{name: "PublishBatch (local activity)", metric: "temporal_local_activity_execution_latency_seconds",
		labels: [][2]string{{"activity_type", workflows.PublishBatch.Name}}},
	{name: "  its Kafka sends", metric: "claimflow_kafka_publish_seconds",
		labels: [][2]string{{"topic", workflows.EnrollmentTopic}}},
	{name: "RespondWorkflowTaskCompleted", metric: "temporal_request_latency_seconds",
		labels: [][2]string{{"operation", "RespondWorkflowTaskCompleted"}, {"workflow_type", enrollmentBatchType}}},
	{name: "answer written", metric: "claimflow_claim_answer_seconds"},
	{name: "server total (POST enrollments)", metric: "claimflow_http_request_seconds",
		labels: [][2]string{{"route", "/v1/courses/:id/enrollments"}, {"method", "POST"}}},
}

func (s stageSpec) filter() map[string]string {
	m := make(map[string]string, len(s.labels))
	for _, l := range s.labels {
		m[l[0]] = l[1]
	}
	return m
}

func (s stageSpec) labelText() string {
	parts := make([]string, len(s.labels))
	for i, l := range s.labels {
		parts[i] = fmt.Sprintf("%s=%q", l[0], l[1])
	}
	return strings.Join(parts, ",")
}

// stageRows reads every spec from the window's histograms.
func stageRows(window histograms) []StageRow {
	rows := make([]StageRow, 0, len(stageSpecs))
	for _, s := range stageSpecs {
		h := window.merge(s.metric, s.filter())
		row := StageRow{Name: s.name, Metric: s.metric, Labels: s.labelText(), Count: uint64(math.Round(max(h.count, 0)))}
		p50, p95 := h.quantile(0.5), h.quantile(0.95)
		if s.claims {
			p50, p95 = h.countQuantile(0.5), h.countQuantile(0.95)
		}
		if math.IsNaN(p50) {
			p50, p95 = 0, 0
		}
		if s.claims {
			row.Unit = "claims"
			row.P50, row.P95 = ptr(round3(p50)), ptr(round3(p95))
		} else {
			row.P50MS, row.P95MS = ptr(round3(p50*1000)), ptr(round3(p95*1000))
		}
		rows = append(rows, row)
	}
	return rows
}

func ptr(v float64) *float64 { return &v }

// clientRow is the bench's own latency of the answers (any status, as the
// server's histogram counts them) that ended in the window [from, to]
// (offsets from the run's start).
func clientRow(samples []Sample, from, to time.Duration) StageRow {
	var lat []float64
	for _, s := range samples {
		if s.End >= from && s.End <= to && s.Outcome == OutcomeStatus {
			lat = append(lat, ms(s.Latency))
		}
	}
	sum := Summarize(lat)
	return StageRow{Name: clientStage, Metric: "bench samples", Count: uint64(len(lat)),
		P50MS: ptr(sum.P50), P95MS: ptr(sum.P95)}
}

// HoldWindow is the part of the scenario the stage table covers, as
// offsets from its start: the longest stage that holds a non-zero rate (the
// burst's steady part), or the whole arrival phase when no stage holds.
func HoldWindow(sc Scenario) (from, to time.Duration) {
	var begin, bestLen time.Duration
	rate := sc.StartRate
	for _, st := range sc.Stages {
		if st.Target == rate && st.Target > 0 && st.Duration > bestLen {
			from, to, bestLen = begin, begin+st.Duration, st.Duration
		}
		begin += st.Duration
		rate = st.Target
	}
	if bestLen == 0 {
		return 0, sc.Duration()
	}
	return from, to
}

// stageProbe takes the table's two readings, at the hold's start and end,
// while the load runs.
type stageProbe struct {
	done  chan struct{}
	table *StageTable
	// from and to are when the readings were taken, as offsets from the
	// run's start.
	from, to time.Duration
	err      error
}

// reading is the histograms of every URL and the CPU at one moment, and
// the scalars of every URL added up.
type reading struct {
	at   time.Duration
	hist histograms
	sc   scalars
	cpu  cpuSnapshot
	err  error
}

func takeReading(ctx context.Context, c *http.Client, urls []string, roots []int, start time.Time) reading {
	r := reading{at: time.Since(start)}
	var cpuErr error
	r.cpu, cpuErr = takeCPUSnapshot(roots, os.Getpid())
	r.err = cpuErr
	if len(urls) == 0 {
		return r
	}
	type answer struct {
		h   histograms
		sc  scalars
		err error
	}
	answers := make([]answer, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() {
			answers[i].h, answers[i].sc, answers[i].err = scrapeMetrics(ctx, c, u)
		})
	}
	wg.Wait()
	r.hist, r.sc = histograms{}, scalars{}
	var errs []error
	for i, a := range answers {
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		for name, v := range a.sc {
			r.sc[name] += v
		}
		for name, series := range a.h {
			for _, s := range series {
				// Two processes' series of one name and labels are two
				// series: the source keeps them apart in the diff.
				s.labels[sourceLabel] = urls[i]
				r.hist[name] = append(r.hist[name], s)
			}
		}
	}
	if len(errs) > 0 {
		r.hist = nil
		r.err = errors.Join(append(errs, cpuErr)...)
	}
	return r
}

// sourceLabel holds the URL a series was scraped from; no filter names it.
const sourceLabel = "\x00source"

// startStageProbe reads at start+from and start+to unless ctx ends first.
func startStageProbe(ctx context.Context, urls []string, roots []int, start time.Time, from, to time.Duration) *stageProbe {
	p := &stageProbe{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		c := &http.Client{Timeout: 10 * time.Second}
		defer c.CloseIdleConnections()
		wait := func(at time.Duration) bool { return sleepCtx(ctx, time.Until(start.Add(at))) }
		if !wait(from) {
			p.err = ctx.Err()
			return
		}
		a := takeReading(ctx, c, urls, roots, start)
		if !wait(to) {
			p.err = ctx.Err()
			return
		}
		b := takeReading(ctx, c, urls, roots, start)
		p.from, p.to = a.at, b.at
		p.table = buildStageTable(urls, a, b)
	}()
	return p
}

// buildStageTable diffs two readings into the table (without the client's
// row, which the run adds from its samples).
func buildStageTable(urls []string, a, b reading) *StageTable {
	window := (b.at - a.at).Seconds()
	t := &StageTable{WindowS: round3(window), Metrics: slices.Clone(urls), CPUs: runtime.NumCPU(), CPUModel: cpuModel()}
	switch {
	case len(urls) == 0:
		t.Note = "no metrics URL (pass --metrics)"
	case a.hist == nil || b.hist == nil:
		err := a.err
		if a.hist != nil {
			err = b.err
		}
		t.Note = fmt.Sprintf("metrics not read: %v", err)
	default:
		t.Stages = stageRows(diffHistograms(a.hist, b.hist))
	}
	if a.cpu.procs != nil && b.cpu.procs != nil {
		t.CPU = cpuRows(a.cpu, b.cpu, window, t.CPUs)
		t.MachineBusyShare = machineBusy(a.cpu, b.cpu)
		t.MachineStealShare = machineSteal(a.cpu, b.cpu)
		t.MachineIOStallShare = machineIOStall(a.cpu, b.cpu, window)
	}
	return t
}

// result waits for the second reading and adds the client's row from the
// run's samples; nil when the run ended before the readings.
func (p *stageProbe) result(samples []Sample) *StageTable {
	<-p.done
	if p.table == nil {
		return nil
	}
	if p.table.Note == "" {
		p.table.Stages = append(p.table.Stages, clientRow(samples, p.from, p.to))
	}
	return p.table
}

// writeStageTable prints the table after a run's summary.
func writeStageTable(w io.Writer, t *StageTable) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("  stages over the hold (%.1fs; %s):\n", t.WindowS, strings.Join(t.Metrics, " "))
	if t.Note != "" {
		p("    no stage table: %s\n", t.Note)
	} else {
		p("    %-36s %8s %9s %9s  %s\n", "stage", "count", "p50", "p95", "metric{labels}")
		for _, r := range t.Stages {
			p50, p95 := "—", "—"
			switch {
			case r.Count == 0:
			case r.Unit == "claims":
				p50, p95 = f1(*r.P50), f1(*r.P95)
			default:
				p50, p95 = fmtMS(*r.P50MS), fmtMS(*r.P95MS)
			}
			metric := r.Metric
			if r.Labels != "" {
				metric += "{" + r.Labels + "}"
			}
			p("    %-36s %8d %9s %9s  %s\n", r.Name, r.Count, p50, p95, metric)
		}
	}
	busy := "unknown"
	if t.MachineBusyShare != nil {
		busy = fmt.Sprintf("%.1f%%", 100**t.MachineBusyShare)
		if t.MachineStealShare != nil {
			busy += fmt.Sprintf(", of it steal %.1f%%", 100**t.MachineStealShare)
		}
	}
	if t.MachineIOStallShare != nil {
		busy += fmt.Sprintf("; some task waited for the disk %.1f%% of the time", 100**t.MachineIOStallShare)
	}
	model := ""
	if t.CPUModel != "" {
		model = ", " + t.CPUModel
	}
	p("  CPU over the same window (share of %d CPUs%s; machine busy %s):\n", t.CPUs, model, busy)
	for _, r := range t.CPU {
		p("    %-36s %7.2fs %6.1f%%  %s\n", r.Process, r.CPUS, 100*r.Share, pidList(r.PIDs))
	}
}

// pidList shows a row's PIDs, a long list shortened.
func pidList(pids []int) string {
	if len(pids) == 0 {
		return "(gone)"
	}
	parts := make([]string, 0, min(len(pids), 4))
	for i, pid := range pids {
		if i == 3 && len(pids) > 4 {
			parts = append(parts, fmt.Sprintf("… (%d processes)", len(pids)))
			break
		}
		parts = append(parts, itoa(pid))
	}
	return "pid " + strings.Join(parts, ",")
}
