package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/claimflow/claimflow/bench"
)

// runDisk measures the disk's floor under a directory: no stack, no
// environment, only the file system.
func runDisk(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("claimflow-bench disk", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := bench.DiskOptions{Block: 8 << 10, Ring: 16 << 20, Progress: stderr}
	fs.StringVar(&o.Dir, "dir", ".claimflow", "a directory on the disk to measure: the 'claimflow dev' data dir, where Postgres and Temporal write")
	fs.Float64Var(&o.Rate, "rate", 200, "flushes a second (Postgres flushes its WAL about 160 times a second at 2,000 claims/s)")
	fs.DurationVar(&o.Duration, "duration", 2*time.Minute, "how long to write")
	quick := fs.Bool("quick", false, "the CI form: 2 s (explicit flags still win)")
	jsonOut := fs.String("json", "", "write the figures as JSON to this file")
	set, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *quick {
		o.Duration = pick(set["duration"], o.Duration, 2*time.Second)
	}
	fmt.Fprintf(stderr, "disk: %d-byte writes, each fdatasync'ed, %.0f a second for %s, in %s\n", o.Block, o.Rate, o.Duration, o.Dir)
	r, err := bench.DiskFloor(ctx, o)
	if err != nil {
		return err
	}
	bench.WriteDiskTable(stdout, r)
	if *jsonOut != "" {
		return writeJSONFile(*jsonOut, r)
	}
	return nil
}
