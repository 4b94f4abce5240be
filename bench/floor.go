package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// FloorTaskQueue prefixes the task queue each floor run polls alone, away
// from claimflow's own queue so the two never share pollers. Each run's
// queue is its own (FloorResult.TaskQueue): a worker of an earlier run that
// is still stopping, or a task the server matched to its last poll, never
// stands between this run's workflows and this run's worker.
const FloorTaskQueue = "claimflow-bench-floor"

// floorTaskQueue names the task queue of the floor run runID.
func floorTaskQueue(runID string) string { return FloorTaskQueue + "-" + runID }

// floorWorkflowName is the empty workflow's registered name.
const floorWorkflowName = "BenchEmpty"

// floorUpdateWorkflowName is the empty workflow that answers one update.
const floorUpdateWorkflowName = "BenchEmptyUpdate"

// floorUpdateName is the update the empty update workflow answers at once.
const floorUpdateName = "decide"

// floorLongLivedWorkflowName is the run that stays and answers updates.
const floorLongLivedWorkflowName = "BenchLongLived"

// floorStopSignal ends a long-lived run once the floor is done with it.
const floorStopSignal = "stop"

// DefaultFloorUpdatesPerRun is how many updates a long-lived run answers
// before it continues as new: below the 2,000 distinct updates the server
// lets one run take (history.maxTotalUpdates), with room for the
// updates that arrive while it closes.
const DefaultFloorUpdatesPerRun = 1000

// emptyWorkflow does nothing: one workflow task, then it completes. Its rate
// is what the Temporal server and one worker can do on this machine before
// any activity, update or database write.
func emptyWorkflow(workflow.Context) error { return nil }

// emptyUpdateWorkflow is claimflow's shape with nothing inside: started by
// Update-With-Start, it answers the update at once, in its first workflow
// task, and completes. The caller's wait for the update's answer is the
// floor of a claim's answer on this server: no activity, no database, no
// broker.
func emptyUpdateWorkflow(ctx workflow.Context) error {
	answered := false
	if err := workflow.SetUpdateHandler(ctx, floorUpdateName, func(workflow.Context) error {
		answered = true
		return nil
	}); err != nil {
		return err
	}
	return workflow.Await(ctx, func() bool { return answered })
}

// longLivedWorkflow is a run that stays: it answers every update sent to it
// at once, as many callers as send them, and continues as new after perRun
// of them; the stop signal ends it. The time to an update's answer is the
// floor of a decision recorded in a run that is already there for it, with
// no start, no first workflow task and no close on the way.
func longLivedWorkflow(ctx workflow.Context, perRun int) error {
	answered := 0
	if err := workflow.SetUpdateHandler(ctx, floorUpdateName, func(workflow.Context) error {
		answered++
		return nil
	}); err != nil {
		return err
	}
	stopped := false
	stop := workflow.GetSignalChannel(ctx, floorStopSignal)
	workflow.Go(ctx, func(ctx workflow.Context) { stop.Receive(ctx, nil); stopped = true })
	if err := workflow.Await(ctx, func() bool { return stopped || answered >= perRun }); err != nil {
		return err
	}
	// Updates accepted in this workflow task finish before the run closes;
	// those that reach it while it closes are aborted by the server and
	// retried by their callers on the next run.
	if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
		return err
	}
	if stopped {
		return nil
	}
	return workflow.NewContinueAsNewError(ctx, floorLongLivedWorkflowName, perRun)
}

// FloorOptions configures Floor.
type FloorOptions struct {
	Client      client.Client
	Workflows   int
	Concurrency int
	// Warmup workflows run first and are not counted: the worker's pollers
	// and the task queue come up during them.
	Warmup int
	// Update starts each workflow with Update-With-Start and waits for the
	// update's answer (claimflow's shape) instead of starting it and
	// waiting for its result.
	Update bool
	// Started, with Update, starts each workflow first (untimed) and waits
	// until its first workflow task is done, then times only the update
	// sent to the waiting run: the floor of a decision recorded in a run
	// that already exists, with no start on the way.
	Started bool
	// LongLived starts Runs runs that stay (each continues as new after
	// UpdatesPerRun updates) and times updates sent to them: caller k of
	// Concurrency sends its updates to run k mod Runs, one at a time.
	// Workflows and Warmup then count updates.
	LongLived     bool
	Runs          int
	UpdatesPerRun int
	// WorkerOptions are the worker settings of the worker started on
	// this run's task queue (claimflow's own, for a like-for-like floor).
	WorkerOptions sdkworker.Options
	Progress      io.Writer
}

// FloorResult is the floor's figures.
type FloorResult struct {
	RunID       string         `json:"run_id"`
	TaskQueue   string         `json:"task_queue"`
	Warmup      int            `json:"warmup"`
	Workflows   int            `json:"workflows"`
	Concurrency int            `json:"concurrency"`
	Mode        string         `json:"mode"`
	Completed   int            `json:"completed"`
	Errors      int            `json:"errors"`
	DurationS   float64        `json:"duration_s"`
	WFPerS      float64        `json:"wf_per_s"`
	Latency     LatencySummary `json:"latency_ms"`
	FirstError  string         `json:"first_error,omitempty"`
	// Runs and UpdatesPerRun describe the long-lived mode's runs.
	Runs          int `json:"runs,omitempty"`
	UpdatesPerRun int `json:"updates_per_run,omitempty"`
}

// floor modes, as FloorResult.Mode names them.
const (
	floorModeStart         = "start"
	floorModeUpdateStart   = "update-with-start"
	floorModeUpdateStarted = "update-started-run"
	floorModeLongLived     = "update-long-lived-run"
)

func (o FloorOptions) mode() string {
	switch {
	case o.LongLived:
		return floorModeLongLived
	case o.Update && o.Started:
		return floorModeUpdateStarted
	case o.Update:
		return floorModeUpdateStart
	}
	return floorModeStart
}

// Floor starts a worker for the empty workflow, then runs Workflows of them
// (start and wait for completion, or with Update Update-With-Start and wait
// for the update's answer) on Concurrency goroutines, as fast as the server
// lets it. With LongLived it sends Workflows updates to runs that stay.
func Floor(ctx context.Context, o FloorOptions) (res FloorResult, err error) {
	if o.Workflows <= 0 || o.Concurrency <= 0 {
		return FloorResult{}, fmt.Errorf("workflows and concurrency must be positive")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Started && !o.Update {
		return FloorResult{}, fmt.Errorf("started runs are timed by their update: Started needs Update")
	}
	if o.LongLived && o.Started {
		return FloorResult{}, fmt.Errorf("long-lived runs are started once, not per update: LongLived excludes Started")
	}
	res = FloorResult{RunID: newRunID(), Warmup: o.Warmup, Workflows: o.Workflows, Concurrency: o.Concurrency, Mode: o.mode()}
	res.TaskQueue = floorTaskQueue(res.RunID)
	w := sdkworker.New(o.Client, res.TaskQueue, o.WorkerOptions)
	w.RegisterWorkflowWithOptions(emptyWorkflow, workflow.RegisterOptions{Name: floorWorkflowName})
	w.RegisterWorkflowWithOptions(emptyUpdateWorkflow, workflow.RegisterOptions{Name: floorUpdateWorkflowName})
	w.RegisterWorkflowWithOptions(longLivedWorkflow, workflow.RegisterOptions{Name: floorLongLivedWorkflowName})
	if err := w.Start(); err != nil {
		return res, fmt.Errorf("start floor worker: %w", err)
	}
	defer w.Stop()
	op := func(prefix string) floorOp {
		return func(ctx context.Context, i int64, _ int) (time.Duration, error) {
			return runOne(ctx, o.Client, res.Mode, client.StartWorkflowOptions{
				ID:                  fmt.Sprintf("bench-floor-%s-%d", prefix, i),
				TaskQueue:           res.TaskQueue,
				WorkflowRunTimeout:  time.Minute,
				WorkflowTaskTimeout: 10 * time.Second,
			})
		}
	}
	if o.LongLived {
		if o.Runs <= 0 {
			o.Runs = 1
		}
		if o.UpdatesPerRun <= 0 {
			o.UpdatesPerRun = DefaultFloorUpdatesPerRun
		}
		res.Runs, res.UpdatesPerRun = o.Runs, o.UpdatesPerRun
		runs, startErr := startLongLived(ctx, o.Client, res.TaskQueue, res.RunID, o.Runs, o.UpdatesPerRun)
		defer func() {
			// However the floor ended, the runs it started end with it.
			if stopErr := stopLongLived(ctx, o.Client, runs); stopErr != nil && err == nil {
				err = stopErr
			}
		}()
		if startErr != nil {
			return res, startErr
		}
		op = func(string) floorOp {
			return func(ctx context.Context, _ int64, caller int) (time.Duration, error) {
				return updateLongLived(ctx, o.Client, runs[caller%len(runs)])
			}
		}
	}
	if err := runEmpty(ctx, o.Warmup, o.Concurrency, op(res.RunID+"-warmup"), nil); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}

	var (
		done     atomic.Int64
		mu       sync.Mutex
		lat      = make([]float64, 0, o.Workflows)
		firstErr error
	)
	stopProgress := make(chan struct{})
	began := time.Now()
	go func() {
		t := time.NewTicker(3 * time.Second)
		defer t.Stop()
		prev, prevAt := int64(0), began
		for {
			select {
			case <-stopProgress:
				return
			case now := <-t.C:
				d := done.Load()
				fmt.Fprintf(o.Progress, "floor %5.0fs  completed %d/%d  %.1f wf/s\n", now.Sub(began).Seconds(), d, o.Workflows,
					float64(d-prev)/now.Sub(prevAt).Seconds())
				prev, prevAt = d, now
			}
		}
	}()
	_ = runEmpty(ctx, o.Workflows, o.Concurrency, op(res.RunID), func(elapsed time.Duration, err error) {
		mu.Lock()
		if err != nil {
			res.Errors++
			if firstErr == nil {
				firstErr = err
			}
		} else {
			res.Completed++
			lat = append(lat, ms(elapsed))
		}
		mu.Unlock()
		done.Add(1)
	})
	close(stopProgress)
	elapsed := time.Since(began)
	res.DurationS = round3(elapsed.Seconds())
	res.WFPerS = round3(float64(res.Completed) / elapsed.Seconds())
	res.Latency = Summarize(lat)
	if firstErr != nil {
		res.FirstError = firstErr.Error()
	}
	return res, ctx.Err()
}

// floorOp is one timed operation of a floor: the i-th of the run, by
// caller (0 … concurrency-1).
type floorOp func(ctx context.Context, i int64, caller int) (time.Duration, error)

// runEmpty runs op n times on concurrency goroutines and returns the first
// error; each completion is passed to done when it is not nil.
func runEmpty(ctx context.Context, n, concurrency int, op floorOp, done func(time.Duration, error)) error {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for caller := range concurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				took, err := op(ctx, i, caller)
				if done != nil {
					done(took, err)
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// startLongLived starts n long-lived runs, waits until each finished its
// first workflow task and waits for updates, and returns their workflow IDs
// (each run's later runs follow it under the same ID).
func startLongLived(ctx context.Context, c client.Client, taskQueue, prefix string, n, perRun int) ([]string, error) {
	var runs []string
	for k := range n {
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
			ID:        fmt.Sprintf("bench-floor-%s-long-lived-%d", prefix, k),
			TaskQueue: taskQueue,
			// A safety net only: the floor stops its runs when it is done.
			WorkflowExecutionTimeout: time.Hour,
			WorkflowTaskTimeout:      10 * time.Second,
		}, floorLongLivedWorkflowName, perRun)
		if err != nil {
			return runs, fmt.Errorf("start long-lived run %d: %w", k, err)
		}
		runs = append(runs, run.GetID())
		if err := awaitFirstTask(ctx, c, run.GetID(), run.GetRunID()); err != nil {
			return runs, err
		}
	}
	return runs, nil
}

// updateLongLived sends one update to the latest run of id and waits for its
// answer; an update that reached a run as it continued as new is retried by
// the client on the next.
func updateLongLived(ctx context.Context, c client.Client, id string) (time.Duration, error) {
	start := time.Now()
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: id, UpdateName: floorUpdateName, WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err == nil {
		err = h.Get(ctx, nil)
	}
	if err != nil {
		return 0, fmt.Errorf("update %s: %w", id, err)
	}
	return time.Since(start), nil
}

// stopLongLived signals each run to end and waits until its latest run has.
func stopLongLived(ctx context.Context, c client.Client, ids []string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, id := range ids {
		if err := c.SignalWorkflow(ctx, id, "", floorStopSignal, nil); err != nil {
			return fmt.Errorf("stop long-lived run %s: %w", id, err)
		}
		if err := c.GetWorkflow(ctx, id, "").Get(ctx, nil); err != nil {
			return fmt.Errorf("long-lived run %s: %w; its history: %s", id, err, historyTrail(ctx, c, id, ""))
		}
	}
	return nil
}

// runOne runs one empty workflow and returns the time its mode counts:
// started and awaited; started by Update-With-Start and awaited until the
// update is answered; or started and left to wait for its update (not
// counted), then sent the update and awaited until it is answered.
func runOne(ctx context.Context, c client.Client, mode string, opts client.StartWorkflowOptions) (time.Duration, error) {
	start := time.Now()
	switch mode {
	case floorModeStart:
		run, err := c.ExecuteWorkflow(ctx, opts, floorWorkflowName)
		if err != nil {
			return 0, err
		}
		err = run.Get(ctx, nil)
		return time.Since(start), err
	case floorModeUpdateStarted:
		run, err := c.ExecuteWorkflow(ctx, opts, floorUpdateWorkflowName)
		if err != nil {
			return 0, err
		}
		if err := awaitFirstTask(ctx, c, run.GetID(), run.GetRunID()); err != nil {
			return 0, err
		}
		start = time.Now()
		h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
			WorkflowID: run.GetID(), RunID: run.GetRunID(),
			UpdateName: floorUpdateName, WaitForStage: client.WorkflowUpdateStageCompleted,
		})
		if err == nil {
			err = h.Get(ctx, nil)
		}
		if err != nil {
			// Say what the run went through: an update that never got an
			// answer is the server's or the worker's story, told by the
			// run's events.
			return 0, fmt.Errorf("update %s: %w; its history: %s", run.GetID(), err, historyTrail(ctx, c, run.GetID(), run.GetRunID()))
		}
		return time.Since(start), nil
	}
	opts.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING
	h, err := c.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: c.NewWithStartWorkflowOperation(opts, floorUpdateWorkflowName),
		UpdateOptions: client.UpdateWorkflowOptions{
			UpdateName:   floorUpdateName,
			WaitForStage: client.WorkflowUpdateStageCompleted,
		},
	})
	if err != nil {
		return 0, err
	}
	err = h.Get(ctx, nil)
	return time.Since(start), err
}

// awaitFirstTask long-polls the run's history until its first workflow
// task completed: the run has registered its update handler and waits.
func awaitFirstTask(ctx context.Context, c client.Client, id, runID string) error {
	it := c.GetWorkflowHistory(ctx, id, runID, true, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var seen []enumspb.EventType
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return fmt.Errorf("wait for the first workflow task of %s: %w; its history so far: %s", id, err, trail(seen))
		}
		if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			return nil
		}
		seen = append(seen, ev.GetEventType())
	}
	return fmt.Errorf("run %s closed before its first workflow task completed; its history: %s", id, trail(seen))
}

// historyTrail reads a run's events, for an error message; it gives up
// after a few seconds.
func historyTrail(ctx context.Context, c client.Client, id, runID string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var seen []enumspb.EventType
	it := c.GetWorkflowHistory(ctx, id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return trail(seen) + " (then: " + err.Error() + ")"
		}
		seen = append(seen, ev.GetEventType())
	}
	return trail(seen)
}

// trail names event types in order, a run of one type once with its count:
// "WorkflowExecutionStarted, WorkflowTaskScheduled, WorkflowTaskTimedOut ×3".
func trail(types []enumspb.EventType) string {
	if len(types) == 0 {
		return "(no events)"
	}
	var b strings.Builder
	for i := 0; i < len(types); {
		j := i
		for j < len(types) && types[j] == types[i] {
			j++
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(types[i].String()) // the name the Web UI and the CLI show
		if j-i > 1 {
			fmt.Fprintf(&b, " ×%d", j-i)
		}
		i = j
	}
	return b.String()
}
