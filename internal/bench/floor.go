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
}

// floor modes, as FloorResult.Mode names them.
const (
	floorModeStart         = "start"
	floorModeUpdateStart   = "update-with-start"
	floorModeUpdateStarted = "update-started-run"
)

func (o FloorOptions) mode() string {
	switch {
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
// lets it.
func Floor(ctx context.Context, o FloorOptions) (FloorResult, error) {
	if o.Workflows <= 0 || o.Concurrency <= 0 {
		return FloorResult{}, fmt.Errorf("workflows and concurrency must be positive")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Started && !o.Update {
		return FloorResult{}, fmt.Errorf("started runs are timed by their update: Started needs Update")
	}
	res := FloorResult{RunID: newRunID(), Warmup: o.Warmup, Workflows: o.Workflows, Concurrency: o.Concurrency, Mode: o.mode()}
	res.TaskQueue = floorTaskQueue(res.RunID)
	w := sdkworker.New(o.Client, res.TaskQueue, o.WorkerOptions)
	w.RegisterWorkflowWithOptions(emptyWorkflow, workflow.RegisterOptions{Name: floorWorkflowName})
	w.RegisterWorkflowWithOptions(emptyUpdateWorkflow, workflow.RegisterOptions{Name: floorUpdateWorkflowName})
	if err := w.Start(); err != nil {
		return res, fmt.Errorf("start floor worker: %w", err)
	}
	defer w.Stop()
	if err := runEmpty(ctx, o.Client, res.TaskQueue, res.Mode, res.RunID+"-warmup", o.Warmup, o.Concurrency, nil); err != nil {
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
	_ = runEmpty(ctx, o.Client, res.TaskQueue, res.Mode, res.RunID, o.Workflows, o.Concurrency, func(elapsed time.Duration, err error) {
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

// runEmpty runs n empty workflows on concurrency goroutines and returns the
// first error; each completion is passed to done when it is not nil.
func runEmpty(ctx context.Context, c client.Client, taskQueue, mode, prefix string, n, concurrency int, done func(time.Duration, error)) error {
	var (
		next  atomic.Int64
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for range concurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				opts := client.StartWorkflowOptions{
					ID:                  fmt.Sprintf("bench-floor-%s-%d", prefix, i),
					TaskQueue:           taskQueue,
					WorkflowRunTimeout:  time.Minute,
					WorkflowTaskTimeout: 10 * time.Second,
				}
				took, err := runOne(ctx, c, mode, opts)
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
