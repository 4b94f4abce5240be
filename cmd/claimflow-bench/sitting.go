package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/claimflow/claimflow/bench"
)

// A sitting is docs/performance.md's targets table taken again on this
// machine: each target's command run --rounds times, round by round, each
// run on a 'claimflow dev' of its own with a fresh data dir, and each
// figure's median and range beside its goal.

// sittingTarget is one row of the targets table.
type sittingTarget struct {
	name string // its --targets name
	what string // the row as the doc names it
	cmd  string // the bench subcommand
	args []string
	goal string
	// idleAfter, when set, is how long after the command (its audit
	// included) the dev process's resident set is read: the run's figure.
	idleAfter time.Duration
}

// The goals the figures are judged by, as the targets table states them.
const (
	goal2000P50MS  = 20
	goal20P50MS    = 10
	goalFullP95MS  = 60
	goalRatio      = 2.0
	goalRatioFloor = 1.5
	goalPeakRSSMiB = 256
	goalIdleRSSMiB = 256
)

// sittingTargets are the targets table's rows, in its order and with its
// commands and goals (TestSittingMatchesTheTargetsTable ties the copies).
var sittingTargets = []sittingTarget{
	{"2000", "2,000/s for 45 s", "burst", []string{"--rate", "2000", "--ramp", "10s", "--hold", "30s", "--rampdown", "5s"}, fmt.Sprintf("p50 ≤ %d ms", goal2000P50MS), 0},
	{"20", "20/s", "burst", []string{"--rate", "20", "--ramp", "10s", "--hold", "30s", "--rampdown", "5s"}, fmt.Sprintf("p50 ≤ %d ms", goal20P50MS), 0},
	{"full", "the full scenario", "burst", []string{"--growth", "10s"}, fmt.Sprintf("flat, p95 ≤ %d ms", goalFullP95MS), 0},
	{"capacity", "capacity", "capacity", nil, fmt.Sprintf("≥ %.1f×, no run under %.1f", goalRatio, goalRatioFloor), 0},
	{"idle", "idle RSS after 1 M events", "burst",
		[]string{"--rate", "2000", "--ramp", "10s", "--hold", "560s", "--rampdown", "5s", "--seats", "20000", "--students", "2000000"},
		fmt.Sprintf("≤ %d MiB", goalIdleRSSMiB), 180 * time.Second},
}

// idleAfterQuick stands for an idle target's wait in a --quick sitting.
const idleAfterQuick = 5 * time.Second

// idleWait is how long the target's run waits before it reads the dev
// process's resident set.
func (t sittingTarget) idleWait(quick bool) time.Duration {
	if quick && t.idleAfter > 0 {
		return idleAfterQuick
	}
	return t.idleAfter
}

// peakRSSGoal is the targets table's row judged over the burst runs of
// the other targets (the idle target's ten minutes have a goal of their own).
var peakRSSGoal = fmt.Sprintf("≤ %d MiB", goalPeakRSSMiB)

// devInternalAddr is where each run's 'claimflow dev' serves /metrics.
const devInternalAddr = "127.0.0.1:9466"

type sittingRun struct {
	rounds    int
	targets   []sittingTarget
	claimflow string
	out       string
	quick     bool
}

func parseSitting(args []string, stderr io.Writer) (sittingRun, error) {
	fs := flag.NewFlagSet("claimflow-bench sitting", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var names []string
	for _, t := range sittingTargets {
		names = append(names, t.name)
	}
	r := sittingRun{}
	fs.IntVar(&r.rounds, "rounds", 3, "runs of each target, taken round by round")
	only := fs.String("targets", strings.Join(names, ","), "the targets to run, comma-separated")
	fs.StringVar(&r.claimflow, "claimflow", "", "the claimflow binary each run starts as 'claimflow dev' (default: built from ./cmd/claimflow of the checkout here)")
	fs.StringVar(&r.out, "out", "", "where each run's dev log, bench output and JSON stay (default: a new directory under the system's temporary one)")
	fs.BoolVar(&r.quick, "quick", false, "each run --quick: a check that the sitting runs, not a measure")
	if _, err := parseFlags(fs, args); err != nil {
		return r, err
	}
	if r.rounds < 1 {
		return r, fmt.Errorf("--rounds %d: at least 1", r.rounds)
	}
	for name := range strings.SplitSeq(*only, ",") {
		i := slices.IndexFunc(sittingTargets, func(t sittingTarget) bool { return t.name == strings.TrimSpace(name) })
		if i < 0 {
			return r, fmt.Errorf("--targets: no target %q (the targets: %s)", name, strings.Join(names, ", "))
		}
		r.targets = append(r.targets, sittingTargets[i])
	}
	return r, nil
}

// runSitting runs the sitting and prints its table; a run that failed, or
// whose audit did not pass, makes it fail once every run is done.
func runSitting(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	r, err := parseSitting(args, stderr)
	if err != nil {
		return err
	}
	if r.out == "" {
		if r.out, err = os.MkdirTemp("", "claimflow-sitting-"); err != nil {
			return err
		}
	}
	if r.claimflow == "" {
		r.claimflow = filepath.Join(r.out, "claimflow")
		build := exec.CommandContext(ctx, "go", "build", "-o", r.claimflow, "./cmd/claimflow")
		build.Stdout, build.Stderr = stderr, stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build claimflow from ./cmd/claimflow (run from the checkout, or pass --claimflow): %w", err)
		}
	}
	fmt.Fprintf(stderr, "sitting: rounds %d, targets %d, each run on a fresh 'claimflow dev'; logs and JSON in %s\n", r.rounds, len(r.targets), r.out)
	results := map[string][]sittingFigures{}
	var failed []string
	for round := 1; round <= r.rounds; round++ {
		for _, t := range r.targets {
			dir := filepath.Join(r.out, fmt.Sprintf("%s-%d", t.name, round))
			f, err := r.runOne(ctx, t, dir)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s round %d: %v (%s)", t.name, round, err, dir))
				fmt.Fprintf(stderr, "sitting: %s round %d failed: %v\n", t.name, round, err)
				continue
			}
			fmt.Fprintf(stderr, "sitting: %s round %d: %s\n", t.name, round, f.line())
			results[t.name] = append(results[t.name], f)
		}
	}
	writeSitting(stdout, r.targets, results, r.quick)
	if len(failed) > 0 {
		return fmt.Errorf("%d runs failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// runOne starts 'claimflow dev' on a fresh data dir in dir, runs the
// target's command against it, stops it, and removes the data dir.
func (r sittingRun) runOne(ctx context.Context, t sittingTarget, dir string) (sittingFigures, error) {
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return sittingFigures{}, err
	}
	defer os.RemoveAll(data)
	dev, err := startDev(ctx, r.claimflow, data, filepath.Join(dir, "dev.log"))
	if err != nil {
		return sittingFigures{}, err
	}
	defer dev.stop()
	pm, err := os.ReadFile(filepath.Join(data, "pg", "postmaster.pid"))
	if err != nil {
		return sittingFigures{}, fmt.Errorf("the dev stack's postmaster: %w", err)
	}
	postmaster, _, _ := strings.Cut(string(pm), "\n")
	jsonPath := filepath.Join(dir, "result.json")
	args := []string{t.cmd, "--data-dir", data, "--json", jsonPath,
		"--pid", strconv.Itoa(dev.cmd.Process.Pid), "--pid", strings.TrimSpace(postmaster),
		"--metrics", "http://" + devInternalAddr + "/metrics"}
	if r.quick {
		args = append(args, "--quick")
	} else {
		args = append(args, t.args...)
	}
	out, err := os.Create(filepath.Join(dir, "bench.out"))
	if err != nil {
		return sittingFigures{}, err
	}
	defer out.Close()
	if err := run(ctx, args, out, out); err != nil {
		return sittingFigures{}, fmt.Errorf("claimflow-bench %s: %w", strings.Join(args, " "), err)
	}
	f, err := readFigures(t, jsonPath)
	if err != nil || t.idleAfter == 0 {
		return f, err
	}
	wait := t.idleWait(r.quick)
	select {
	case <-time.After(wait):
	case <-dev.exited:
		return f, errors.New("claimflow dev exited while idle")
	case <-ctx.Done():
		return f, ctx.Err()
	}
	if f.idleRSSMiB, err = bench.RSSMiB(dev.cmd.Process.Pid); err != nil {
		return f, fmt.Errorf("the dev process's resident set: %w", err)
	}
	fmt.Fprintf(out, "idle %s after the command: VmRSS of the dev process (pid %d) %.1f MiB\n", wait, dev.cmd.Process.Pid, f.idleRSSMiB)
	return f, nil
}

// devProcess is one run's 'claimflow dev'.
type devProcess struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startDev starts 'claimflow dev' on data and waits for its ready line;
// its output goes to logPath.
func startDev(ctx context.Context, bin, data, logPath string) (*devProcess, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "dev", "--data-dir", data)
	cmd.Env = append(os.Environ(), "INTERNAL_HTTP_ADDR="+devInternalAddr)
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = log.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start %s dev: %w", bin, err)
	}
	d := &devProcess{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		unready := ready // closed at the first ready line, then nil
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(log, sc.Text())
			if strings.HasPrefix(sc.Text(), "claimflow ready:") && unready != nil {
				close(unready)
				unready = nil
			}
		}
		_ = cmd.Wait()
		_ = log.Close()
		close(d.exited)
	}()
	// The first start on a new machine builds the Temporal CLI and fetches
	// PostgreSQL.
	select {
	case <-ready:
		return d, nil
	case <-d.exited:
		return nil, fmt.Errorf("claimflow dev exited before it was ready (%s)", logPath)
	case <-time.After(20 * time.Minute):
		d.stop()
		return nil, fmt.Errorf("claimflow dev not ready in 20 minutes (%s)", logPath)
	case <-ctx.Done():
		d.stop()
		return nil, ctx.Err()
	}
}

// stop asks 'claimflow dev' to stop as Ctrl-C does, and kills it if it has
// not within two minutes.
func (d *devProcess) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-d.exited:
	case <-time.After(2 * time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// sittingFigures are what the table takes from one run's JSON.
type sittingFigures struct {
	p50, p95, p99 float64
	busy, steal   float64 // shares of the machine, 0 when not read
	rssMiB        float64
	idleRSSMiB    float64 // the dev process's, idleAfter past the command
	auditOK       bool
	flat          *bool // the full scenario's check
	cf, peer      float64
	ratio         float64 // capacity
}

func (f sittingFigures) line() string {
	if f.ratio > 0 || f.cf > 0 {
		return fmt.Sprintf("claimflow %.0f/s, peer %.0f/s, ratio %.2f", f.cf, f.peer, f.ratio)
	}
	s := fmt.Sprintf("p50 %.1f, p95 %.1f, p99 %.1f ms, %.1f %% busy (steal %.1f %%), peak RSS %.0f MiB, audit %s",
		f.p50, f.p95, f.p99, 100*f.busy, 100*f.steal, f.rssMiB, map[bool]string{true: "OK", false: "FAILED"}[f.auditOK])
	if f.flat != nil {
		s += ", " + map[bool]string{true: "flat", false: "not flat"}[*f.flat]
	}
	if f.idleRSSMiB > 0 {
		s += fmt.Sprintf(", idle RSS %.0f MiB", f.idleRSSMiB)
	}
	return s
}

func readFigures(t sittingTarget, path string) (sittingFigures, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return sittingFigures{}, err
	}
	var f sittingFigures
	if t.cmd == "capacity" {
		var c bench.Capacity
		if err := json.Unmarshal(b, &c); err != nil {
			return f, fmt.Errorf("%s: %w", path, err)
		}
		if c.Claimflow == nil || c.Peer == nil {
			return f, errors.New(path + ": an arm is missing")
		}
		f.cf, f.peer, f.ratio = c.Claimflow.MaxHeldRPS, c.Peer.MaxHeldRPS, c.Ratio
		return f, nil
	}
	var res bench.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return f, fmt.Errorf("%s: %w", path, err)
	}
	f.p50, f.p95, f.p99 = res.Latency.P50, res.Latency.P95, res.Latency.P99
	f.auditOK = res.Audit.OK()
	if res.RSSMB != nil {
		f.rssMiB = *res.RSSMB
	}
	if st := res.StageTable; st != nil {
		if st.MachineBusyShare != nil {
			f.busy = *st.MachineBusyShare
		}
		if st.MachineStealShare != nil {
			f.steal = *st.MachineStealShare
		}
	}
	if res.Growth != nil && res.Growth.Flatness != nil {
		flat := res.Growth.Flatness.Flat()
		f.flat = &flat
	}
	return f, nil
}

// medianRange is "median (min–max)" of vs, or the one value.
func medianRange(vs []float64, format string) string {
	if len(vs) == 0 {
		return "–"
	}
	s := slices.Sorted(slices.Values(vs))
	m := bench.Percentile(s, 50)
	if len(s) == 1 {
		return fmt.Sprintf(format, m)
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", m, s[0], s[len(s)-1])
}

func column(fs []sittingFigures, get func(sittingFigures) float64) []float64 {
	out := make([]float64, len(fs))
	for i, f := range fs {
		out[i] = get(f)
	}
	return out
}

// judge says whether a target's runs meet its goal, by the median as the
// doc judges it.
func judge(t sittingTarget, fs []sittingFigures) bool {
	if len(fs) == 0 {
		return false
	}
	med := func(get func(sittingFigures) float64) float64 {
		return bench.Percentile(slices.Sorted(slices.Values(column(fs, get))), 50)
	}
	switch t.name {
	case "2000":
		return med(func(f sittingFigures) float64 { return f.p50 }) <= goal2000P50MS
	case "20":
		return med(func(f sittingFigures) float64 { return f.p50 }) <= goal20P50MS
	case "full":
		for _, f := range fs {
			if f.flat == nil || !*f.flat {
				return false
			}
		}
		return med(func(f sittingFigures) float64 { return f.p95 }) <= goalFullP95MS
	case "capacity":
		ratios := column(fs, func(f sittingFigures) float64 { return f.ratio })
		return med(func(f sittingFigures) float64 { return f.ratio }) >= goalRatio && slices.Min(ratios) >= goalRatioFloor
	case "idle":
		// Every run, as the peak RSS: memory does not hang on the hour.
		idle := column(fs, func(f sittingFigures) float64 { return f.idleRSSMiB })
		return slices.Min(idle) > 0 && slices.Max(idle) <= goalIdleRSSMiB
	}
	return false
}

// writeSitting prints each target's runs, their medians and ranges, and
// whether the goal is met, then the peak RSS over every burst run. Runs
// --quick are not the targets' and are not judged.
func writeSitting(w io.Writer, targets []sittingTarget, results map[string][]sittingFigures, quick bool) {
	yes := map[bool]string{true: "yes", false: "no"}
	met := func(ok bool) string {
		if quick {
			return "not judged (--quick)"
		}
		return yes[ok]
	}
	fmt.Fprintln(w, "\n== sitting: medians (ranges) of each target's runs ==")
	var rss []float64
	for _, t := range targets {
		fs := results[t.name]
		command := strings.Join(append([]string{t.cmd}, t.args...), " ")
		if quick {
			command = t.cmd + " --quick"
		}
		fmt.Fprintf(w, "%s (%s), goal %s; runs: %d\n", t.what, command, t.goal, len(fs))
		if t.cmd == "capacity" {
			fmt.Fprintf(w, "  claimflow %s/s, peer %s/s, ratio %s\n",
				medianRange(column(fs, func(f sittingFigures) float64 { return f.cf }), "%.0f"),
				medianRange(column(fs, func(f sittingFigures) float64 { return f.peer }), "%.0f"),
				medianRange(column(fs, func(f sittingFigures) float64 { return f.ratio }), "%.2f"))
		} else {
			fmt.Fprintf(w, "  p50 / p95 / p99: %s / %s / %s ms; busy %s %%, steal at most %.1f %%\n",
				medianRange(column(fs, func(f sittingFigures) float64 { return f.p50 }), "%.1f"),
				medianRange(column(fs, func(f sittingFigures) float64 { return f.p95 }), "%.1f"),
				medianRange(column(fs, func(f sittingFigures) float64 { return f.p99 }), "%.1f"),
				medianRange(column(fs, func(f sittingFigures) float64 { return 100 * f.busy }), "%.1f"),
				100*slices.Max(append(column(fs, func(f sittingFigures) float64 { return f.steal }), 0)))
			audits, flat := 0, 0
			for _, f := range fs {
				if f.auditOK {
					audits++
				}
				if f.flat != nil && *f.flat {
					flat++
				}
				if t.idleAfter == 0 {
					rss = append(rss, f.rssMiB)
				}
			}
			fmt.Fprintf(w, "  audits clean: %d of %d", audits, len(fs))
			if t.name == "full" {
				fmt.Fprintf(w, "; flat: %d of %d", flat, len(fs))
			}
			fmt.Fprintln(w)
			if t.idleAfter > 0 {
				fmt.Fprintf(w, "  idle RSS %s after the command, the dev process: %s MiB\n", t.idleWait(quick),
					medianRange(column(fs, func(f sittingFigures) float64 { return f.idleRSSMiB }), "%.0f"))
			}
		}
		fmt.Fprintf(w, "  met: %s\n", met(judge(t, fs)))
	}
	if len(rss) > 0 {
		fmt.Fprintf(w, "peak RSS of the dev process and the postmaster, goal %s: %s MiB; met: %s\n", peakRSSGoal,
			medianRange(rss, "%.0f"), met(slices.Max(rss) <= goalPeakRSSMiB))
	}
}
