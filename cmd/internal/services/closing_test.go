package services

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/internal/config"
)

// The server's refusal of an update whose run continues as new, as
// go.temporal.io/server (service/history/consts.ErrWorkflowClosing) builds it.
var closingErr = &serviceerror.ResourceExhausted{
	Cause:   enumspb.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW,
	Scope:   enumspb.RESOURCE_EXHAUSTED_SCOPE_NAMESPACE,
	Message: "workflow operation can not be applied because workflow is closing",
}

// The server's abort of an update whose workflow task failed, as
// go.temporal.io/server (service/history/workflow/update) builds it.
var notReady = serviceerror.NewWorkflowNotReady("Unable to perform workflow execution update due to unexpected workflow task failure.")

func TestWorkflowClosingKnowsTheServersRefusal(t *testing.T) {
	busy := &serviceerror.ResourceExhausted{Cause: enumspb.RESOURCE_EXHAUSTED_CAUSE_BUSY_WORKFLOW,
		Scope: enumspb.RESOURCE_EXHAUSTED_SCOPE_NAMESPACE, Message: "Workflow is busy."}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"an update's refusal", serviceerror.ToStatus(closingErr).Err(), true},
		{"Update-With-Start's: the start aborted, the update refused", serviceerror.ToStatus(serviceerror.NewMultiOperationExecution("Update-with-Start could not be executed.",
			[]error{serviceerror.NewMultiOperationAborted("Operation was aborted."), closingErr})).Err(), true},
		{"an update whose workflow task failed as its run closed", serviceerror.ToStatus(notReady).Err(), true},
		{"Update-With-Start's: the start aborted, the update's task failed", serviceerror.ToStatus(serviceerror.NewMultiOperationExecution("Update-with-Start could not be executed.",
			[]error{serviceerror.NewMultiOperationAborted("Operation was aborted."), notReady})).Err(), true},
		{"another failed precondition", serviceerror.ToStatus(serviceerror.NewFailedPrecondition("Namespace is not active.")).Err(), false},
		{"a busy workflow that is not closing", serviceerror.ToStatus(busy).Err(), false},
		{"a run that completed (not retryable)", serviceerror.ToStatus(serviceerror.NewNotFound("workflow update was aborted by closing workflow")).Err(), false},
		{"the server unavailable", serviceerror.ToStatus(serviceerror.NewUnavailable("workflow update was aborted")).Err(), false},
		{"not a gRPC error", errors.New("workflow is closing"), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := workflowClosing(tt.err); got != tt.want {
				t.Errorf("workflowClosing(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

const closingUpdate = "closing-test-update"

// closingTestWorkflow answers closingUpdate. Its first run spends its first
// workflow task in a local activity of a second and continues as new at its
// end: an update sent meanwhile is received while that task runs, and the
// server refuses it as the run continues as new. Later runs wait.
func closingTestWorkflow(ctx workflow.Context, first bool) error {
	if err := workflow.SetUpdateHandler(ctx, closingUpdate, func(workflow.Context) (string, error) {
		return workflow.GetInfo(ctx).WorkflowExecution.RunID, nil
	}); err != nil {
		return err
	}
	if first {
		lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
		if err := workflow.ExecuteLocalActivity(lctx, func(context.Context) error {
			time.Sleep(time.Second)
			return nil
		}).Get(ctx, nil); err != nil {
			return err
		}
		return workflow.NewContinueAsNewError(ctx, "closingTestWorkflow", false)
	}
	return workflow.Await(ctx, func() bool { return false })
}

// TestUpdateToAClosingRunIsRetriedAtOnce: against a real Temporal dev
// server, an update sent to a run while it continues as new lands on the
// next run, and it is claimflow's client that sent it there (the retry
// counter), not the SDK's retry 400 ms or more later. Both ways of sending
// an update: alone, and with Update-With-Start (the API's batches to a
// desk).
func TestUpdateToAClosingRunIsRetriedAtOnce(t *testing.T) {
	bin := os.Getenv("TEMPORAL_CLI")
	if bin == "" {
		if testing.Short() {
			t.Skip("needs the Temporal CLI's dev server; skipped with -short unless TEMPORAL_CLI is set")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		var err error
		if bin, err = devstack.TemporalCLI(ctx, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ports, err := devstack.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := devstack.StartTemporal(ctx, devstack.TemporalOptions{Binary: bin, Port: ports[0], UIPort: ports[1], Headless: true,
		LogFile: t.TempDir() + "/temporal.log"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })

	tel := NewTelemetry()
	c, err := DialTemporal(ctx, config.Config{TemporalAddress: srv.Addr, Namespace: srv.Namespace},
		slog.New(slog.NewTextHandler(io.Discard, nil)), tel)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const queue = "closing-test"
	w := sdkworker.New(c, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(closingTestWorkflow, workflow.RegisterOptions{Name: "closingTestWorkflow"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	for _, tt := range []struct {
		name, operation string
		send            func(ctx context.Context, id string) (client.WorkflowUpdateHandle, error)
	}{
		{"update", "UpdateWorkflowExecution", func(ctx context.Context, id string) (client.WorkflowUpdateHandle, error) {
			return c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: id, UpdateName: closingUpdate,
				WaitForStage: client.WorkflowUpdateStageCompleted})
		}},
		{"update-with-start", "ExecuteMultiOperation", func(ctx context.Context, id string) (client.WorkflowUpdateHandle, error) {
			return c.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
				StartWorkflowOperation: c.NewWithStartWorkflowOperation(client.StartWorkflowOptions{ID: id, TaskQueue: queue,
					WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING}, "closingTestWorkflow", true),
				UpdateOptions: client.UpdateWorkflowOptions{UpdateName: closingUpdate, WaitForStage: client.WorkflowUpdateStageCompleted},
			})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("closing-test-%s-%d", tt.name, time.Now().UnixNano())
			first, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue,
				WorkflowExecutionTimeout: time.Minute}, "closingTestWorkflow", true)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // into the first task's local activity
			before := testutil.ToFloat64(tel.ClosingRetries.WithLabelValues(tt.operation, "answered"))
			h, err := tt.send(ctx, id)
			if err != nil {
				t.Fatalf("send the update: %v", err)
			}
			var runID string
			if err := h.Get(ctx, &runID); err != nil {
				t.Fatalf("the update's answer: %v", err)
			}
			if runID == first.GetRunID() {
				t.Fatalf("the update was answered by the run that continued as new (%s): it was never refused", runID)
			}
			if got := testutil.ToFloat64(tel.ClosingRetries.WithLabelValues(tt.operation, "answered")) - before; got != 1 {
				t.Errorf("claimflow's client retried %v %s calls that got through, want 1 (to_sdk: %v)", got, tt.operation,
					testutil.ToFloat64(tel.ClosingRetries.WithLabelValues(tt.operation, "to_sdk")))
			}
			_ = c.TerminateWorkflow(ctx, id, "", "test done")
		})
	}
}
