package workflows_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// quiet keeps the replayer's expected panics out of the test output.
var quiet = log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// fixture is one recorded history in testdata/ and the path it covers.
type fixture struct {
	file     string // in testdata/
	workflow string // the workflow type of the run
	path     string // what the run did
}

// fixtures lists every history in testdata/, each path a run can take
// today once; scripts/record-histories (TestRecordHistories and
// TestRecordWaitlistHistories in cmd/claimflow) writes them from a real
// stack, and docs/replay.md has the same table and says when to re-record.
var fixtures = []fixture{
	// Enrollment claims on a desk, and the runs that finish them.
	{file: "enrollment_desk_confirmed.json", workflow: "EnrollmentDesk",
		path: "three batches: one confirmed, one refused course_full, one waitlisted; outcome upserted; continued as new after its three batches"},
	{file: "enrollment_desk_fallback.json", workflow: "EnrollmentDesk",
		path: "the publish failed: answered reserved, the batch's run started (abandoned), continued as new"},
	{file: "enrollment_desk_full.json", workflow: "EnrollmentDesk",
		path: "a batch it could not list in its search attributes turned away (DeskFull), continued as new at once"},
	{file: "enrollment_batch_confirmed.json", workflow: "EnrollmentBatch",
		path: "the run a desk handed its batch to: PublishBatch retried until the broker was back, confirmed"},
	{file: "enrollment_batch_handed_off.json", workflow: "EnrollmentBatch",
		path: "the publish policy spent: each enrollment handed to an Enrollment run of its own (child, abandoned)"},
	{file: "enrollment_handed_off_dead_letter_retried.json", workflow: "Enrollment",
		path: "dead-lettered, operator retry, published and confirmed"},
	{file: "enrollment_handed_off_dead_letter_compensated.json", workflow: "Enrollment",
		path: "dead-lettered, operator compensate: seat released, promotion started, enrollment.failed published"},
	{file: "enrollment_dead_letter_named_decisions.json", workflow: "Enrollment",
		path: "dead-lettered; two concurrent API retries, one taken; round 2 dead-lettered; a stale round-1 decision ignored; compensate of round 2"},
	{file: "enrollment_promoted_confirmed.json", workflow: "Enrollment",
		path: "a promoted enrollment: enrollment.promoted, then enrollment.confirmed published, confirmed"},
	{file: "recover_reservations.json", workflow: "RecoverReservations",
		path: "a stranded reservation found and its batch's run started"},
	// Cancellations and the waitlist.
	{file: "cancellation_cancelled.json", workflow: "Cancellation",
		path: "a confirmed enrollment cancelled: seat released, enrollment.cancelled published"},
	{file: "cancellation_left_waitlist.json", workflow: "Cancellation",
		path: "a waitlisted enrollment cancelled: it leaves the queue, no seat freed, nothing published, no promotion"},
	{file: "cancellation_promoted.json", workflow: "Cancellation",
		path: "a confirmed enrollment cancelled with a waitlist: Promotion child started before enrollment.cancelled is published"},
	{file: "promotion_promoted.json", workflow: "Promotion",
		path: "a freed seat: the head of the queue promoted in one transaction, its Enrollment run started (child, abandoned)"},
	{file: "promotion_capacity_raised.json", workflow: "Promotion",
		path: "started by the API after a capacity raise: the next in line promoted, its run started"},
	// Coupons.
	{file: "coupon_issue_issued.json", workflow: "IssueCoupon",
		path: "coupon reserved from the stock, answered issued, coupon.issued published"},
	{file: "coupon_issue_starter_late.json", workflow: "IssueCoupon",
		path: "issued before the starter's update (named in the input) arrived: the run waited for it (a timer) and answered it issued"},
	{file: "coupon_use_used.json", workflow: "UseCoupon",
		path: "coupon held, vendor paid, payout recorded, coupon.used published"},
	{file: "coupon_use_payout_declined.json", workflow: "UseCoupon",
		path: "payout declined (402): compensated, coupon unheld, coupon.use_failed published"},
	{file: "coupon_use_payout_failed.json", workflow: "UseCoupon",
		path: "payout 503 on every attempt of its policy: compensated (payout_failed), coupon.use_failed published"},
	{file: "coupon_use_5xx_retried.json", workflow: "UseCoupon",
		path: "payout 503 twice, paid on the third attempt under the same key"},
	{file: "coupon_use_response_lost.json", workflow: "UseCoupon",
		path: "payout processed but its answer lost (client timeout), retried under the same key and paid once"},
	{file: "coupon_use_dead_letter_retried.json", workflow: "UseCoupon",
		path: "paid, coupon.used dead-lettered, operator retry, published"},
	{file: "coupon_use_starter_late.json", workflow: "UseCoupon",
		path: "used before the starter's update arrived: the run waited for it and answered it used"},
	// The consumer's durable path.
	{file: "deliver_event_delivered.json", workflow: "DeliverEvent",
		path: "inline attempt failed; delivered by the run within its retry policy, never parked"},
	{file: "deliver_event_dead_letter_retried.json", workflow: "DeliverEvent",
		path: "retry policy spent: dead-lettered, operator retry, delivered"},
	{file: "deliver_event_dead_letter_discarded.json", workflow: "DeliverEvent",
		path: "retry policy spent: dead-lettered, operator compensate, discarded (never delivered)"},
}

// allWorkflows are the worker's workflow types, by name.
var allWorkflows = []string{"Enrollment", "Cancellation", "Promotion", "EnrollmentBatch", "EnrollmentDesk",
	"RecoverReservations", "IssueCoupon", "UseCoupon", "DeliverEvent"}

// newReplayer registers every workflow as the worker does.
func newReplayer() worker.WorkflowReplayer {
	r := worker.NewWorkflowReplayer()
	r.RegisterWorkflow(workflows.Enrollment)
	r.RegisterWorkflow(workflows.Cancellation)
	r.RegisterWorkflow(workflows.Promotion)
	r.RegisterWorkflow(workflows.EnrollmentBatch)
	r.RegisterWorkflow(workflows.EnrollmentDesk)
	r.RegisterWorkflow(workflows.RecoverReservations)
	r.RegisterWorkflow(workflows.IssueCoupon)
	r.RegisterWorkflow(workflows.UseCoupon)
	r.RegisterWorkflow(workflows.DeliverEvent)
	return r
}

// fixturesOf lists the fixtures of the given workflow types.
func fixturesOf(types ...string) []fixture {
	var out []fixture
	for _, f := range fixtures {
		if slices.Contains(types, f.workflow) {
			out = append(out, f)
		}
	}
	return out
}

// Histories in testdata/ were recorded from the real Temporal dev server
// (scripts/record-histories). Replaying them against the current code fails when a
// change would break runs already in flight.
func TestReplayRecordedHistories(t *testing.T) {
	for _, f := range fixtures {
		t.Run(strings.TrimSuffix(f.file, ".json"), func(t *testing.T) {
			file := recordedFixture(t, f)
			h, err := client.HistoryFromJSON(mustOpen(t, file), client.HistoryJSONOptions{})
			if err != nil {
				t.Fatalf("load %s: %v", file, err)
			}
			started := h.Events[0].GetWorkflowExecutionStartedEventAttributes()
			if got := started.GetWorkflowType().GetName(); got != f.workflow {
				t.Fatalf("%s is a %s run; the table says %s", file, got, f.workflow)
			}
			if err := newReplayer().ReplayWorkflowHistoryFromJSONFile(quiet, file); err != nil {
				t.Fatalf("replay %s (%s): %v", file, f.path, err)
			}
		})
	}
}

// recordedFixture is f's path in testdata/; a fixture the table lists but
// nobody recorded yet fails the test that needs it, saying so.
func recordedFixture(t *testing.T, f fixture) string {
	t.Helper()
	file := filepath.Join("testdata", f.file)
	if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is not recorded yet (%s run: %s): record it with scripts/record-histories", file, f.workflow, f.path)
	} else if err != nil {
		t.Fatal(err)
	}
	return file
}

func mustOpen(t *testing.T, file string) io.Reader {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// Every history in testdata/ is in the table, so each is replayed and
// documented, and every entry of the table has its file.
func TestEveryFixtureIsInTheTable(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, f := range fixtures {
		if listed[f.file] {
			t.Errorf("%s is listed twice", f.file)
		}
		listed[f.file] = true
		if f.path == "" || f.workflow == "" {
			t.Errorf("%s: say which workflow and path it covers", f.file)
		}
	}
	for _, file := range files {
		if !listed[filepath.Base(file)] {
			t.Errorf("testdata/%s is not in the fixtures table of replay_test.go: add it with the path it covers", filepath.Base(file))
		}
		delete(listed, filepath.Base(file))
	}
	for file := range listed {
		t.Errorf("the fixtures table lists %s, which is not in testdata/: record it with scripts/record-histories", file)
	}
	// Every registered workflow has at least one history.
	for _, w := range allWorkflows {
		if len(fixturesOf(w)) == 0 {
			t.Errorf("no fixture replays %s", w)
		}
	}
}

// probe is a different program under any workflow's name: its first command
// is an activity no workflow schedules.
func probe[In any](ctx workflow.Context, _ In) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10e9})
	return workflow.ExecuteActivity(ctx, "ReplayProbe").Get(ctx, nil)
}

// Every fixture can fail: replayed against another program of the same
// name, each is reported non-deterministic, so none passes vacuously (an
// empty history, a workflow the replayer never reaches).
func TestEveryFixtureFailsAgainstAnotherProgram(t *testing.T) {
	r := worker.NewWorkflowReplayer()
	for name, fn := range map[string]any{
		"Enrollment":          probe[workflows.EnrollmentInput],
		"EnrollmentBatch":     probe[workflows.EnrollmentBatchInput],
		"EnrollmentDesk":      probe[workflows.EnrollmentDeskInput],
		"RecoverReservations": probe[workflows.RecoverReservationsInput],
		"Cancellation":        probe[workflows.CancellationInput],
		"Promotion":           probe[workflows.PromoteWaitlistInput],
		"IssueCoupon":         probe[workflows.IssueCouponInput],
		"UseCoupon":           probe[workflows.UseCouponInput],
		"DeliverEvent":        probe[workflows.DeliverEventInput],
	} {
		r.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: name})
	}
	for _, f := range fixtures {
		t.Run(strings.TrimSuffix(f.file, ".json"), func(t *testing.T) {
			err := r.ReplayWorkflowHistoryFromJSONFile(quiet, recordedFixture(t, f))
			// TMPRL1100 is the SDK's code for a nondeterministic workflow.
			if err == nil || !strings.Contains(err.Error(), "TMPRL1100") {
				t.Errorf("replaying %s against another program: got %v, want a nondeterminism error", f.file, err)
			}
		})
	}
}

// The replay test must be able to fail: an Enrollment or batch run that
// confirms before it publishes is a different program, and every recorded
// history of them must say so.
func TestReplayDetectsAChangedStepOrder(t *testing.T) {
	enrollments := fixturesOf("Enrollment", "EnrollmentBatch")
	if len(enrollments) == 0 {
		t.Fatal("no enrollment histories in the fixtures table")
	}
	changed := func(ctx workflow.Context, in workflows.EnrollmentInput) (workflows.EnrollmentState, error) {
		ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10e9})
		err := workflow.ExecuteActivity(ctx, workflows.MarkConfirmed.Name, in.EnrollmentID).Get(ctx, nil)
		return workflows.EnrollmentState{}, err
	}
	for _, f := range enrollments {
		t.Run(strings.TrimSuffix(f.file, ".json"), func(t *testing.T) {
			file := recordedFixture(t, f)
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(changed, workflow.RegisterOptions{Name: "Enrollment"})
			r.RegisterWorkflowWithOptions(changed, workflow.RegisterOptions{Name: "EnrollmentBatch"})
			err := r.ReplayWorkflowHistoryFromJSONFile(quiet, file)
			// TMPRL1100 is the SDK's code for a nondeterministic workflow.
			if err == nil || !strings.Contains(err.Error(), "TMPRL1100") {
				t.Errorf("replaying %s against a reordered workflow: got %v, want a nondeterminism error", file, err)
			}
		})
	}
}

// tctl writes histories with short enum names ("WorkflowExecutionStarted")
// where the temporal CLI writes "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"; both
// must load. The tctl-style file is derived from a recorded one.
func TestReplayTctlStyleHistory(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "enrollment_handed_off_dead_letter_retried.json"))
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
