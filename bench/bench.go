package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/kafka"
)

// Options is everything a burst needs besides the arm it drives.
type Options struct {
	Scenario Scenario
	// Courses are created per run with Seats each; iteration n enrolls
	// student s<n mod Students>.
	Courses  int
	Seats    int
	Students int
	// Timeout bounds one HTTP request (k6's default is 60 s).
	Timeout time.Duration
	// MaxRetries bounds how often one iteration retries after a 429/503
	// that carries Retry-After.
	MaxRetries int
	// Churn is the fraction of enrolled iterations that cancel their
	// enrollment HoldSeat after it was granted; Waitlist makes every claim
	// ask for a place on the waitlist of a full course (claimflow only).
	Churn    float64
	HoldSeat time.Duration
	Waitlist bool
	// DrainTimeout bounds the wait for the run's enrollments to settle
	// before the audit.
	DrainTimeout time.Duration
	// DB and Kafka are the infrastructure both arms share; the audit reads
	// them.
	DB    *pgxpool.Pool
	Kafka kafka.Config
	// PeerDB, when set, is the pool the outbox peer's arm runs on
	// instead of DB: the schema owner's (MIGRATE_DATABASE_URL), since the
	// peer creates its own tables and claimflow's runtime role may not.
	PeerDB *pgxpool.Pool
	// Progress receives the live progress line every ProgressEvery.
	Progress      io.Writer
	ProgressEvery time.Duration
	Log           *slog.Logger
	// Holders, when set, tells who holds the enrollments still reserved on
	// the courses whose ID starts with coursePrefix (claimflow's arm: the
	// command asks Temporal); the audit reports them.
	Holders func(ctx context.Context, coursePrefix string) (Holders, error)
	// Growth, when set, reads the run every Growth into a growth table;
	// DataDir is the 'claimflow dev' data dir whose files it sizes.
	Growth  time.Duration
	DataDir string
}

func (o *Options) defaults() {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 3 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 3 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// Validate rejects options that cannot run.
func (o Options) Validate() error {
	if err := o.Scenario.Validate(); err != nil {
		return err
	}
	switch {
	case o.Courses < 1:
		return fmt.Errorf("--courses must be at least 1")
	case o.Seats < 0 || o.Seats > 1_000_000:
		return fmt.Errorf("--seats must be between 0 and 1000000")
	case o.Students < 1:
		return fmt.Errorf("--students must be at least 1")
	case o.MaxRetries < 0:
		return fmt.Errorf("--max-retries must not be negative")
	case o.Churn < 0 || o.Churn > 1:
		return fmt.Errorf("--churn must be a fraction between 0 and 1")
	case o.HoldSeat < 0:
		return fmt.Errorf("--hold-seat must not be negative")
	case o.DB == nil:
		return fmt.Errorf("no database for the stage latencies and the audit")
	}
	return nil
}

// Arm is one system under test.
type Arm struct {
	Name string
	// URL is the API the courses are created on; URLs, when set, are
	// every API process, which take the enrollments in turn.
	URL    string
	URLs   []string
	Schema Schema
	// Token, when set, is sent as the bearer token of every request: an
	// admin's, since the bench creates courses and enrolls any student.
	Token string
	// PIDs whose summed VmRSS peak is reported; RSSScope says what they are.
	// The stage table's CPU rows are these processes and their descendants.
	PIDs     []int
	RSSScope string
	// Metrics are the /metrics URLs the stage table is read from (the API's,
	// and the worker's when it runs apart); without any, NoMetrics says why
	// there is no stage table.
	Metrics   []string
	NoMetrics string
}

func (a Arm) bases() []string {
	if len(a.URLs) > 0 {
		return a.URLs
	}
	return []string{a.URL}
}

// Result is one arm's figures; the JSON keys are the issue's.
type Result struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	RunID    string `json:"run_id"`
	Scenario string `json:"scenario"`
	HTTPSummary
	Iterations        DriveStats `json:"iterations"`
	DroppedIterations int        `json:"dropped_iterations"`
	Retries           int        `json:"retries"`
	DurationS         float64    `json:"duration_s"`
	ConfirmedPerS     float64    `json:"confirmed_per_s"`
	// ConfirmedPerSPeak is the highest confirmation rate held for 10 s.
	ConfirmedPerSPeak float64  `json:"confirmed_per_s_peak_10s"`
	Stages            Stages   `json:"stages_ms"`
	Audit             Audit    `json:"audit"`
	RSSMB             *float64 `json:"rss_mb"`
	// Waitlist is the churn/waitlist figures (nil without --churn or
	// --waitlist).
	Waitlist *WaitlistFigures `json:"waitlist,omitempty"`
	RSSScope string           `json:"rss_scope,omitempty"`
	// StageTable is where an answer's time went during the hold (nil for
	// an arm without metrics: the peer, or no URL; NoStageTable says why).
	StageTable   *StageTable `json:"stage_table,omitempty"`
	NoStageTable string      `json:"no_stage_table,omitempty"`
	// Growth is the run interval by interval (Options.Growth).
	Growth   *Growth  `json:"growth,omitempty"`
	Timeline []Second `json:"timeline"`
}

// newRunID is a short unique prefix for the run's course IDs, so the SQL and
// the topic scan can tell this run's rows and events from everyone else's.
func newRunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return "bn" + strconv.FormatInt(time.Now().Unix(), 36) + hex.EncodeToString(b[:])
}

// Run drives one arm through the scenario, drains, and audits.
func Run(ctx context.Context, o Options, arm Arm) (*Result, error) {
	o.defaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Name: arm.Name, Target: arm.URL, RunID: newRunID(), Scenario: o.Scenario.String(), RSSScope: arm.RSSScope}
	courses := make([]string, o.Courses)
	for i := range courses {
		courses[i] = fmt.Sprintf("%s-c%03d", res.RunID, i)
	}
	client := newHTTPClient(o.Scenario.MaxVUs, o.Timeout)
	defer client.CloseIdleConnections()
	fmt.Fprintf(o.Progress, "[%s] run %s against %s: %d courses × %d seats; %s (%d iterations scheduled)\n",
		arm.Name, res.RunID, arm.URL, o.Courses, o.Seats, o.Scenario, o.Scenario.Expected())
	if err := createCourses(ctx, client, arm.URL, arm.Token, courses, o.Seats); err != nil {
		return nil, fmt.Errorf("prepare courses on %s: %w", arm.URL, err)
	}

	rss := startRSS(arm.PIDs, 500*time.Millisecond)
	rec := &Recorder{}
	start := time.Now()
	var probe *stageProbe
	if len(arm.Metrics) > 0 {
		from, to := HoldWindow(o.Scenario)
		probe = startStageProbe(ctx, arm.Metrics, arm.PIDs, start, from, to)
	} else {
		res.NoStageTable = arm.NoMetrics
	}
	var growth *growthProbe
	if o.Growth > 0 {
		growth = startGrowthProbe(ctx, o.Growth, o.DataDir, o.DB, arm.Metrics, arm.PIDs, start)
	}
	en := &enroller{
		client: client, bases: arm.bases(), token: arm.Token, courses: courses, students: o.Students,
		sleep: o.Scenario.Sleep, maxRetries: o.MaxRetries, start: start, rec: rec,
		churn: o.Churn, holdSeat: o.HoldSeat, waitlist: o.Waitlist,
	}
	defer en.useH1(o.Timeout)()
	d := &driver{sc: o.Scenario, clock: wallClock{start: start}, iteration: en.iteration, onDrop: rec.Drop}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		showProgress(o, arm.Name, d, rec, stopProgress)
	}()
	stats := d.run(ctx)
	close(stopProgress)
	<-progressDone
	if err := ctx.Err(); err != nil {
		rss.Stop()
		return nil, err
	}

	samples, dropped := rec.Snapshot()
	if probe != nil {
		if res.StageTable = probe.result(samples); res.StageTable == nil {
			res.NoStageTable = "the run ended before the hold's second reading"
		}
	}
	sendSpan := o.Scenario.Duration()
	for _, s := range samples {
		sendSpan = max(sendSpan, s.End)
	}
	res.HTTPSummary = SummarizeHTTP(samples, sendSpan)
	if growth != nil {
		from, to := HoldWindow(o.Scenario)
		res.Growth = growth.result(samples, res.HTTPSummary.Latency, from, to)
	}
	res.Iterations = stats
	res.DroppedIterations = stats.Dropped
	res.Retries = int(en.retries.Load())
	res.DurationS = round3(stats.Elapsed.Seconds())
	res.Timeline = Timeline(samples, dropped, o.Scenario)

	fmt.Fprintf(o.Progress, "[%s] load done in %s; draining (up to %s)...\n", arm.Name, stats.Elapsed.Round(time.Millisecond), o.DrainTimeout)
	drainStart := time.Now()
	lastShown := time.Now()
	drained, err := drain(ctx, o.DB, arm.Schema, courses, o.DrainTimeout, func(reserved, total int) {
		if time.Since(lastShown) >= o.ProgressEvery {
			fmt.Fprintf(o.Progress, "[%s] drain %4.0fs  %d enrollments, %d still reserved\n", arm.Name, time.Since(drainStart).Seconds(), total, reserved)
			lastShown = time.Now()
		}
	})
	res.RSSMB = rss.Stop()
	if err != nil {
		return nil, err
	}
	drainTook := time.Since(drainStart)

	if res.Stages, err = stageLatencies(ctx, o.DB, arm.Schema, courses); err != nil {
		return nil, err
	}
	if res.ConfirmedPerS, err = confirmedRate(ctx, o.DB, arm.Schema, courses); err != nil {
		return nil, err
	}
	if res.ConfirmedPerSPeak, err = peakConfirmedRate(ctx, o.DB, arm.Schema, courses); err != nil {
		return nil, err
	}
	if res.Audit, err = audit(ctx, o.DB, o.Kafka, arm.Schema, res.RunID+"-", courses, en.Accepted()); err != nil {
		return nil, err
	}
	res.Audit.Drained = drained
	res.Audit.DrainS = round3(drainTook.Seconds())
	if o.Holders != nil && res.Audit.Pending > 0 {
		h, err := o.Holders(ctx, res.RunID+"-")
		if err != nil {
			return nil, err
		}
		res.Audit.Holders = &h
	}
	if o.Churn > 0 || o.Waitlist {
		wl, err := waitlistFigures(ctx, o.DB, res.RunID, courses, en)
		if err != nil {
			return nil, err
		}
		res.Waitlist = &wl
	}
	return res, nil
}

// showProgress prints one line per interval until stop: the scheduled rate,
// what was answered in the interval, in-flight VUs, drops and errors.
func showProgress(o Options, name string, d *driver, rec *Recorder, stop <-chan struct{}) {
	t := time.NewTicker(o.ProgressEvery)
	defer t.Stop()
	total := o.Scenario.Duration()
	var prev time.Duration
	errors := 0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := d.clock.Now()
		recent := rec.since(prev)
		lat := make([]float64, 0, len(recent))
		failed := 0
		for _, s := range recent {
			lat = append(lat, ms(s.Latency))
			if s.Failed() {
				failed++
			}
		}
		errors += failed
		sum := Summarize(lat)
		window := (now - prev).Seconds()
		fmt.Fprintf(o.Progress, "[%s] %5.0fs/%.0fs  target %6.0f/s  answered %7.1f/s  in-flight %5d  dropped %6d  late %5d  errors %6d  p95 %8.1fms\n",
			name, now.Seconds(), total.Seconds(), o.Scenario.RateAt(now), float64(len(recent))/window,
			d.InFlight(), d.dropped.Load(), d.late.Load(), errors, sum.P95)
		prev = now
	}
}

// RunPeer starts the outbox peer in this process, drives it like Run, and
// stops it. Its RSS is this process's: load generator and peer together.
func RunPeer(ctx context.Context, o Options) (*Result, error) {
	o.defaults()
	if o.PeerDB != nil {
		o.DB = o.PeerDB // the peer's tables, its drain and its audit
	}
	peer, err := StartPeer(ctx, PeerOptions{DB: o.DB, Kafka: o.Kafka, Log: o.Log})
	if err != nil {
		return nil, fmt.Errorf("start peer: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = peer.Stop(stopCtx)
	}()
	return Run(ctx, o, Arm{
		Name: "peer", URL: peer.URL(), Schema: PeerSchema,
		PIDs: []int{os.Getpid()}, RSSScope: "the bench process: load generator + peer API + relay",
	})
}

// Ratio is claimflow ÷ peer. Throughput is confirmed enrollments per second
// (events out and rows confirmed), the figure that matters to the business:
// achieved_rps alone counts 503s and their Retry-After retries as throughput.
type Ratio struct {
	Throughput  float64 `json:"throughput"`
	AchievedRPS float64 `json:"achieved_rps"`
	OKRPS       float64 `json:"ok_rps"`
	P50         float64 `json:"p50"`
	P95         float64 `json:"p95"`
}

// Comparison is `bench compare`'s result.
type Comparison struct {
	Claimflow *Result `json:"claimflow"`
	Peer      *Result `json:"peer"`
	Ratio     Ratio   `json:"ratio"`
}

// Compare runs claimflow, then the peer, with the same scenario.
func Compare(ctx context.Context, o Options, claimflow Arm) (*Comparison, error) {
	if err := peerTablesFirst(ctx, o.DB, o.PeerDB); err != nil {
		return nil, err
	}
	cf, err := Run(ctx, o, claimflow)
	if err != nil {
		return nil, fmt.Errorf("claimflow arm: %w", err)
	}
	peer, err := RunPeer(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("peer arm: %w", err)
	}
	return &Comparison{Claimflow: cf, Peer: peer, Ratio: Ratio{
		Throughput:  ratio(cf.ConfirmedPerS, peer.ConfirmedPerS),
		AchievedRPS: ratio(cf.AchievedRPS, peer.AchievedRPS),
		OKRPS:       ratio(cf.OKRPS, peer.OKRPS),
		P50:         ratio(cf.Latency.P50, peer.Latency.P50),
		P95:         ratio(cf.Latency.P95, peer.Latency.P95),
	}}, nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return round3(a / b)
}

// ParsePIDs reads "--pid" values.
func ParsePIDs(values []string) ([]int, error) {
	var out []int
	for _, v := range values {
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--pid %q is not a process ID", f)
			}
			out = append(out, n)
		}
	}
	return out, nil
}
