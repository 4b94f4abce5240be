package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/claimflow/claimflow/bench"
	"github.com/claimflow/claimflow/internal/store"
)

func runReads(ctx context.Context, env benchEnv, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("claimflow-bench reads", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "http://"+env.HTTPAddr, "base URL of the claimflow API under test")
	o := bench.ReadsOptions{Timeout: 10 * time.Second}
	fs.IntVar(&o.Enrollments, "enrollments", 100_000, "enrollments seeded before the reads")
	fs.IntVar(&o.Students, "students", 20_000, "distinct students they belong to; each reads with its own token")
	fs.Float64Var(&o.Rate, "rate", 500, "reads per second")
	fs.DurationVar(&o.Hold, "hold", 20*time.Second, "how long to read")
	fs.IntVar(&o.Limit, "limit", 20, "page size of each read")
	quick := fs.Bool("quick", false, "the CI form: 2,000 enrollments of 400 students, 50/s for 3 s (explicit flags still win)")
	jsonOut := fs.String("json", "", "write the figures as JSON to this file")
	dataDir := fs.String("data-dir", ".claimflow", "the 'claimflow dev' data dir whose jwt-secret signs the students' tokens")
	set, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *quick {
		o.Enrollments = pick(set["enrollments"], o.Enrollments, 2000)
		o.Students = pick(set["students"], o.Students, 400)
		o.Rate = pick(set["rate"], o.Rate, 50)
		o.Hold = pick(set["hold"], o.Hold, 3*time.Second)
	}
	sign, err := studentSigner(env, *dataDir, o.Hold+time.Hour)
	if err != nil {
		return err
	}
	// The schema owner seeds: it may also ANALYZE the table it owns.
	seed, err := store.Open(ctx, env.MigrateDatabaseURL, 4)
	if err != nil {
		return fmt.Errorf("the seeding database (MIGRATE_DATABASE_URL): %w", err)
	}
	defer seed.Close()
	o.Seed, o.Token, o.Progress = seed, sign, stderr
	r, err := bench.RunReads(ctx, strings.TrimRight(*target, "/"), o)
	if err != nil {
		return err
	}
	bench.WriteReads(stdout, r)
	if *jsonOut != "" {
		return writeJSONFile(*jsonOut, r)
	}
	return nil
}
