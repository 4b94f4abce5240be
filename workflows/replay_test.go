package workflows_test

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// quiet keeps the replayer's expected panics out of the test output.
var quiet = log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// Histories in testdata/ were recorded from the real Temporal dev server
// (`temporal workflow show --output json`). Replaying them against the
// current code fails when a change would break runs already in flight.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("expected recorded histories in testdata/, found %v", files)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(workflows.Enrollment)
			r.RegisterWorkflow(workflows.Cancellation)
			r.RegisterWorkflow(workflows.EnrollmentBatch)
			r.RegisterWorkflow(workflows.IssueCoupon)
			r.RegisterWorkflow(workflows.UseCoupon)
			if err := r.ReplayWorkflowHistoryFromJSONFile(quiet, file); err != nil {
				t.Fatalf("replay %s: %v", file, err)
			}
		})
	}
}

// The replay test must be able to fail: an Enrollment that skips the seat
// reservation is a different program, and every recorded enrollment history
// must say so.
func TestReplayDetectsAChangedStepOrder(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "enrollment_*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no enrollment histories in testdata/: %v", err)
	}
	changed := func(ctx workflow.Context, in workflows.EnrollmentInput) (workflows.EnrollmentState, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10e9})
		err := workflow.ExecuteActivity(ctx, workflows.MarkConfirmed.Name, in.EnrollmentID).Get(ctx, nil)
		return workflows.EnrollmentState{}, err
	}
	for _, file := range files {
		r := worker.NewWorkflowReplayer()
		r.RegisterWorkflowWithOptions(changed, workflow.RegisterOptions{Name: "Enrollment"})
		r.RegisterWorkflowWithOptions(changed, workflow.RegisterOptions{Name: "EnrollmentBatch"})
		err := r.ReplayWorkflowHistoryFromJSONFile(quiet, file)
		// TMPRL1100 is the SDK's code for a nondeterministic workflow.
		if err == nil || !strings.Contains(err.Error(), "TMPRL1100") {
			t.Errorf("replaying %s against a reordered workflow: got %v, want a nondeterminism error", file, err)
		}
	}
}

// tctl writes histories with short enum names ("WorkflowExecutionStarted")
// where the temporal CLI writes "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"; both
// must load. The tctl-style file is derived from a recorded one.
func TestReplayTctlStyleHistory(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "enrollment_confirmed.json"))
	if err != nil {
		t.Fatal(err)
	}
	short := strings.NewReplacer(
		`"EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"`, `"WorkflowExecutionStarted"`,
		`"EVENT_TYPE_WORKFLOW_TASK_SCHEDULED"`, `"WorkflowTaskScheduled"`,
		`"EVENT_TYPE_WORKFLOW_TASK_STARTED"`, `"WorkflowTaskStarted"`,
		`"EVENT_TYPE_WORKFLOW_TASK_COMPLETED"`, `"WorkflowTaskCompleted"`,
		`"EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"`, `"ActivityTaskScheduled"`,
		`"EVENT_TYPE_ACTIVITY_TASK_STARTED"`, `"ActivityTaskStarted"`,
		`"EVENT_TYPE_ACTIVITY_TASK_COMPLETED"`, `"ActivityTaskCompleted"`,
		`"EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED"`, `"WorkflowExecutionCompleted"`,
		`"EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"`, `"WorkflowExecutionUpdateAccepted"`,
		`"EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED"`, `"WorkflowExecutionUpdateCompleted"`,
		`"EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES"`, `"UpsertWorkflowSearchAttributes"`,
	).Replace(string(raw))
	if short == string(raw) {
		t.Fatal("the recorded history has no long enum names to shorten")
	}
	file := filepath.Join(t.TempDir(), "tctl.json")
	if err := os.WriteFile(file, []byte(short), 0o644); err != nil {
		t.Fatal(err)
	}
	r := worker.NewWorkflowReplayer()
	r.RegisterWorkflow(workflows.Enrollment)
	if err := r.ReplayWorkflowHistoryFromJSONFile(quiet, file); err != nil {
		t.Fatalf("replay tctl-style history: %v", errors.Unwrap(err))
	}
}
