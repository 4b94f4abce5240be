package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	updatepb "go.temporal.io/api/update/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/claimflow/claimflow/internal/store"
	"github.com/claimflow/claimflow/workflows"
)

// ReservationReport says who holds each enrollment still reserved. A
// reservation is in flight while a live run holds it: the desk run that
// reserved it, while the update that carries its batch is still there to be
// decided (Temporal knows it, and it has not completed), its batch's run, or
// its own Enrollment run (a hand-off, a promotion) or the promotion about to
// start that run. Any other is
// orphaned: a seat that nobody will publish, confirm or give back, until
// the recovery (workflows.RecoverReservations) gives its batch a run. An
// orphan older than Bound means the recovery did not: the audit fails.
type ReservationReport struct {
	Reserved int           `json:"reserved"`
	InFlight int           `json:"in_flight"`
	Orphaned []Orphan      `json:"orphaned,omitempty"`
	Bound    time.Duration `json:"recovery_bound"`
}

// Orphan is a reservation that no live run holds.
type Orphan struct {
	EnrollmentID string        `json:"enrollment_id"`
	CourseID     string        `json:"course_id"`
	BatchID      string        `json:"batch_id,omitempty"`
	WorkflowID   string        `json:"workflow_id"`
	RunID        string        `json:"run_id"`
	Age          time.Duration `json:"age"`
}

// OK says no reservation has been orphaned for longer than the recovery
// bound.
func (r ReservationReport) OK() bool {
	for _, o := range r.Orphaned {
		if o.Age > r.Bound {
			return false
		}
	}
	return true
}

// Overdue counts the orphans older than the bound.
func (r ReservationReport) Overdue() int {
	n := 0
	for _, o := range r.Orphaned {
		if o.Age > r.Bound {
			n++
		}
	}
	return n
}

// WriteText prints the report's lines.
func (r ReservationReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "reservations: %d still reserved, %d held by a live run, %d orphaned (%d older than the recovery bound %s)\n",
		r.Reserved, r.InFlight, len(r.Orphaned), r.Overdue(), r.Bound)
	for i, o := range r.Orphaned {
		if i == 20 {
			fmt.Fprintf(w, "  … %d more\n", len(r.Orphaned)-i)
			break
		}
		fmt.Fprintf(w, "  orphaned %s (course %s, batch %s, reserved by %s/%s) for %s\n",
			o.EnrollmentID, o.CourseID, o.BatchID, o.WorkflowID, o.RunID, o.Age.Round(time.Second))
	}
}

// CheckReservations reports who holds each enrollment still reserved on the
// courses whose ID starts with prefix ("" for all), asking the Temporal
// namespace ns. bound is the recovery bound (config.Config.RecoveryBound).
func CheckReservations(ctx context.Context, db *pgxpool.Pool, tc client.Client, ns, prefix string, bound time.Duration) (ReservationReport, error) {
	r := ReservationReport{Bound: bound}
	held, err := store.Reservations(ctx, db, prefix)
	if err != nil {
		return r, err
	}
	r.Reserved = len(held)
	open := map[string]bool{} // workflow ID (and run ID) → running, asked once each
	running := func(workflowID, runID string) (bool, error) {
		key := workflowID + "/" + runID
		if v, ok := open[key]; ok {
			return v, nil
		}
		d, err := tc.DescribeWorkflow(ctx, workflowID, runID)
		var notFound *serviceerror.NotFound
		switch {
		case errors.As(err, &notFound):
			open[key] = false
		case err != nil:
			return false, fmt.Errorf("describe %s: %w", key, err)
		default:
			open[key] = d.RawResponse.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
		}
		return open[key], nil
	}
	for _, h := range held {
		owners := []struct{ workflowID, runID string }{
			{workflows.EnrollmentWorkflowID(workflows.EnrollmentInput{EnrollmentID: h.ID, CourseID: h.CourseID, StudentID: h.StudentID}), ""},
		}
		if h.BatchID != "" {
			owners = append(owners, struct{ workflowID, runID string }{workflows.EnrollmentBatchWorkflowID(h.BatchID), ""})
		}
		if h.PromotedBy != "" {
			owners = append(owners, struct{ workflowID, runID string }{workflows.PromotionWorkflowID(h.CourseID, h.PromotedBy), ""})
		}
		live := false
		if h.BatchID != "" && workflows.IsEnrollmentDesk(h.WorkflowID) {
			if live, err = updatePending(ctx, tc, ns, h.WorkflowID, h.RunID, h.BatchID); err != nil {
				return r, err
			}
		}
		for _, o := range owners {
			if live {
				break
			}
			if live, err = running(o.workflowID, o.runID); err != nil {
				return r, err
			}
		}
		if live {
			r.InFlight++
			continue
		}
		r.Orphaned = append(r.Orphaned, Orphan{EnrollmentID: h.ID, CourseID: h.CourseID, BatchID: h.BatchID,
			WorkflowID: h.WorkflowID, RunID: h.RunID, Age: h.Age})
	}
	return r, nil
}

// updatePending says whether Temporal still has the update updateID on the
// run, admitted or accepted but not completed: its workflow decides it yet.
// An update the server lost (it keeps one it has not accepted in memory
// only) is not found.
func updatePending(ctx context.Context, tc client.Client, ns, workflowID, runID, updateID string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := tc.WorkflowService().PollWorkflowExecutionUpdate(ctx, &workflowservice.PollWorkflowExecutionUpdateRequest{
		Namespace: ns,
		UpdateRef: &updatepb.UpdateRef{
			WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: workflowID, RunId: runID},
			UpdateId:          updateID,
		},
		Identity:   "claimflow-audit",
		WaitPolicy: &updatepb.WaitPolicy{LifecycleStage: enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED},
	})
	var notFound *serviceerror.NotFound
	switch {
	case errors.As(err, &notFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ask %s/%s about update %s: %w", workflowID, runID, updateID, err)
	}
	return resp.GetStage() != enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_COMPLETED, nil
}
