package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/claimflow/claimflow/bench"
	"github.com/claimflow/claimflow/internal/store"
)

// capacityRun is `claimflow-bench capacity` as its flags describe it.
type capacityRun struct {
	opts bench.CapacityOptions
	// arm is claimflow's, with what each window's stage table reads.
	arm     bench.Arm
	token   string
	dataDir string
	jsonOut string
	plotOut string
}

func parseCapacity(env benchEnv, args []string, stderr io.Writer) (capacityRun, error) {
	fs := flag.NewFlagSet("claimflow-bench capacity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := bench.DefaultCapacity()
	r := capacityRun{}
	target := fs.String("target", "http://"+env.HTTPAddr, "base URL of the claimflow API under test")
	start := fs.Float64("start", def.StartRate, "rate of the first step, arrivals per second")
	step := fs.Float64("step", def.StepRate, "rate added by each step")
	stepDur := fs.Duration("step-duration", def.StepDuration, "how long each step holds its rate (a multiple of --window)")
	maxRate := fs.Float64("max-rate", def.MaxRate, "last step; a run that holds it stops there")
	window := fs.Duration("window", def.Window, "span the objective is judged over")
	p95 := fs.Duration("p95", def.P95Limit, "objective: p95 of a window at most this")
	minDecided := fs.Float64("min-decided", def.MinDecided, "objective: share of a window's arrivals answered 201/202/409 on the first try")
	courses := fs.Int("courses", def.Courses, "courses created per arm")
	seats := fs.Int("seats", def.Seats, "capacity of each course")
	students := fs.Int("students", def.Students, "distinct students; arrival n enrolls student n mod this")
	timeout := fs.Duration("timeout", def.Timeout, "HTTP request timeout; also sizes the VUs (max-rate × timeout)")
	drainTimeout := fs.Duration("drain-timeout", def.DrainTimeout, "how long to let an arm's claims settle before the next arm")
	quick := fs.Bool("quick", false, "the CI form: 25/s, +25/s every 4 s up to 100/s, 2 s windows, 5 courses (explicit flags still win)")
	fs.StringVar(&r.jsonOut, "json", "", "write every figure as JSON to this file")
	fs.StringVar(&r.plotOut, "plot", "", "draw throughput and latency percentiles per second into this PNG")
	fs.StringVar(&r.token, "token", "", "bearer token for the claimflow API (an admin's); default: one minted from JWT_SECRET or <data-dir>/jwt-secret when there is one")
	fs.StringVar(&r.dataDir, "data-dir", ".claimflow", "the 'claimflow dev' data dir whose jwt-secret signs the default token")
	var pidFlags, metrics stringList
	fs.Var(&pidFlags, "pid", "process whose CPU, with its descendants', each window's stage table shows, in both arms (repeatable; e.g. the 'claimflow dev' process and the Postgres postmaster)")
	fs.Var(&metrics, "metrics", "claimflow /metrics URL each window's stage table is read from (repeatable: the API's, and the worker's when it runs apart); default: the API's, at INTERNAL_HTTP_ADDR when set, else --target")
	set, err := parseFlags(fs, args)
	if err != nil {
		return r, err
	}
	base := def
	if *quick {
		base = bench.QuickCapacity()
	}
	o := base
	o.StartRate = pick(set["start"], *start, base.StartRate)
	o.StepRate = pick(set["step"], *step, base.StepRate)
	o.StepDuration = pick(set["step-duration"], *stepDur, base.StepDuration)
	o.MaxRate = pick(set["max-rate"], *maxRate, base.MaxRate)
	o.Window = pick(set["window"], *window, base.Window)
	o.P95Limit = pick(set["p95"], *p95, base.P95Limit)
	o.MinDecided = pick(set["min-decided"], *minDecided, base.MinDecided)
	o.Courses = pick(set["courses"], *courses, base.Courses)
	o.Seats = pick(set["seats"], *seats, base.Seats)
	o.Students = pick(set["students"], *students, base.Students)
	o.Timeout = pick(set["timeout"], *timeout, base.Timeout)
	o.DrainTimeout = pick(set["drain-timeout"], *drainTimeout, base.DrainTimeout)
	o.Kafka = env.kafkaConfig("claimflow-bench")
	o.Progress = stderr
	r.opts = o
	arm, err := claimflowArm(env, *target, set["target"], pidFlags, metrics)
	if err != nil {
		return r, err
	}
	r.arm = arm
	return r, o.Validate()
}

func runCapacity(ctx context.Context, env benchEnv, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	r, err := parseCapacity(env, args, stderr)
	if err != nil {
		return err
	}
	pool, err := store.Open(ctx, env.DatabaseURL, 64)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The peer creates its own tables: as the schema owner, since the
	// services' runtime role has no DDL.
	peerPool, err := store.Open(ctx, env.MigrateDatabaseURL, 64)
	if err != nil {
		return fmt.Errorf("the outbox peer's database (MIGRATE_DATABASE_URL): %w", err)
	}
	defer peerPool.Close()
	o := r.opts
	o.DB, o.PeerDB, o.Log = pool, peerPool, log
	token := r.token
	if token == "" {
		steps := (o.MaxRate-o.StartRate)/o.StepRate + 1
		token, err = mintAdminToken(env, r.dataDir, time.Duration(steps)*o.StepDuration+2*o.DrainTimeout+time.Hour)
		if err != nil {
			return err
		}
	}
	arm := r.arm
	arm.Token = token
	c, err := bench.RunCapacity(ctx, o, arm)
	if err != nil {
		return err
	}
	bench.WriteCapacityTable(stdout, c)
	if r.jsonOut != "" {
		if err := writeJSONFile(r.jsonOut, c); err != nil {
			return err
		}
	}
	if r.plotOut != "" {
		if err := writePlotFile(r.plotOut, c.AsResults()); err != nil {
			return err
		}
	}
	return nil
}
