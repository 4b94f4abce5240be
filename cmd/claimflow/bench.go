package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	sdkworker "go.temporal.io/sdk/worker"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/internal/bench"
)

const benchUsage = `usage: claimflow bench <burst|peer|compare|floor> [flags]

  burst     the user's k6 scenario against a running claimflow API (--target),
            then stage latencies from Postgres and an exactly-once audit of Kafka
  peer      the same against a transactional-outbox peer run inside the bench
  compare   burst, then peer, back to back; prints both and the ratios
  floor     the rate of an empty workflow on the same Temporal server

Defaults are the user's scenario (0→2000/s over 30s, hold 3m20s, down over 10s,
each VU enrolls then sleeps 1s); --quick is a 5 s run at 50/s for CI. The bench
reads DATABASE_URL, KAFKA_BROKERS, KAFKA_VERSION and TEMPORAL_ADDRESS like the
other commands (defaults fit 'claimflow dev').

run 'claimflow bench <command> -h' for its flags.
`

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runBench(ctx context.Context, cfg config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, benchUsage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "burst", "peer", "compare":
		return runBenchLoad(ctx, cfg, log, args[0], args[1:], stdout, stderr)
	case "floor":
		return runBenchFloor(ctx, cfg, log, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "claimflow bench: unknown command %q\n\n%s", args[0], benchUsage)
	return flag.ErrHelp
}

func runBenchLoad(ctx context.Context, cfg config, log *slog.Logger, mode string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench "+mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := bench.UserScenario()
	target := fs.String("target", "http://"+cfg.HTTPAddr, "base URL of the claimflow API under test (burst, compare)")
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
	timeout := fs.Duration("timeout", 60*time.Second, "HTTP request timeout (k6's default)")
	maxRetries := fs.Int("max-retries", 3, "retries of one iteration after a 429/503 carrying Retry-After")
	drainTimeout := fs.Duration("drain-timeout", 3*time.Minute, "how long to wait for the run's enrollments to settle before the audit")
	progressEvery := fs.Duration("progress", 3*time.Second, "interval of the live progress line on stderr")
	jsonOut := fs.String("json", "", "write every figure as JSON to this file")
	plotOut := fs.String("plot", "", "draw throughput and latency percentiles per second into this PNG")
	token := fs.String("token", "", "bearer token for the claimflow API (an admin's); default: one minted from JWT_SECRET or <data-dir>/jwt-secret when there is one")
	dataDir := fs.String("data-dir", ".claimflow", "the 'claimflow dev' data dir whose jwt-secret signs the default token")
	var pids stringList
	fs.Var(&pids, "pid", "process whose peak RSS is reported for claimflow (repeatable; e.g. the 'claimflow dev' process)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

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
	pidList, err := bench.ParsePIDs(pids)
	if err != nil {
		return err
	}

	pool, err := openDB(ctx, cfg, 64)
	if err != nil {
		return err
	}
	defer pool.Close()
	o := bench.Options{
		Scenario: sc, Courses: *courses, Seats: *seats, Students: *students,
		Timeout: *timeout, MaxRetries: *maxRetries, DrainTimeout: *drainTimeout,
		DB: pool, Kafka: kafkaConfig(cfg, "claimflow-bench"),
		Progress: stderr, ProgressEvery: *progressEvery, Log: log,
	}
	if err := o.Validate(); err != nil {
		return err
	}
	if *token == "" && mode != "peer" {
		*token, err = benchToken(cfg, *dataDir, sc.Duration()+*drainTimeout+time.Hour)
		if err != nil {
			return err
		}
	}
	arm := bench.Arm{Name: "claimflow", URL: strings.TrimRight(*target, "/"), Schema: bench.ClaimflowSchema, Token: *token, PIDs: pidList}
	if len(pidList) > 0 {
		arm.RSSScope = fmt.Sprintf("pids %s", pids.String())
	}

	var out any
	var plotted []*bench.Result
	var failedAudit bool
	switch mode {
	case "burst", "peer":
		var r *bench.Result
		if mode == "burst" {
			r, err = bench.Run(ctx, o, arm)
		} else {
			r, err = bench.RunPeer(ctx, o)
		}
		if err != nil {
			return err
		}
		bench.WriteSummary(stdout, r)
		out, plotted, failedAudit = r, []*bench.Result{r}, !r.Audit.OK()
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
	if *jsonOut != "" {
		if err := writeJSONFile(*jsonOut, out); err != nil {
			return err
		}
	}
	if *plotOut != "" {
		if err := writePlotFile(*plotOut, plotted); err != nil {
			return err
		}
	}
	if failedAudit {
		return errors.New("the exactly-once audit found lost, duplicated, missing or oversold claims (see above)")
	}
	return nil
}

// benchToken mints an admin token for the local stack with JWT_SECRET or
// the dev stack's jwt-secret file; without either (AUTH_MODE=jwks, or an
// API run with --insecure-no-auth) it returns no token.
func benchToken(cfg config, dataDir string, ttl time.Duration) (string, error) {
	if cfg.Security.AuthMode == authJWKS {
		return "", nil // tokens come from the identity provider: pass --token
	}
	secret := cfg.Security.JWTSecret
	if secret == "" {
		var err error
		secret, err = readSecretFile(dataDir)
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
	}
	return signToken(secret, "claimflow-bench", api.RoleAdmin, ttl, cfg.Security.Issuer, cfg.Security.Audience)
}

func pick[T any](explicit bool, v, def T) T {
	if explicit {
		return v
	}
	return def
}

func runBenchFloor(ctx context.Context, cfg config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("workflows", 2000, "empty workflows to run")
	concurrency := fs.Int("concurrency", 64, "workflows started and awaited at once")
	warmup := fs.Int("warmup", 64, "empty workflows run first and not counted (pollers and task queue warm up)")
	quick := fs.Bool("quick", false, "a small run for CI: 100 workflows, 16 at once, 16 warm-up")
	jsonOut := fs.String("json", "", "write the figures as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
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
	}
	tc, err := dialTemporal(ctx, cfg, log, nil)
	if err != nil {
		return err
	}
	defer tc.Close()
	fmt.Fprintf(stderr, "floor: %d empty workflows (after %d warm-up), %d at once, on %s task queue %s\n",
		*n, *warmup, *concurrency, cfg.TemporalAddress, bench.FloorTaskQueue)
	res, err := bench.Floor(ctx, bench.FloorOptions{
		Client: tc, Workflows: *n, Concurrency: *concurrency, Warmup: *warmup, Progress: stderr,
		// claimflow's worker settings (worker.New).
		WorkerOptions: sdkworker.Options{MaxConcurrentActivityExecutionSize: cfg.MaxActivities, WorkerStopTimeout: 20 * time.Second},
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
		return fmt.Errorf("%d of %d empty workflows failed: %s", res.Errors, res.Workflows, res.FirstError)
	}
	return nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
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
