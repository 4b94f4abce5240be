package main

// The benchmark library against the real stack, in claimflow-bench's
// --quick form, so the harness cannot rot: every run (burst, peer, compare,
// floor) goes end to end, its JSON has the keys the issue names, and its
// audit finds nothing lost, duplicated or oversold. The test lives here
// rather than in cmd/claimflow-bench because this package's helpers start
// the real stack in process; test imports do not link the bench into the
// claimflow binary. claimflow-bench's own tests check that its flags build
// these same options.

import (
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/claimflow/claimflow/api"
	"github.com/claimflow/claimflow/bench"
	"github.com/claimflow/claimflow/cmd/internal/services"
	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/worker"
)

func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("the bench runs against the real stack; skipped with -short")
	}
	dir := dataDir(t)
	s := startTestStack(t, testStackOptions(t, dir))
	out := t.TempDir()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Each run is bounded on its own, as each claimflow-bench invocation is.
	runCtx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		t.Cleanup(cancel)
		return ctx
	}

	pool, err := services.OpenDB(runCtx(t), s.Config, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	peerPool, err := store.Open(runCtx(t), s.Config.MigrateDatabaseURL, 64) // the peer creates its tables as the owner
	if err != nil {
		t.Fatal(err)
	}
	defer peerPool.Close()
	token, err := mintToken(s.Config.Security.JWTSecret, "claimflow-bench", api.RoleAdmin, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// claimflow-bench burst --quick: 50/s for 5 s, 5 courses × 40 seats.
	quick := func(sc bench.Scenario, progress time.Duration) bench.Options {
		return bench.Options{
			Scenario: sc, Courses: 5, Seats: 40, Students: 1_000_000,
			Timeout: 60 * time.Second, MaxRetries: 3, DrainTimeout: time.Minute,
			DB: pool, PeerDB: peerPool, Kafka: s.Config.Kafka("claimflow-bench"),
			Progress: testWriter{t}, ProgressEvery: progress, Log: log,
		}
	}
	// The stage table reads the API's /metrics, where claimflow-bench's
	// default --metrics finds it: the internal address, if any.
	metricsAddr := s.API.Addr
	if s.API.InternalAddr != "" {
		metricsAddr = s.API.InternalAddr
	}
	arm := bench.Arm{Name: "claimflow", URL: "http://" + s.API.Addr, Schema: bench.ClaimflowSchema, Token: token,
		Metrics: []string{"http://" + metricsAddr + "/metrics"}}

	t.Run("burst", func(t *testing.T) {
		o := quick(bench.QuickScenario(), time.Second)
		o.Growth, o.DataDir = time.Second, dir // --growth 1s --data-dir
		a := arm
		a.PIDs, a.RSSScope = []int{os.Getpid()}, "pids "+strconv.Itoa(os.Getpid())
		r, err := bench.Run(runCtx(t), o, a)
		if err != nil {
			t.Fatal(err)
		}
		summary := summarize(t, r)
		for _, want := range []string{"http_reqs", "http_req_duration", "requested → recorded", "audit", "stages over the hold", "CPU over the same window", "growth, every 1s"} {
			if !strings.Contains(summary, want) {
				t.Errorf("summary lacks %q", want)
			}
		}
		j := asJSON(t, r)
		checkArm(t, "burst", j, 250)
		if j["rss_mb"] == nil {
			t.Error("rss_mb is null although a PID was given")
		}
		checkStageTable(t, j)
		checkGrowth(t, r.Growth)
		checkPlot(t, filepath.Join(out, "burst.png"), r)
	})

	t.Run("churn and waitlist on hot courses", func(t *testing.T) {
		// claimflow-bench burst --quick --courses 2 --seats 10 --churn 0.3 --hold-seat 500ms --waitlist
		o := quick(bench.QuickScenario(), time.Second)
		o.Courses, o.Seats, o.Churn, o.HoldSeat, o.Waitlist = 2, 10, 0.3, 500*time.Millisecond, true
		r, err := bench.Run(runCtx(t), o, arm)
		if err != nil {
			t.Fatal(err)
		}
		summary := summarize(t, r)
		w := r.Waitlist
		if w == nil || !strings.Contains(summary, "waitlist audit: OK") {
			t.Fatalf("no clean waitlist audit in the summary: %+v", w)
		}
		if !r.Audit.OK() {
			t.Errorf("audit: %+v", r.Audit)
		}
		// 250 claims on 20 seats: most wait; the churn frees seats that
		// the waitlist takes.
		if w.Cancelled == 0 || w.Waitlisted == 0 || w.Promoted == 0 || w.PromotionMS.Count == 0 {
			t.Errorf("churn and waitlist did nothing: %+v", w)
		}
	})

	t.Run("reads", func(t *testing.T) {
		// claimflow-bench reads --quick: 2,000 enrollments of 400 students,
		// each reading its own list with its own token at 50/s for 3 s.
		r, err := bench.RunReads(runCtx(t), "http://"+s.API.Addr, bench.ReadsOptions{
			Enrollments: 2000, Students: 400, Rate: 50, Hold: 3 * time.Second, Limit: 20, Timeout: 10 * time.Second,
			Seed: peerPool, Progress: testWriter{t},
			Token: func(sub string) (string, error) { return mintToken(s.Config.Security.JWTSecret, sub, "", time.Hour) },
		})
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		bench.WriteReads(&out, r)
		t.Logf("reads:\n%s", out.String())
		if r.Requests < 140 || r.Status["200"] != r.Requests || r.Latency.P50 <= 0 || r.TableRows < 2000 {
			t.Errorf("reads: %+v", r)
		}
	})

	t.Run("peer", func(t *testing.T) {
		r, err := bench.RunPeer(runCtx(t), quick(bench.QuickScenario(), 3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		summarize(t, r)
		checkArm(t, "peer", asJSON(t, r), 250)
	})

	t.Run("compare", func(t *testing.T) {
		// claimflow-bench compare --quick --rate 20 --hold 2s
		sc := bench.ShapedScenario(20, 0, 2*time.Second, 0)
		sc.MaxVUs = 200
		c, err := bench.Compare(runCtx(t), quick(sc, 3*time.Second), arm)
		if err != nil {
			t.Fatal(err)
		}
		var table strings.Builder
		bench.WriteCompareTable(&table, c)
		t.Logf("compare:\n%s", table.String())
		if !strings.Contains(table.String(), "| claimflow | peer (outbox) | claimflow ÷ peer |") {
			t.Error("compare printed no comparison table")
		}
		j := asJSON(t, c)
		for _, name := range []string{"claimflow", "peer"} {
			a, _ := j[name].(map[string]any)
			checkArm(t, name, a, 40)
		}
		// The stage table is claimflow's: the peer has no such metrics.
		if cf, _ := j["claimflow"].(map[string]any); cf["stage_table"] == nil {
			t.Error("compare: the claimflow arm has no stage_table")
		}
		if pe, _ := j["peer"].(map[string]any); pe["stage_table"] != nil {
			t.Errorf("compare: the peer arm has a stage_table: %v", pe["stage_table"])
		}
		ratio, _ := j["ratio"].(map[string]any)
		for _, k := range []string{"throughput", "p50", "p95"} {
			if v, ok := ratio[k].(float64); !ok || v <= 0 {
				t.Errorf("ratio.%s = %v", k, ratio[k])
			}
		}
		checkPlot(t, filepath.Join(out, "compare.png"), c.Claimflow, c.Peer)
	})

	t.Run("capacity", func(t *testing.T) {
		// claimflow-bench capacity --quick: 25/s, +25/s every 4 s up to
		// 100/s, judged over 2 s windows, both arms.
		o := bench.QuickCapacity()
		o.DB, o.PeerDB, o.Kafka, o.Progress, o.Log = pool, peerPool, s.Config.Kafka("claimflow-bench"), testWriter{t}, log
		c, err := bench.RunCapacity(runCtx(t), o, arm)
		if err != nil {
			t.Fatal(err)
		}
		var table strings.Builder
		bench.WriteCapacityTable(&table, c)
		t.Logf("capacity:\n%s", table.String())
		j := asJSON(t, c)
		held := map[string]float64{}
		for _, name := range []string{"claimflow", "peer"} {
			a, ok := j[name].(map[string]any)
			if !ok {
				t.Fatalf("no %q arm in %v", name, j)
			}
			m, ok := a["max_held_rps"].(float64)
			if !ok {
				t.Fatalf("%s: max_held_rps is %v", name, a["max_held_rps"])
			}
			held[name] = m
			steps, _ := a["steps"].([]any)
			if len(steps) == 0 {
				t.Fatalf("%s: no steps", name)
			}
			// The claimed maximum is the rate of the last step held, and
			// every step up to it held with all its windows judged.
			var lastHeld float64
			for i, raw := range steps {
				st := raw.(map[string]any)
				wins, _ := st["windows"].([]any)
				if len(wins) != 2 {
					t.Errorf("%s step %d: %d windows, want 2 (4 s steps, 2 s windows)", name, i, len(wins))
				}
				if st["held"] == true {
					lastHeld = st["rate_rps"].(float64)
				} else if i != len(steps)-1 {
					t.Errorf("%s: step %d broke but the run went on", name, i)
				}
				if n, _ := st["arrivals"].(float64); n < 0.9*st["rate_rps"].(float64)*4 {
					t.Errorf("%s step %d: %v arrivals at %v/s over 4 s", name, i, st["arrivals"], st["rate_rps"])
				}
			}
			if m != lastHeld {
				t.Errorf("%s: max_held_rps %v, but the last held step is %v", name, m, lastHeld)
			}
			checkWindowStages(t, name, steps)
		}
		want := 0.0
		if held["peer"] > 0 {
			want = math.Round(held["claimflow"]/held["peer"]*1000) / 1000
		}
		if j["ratio"] != want {
			t.Errorf("ratio %v, want claimflow ÷ peer = %v", j["ratio"], want)
		}
		checkPlot(t, filepath.Join(out, "capacity.png"), c.AsResults()...)
	})

	for _, mode := range []struct {
		name            string
		update, started bool
	}{{"start", false, false}, {"update-with-start", true, false}, {"update-started-run", true, true}} {
		t.Run("floor/"+mode.name, func(t *testing.T) {
			tc, err := services.DialTemporal(runCtx(t), s.Config, log, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tc.Close()
			// claimflow-bench floor --quick [--update]: 100 workflows, 16 at once, 16 warm-up.
			res, err := bench.Floor(runCtx(t), bench.FloorOptions{
				Client: tc, Workflows: 100, Concurrency: 16, Warmup: 16, Update: mode.update, Started: mode.started, Progress: testWriter{t},
				WorkerOptions: worker.SDKOptions(worker.Options{MaxConcurrentActivities: s.Config.MaxActivities}),
			})
			if err != nil {
				t.Fatal(err)
			}
			f := asJSON(t, res)
			if f["completed"] != float64(100) || f["errors"] != float64(0) || f["mode"] != mode.name {
				t.Errorf("floor: %v", f)
			}
			if v, _ := f["wf_per_s"].(float64); v <= 0 {
				t.Errorf("floor wf_per_s = %v", f["wf_per_s"])
			}
			// Where the whole run is timed, the workers were busy timing
			// it: the counted latencies fill most of concurrency × wall
			// (a timer read before the run ended fills a fraction).
			if !mode.started {
				busy := res.Latency.Avg * float64(res.Completed) / 1000
				if whole := float64(res.Concurrency) * res.DurationS; busy < 0.5*whole {
					t.Errorf("floor timed %.2f s of %d workers × %.2f s = %.2f s: it does not time the whole run", busy, res.Concurrency, res.DurationS, whole)
				}
			}
			// Each counted workflow ran on the server: its run is there,
			// closed as completed (the update workflow ends once answered).
			id := fmt.Sprintf("bench-floor-%s-%d", res.RunID, 99)
			d, err := tc.DescribeWorkflow(runCtx(t), id, "")
			if err != nil {
				t.Fatalf("describe %s: %v", id, err)
			}
			if st := d.RawResponse.GetWorkflowExecutionInfo().GetStatus(); st != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
				t.Errorf("%s is %v, want completed", id, st)
			}
			// It ran on this floor run's own task queue, which no other
			// floor run's worker polled.
			if tq := d.RawResponse.GetExecutionConfig().GetTaskQueue().GetName(); tq != res.TaskQueue || !strings.HasSuffix(tq, res.RunID) {
				t.Errorf("%s ran on task queue %q, want %q (ending in its run ID %s)", id, tq, res.TaskQueue, res.RunID)
			}
			// The update modes answered an update; the start mode had none.
			// A started run had finished a workflow task before its update
			// came; one started by Update-With-Start accepts it in its first.
			updates, tasksBeforeUpdate := 0, 0
			it := tc.GetWorkflowHistory(runCtx(t), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
			for it.HasNext() {
				ev, err := it.Next()
				if err != nil {
					t.Fatal(err)
				}
				switch ev.GetEventType() {
				case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
					updates++
				case enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
					if updates == 0 {
						tasksBeforeUpdate++
					}
				}
			}
			if want := map[bool]int{false: 0, true: 1}[mode.update]; updates != want {
				t.Errorf("%s answered %d updates, want %d", id, updates, want)
			}
			if mode.update {
				// Started: the waiting task, then the one that answered.
				if want := map[bool]int{false: 1, true: 2}[mode.started]; tasksBeforeUpdate != want {
					t.Errorf("%s completed %d workflow tasks up to its update's answer, want %d", id, tasksBeforeUpdate, want)
				}
			}
		})
	}

	t.Run("floor/update-long-lived-run", func(t *testing.T) {
		tc, err := services.DialTemporal(runCtx(t), s.Config, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		// claimflow-bench floor --quick --long-lived: 100 updates from 16
		// callers to 4 runs that continue as new every 30 updates.
		const runs, perRun, warmup, updates = 4, 30, 16, 100
		res, err := bench.Floor(runCtx(t), bench.FloorOptions{
			Client: tc, Workflows: updates, Concurrency: 16, Warmup: warmup, LongLived: true, Runs: runs, UpdatesPerRun: perRun, Progress: testWriter{t},
			WorkerOptions: worker.SDKOptions(worker.Options{MaxConcurrentActivities: s.Config.MaxActivities}),
		})
		if err != nil {
			t.Fatal(err)
		}
		f := asJSON(t, res)
		if f["completed"] != float64(updates) || f["errors"] != float64(0) || f["mode"] != "update-long-lived-run" ||
			f["runs"] != float64(runs) || f["updates_per_run"] != float64(perRun) {
			t.Errorf("floor: %v", f)
		}
		if v, _ := f["wf_per_s"].(float64); v <= 0 || res.Latency.P50 <= 0 {
			t.Errorf("floor wf_per_s = %v, p50 %v", f["wf_per_s"], res.Latency.P50)
		}
		// Walk each run's chain back from its latest run: the latest was
		// stopped and completed, every earlier one continued as new, and
		// across the chains each update sent (warm-up included) was
		// answered exactly once: none lost at a continue-as-new, none twice.
		answered, chains := 0, 0
		for k := range runs {
			id := fmt.Sprintf("bench-floor-%s-long-lived-%d", res.RunID, k)
			chain := runChain(t, tc, id)
			chains += len(chain)
			for i, h := range chain {
				want := enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
				if i == 0 { // the latest
					want = enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
				}
				if last := h.Events[len(h.Events)-1].GetEventType(); last != want {
					t.Errorf("%s: run %d of the chain (latest first) ended with %v, want %v", id, i, last, want)
				}
				if tq := h.Events[0].GetWorkflowExecutionStartedEventAttributes().GetTaskQueue().GetName(); tq != res.TaskQueue {
					t.Errorf("%s ran on task queue %q, want %q", id, tq, res.TaskQueue)
				}
				answered += countEvents(h, enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED)[0]
			}
		}
		if answered != warmup+updates {
			t.Errorf("the long-lived runs answered %d updates, want the %d sent", answered, warmup+updates)
		}
		// 116 updates over 4 runs at most 30 a run: at least one continued as new.
		if chains <= runs {
			t.Errorf("%d runs in %d chains: none continued as new after %d updates", chains, runs, perRun)
		}
	})
}

// summarize logs and returns the summary claimflow-bench prints for r.
func summarize(t *testing.T, r *bench.Result) string {
	t.Helper()
	var b strings.Builder
	bench.WriteSummary(&b, r)
	t.Logf("%s:\n%s", r.Name, b.String())
	return b.String()
}

// asJSON is v as claimflow-bench's --json writes it, read back generically
// so the test checks the keys a reader of the file sees.
func asJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// checkStageTable holds a burst's stage table to the stages issue 17 reads
// most: the batcher's wait, the batch's update, ReserveSeats and
// PublishBatch were all observed during the hold, and the CPU table has a
// row for the claimflow process (here the test process, which also runs
// the bench), so the table cannot silently go empty.
func checkStageTable(t *testing.T, arm map[string]any) {
	t.Helper()
	st, ok := arm["stage_table"].(map[string]any)
	if !ok {
		t.Fatalf("no stage_table (no_stage_table: %v)", arm["no_stage_table"])
	}
	if note, _ := st["note"].(string); note != "" {
		t.Fatalf("stage table without stages: %s", note)
	}
	if w, _ := st["window_s"].(float64); w <= 0 {
		t.Errorf("stage table window %v", st["window_s"])
	}
	counts := map[string]float64{}
	stages, _ := st["stages"].([]any)
	for _, raw := range stages {
		row, _ := raw.(map[string]any)
		name, _ := row["name"].(string)
		counts[name], _ = row["count"].(float64)
		if row["metric"] == "" || row["count"] == nil {
			t.Errorf("stage row %v lacks its metric or count", row)
		}
		if _, isMS := row["p50_ms"]; !isMS && row["unit"] != "claims" {
			t.Errorf("stage row %v has no p50_ms", row)
		}
	}
	for _, name := range []string{"batcher wait", "batch update round trip", "ReserveSeats (local activity)",
		"PublishBatch (local activity)", "client-observed (bench samples)"} {
		if counts[name] <= 0 {
			t.Errorf("stage %q counted nothing during the hold (stages %v)", name, counts)
		}
	}
	cpu, _ := st["cpu"].([]any)
	var claimflowRow bool
	for _, raw := range cpu {
		row, _ := raw.(map[string]any)
		process, _ := row["process"].(string)
		if s, _ := row["cpu_s"].(float64); strings.HasPrefix(process, "claimflow") && s > 0 {
			claimflowRow = true
		}
	}
	if !claimflowRow {
		t.Errorf("no CPU row for the claimflow process: %v", cpu)
	}
	if _, ok := st["machine_busy_share"].(float64); !ok {
		t.Errorf("machine_busy_share = %v", st["machine_busy_share"])
	}
	checkIOStall(t, "the hold", st)
}

// checkIOStall fails when a stage table lacks the disk's stall share on a
// kernel that reports it (/proc/pressure/io).
func checkIOStall(t *testing.T, where string, st map[string]any) {
	t.Helper()
	if _, err := os.Stat("/proc/pressure/io"); err != nil {
		return
	}
	if v, ok := st["machine_io_stall_share"].(float64); !ok || v < 0 || v > 1 {
		t.Errorf("%s: machine_io_stall_share = %v, want a share", where, st["machine_io_stall_share"])
	}
}

// checkWindowStages checks that every judged window of a capacity arm
// says where its time went: claimflow's from the API's histograms (every
// window decided claims, so its batcher wait and its runs counted some),
// the peer's without metrics, and both with the bench's CPU.
func checkWindowStages(t *testing.T, arm string, steps []any) {
	t.Helper()
	for i, raw := range steps {
		wins, _ := raw.(map[string]any)["windows"].([]any)
		for k, rw := range wins {
			st, ok := rw.(map[string]any)["stages"].(map[string]any)
			if !ok {
				t.Errorf("%s step %d window %d: no stages", arm, i, k)
				continue
			}
			counts := map[string]float64{}
			stages, _ := st["stages"].([]any)
			for _, rs := range stages {
				r := rs.(map[string]any)
				counts[r["name"].(string)], _ = r["count"].(float64)
			}
			switch arm {
			case "claimflow":
				for _, name := range []string{"batcher wait", "batch update round trip", "ReserveSeats (local activity)"} {
					if counts[name] == 0 {
						t.Errorf("%s step %d window %d: %q counted nothing (note %v)", arm, i, k, name, st["note"])
					}
				}
			default:
				if len(stages) != 0 || st["note"] != "the outbox peer serves no metrics" {
					t.Errorf("%s step %d window %d: stages %v, note %v", arm, i, k, stages, st["note"])
				}
			}
			var bench bool
			cpu, _ := st["cpu"].([]any)
			for _, rc := range cpu {
				if p, _ := rc.(map[string]any)["process"].(string); strings.HasPrefix(p, "bench") {
					bench = true
				}
			}
			if !bench {
				t.Errorf("%s step %d window %d: no CPU row of the bench: %v", arm, i, k, cpu)
			}
			if _, ok := st["machine_steal_share"].(float64); !ok {
				t.Errorf("%s step %d window %d: machine_steal_share = %v", arm, i, k, st["machine_steal_share"])
			}
			checkIOStall(t, fmt.Sprintf("%s step %d window %d", arm, i, k), st)
		}
	}
}

// checkPlot draws results as claimflow-bench's --plot does and checks the
// file is a PNG of a useful size.
func checkPlot(t *testing.T, path string, results ...*bench.Result) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := bench.WritePlot(f, results...); err != nil {
		f.Close()
		t.Fatalf("plot: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	checkPNG(t, path)
}

// checkArm checks one arm's JSON: every key the issue lists, a clean audit,
// and answers that add up. scheduled is the number of iterations.
func checkArm(t *testing.T, name string, arm map[string]any, scheduled int) {
	t.Helper()
	obj := func(m map[string]any, key string) map[string]any {
		v, ok := m[key].(map[string]any)
		if !ok {
			t.Fatalf("%s: %q is %v, want an object", name, key, m[key])
		}
		return v
	}
	num := func(m map[string]any, key string) float64 {
		v, ok := m[key].(float64)
		if !ok {
			t.Fatalf("%s: %q is %v, want a number", name, key, m[key])
		}
		return v
	}
	for _, k := range []string{"requests", "achieved_rps", "confirmed_per_s", "failure_rate"} {
		num(arm, k)
	}
	if _, ok := arm["rss_mb"]; !ok {
		t.Errorf("%s: no rss_mb key", name)
	}
	// A loaded CI machine may make claimflow answer 503 + Retry-After
	// (Temporal slower than the API's decision timeout): that is a
	// measurement. A connection error or an unexpected status is a bug.
	failures := obj(arm, "failures")
	num(failures, "5xx")
	num(failures, "timeout")
	for _, k := range []string{"conn", "other"} {
		if n := num(failures, k); n != 0 {
			t.Errorf("%s: %v failures of kind %s", name, n, k)
		}
	}
	lat := obj(arm, "latency_ms")
	for _, k := range []string{"avg", "p50", "p90", "p95", "p99", "max"} {
		num(lat, k)
	}
	if num(lat, "p50") > num(lat, "p95") || num(lat, "p95") > num(lat, "max") {
		t.Errorf("%s: latency percentiles out of order: %v", name, lat)
	}
	stages := obj(arm, "stages_ms")
	for _, s := range []string{"requested_to_recorded", "recorded_to_published", "requested_to_confirmed"} {
		st := obj(stages, s)
		for _, k := range []string{"avg", "p50", "p95"} {
			if num(st, k) < 0 {
				t.Errorf("%s: %s.%s is negative", name, s, k)
			}
		}
	}
	a := obj(arm, "audit")
	for _, k := range []string{"lost", "duplicate_events", "missing_events", "oversold_courses"} {
		if n := num(a, k); n != 0 {
			t.Errorf("%s: audit %s = %v, want 0 (audit %v)", name, k, n, a)
		}
	}
	if a["drained"] != true {
		t.Errorf("%s: the run did not drain: %v", name, a)
	}
	status := obj(arm, "status")
	var answered float64
	for _, code := range []string{"201", "202", "409", "503", "timeout"} {
		n, _ := status[code].(float64)
		answered += n
	}
	if n, _ := status["201"].(float64); n < 1 {
		t.Errorf("%s: no enrollment accepted: %v", name, status)
	}
	if requests := num(arm, "requests"); answered != requests {
		t.Errorf("%s: %v requests but only %v answered 201/202/409/503/timeout: %v", name, requests, answered, status)
	}
	it := obj(arm, "iterations")
	if num(it, "scheduled") != float64(scheduled) || num(it, "started")+num(it, "dropped") != float64(scheduled) {
		t.Errorf("%s: iterations %v, want %d scheduled", name, it, scheduled)
	}
	if num(a, "confirmed") != num(a, "enrollments") || num(a, "events") != num(a, "confirmed") ||
		num(a, "accepted") > num(a, "confirmed") {
		t.Errorf("%s: audit %v: every enrollment should be confirmed with one event", name, a)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	if img.Bounds().Dx() < 100 || img.Bounds().Dy() < 100 {
		t.Fatalf("%s is only %v", path, img.Bounds())
	}
}

// checkGrowth wants a row per second of the run with its answers, its
// stages, the data dir's and Postgres' sizes and the heap.
func checkGrowth(t *testing.T, g *bench.Growth) {
	t.Helper()
	if g == nil || len(g.Rows) < 4 {
		t.Fatalf("growth table: %+v, want a row per second of a 5 s run", g)
	}
	var answers int
	for _, r := range g.Rows {
		answers += r.Answers
		if r.TemporalDB == nil || r.KafkaDir == nil || r.PGTables == nil || r.PGIndexes == nil || r.PGCheckpoints == nil || r.PGAutovacuums == nil {
			t.Errorf("growth row at %gs lacks a size or a Postgres counter: %+v", r.FromS, r)
		}
		if r.HeapMB == nil || *r.HeapMB <= 0 || r.GCCycles == nil || r.MachineBusyShare == nil {
			t.Errorf("growth row at %gs lacks the heap, GC or the machine: %+v", r.FromS, r)
		}
		if len(r.Stages) == 0 {
			t.Errorf("growth row at %gs has no stages", r.FromS)
		}
	}
	if answers < 150 {
		t.Errorf("the growth rows hold %d answers of a 250-claim run", answers)
	}
	if len(g.Per30s) != 1 || g.Per30s[0].Answers < answers || g.Per30s[0].P95MS <= 0 {
		t.Errorf("the client's 30 s windows of a 5 s run: %+v, want one with the rows' %d answers", g.Per30s, answers)
	}
	if first, last := g.Rows[0], g.Rows[len(g.Rows)-1]; *last.PGTables <= *first.PGTables && *last.TemporalDB <= *first.TemporalDB {
		t.Errorf("neither Postgres' tables nor the Temporal DB grew over the run: %d → %d, %d → %d", *first.PGTables, *last.PGTables, *first.TemporalDB, *last.TemporalDB)
	}
}
