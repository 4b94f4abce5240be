package workflows

import (
	"fmt"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// A batch run (EnrollmentBatch, enrollment-batch:<batch id>) finishes the
// claims of one batch that hold a seat but whose event is not out: the
// desk starts it when its publish failed, and RecoverReservations starts it
// for reservations nobody finishes (a desk's workflow task that committed
// its reservation and then was lost). It publishes on the retry policy and
// confirms; when the policy is spent, each enrollment goes on in a run of
// its own, which dead-letters it and waits for an operator.

// EnrollmentBatchWorkflowID names the run of a batch; batch IDs are
// time-ordered UUIDs chosen by the API instance that collected the batch.
func EnrollmentBatchWorkflowID(batchID string) string {
	return "enrollment-batch:" + batchID
}

// EnrollmentBatchInput is a batch's reserved claims, each with the batch's
// ID and the time on its events (EnrollmentInput.OccurredAt).
type EnrollmentBatchInput struct {
	BatchID string
	Claims  []EnrollmentInput
}

// BatchState is what the batch run's status query returns.
type BatchState struct {
	BatchID   string
	Claims    int
	Status    EnrollmentStatus
	HandedOff []string `json:",omitempty"` // enrollments whose publish went to their own run
}

// ReserveSeatsInput claims seats for many students at once. Decisions come
// back in the order of Claims.
type ReserveSeatsInput struct {
	Claims     []EnrollmentInput
	WorkflowID string
	RunID      string
}

type ReserveSeatsResult struct {
	Decisions []Decision
	// Published lists the batch's own enrollments, recorded by an earlier
	// attempt, whose event is already out (published_at is set).
	Published []string `json:",omitempty"`
}

// PublishBatchInput sends every message and records published_at for each
// acknowledged one; already-published enrollments are skipped, so a retry
// sends only what is missing.
type PublishBatchInput struct {
	Messages      []Message
	EnrollmentIDs []string // parallel to Messages
	// FailFast asks for an immediate error, without a send, while the
	// broker was failing moments ago: the desk has a durable path to hand
	// the batch to and should not wait on a broker that is down.
	FailFast bool `json:",omitempty"`
	// Confirm confirms each acknowledged enrollment in the statement that
	// records its publish: one write per enrollment instead of two.
	Confirm bool `json:",omitempty"`
	// PublishedKnown says Published lists every enrollment of the batch
	// whose event is already out, as read moments ago in the same workflow
	// task (ReserveSeatsResult.Published), so PublishBatch need not look
	// them up. Only a single attempt may rely on it: a retry looks again.
	PublishedKnown bool     `json:",omitempty"`
	Published      []string `json:",omitempty"`
}

// EnrollmentBatch publishes and confirms a batch's reserved claims.
func EnrollmentBatch(ctx workflow.Context, in EnrollmentBatchInput) (BatchState, error) {
	c := &claim[BatchState, struct{}]{state: BatchState{BatchID: in.BatchID, Claims: len(in.Claims), Status: StatusReserved}}
	if err := c.register(ctx, nil); err != nil {
		return c.state, err
	}
	err := finishBatch(ctx, in, &c.state)
	if err != nil && c.state.Status == StatusReserved {
		c.state.Status = StatusFailed
	}
	c.end(ctx, err, nil)
	// In the task that closes the run, so it costs no visibility write of
	// its own (visibility.go).
	upsertClaimStatus(ctx, string(c.state.Status))
	return c.state, err
}

func finishBatch(ctx workflow.Context, in EnrollmentBatchInput, state *BatchState) (err error) {
	ids := make([]string, len(in.Claims))
	for i, c := range in.Claims {
		ids[i] = c.EnrollmentID
	}
	var s saga
	// An operator's cancel before the events are out gives the seats back.
	defer s.unwindIfCancelled(ctx, &err, func(ctx workflow.Context) error {
		err := s.compensate(ctx)
		state.Status = StatusFailed
		return err
	})
	s.add(func(ctx workflow.Context) error {
		return ReleaseSeats.Execute(compensationOptions(ctx), ids)
	})
	err = PublishBatch.Execute(publishOptions(ctx), confirmedEvents(in.Claims))
	if temporal.IsCanceledError(err) {
		return err
	}
	if err != nil {
		// The publish policy is spent. Each enrollment goes on in a run of
		// its own, which dead-letters it and waits for an operator; this
		// batch is done with them.
		s.forget()
		state.Status = StatusHandedOff
		return handOff(ctx, in.Claims, state)
	}
	// The events are out: the seats belong to the students.
	s.forget()
	cctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	if err := ConfirmBatch.ExecuteLocal(localDatabaseOptions(cctx), ids); err != nil {
		return fmt.Errorf("confirm batch %s: %w", in.BatchID, err)
	}
	state.Status = StatusConfirmed
	return nil
}

// handOff starts an Enrollment run per enrollment, which publishes its
// events (the same payload as any copy already out) and dead-letters them.
// The runs outlive this one (ParentClosePolicy abandon): an operator may
// take days to decide about a dead letter.
func handOff(ctx workflow.Context, claims []EnrollmentInput, state *BatchState) error {
	futures := make([]workflow.ChildWorkflowFuture, len(claims))
	for i, c := range claims {
		futures[i] = startEnrollment(ctx, c)
		state.HandedOff = append(state.HandedOff, c.EnrollmentID)
	}
	for i, f := range futures {
		// Wait for the start only; the child's outcome is its own.
		if err := f.GetChildWorkflowExecution().Get(ctx, nil); err != nil && !temporal.IsWorkflowExecutionAlreadyStartedError(err) {
			return fmt.Errorf("hand enrollment %s to its own run: %w", claims[i].EnrollmentID, err)
		}
	}
	slices.Sort(state.HandedOff)
	return nil
}

// startEnrollment starts the Enrollment run of one reserved enrollment, as
// a child that outlives its starter.
func startEnrollment(ctx workflow.Context, c EnrollmentInput) workflow.ChildWorkflowFuture {
	list := ClaimListOf([]EnrollmentInput{c})
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:            EnrollmentWorkflowID(c),
		ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		TypedSearchAttributes: list.startAttributes(StatusReserved),
	})
	return workflow.ExecuteChildWorkflow(cctx, Enrollment, c)
}

// localDatabaseOptions: database steps of the desk and the batch run run as
// local activities in the worker that holds the workflow task, sparing a
// task round trip each.
func localDatabaseOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, localDatabaseActivityOptions())
}

func localDatabaseActivityOptions() workflow.LocalActivityOptions {
	return workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second, RetryPolicy: databaseRetryPolicy}
}

// fastLocalOptions: the desk's publish gets one attempt, bounded like the
// publish activity; the batch run owns retries.
func fastLocalOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, fastLocalActivityOptions())
}

func fastLocalActivityOptions() workflow.LocalActivityOptions {
	return workflow.LocalActivityOptions{StartToCloseTimeout: 15 * time.Second, RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}}
}
