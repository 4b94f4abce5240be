package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/kafka"
)

// CapacityOptions describe `claimflow-bench capacity`: an open-model
// arrival rate stepped up from StartRate by StepRate every StepDuration
// until the service-level objective breaks in one Window of a step (or
// MaxRate held), for each arm with the same generator.
type CapacityOptions struct {
	StartRate    float64
	StepRate     float64
	StepDuration time.Duration
	MaxRate      float64
	// Window is the span the objective is judged over.
	Window time.Duration
	// P95Limit: a window whose p95 exceeds it breaks the step.
	P95Limit time.Duration
	// MinDecided is the share of a window's arrivals that must be decided
	// (201, 202 or 409) on their first try.
	MinDecided float64
	// Courses are created per arm with Seats each; iteration n enrolls
	// student n mod Students.
	Courses  int
	Seats    int
	Students int
	// Timeout bounds one request; an arrival unanswered by then is a
	// timeout, and it sizes the VUs.
	Timeout time.Duration
	// DB, when set, lets an arm's claims settle before the next arm runs,
	// so the second arm does not share the machine with the first's tail.
	DB *pgxpool.Pool
	// PeerDB is the pool the outbox peer runs on: the schema owner's, since
	// the peer creates its own tables (DB when nil).
	PeerDB       *pgxpool.Pool
	Kafka        kafka.Config
	DrainTimeout time.Duration
	Progress     io.Writer
	Log          *slog.Logger
}

// DefaultCapacity is the staircase: 500/s, +250/s every 15 s,
// judged over 5-second windows against p95 ≤ 250 ms and 99 % decided on
// the first try.
func DefaultCapacity() CapacityOptions {
	return CapacityOptions{
		StartRate: 500, StepRate: 250, StepDuration: 15 * time.Second, MaxRate: 20_000,
		Window: 5 * time.Second, P95Limit: 250 * time.Millisecond, MinDecided: 0.99,
		Courses: 100, Seats: 1_000_000, Students: 10_000_000,
		Timeout: 10 * time.Second, DrainTimeout: 3 * time.Minute,
	}
}

// QuickCapacity is the CI form: four short steps from 25/s.
func QuickCapacity() CapacityOptions {
	o := DefaultCapacity()
	o.StartRate, o.StepRate, o.StepDuration, o.MaxRate, o.Window = 25, 25, 4*time.Second, 100, 2*time.Second
	o.Courses, o.Seats = 5, 1000
	o.DrainTimeout = time.Minute
	return o
}

// Validate rejects a staircase that cannot run or cannot be judged.
func (o CapacityOptions) Validate() error {
	switch {
	case o.StartRate <= 0 || o.StepRate <= 0 || o.MaxRate < o.StartRate:
		return fmt.Errorf("--start and --step must be positive and --max-rate at least --start")
	case o.StepDuration <= 0 || o.Window <= 0 || o.StepDuration%o.Window != 0:
		return fmt.Errorf("--step-duration must be a positive multiple of --window")
	case o.P95Limit <= 0 || o.MinDecided <= 0 || o.MinDecided > 1:
		return fmt.Errorf("--p95 must be positive and --min-decided in (0, 1]")
	case o.Courses < 1 || o.Seats < 1 || o.Students < 1:
		return fmt.Errorf("--courses, --seats and --students must be at least 1")
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive")
	}
	return nil
}

// rates lists the steps' rates.
func (o CapacityOptions) rates() []float64 {
	var out []float64
	for r := o.StartRate; r <= o.MaxRate+1e-9; r += o.StepRate {
		out = append(out, r)
	}
	return out
}

// scenario is the staircase as driver stages: each step holds its rate; a
// 1 ms ramp joins the steps, so rates move in steps, not slopes.
func (o CapacityOptions) scenario(steps int) Scenario {
	rs := o.rates()[:steps]
	s := Scenario{StartRate: rs[0], MaxVUs: o.maxVUs()}
	for i, r := range rs {
		if i == 0 {
			s.Stages = append(s.Stages, Stage{Duration: o.StepDuration, Target: r})
			continue
		}
		s.Stages = append(s.Stages, Stage{Duration: time.Millisecond, Target: r}, Stage{Duration: o.StepDuration - time.Millisecond, Target: r})
	}
	return s
}

// maxVUs sizes the generator from rate and latency: an arrival can find
// every VU busy only when MaxRate × Timeout requests are outstanding, that
// is when requests are already older than the timeout, which breaks the
// objective on its own. So a drop is never the generator's limit alone.
func (o CapacityOptions) maxVUs() int {
	return int(math.Ceil(o.MaxRate * o.Timeout.Seconds()))
}

// CapacityWindow is one judged window of a step, by scheduled arrival time.
type CapacityWindow struct {
	FromS    float64 `json:"from_s"`
	Arrivals int     `json:"arrivals"`
	Dropped  int     `json:"dropped"`
	Late     int     `json:"late"`
	// Decided is the share of arrivals answered 201, 202 or 409 at once.
	Decided    float64 `json:"decided_first_try"`
	Status5xx  int     `json:"5xx"`
	Timeouts   int     `json:"timeouts"`
	ConnErrors int     `json:"conn_errors"`
	Status429  int     `json:"429"`
	P95        float64 `json:"p95_ms"`
	BrokenBy   string  `json:"broken_by,omitempty"`
	// Stages is where the window's time went: the arm's /metrics
	// histograms and the CPU of its --pid processes (and the bench's)
	// between the window's edges, read by the wall clock, where its
	// arrivals are counted by schedule. Nil when a reading is missing.
	Stages *StageTable `json:"stages,omitempty"`
}

// CapacityStep is one rate held for StepDuration.
type CapacityStep struct {
	RateRPS  float64          `json:"rate_rps"`
	Held     bool             `json:"held"`
	BrokenBy string           `json:"broken_by,omitempty"`
	Arrivals int              `json:"arrivals"`
	Latency  LatencySummary   `json:"latency_ms"`
	Windows  []CapacityWindow `json:"windows"`
	// GeneratorCPUS is the bench process's CPU seconds during the step;
	// for the peer arm that includes the peer, which runs in the bench.
	GeneratorCPUS float64 `json:"generator_cpu_s"`
}

// CapacityArm is one arm's staircase.
type CapacityArm struct {
	Name       string         `json:"name"`
	Target     string         `json:"target"`
	RunID      string         `json:"run_id"`
	MaxHeldRPS float64        `json:"max_held_rps"`
	Steps      []CapacityStep `json:"steps"`
	// GeneratorScope says what GeneratorCPUS counts.
	GeneratorScope string   `json:"generator_scope"`
	Drained        bool     `json:"drained"`
	Timeline       []Second `json:"timeline"`
}

// Capacity is `bench capacity`'s result; Ratio = claimflow ÷ peer of
// max_held_rps.
type Capacity struct {
	Options   capacityEcho `json:"options"`
	Claimflow *CapacityArm `json:"claimflow"`
	Peer      *CapacityArm `json:"peer"`
	Ratio     float64      `json:"ratio"`
}

type capacityEcho struct {
	StartRate    float64 `json:"start_rps"`
	StepRate     float64 `json:"step_rps"`
	StepDuration float64 `json:"step_s"`
	Window       float64 `json:"window_s"`
	P95Limit     float64 `json:"p95_limit_ms"`
	MinDecided   float64 `json:"min_decided_first_try"`
	MaxVUs       int     `json:"max_vus"`
}

// RunCapacity runs the claimflow arm, then the peer arm started in this
// process, and reports both and the ratio.
func RunCapacity(ctx context.Context, o CapacityOptions, claimflow Arm) (*Capacity, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	out := &Capacity{Options: capacityEcho{
		StartRate: o.StartRate, StepRate: o.StepRate, StepDuration: o.StepDuration.Seconds(), Window: o.Window.Seconds(),
		P95Limit: ms(o.P95Limit), MinDecided: o.MinDecided, MaxVUs: o.maxVUs(),
	}}
	if err := peerTablesFirst(ctx, o.DB, o.PeerDB); err != nil {
		return nil, err
	}
	cf, err := capacityArm(ctx, o, claimflow, "the bench process: load generator only")
	if err != nil {
		return nil, fmt.Errorf("claimflow arm: %w", err)
	}
	out.Claimflow = cf
	peerOpts := o
	if o.PeerDB != nil {
		peerOpts.DB = o.PeerDB // the peer's tables and its drain
	}
	peer, err := StartPeer(ctx, PeerOptions{DB: peerOpts.DB, Kafka: o.Kafka, Log: o.Log})
	if err != nil {
		return nil, fmt.Errorf("start peer: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = peer.Stop(stopCtx)
	}()
	// The peer's windows show the same processes' CPU (its relay and API
	// run in the bench); it serves no metrics.
	pa, err := capacityArm(ctx, peerOpts, Arm{Name: "peer", URL: peer.URL(), Schema: PeerSchema, PIDs: claimflow.PIDs,
		NoMetrics: "the outbox peer serves no metrics"}, "the bench process: load generator + peer API + relay")
	if err != nil {
		return nil, fmt.Errorf("peer arm: %w", err)
	}
	out.Peer = pa
	out.Ratio = ratio(cf.MaxHeldRPS, pa.MaxHeldRPS)
	return out, nil
}

// capSample is one arrival's first (and only) attempt.
type capSample struct {
	scheduled time.Duration
	latency   time.Duration
	status    int
	outcome   Outcome
}

// capacityRecorder files arrivals into windows by scheduled time.
type capacityRecorder struct {
	window time.Duration
	mu     sync.Mutex
	// per window: started, ended, dropped, late, samples
	started, ended, dropped, late []int
	samples                       [][]capSample
}

func (r *capacityRecorder) slot(at time.Duration) int {
	w := int(at / r.window)
	r.ensure(w)
	return w
}

// ensure grows the per-window tables to hold window w.
func (r *capacityRecorder) ensure(w int) {
	for len(r.started) <= w {
		r.started, r.ended, r.dropped, r.late = append(r.started, 0), append(r.ended, 0), append(r.dropped, 0), append(r.late, 0)
		r.samples = append(r.samples, nil)
	}
}

func (r *capacityRecorder) start(at time.Duration, late bool) {
	r.mu.Lock()
	w := r.slot(at)
	r.started[w]++
	if late {
		r.late[w]++
	}
	r.mu.Unlock()
}

func (r *capacityRecorder) end(s capSample) {
	r.mu.Lock()
	w := r.slot(s.scheduled)
	r.ended[w]++
	r.samples[w] = append(r.samples[w], s)
	r.mu.Unlock()
}

func (r *capacityRecorder) drop(at time.Duration) {
	r.mu.Lock()
	r.dropped[r.slot(at)]++
	r.mu.Unlock()
}

// settled reports whether every arrival of window w has ended.
func (r *capacityRecorder) settled(w int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ensure(w)
	return r.started[w] == r.ended[w]
}

// judge evaluates window w; arrivals still unanswered count as timeouts.
func (r *capacityRecorder) judge(w int, o CapacityOptions) CapacityWindow {
	r.mu.Lock()
	r.ensure(w)
	samples := slices.Clone(r.samples[w])
	started, dropped, late := r.started[w], r.dropped[w], r.late[w]
	r.mu.Unlock()
	return judgeWindow(time.Duration(w)*r.window, samples, started, dropped, late, o)
}

// judgeWindow applies the objective to one window's arrivals.
func judgeWindow(from time.Duration, samples []capSample, started, dropped, late int, o CapacityOptions) CapacityWindow {
	cw := CapacityWindow{FromS: from.Seconds(), Arrivals: started + dropped, Dropped: dropped, Late: late}
	cw.Timeouts = started - len(samples) // never answered
	lat := make([]float64, 0, len(samples))
	decided := 0
	for _, s := range samples {
		switch {
		case s.outcome == OutcomeTimeout:
			cw.Timeouts++
		case s.outcome == OutcomeConn:
			cw.ConnErrors++
		default:
			lat = append(lat, ms(s.latency))
			switch {
			case s.status >= 500:
				cw.Status5xx++
			case s.status == 429:
				cw.Status429++
			case s.status == 201 || s.status == 202 || s.status == 409:
				decided++
			}
		}
	}
	slices.Sort(lat)
	cw.P95 = round3(Percentile(lat, 95))
	if cw.Arrivals > 0 {
		cw.Decided = round3(float64(decided) / float64(cw.Arrivals))
	}
	switch {
	case cw.Arrivals == 0:
		cw.BrokenBy = "no arrivals"
	case cw.Status5xx > 0:
		cw.BrokenBy = "5xx"
	case cw.Timeouts > 0 || cw.ConnErrors > 0:
		cw.BrokenBy = "timeout or connection error"
	case cw.Dropped > 0:
		cw.BrokenBy = "dropped iterations"
	case cw.P95 > ms(o.P95Limit):
		cw.BrokenBy = "p95 above " + o.P95Limit.String()
	case cw.Decided < o.MinDecided:
		cw.BrokenBy = "fewer than " + strconv.FormatFloat(o.MinDecided*100, 'f', -1, 64) + " % decided on the first try"
	}
	return cw
}

// cpuSeconds is this process's user + system CPU time.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

// capacityArm climbs the staircase against one arm until a step breaks.
func capacityArm(ctx context.Context, o CapacityOptions, arm Arm, scope string) (*CapacityArm, error) {
	res := &CapacityArm{Name: arm.Name, Target: arm.URL, RunID: newRunID(), GeneratorScope: scope}
	courses := make([]string, o.Courses)
	for i := range courses {
		courses[i] = fmt.Sprintf("%s-c%03d", res.RunID, i)
	}
	client := newHTTPClient(min(o.maxVUs(), 10_000), o.Timeout)
	defer client.CloseIdleConnections()
	if err := createCourses(ctx, client, arm.URL, arm.Token, courses, o.Seats); err != nil {
		return nil, fmt.Errorf("prepare courses on %s: %w", arm.URL, err)
	}
	rates := o.rates()
	sc := o.scenario(len(rates))
	fmt.Fprintf(o.Progress, "[%s] capacity run %s against %s: from %g/s by +%g/s every %s up to %g/s; windows of %s; %d VUs\n",
		arm.Name, res.RunID, arm.URL, o.StartRate, o.StepRate, o.StepDuration, o.MaxRate, o.Window, sc.MaxVUs)

	rec := &capacityRecorder{window: o.Window}
	en := &enroller{client: client, bases: arm.bases(), token: arm.Token, courses: courses, students: o.Students}
	defer en.useH1(o.Timeout)()
	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	d := &driver{sc: sc, clock: wallClock{start: start}, onDrop: rec.drop}
	d.iteration = func(ctx context.Context, n int, at time.Duration) {
		rec.start(at, time.Since(start)-at > lateAfter)
		course, student := en.pick(n)
		began := time.Now()
		status, _, _, err := en.post(ctx, n, "/v1/courses/"+course+"/enrollments", []byte(`{"student_id":"`+student+`"}`))
		s := capSample{scheduled: at, latency: time.Since(began), status: status}
		if err != nil {
			s.outcome = classify(err)
		}
		rec.end(s)
	}
	perStep := int(o.StepDuration / o.Window)
	probe := startWindowProbe(runCtx, arm, start, o.Window, len(rates)*perStep)
	driven := make(chan DriveStats, 1)
	go func() { driven <- d.run(runCtx) }()

	cpuAt := cpuSeconds()
	var all []capSample
	var dropped []time.Duration
	for i, rate := range rates {
		step := CapacityStep{RateRPS: rate, Held: true}
		for k := 0; k < perStep; k++ {
			w := i*perStep + k
			end := time.Duration(w+1) * o.Window
			// Judge once every arrival of the window has an answer, or once
			// the slowest could have timed out.
			deadline := end + o.Timeout + time.Second
			for {
				now := time.Since(start)
				if now >= end && (rec.settled(w) || now >= deadline) {
					break
				}
				if !sleepCtx(ctx, 100*time.Millisecond) {
					return nil, ctx.Err()
				}
			}
			cw := rec.judge(w, o)
			cw.Stages = probe.table(ctx, w)
			step.Windows = append(step.Windows, cw)
			step.Arrivals += cw.Arrivals
			if cw.BrokenBy != "" && step.Held {
				step.Held, step.BrokenBy = false, cw.BrokenBy
			}
		}
		now := cpuSeconds()
		step.GeneratorCPUS, cpuAt = round3(now-cpuAt), now
		rec.mu.Lock()
		var lat []float64
		for k := 0; k < perStep; k++ {
			for _, s := range rec.samples[i*perStep+k] {
				all = append(all, s)
				if s.outcome == OutcomeStatus {
					lat = append(lat, ms(s.latency))
				}
			}
			for n := 0; n < rec.dropped[i*perStep+k]; n++ {
				dropped = append(dropped, time.Duration(i*perStep+k)*o.Window)
			}
		}
		rec.mu.Unlock()
		step.Latency = Summarize(lat)
		res.Steps = append(res.Steps, step)
		fmt.Fprintf(o.Progress, "[%s] step %6.0f/s  arrivals %6d  p95 %7.1fms  decided %5.1f%%  %s  (generator CPU %.1fs)\n",
			arm.Name, rate, step.Arrivals, step.Latency.P95, 100*minDecided(step.Windows), heldWord(step), step.GeneratorCPUS)
		if !step.Held {
			break
		}
		res.MaxHeldRPS = rate
	}
	stop()
	<-driven

	samples := make([]Sample, 0, len(all))
	for _, s := range all {
		samples = append(samples, Sample{End: s.scheduled + s.latency, Latency: s.latency, Status: s.status, Outcome: s.outcome})
	}
	slices.SortFunc(samples, func(a, b Sample) int { return cmpDuration(a.End, b.End) })
	res.Timeline = Timeline(samples, dropped, o.scenario(len(res.Steps)))
	res.Drained = true
	if o.DB != nil {
		drained, err := drain(ctx, o.DB, arm.Schema, courses, o.DrainTimeout, func(int, int) {})
		if err != nil {
			return nil, err
		}
		res.Drained = drained
	}
	return res, nil
}

// windowProbe reads an arm's histograms and CPU at every window's edge, so
// that each judged window, a broken one above all, shows where its time
// went.
type windowProbe struct {
	urls     []string
	note     string
	readings []reading
	// ready[w] is closed once readings[w] is taken.
	ready []chan struct{}
}

// startWindowProbe reads at start, start+window, … for windows windows,
// until ctx ends.
func startWindowProbe(ctx context.Context, arm Arm, start time.Time, window time.Duration, windows int) *windowProbe {
	p := &windowProbe{urls: arm.Metrics, note: arm.NoMetrics, readings: make([]reading, windows+1), ready: make([]chan struct{}, windows+1)}
	for i := range p.ready {
		p.ready[i] = make(chan struct{})
	}
	go func() {
		c := &http.Client{Timeout: window}
		defer c.CloseIdleConnections()
		for w := range p.readings {
			if !sleepCtx(ctx, time.Until(start.Add(time.Duration(w)*window))) {
				return
			}
			p.readings[w] = takeReading(ctx, c, p.urls, arm.PIDs, start)
			close(p.ready[w])
		}
	}()
	return p
}

// table is window w's stage table once both its edges were read; nil if
// ctx ended first.
func (p *windowProbe) table(ctx context.Context, w int) *StageTable {
	for _, edge := range []int{w, w + 1} {
		select {
		case <-p.ready[edge]:
		case <-ctx.Done():
			return nil
		}
	}
	t := buildStageTable(p.urls, p.readings[w], p.readings[w+1])
	if len(p.urls) == 0 && p.note != "" {
		t.Note = p.note
	}
	return t
}

func minDecided(ws []CapacityWindow) float64 {
	m := 1.0
	for _, w := range ws {
		m = min(m, w.Decided)
	}
	return m
}

func heldWord(s CapacityStep) string {
	if s.Held {
		return "held"
	}
	return "BROKEN: " + s.BrokenBy
}

// AsResults lets WritePlot draw a capacity run like the other commands.
func (c *Capacity) AsResults() []*Result {
	var out []*Result
	for _, a := range []*CapacityArm{c.Claimflow, c.Peer} {
		if a != nil {
			out = append(out, &Result{Name: a.Name + " capacity", Timeline: a.Timeline})
		}
	}
	return out
}

// WriteCapacityTable prints each arm's steps and the ratio.
func WriteCapacityTable(w io.Writer, c *Capacity) {
	for _, a := range []*CapacityArm{c.Claimflow, c.Peer} {
		if a == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s (%s): max held %g/s\n", a.Name, a.Target, a.MaxHeldRPS)
		fmt.Fprintf(w, "  %8s  %8s  %8s  %8s  %8s  %8s  %s\n", "rate/s", "arrivals", "p50 ms", "p95 ms", "p99 ms", "gen CPU", "verdict")
		for _, s := range a.Steps {
			fmt.Fprintf(w, "  %8g  %8d  %8.1f  %8.1f  %8.1f  %7.1fs  %s\n", s.RateRPS, s.Arrivals, s.Latency.P50, s.Latency.P95, s.Latency.P99, s.GeneratorCPUS, heldWord(s))
		}
		writeCPUPerClaim(w, a.Steps)
		if n := len(a.Steps); n > 0 && !a.Steps[n-1].Held {
			writeBrokenStep(w, a.Steps[n-1], c.Options.Window)
		}
	}
	fmt.Fprintf(w, "\ncapacity ratio claimflow ÷ peer: %s\n", fx(c.Ratio))
}

// cpuPerClaim is each process's CPU milliseconds per arrival over a step's
// windows that have a reading (the processes in first-seen order); nil
// when none has.
func cpuPerClaim(s CapacityStep) (procs []string, ms map[string]float64) {
	cpuS := map[string]float64{}
	arrivals := 0
	for _, cw := range s.Windows {
		if cw.Stages == nil {
			continue
		}
		arrivals += cw.Arrivals
		for _, r := range cw.Stages.CPU {
			if _, ok := cpuS[r.Process]; !ok {
				procs = append(procs, r.Process)
			}
			cpuS[r.Process] += r.CPUS
		}
	}
	if arrivals == 0 {
		return nil, nil
	}
	ms = make(map[string]float64, len(cpuS))
	for p, v := range cpuS {
		ms[p] = 1000 * v / float64(arrivals)
	}
	return procs, ms
}

// writeCPUPerClaim prints, step by step, each process's CPU milliseconds
// per claim: the cost of a part as batches grow with the rate.
func writeCPUPerClaim(w io.Writer, steps []CapacityStep) {
	var procs []string
	perStep := make([]map[string]float64, len(steps))
	for i, s := range steps {
		var ps []string
		ps, perStep[i] = cpuPerClaim(s)
		for _, p := range ps {
			if !slices.Contains(procs, p) {
				procs = append(procs, p)
			}
		}
	}
	if len(procs) == 0 {
		return
	}
	fmt.Fprintf(w, "  CPU ms per claim (CPU over the step's windows ÷ its arrivals):\n  %8s", "rate/s")
	for _, p := range procs {
		fmt.Fprintf(w, "  %*s", max(10, len(p)), p)
	}
	fmt.Fprintln(w)
	for i, s := range steps {
		if perStep[i] == nil {
			continue
		}
		fmt.Fprintf(w, "  %8g", s.RateRPS)
		for _, p := range procs {
			fmt.Fprintf(w, "  %*.3f", max(10, len(p)), perStep[i][p])
		}
		fmt.Fprintln(w)
	}
}

// writeBrokenStep shows the step that broke window by window: each stage's
// p95 and each process's CPU share, the windows that broke (*) beside
// those that held; window is the windows' length in seconds.
func writeBrokenStep(w io.Writer, s CapacityStep, window float64) {
	if !slices.ContainsFunc(s.Windows, func(cw CapacityWindow) bool { return cw.Stages != nil }) {
		return
	}
	// The rows: every stage and process any window has, in first-seen order.
	var names, procs []string
	var note string
	for _, cw := range s.Windows {
		t := cw.Stages
		if t == nil {
			continue
		}
		if t.Note != "" {
			note = t.Note
		}
		for _, r := range t.Stages {
			if !slices.Contains(names, r.Name) {
				names = append(names, r.Name)
			}
		}
		for _, r := range t.CPU {
			if !slices.Contains(procs, r.Process) {
				procs = append(procs, r.Process)
			}
		}
	}
	cells := func(label string, cell func(cw CapacityWindow) string) {
		fmt.Fprintf(w, "    %-36s", label)
		for _, cw := range s.Windows {
			fmt.Fprintf(w, " %10s", cell(cw))
		}
		fmt.Fprintln(w)
	}
	row := func(label string, cell func(t *StageTable) string) {
		cells(label, func(cw CapacityWindow) string {
			if cw.Stages == nil {
				return "—"
			}
			return cell(cw.Stages)
		})
	}
	fmt.Fprintf(w, "  where the %g/s step's time went, window by window (p95; CPU as a share of all CPUs; * broke):\n", s.RateRPS)
	fmt.Fprintf(w, "    %-36s", "window (s)")
	for _, cw := range s.Windows {
		mark := " "
		if cw.BrokenBy != "" {
			mark = "*"
		}
		fmt.Fprintf(w, " %10s", fmt.Sprintf("%g–%g%s", cw.FromS, cw.FromS+window, mark))
	}
	fmt.Fprintln(w)
	cells("client p95 (by arrival)", func(cw CapacityWindow) string { return fmtMS(cw.P95) })
	if note != "" {
		fmt.Fprintf(w, "    stages: %s\n", note)
	}
	for _, name := range names {
		row(name, func(t *StageTable) string {
			for _, r := range t.Stages {
				switch {
				case r.Name != name:
				case r.Count == 0:
					return "—"
				case r.Unit == "claims":
					return f1(*r.P95)
				default:
					return fmtMS(*r.P95MS)
				}
			}
			return "—"
		})
	}
	for _, proc := range procs {
		row("CPU "+proc, func(t *StageTable) string {
			for _, r := range t.CPU {
				if r.Process == proc {
					return fmt.Sprintf("%.0f%%", 100*r.Share)
				}
			}
			return "0%"
		})
	}
	row("machine busy", func(t *StageTable) string { return pct(t.MachineBusyShare) })
	row("  of it steal", func(t *StageTable) string { return pct(t.MachineStealShare) })
	row("waiting for the disk", func(t *StageTable) string { return pct(t.MachineIOStallShare) })
}

func pct(v *float64) string {
	if v == nil {
		return "?"
	}
	return fmt.Sprintf("%.0f%%", 100**v)
}
