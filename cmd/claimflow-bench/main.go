// Command claimflow-bench load-tests claimflow with the user's k6 scenario
// and measures a transactional-outbox peer the same way. It is a command of
// its own so that the production binary links neither the load generator,
// the peer nor the plot's font.
//
//	claimflow-bench burst     the scenario against a running claimflow API
//	claimflow-bench peer      the same against the outbox peer run inside the bench
//	claimflow-bench compare   burst, then peer, and the ratios
//	claimflow-bench capacity  a stepped arrival rate against both arms until each breaks its objective
//	claimflow-bench floor     the rate of an empty workflow on the same Temporal server
//	claimflow-bench disk      how long a durable write takes on the data dir's disk
//	claimflow-bench sitting   the targets of docs/performance.md, 3 runs each on fresh 'claimflow dev' stacks
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/claimflow/claimflow/bench"
	"github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/worker"
)

const usage = `usage: claimflow-bench <burst|peer|compare|capacity|floor|disk|reads|sitting> [flags]

  burst     the user's k6 scenario against a running claimflow API (--target),
            then stage latencies from Postgres and an exactly-once audit of Kafka
  peer      the same against a transactional-outbox peer run inside the bench
  compare   burst, then peer, back to back; prints both and the ratios
  capacity  claimflow, then the peer: from 500/s, +250/s every 15 s, until
            p95 > 250 ms, a 5xx, a timeout, a dropped iteration or < 99 %%
            decided on the first try in a 5 s window; the highest rate each
            held for a whole step, and the ratio
  floor     the rate of an empty workflow on the same Temporal server
  disk      the disk's floor under --dir: 8 KiB writes, each fdatasync'ed,
            200 a second for 2 minutes; how long the flushes took
  reads     seed 100,000 enrollments, then students read their own lists
            with their own tokens at 500/s: p50/p95 and the answers
  sitting   docs/performance.md's targets again: each target's command
            --rounds times (3), each run on a fresh 'claimflow dev' it
            starts; medians and ranges beside the goals (about 90 min,
            45 without the ten-minute idle runs: --targets 2000,20,full,capacity)

Defaults are the user's scenario (0→2000/s over 30s, hold 3m20s, down over 10s,
each VU enrolls then sleeps 1s); --quick is a 5 s run at 50/s for CI.

environment (defaults fit 'claimflow dev'):
  %s

run 'claimflow-bench <command> -h' for its flags.
`

// errUsage is a command line that names no known subcommand; the usage
// text has been printed.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		// -h asked for the usage: not a failure.
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "claimflow-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintf(stderr, usage, strings.Join(config.Names(), ", "))
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, usage, strings.Join(config.Names(), ", "))
		return flag.ErrHelp
	case "disk":
		// The file system alone: no stack, no environment.
		return runDisk(ctx, args[1:], stdout, stderr)
	case "sitting":
		// Starts a 'claimflow dev' for each run, and runs the others.
		return runSitting(ctx, args[1:], stdout, stderr)
	case "burst", "peer", "compare", "capacity", "floor", "reads":
	default:
		fmt.Fprintf(stderr, "claimflow-bench: unknown command %q\n\n", args[0])
		fmt.Fprintf(stderr, usage, strings.Join(config.Names(), ", "))
		return errUsage
	}
	env, err := loadEnv()
	if err != nil {
		return err
	}
	log := newLogger(env, stderr)
	switch args[0] {
	case "floor":
		return runFloor(ctx, env, log, args[1:], stdout, stderr)
	case "capacity":
		return runCapacity(ctx, env, log, args[1:], stdout, stderr)
	case "reads":
		return runReads(ctx, env, args[1:], stdout, stderr)
	}
	return runLoad(ctx, env, log, args[0], args[1:], stdout, stderr)
}

func newLogger(env benchEnv, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: env.LogLevel}
	if env.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// loadRun is a burst, peer or compare run as its flags describe it; the
// database pool is opened only once the flags are known to be good.
type loadRun struct {
	mode     string
	opts     bench.Options
	arm      bench.Arm
	token    string
	dataDir  string
	jsonOut  string
	plotOut  string
	pidFlags stringList
	metrics  stringList
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// parseLoad reads the flags of burst, peer and compare.
func parseLoad(env benchEnv, mode string, args []string, stderr io.Writer) (loadRun, error) {
	fs := flag.NewFlagSet("claimflow-bench "+mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := bench.UserScenario()
	target := fs.String("target", "http://"+env.HTTPAddr, "base URL of the claimflow API under test (burst, compare); several, comma-separated, take the enrollments in turn (the APIs of 'claimflow dev --shape cluster')")
	rate := fs.Float64("rate", 2000, "target arrival rate, iterations per second")
	ramp := fs.Duration("ramp", user.Stages[0].Duration, "ramp from 0 to --rate over this long (0: start at --rate)")
	hold := fs.Duration("hold", user.Stages[1].Duration, "hold --rate this long")
	rampdown := fs.Duration("rampdown", user.Stages[2].Duration, "ramp down to 0 over this long")
	sleep := fs.Duration("sleep", user.Sleep, "each VU sleeps this long after its enrollment")
	maxVUs := fs.Int("max-vus", user.MaxVUs, "VUs available; an arrival finding all busy is dropped")
	courses := fs.Int("courses", 100, "courses created for the run")
	seats := fs.Int("seats", 5000, "capacity of each course")
	students := fs.Int("students", 1_000_000, "distinct students; iteration n enrolls student n mod this")
	quick := fs.Bool("quick", false, "a small run for CI: 50/s for 5 s, 5 courses × 40 seats (explicit flags still win)")
	churn := fs.Float64("churn", 0, "fraction of enrolled iterations that cancel after --hold-seat (burst only)")
	holdSeat := fs.Duration("hold-seat", 2*time.Second, "how long a churning iteration holds its seat before cancelling")
	waitlist := fs.Bool("waitlist", false, "claims that find the course full join its waitlist (burst only); e.g. --courses 20 --seats 50")
	timeout := fs.Duration("timeout", 60*time.Second, "HTTP request timeout (k6's default)")
	maxRetries := fs.Int("max-retries", 3, "retries of one iteration after a 429/503 carrying Retry-After")
	drainTimeout := fs.Duration("drain-timeout", 3*time.Minute, "how long to wait for the run's enrollments to settle before the audit")
	progressEvery := fs.Duration("progress", 3*time.Second, "interval of the live progress line on stderr")
	growth := fs.Duration("growth", 0, "print a growth table with a row per this interval: client and stage p95, the sizes of the data dir's Temporal DB and WAL and Kafka log, Postgres' tables, indexes, dead tuples, checkpoints and autovacuum runs, GC pauses and heap, machine busy (burst, compare; e.g. 10s)")
	r := loadRun{mode: mode}
	fs.StringVar(&r.jsonOut, "json", "", "write every figure as JSON to this file")
	fs.StringVar(&r.plotOut, "plot", "", "draw throughput and latency percentiles per second into this PNG")
	fs.StringVar(&r.token, "token", "", "bearer token for the claimflow API (an admin's); default: one minted from JWT_SECRET or <data-dir>/jwt-secret when there is one")
	fs.StringVar(&r.dataDir, "data-dir", ".claimflow", "the 'claimflow dev' data dir whose jwt-secret signs the default token")
	fs.Var(&r.pidFlags, "pid", "process whose peak RSS is reported for claimflow, and whose CPU, with its descendants', the stage table shows (repeatable; e.g. the 'claimflow dev' process and the Postgres postmaster)")
	fs.Var(&r.metrics, "metrics", "claimflow /metrics URL the stage table is read from (repeatable: the API's, and the worker's when it runs apart); default: the API's, at INTERNAL_HTTP_ADDR when set, else --target (burst, compare)")
	set, err := parseFlags(fs, args)
	if err != nil {
		return r, err
	}
	if (*churn > 0 || *waitlist) && mode != "burst" {
		return r, fmt.Errorf("--churn and --waitlist drive claimflow alone (the outbox peer has neither cancellation nor waitlist): use burst")
	}

	sc := bench.ShapedScenario(*rate, *ramp, *hold, *rampdown)
	if *quick {
		q := bench.QuickScenario()
		if set["rate"] || set["ramp"] || set["hold"] || set["rampdown"] {
			q = bench.ShapedScenario(pick(set["rate"], *rate, 50), pick(set["ramp"], *ramp, 0),
				pick(set["hold"], *hold, 5*time.Second), pick(set["rampdown"], *rampdown, 0))
			q.MaxVUs = 200
		}
		sc = q
		if !set["courses"] {
			*courses = 5
		}
		if !set["seats"] {
			*seats = 40
		}
		if !set["drain-timeout"] {
			*drainTimeout = time.Minute
		}
	}
	if set["max-vus"] || !*quick {
		sc.MaxVUs = *maxVUs
	}
	sc.Sleep = *sleep
	arm, err := claimflowArm(env, *target, set["target"], r.pidFlags, r.metrics)
	if err != nil {
		return r, err
	}
	r.opts = bench.Options{
		Scenario: sc, Courses: *courses, Seats: *seats, Students: *students,
		Timeout: *timeout, MaxRetries: *maxRetries, DrainTimeout: *drainTimeout,
		Churn: *churn, HoldSeat: *holdSeat, Waitlist: *waitlist,
		Kafka:    env.kafkaConfig("claimflow-bench"),
		Progress: stderr, ProgressEvery: *progressEvery,
		Growth: *growth, DataDir: r.dataDir,
	}
	r.arm = arm
	if len(arm.PIDs) > 0 {
		r.arm.RSSScope = fmt.Sprintf("pids %s", r.pidFlags.String())
	}
	return r, nil
}

// claimflowArm is the arm under test with what its stage tables read: the
// --pid processes, and the --metrics URLs or where the API serves them.
func claimflowArm(env benchEnv, target string, targetSet bool, pidFlags, metrics stringList) (bench.Arm, error) {
	pids, err := bench.ParsePIDs(pidFlags)
	if err != nil {
		return bench.Arm{}, err
	}
	a := bench.Arm{Name: "claimflow", Schema: bench.ClaimflowSchema, PIDs: pids}
	for t := range strings.SplitSeq(target, ",") {
		a.URLs = append(a.URLs, strings.TrimRight(t, "/"))
	}
	a.URL = a.URLs[0]
	if len(metrics) > 0 {
		a.Metrics = metrics
	} else {
		for _, u := range a.URLs {
			m, why := defaultMetrics(env, u, targetSet)
			a.Metrics, a.NoMetrics = append(a.Metrics, m...), why
		}
		if a.NoMetrics != "" {
			a.Metrics = nil
		}
	}
	return a, nil
}

// defaultMetrics is where the API under test serves /metrics: its internal
// address when INTERNAL_HTTP_ADDR is set (then the public one serves none),
// else the target itself. An internal address belongs to the API at
// HTTP_ADDR; for another --target it cannot be derived, and why is said.
func defaultMetrics(env benchEnv, target string, targetSet bool) ([]string, string) {
	if env.InternalHTTPAddr == "" {
		return []string{target + "/metrics"}, ""
	}
	if u, err := url.Parse(target); targetSet && (err != nil || u.Host != env.HTTPAddr) {
		return nil, fmt.Sprintf("INTERNAL_HTTP_ADDR (%s) is the internal address of the API at HTTP_ADDR (%s), not of --target %s; pass --metrics",
			env.InternalHTTPAddr, env.HTTPAddr, target)
	}
	host, port, err := net.SplitHostPort(env.InternalHTTPAddr)
	if err != nil {
		return nil, fmt.Sprintf("INTERNAL_HTTP_ADDR %q is not host:port; pass --metrics", env.InternalHTTPAddr)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1" // listening on every interface: this machine's
	}
	return []string{"http://" + net.JoinHostPort(host, port) + "/metrics"}, ""
}

// parseFlags parses a subcommand's flags, refuses arguments after them and
// returns the names of the flags given, so that --quick overrides only
// what the command line left unset.
func parseFlags(fs *flag.FlagSet, args []string) (map[string]bool, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set, nil
}

func pick[T any](explicit bool, v, def T) T {
	if explicit {
		return v
	}
	return def
}

func runLoad(ctx context.Context, env benchEnv, log *slog.Logger, mode string, args []string, stdout, stderr io.Writer) error {
	r, err := parseLoad(env, mode, args, stderr)
	if err != nil {
		return err
	}
	pool, err := store.Open(ctx, env.DatabaseURL, 64)
	if err != nil {
		return err
	}
	defer pool.Close()
	o := r.opts
	o.DB, o.Log = pool, log
	o.Holders = reservationHolders(env, pool, log)
	if mode == "peer" || mode == "compare" {
		// The peer creates its own tables: as the schema owner, since the
		// services' runtime role has no DDL.
		peerPool, err := store.Open(ctx, env.MigrateDatabaseURL, 64)
		if err != nil {
			return fmt.Errorf("the outbox peer's database (MIGRATE_DATABASE_URL): %w", err)
		}
		defer peerPool.Close()
		o.PeerDB = peerPool
	}
	if err := o.Validate(); err != nil {
		return err
	}
	arm := r.arm
	arm.Token = r.token
	if arm.Token == "" && mode != "peer" {
		arm.Token, err = mintAdminToken(env, r.dataDir, o.Scenario.Duration()+o.DrainTimeout+time.Hour)
		if err != nil {
			return err
		}
	}

	var out any
	var plotted []*bench.Result
	var failedAudit bool
	switch mode {
	case "burst", "peer":
		var res *bench.Result
		if mode == "burst" {
			res, err = bench.Run(ctx, o, arm)
		} else {
			res, err = bench.RunPeer(ctx, o)
		}
		if err != nil {
			return err
		}
		bench.WriteSummary(stdout, res)
		out, plotted, failedAudit = res, []*bench.Result{res}, !res.Audit.OK()
	case "compare":
		c, err := bench.Compare(ctx, o, arm)
		if err != nil {
			return err
		}
		bench.WriteSummary(stdout, c.Claimflow)
		bench.WriteSummary(stdout, c.Peer)
		fmt.Fprintln(stdout)
		bench.WriteCompareTable(stdout, c)
		out, plotted = c, []*bench.Result{c.Claimflow, c.Peer}
		failedAudit = !c.Claimflow.Audit.OK() || !c.Peer.Audit.OK()
	}
	if r.jsonOut != "" {
		if err := writeJSONFile(r.jsonOut, out); err != nil {
			return err
		}
	}
	if r.plotOut != "" {
		if err := writePlotFile(r.plotOut, plotted); err != nil {
			return err
		}
	}
	if failedAudit {
		return errors.New("the exactly-once audit found lost, duplicated, missing or oversold claims (see above)")
	}
	return nil
}

func runFloor(ctx context.Context, env benchEnv, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("claimflow-bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("workflows", 2000, "empty workflows to run")
	concurrency := fs.Int("concurrency", 64, "workflows started and awaited at once")
	warmup := fs.Int("warmup", 64, "empty workflows run first and not counted (pollers and task queue warm up)")
	quick := fs.Bool("quick", false, "a small run for CI: 100 workflows, 16 at once, 16 warm-up (--long-lived: 4 runs, continued as new every 30 updates)")
	update := fs.Bool("update", false, "start each with Update-With-Start and time the update's answer (a claim's shape, empty)")
	started := fs.Bool("started", false, "with --update: start each run first, untimed, and time only the update sent to the waiting run")
	longLived := fs.Bool("long-lived", false, "start --runs runs that stay and time updates sent to them, caller k to run k mod --runs; --workflows and --warmup count updates")
	runs := fs.Int("runs", 1, "with --long-lived: the runs that stay")
	perRun := fs.Int("updates-per-run", bench.DefaultFloorUpdatesPerRun, "with --long-lived: updates a run answers before it continues as new (the server takes at most 2,000 a run)")
	jsonOut := fs.String("json", "", "write the figures as JSON to this file")
	set, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *quick {
		if !set["workflows"] {
			*n = 100
		}
		if !set["concurrency"] {
			*concurrency = 16
		}
		if !set["warmup"] {
			*warmup = 16
		}
		// Four callers a run, and a continue-as-new within the run.
		if !set["runs"] {
			*runs = 4
		}
		if !set["updates-per-run"] {
			*perRun = 30
		}
	}
	tc, err := dialTemporal(ctx, env, log)
	if err != nil {
		return err
	}
	defer tc.Close()
	what := "empty workflows"
	if *longLived {
		what = fmt.Sprintf("updates to %d long-lived run(s)", *runs)
	}
	fmt.Fprintf(stderr, "floor: %d %s (after %d warm-up), %d at once, on %s, on a task queue of their own (%s-…)\n",
		*n, what, *warmup, *concurrency, env.TemporalAddress, bench.FloorTaskQueue)
	res, err := bench.Floor(ctx, bench.FloorOptions{
		Client: tc, Workflows: *n, Concurrency: *concurrency, Warmup: *warmup, Update: *update, Started: *started, Progress: stderr,
		LongLived: *longLived, Runs: *runs, UpdatesPerRun: *perRun,
		// claimflow's worker settings (worker.New), for a like-for-like floor.
		WorkerOptions: worker.SDKOptions(worker.Options{MaxConcurrentActivities: env.MaxActivities}),
	})
	if err != nil {
		return err
	}
	bench.WriteFloorTable(stdout, res)
	if *jsonOut != "" {
		if err := writeJSONFile(*jsonOut, res); err != nil {
			return err
		}
	}
	if res.Errors > 0 {
		return fmt.Errorf("%d of %d failed: %s", res.Errors, res.Workflows, res.FirstError)
	}
	return nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode --json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write --json %s: %w", path, err)
	}
	return nil
}

func writePlotFile(path string, results []*bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write --plot %s: %w", path, err)
	}
	if err := bench.WritePlot(f, results...); err != nil {
		f.Close()
		return fmt.Errorf("draw --plot %s: %w", path, err)
	}
	return f.Close()
}
