package workflows

import (
	"fmt"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Group commit. Every Temporal run costs the server CPU of its own, so one
// run per request caps the claims a small cluster can take. A batch run
// claims the seats of every request that arrived while the previous batch
// was in flight: one transaction, one acks=all send, one confirmation, one
// run — so the cost per enrollment falls with load while each enrollment
// keeps its own ID, event ID, timestamps and, when something goes wrong, its
// own Enrollment run with dead letter and compensation.

// EnrollmentBatchWorkflowID names a batch; batch IDs are time-ordered UUIDs
// chosen by the API instance that collected the batch.
func EnrollmentBatchWorkflowID(batchID string) string {
	return "enrollment-batch:" + batchID
}

type EnrollmentBatchInput struct {
	BatchID string
	Claims  []EnrollmentInput
	// ConfirmBeforeAnswer takes the fast path: publish and confirm before
	// the decision goes out. The API sets it; runs recorded before it
	// existed replay without it, on the path they took. (A GetVersion
	// marker would do the same but costs every run a search-attribute
	// upsert, one more visibility write on the Temporal server.)
	ConfirmBeforeAnswer bool `json:",omitempty"`
	// CollectedAt is when the API closed the batch; a desk run
	// (EnrollmentDesk) stamps the batch's events with it, where a batch
	// run uses its own start time. Both are in the run's history, so a
	// retried workflow task publishes the same payload.
	CollectedAt time.Time `json:",omitzero"`
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
	// broker was failing moments ago: the caller has a durable path to
	// fall back on and should not wait on a broker that is down.
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

// BatchState is what the batch's status query returns.
type BatchState struct {
	BatchID  string
	Claims   int
	Reserved int
	Refused  int
	// Waitlisted claims joined their course's waitlist.
	Waitlisted int `json:",omitempty"`
	Status     EnrollmentStatus
	HandedOff  []string `json:",omitempty"` // enrollments whose publish went to their own run
}

// EnrollmentBatch is the group-commit saga. Its decision update returns
// one Decision per claim, in order.
func EnrollmentBatch(ctx workflow.Context, in EnrollmentBatchInput) (BatchState, error) {
	// A batch keeps ClaimStatus "pending" (set by whoever starts it) while
	// it runs and sets its outcome as it closes (batchOutcome), when that
	// costs no visibility write.
	c := &claim[BatchState, []Decision]{state: BatchState{BatchID: in.BatchID, Claims: len(in.Claims), Status: StatusPending}}
	if err := c.register(ctx, same[[]Decision]); err != nil {
		return c.state, err
	}
	err := runBatch(ctx, in, &c.state, func(d []Decision) { c.decide(ctx, d) }, publishInRun)
	c.end(ctx, err, func(err error) []Decision {
		d := make([]Decision, len(in.Claims))
		for i, claim := range in.Claims {
			d[i] = undecided(claim.EnrollmentID, err)
		}
		return d
	})
	// Nothing may block from here on: the upsert must share the workflow
	// task that closes the run (see outcome.go).
	batchCurrentDetails(ctx, c.state, *c.decision)
	if outcomeVersion(ctx) >= 1 {
		outcomeOfBatch(in.Claims, *c.decision, c.state.Status).upsert(ctx)
	}
	return c.state, err
}

// batchLocalOptions: database steps of a batch run as local activities in
// the worker that holds the workflow task, sparing a task round trip each.
func batchLocalOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, batchLocalActivityOptions())
}

func batchLocalActivityOptions() workflow.LocalActivityOptions {
	return workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second, RetryPolicy: databaseRetryPolicy}
}

// durablePublish publishes a decided batch's events when the fast path did
// not: in the batch run itself (publishInRun), or in a run of their own
// (the desk's publishInChild). It owns the saga from there on.
type durablePublish func(ctx workflow.Context, in EnrollmentBatchInput, b decidedBatch, s *saga, state *BatchState) error

// decidedBatch is what a batch holds once its seats are reserved.
type decidedBatch struct {
	granted     []EnrollmentInput
	reservedIDs []string
	publish     PublishBatchInput
	occurredAt  time.Time
}

func runBatch(ctx workflow.Context, in EnrollmentBatchInput, state *BatchState, decide func([]Decision), durable durablePublish) (err error) {
	info := workflow.GetInfo(ctx)
	// Until ReserveSeats answers, any claim may hold a seat (its commit may
	// have happened with the answer lost); releasing an ID that holds none
	// is a no-op, so the compensation starts with all of them.
	reservedIDs := make([]string, 0, len(in.Claims))
	for _, c := range in.Claims {
		reservedIDs = append(reservedIDs, c.EnrollmentID)
	}
	var s saga
	// An operator's cancel before the events are out gives the seats back.
	defer s.unwindIfCancelled(ctx, &err, func(ctx workflow.Context) error {
		err := s.compensate(ctx)
		state.Status = StatusFailed
		return err
	})
	s.add(func(ctx workflow.Context) error {
		return ReleaseSeats.Execute(compensationOptions(ctx), reservedIDs)
	})
	reserved, err := ReserveSeats.ExecuteLocal(batchLocalOptions(ctx), ReserveSeatsInput{
		Claims: in.Claims, WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID,
	})
	if err != nil {
		return fmt.Errorf("reserve seats of batch %s: %w", in.BatchID, err)
	}
	if len(reserved.Decisions) != len(in.Claims) {
		return fmt.Errorf("reserve seats of batch %s: %d decisions for %d claims", in.BatchID, len(reserved.Decisions), len(in.Claims))
	}
	var granted []EnrollmentInput
	reservedIDs = nil
	for i, d := range reserved.Decisions {
		switch d.Status {
		case StatusReserved:
			granted = append(granted, in.Claims[i])
			reservedIDs = append(reservedIDs, d.EnrollmentID)
		case StatusWaitlisted:
			state.Waitlisted++
		}
	}
	state.Reserved, state.Refused = len(granted), len(in.Claims)-len(granted)-state.Waitlisted
	state.Status = StatusReserved
	batchCurrentDetails(ctx, *state, reserved.Decisions)
	if len(granted) == 0 {
		decide(reserved.Decisions)
		s.forget()
		state.Status = StatusRefused
		return nil
	}

	// The run's start time, not workflow.Now: if a worker dies after the
	// fast path's local publish but before the workflow task completes, the
	// task runs again with a later clock, and the copy it publishes must
	// carry the same payload as the first (copies share event_id and
	// payload; docs/testing.md, "The delivery guarantee").
	occurredAt := workflow.GetInfo(ctx).WorkflowStartTime.UTC()
	if !in.CollectedAt.IsZero() {
		occurredAt = in.CollectedAt.UTC()
	}
	publish := PublishBatchInput{}
	for _, c := range granted {
		at := occurredAt
		if !c.OccurredAt.IsZero() {
			at = c.OccurredAt.UTC() // its own batch's time, in a desk's merged batch
		}
		publish.Messages = append(publish.Messages, Message{Topic: EnrollmentTopic, Key: c.CourseID, Event: Event{
			ID:         EventID(c.EnrollmentID, EventEnrollmentConfirmed),
			Type:       EventEnrollmentConfirmed,
			OccurredAt: at,
			Data: map[string]any{
				"enrollment_id": c.EnrollmentID, "course_id": c.CourseID, "student_id": c.StudentID,
			},
		}})
		publish.EnrollmentIDs = append(publish.EnrollmentIDs, c.EnrollmentID)
	}
	if in.ConfirmBeforeAnswer {
		// The fast path: publish and confirm in this workflow task, in one
		// local-activity attempt, before the decision goes out. The answer
		// then says "confirmed", the event is out milliseconds after the
		// seat was recorded, and the run ends in one workflow task instead
		// of two plus an activity task. Any failure falls back to the
		// durable path below, which answers "reserved" at once, retries on
		// the publish policy and confirms what it has not.
		fast := publish
		fast.FailFast, fast.Confirm = true, true
		// ReserveSeats has just read which events are out, in this task.
		fast.PublishedKnown, fast.Published = true, reserved.Published
		err := PublishBatch.ExecuteLocal(fastLocalOptions(ctx), fast)
		if temporal.IsCanceledError(err) {
			return err
		}
		if err == nil {
			s.forget()
			decide(confirmed(reserved.Decisions))
			state.Status = StatusConfirmed
			return nil
		}
	}
	decide(reserved.Decisions)
	return durable(ctx, in, decidedBatch{granted: granted, reservedIDs: reservedIDs, publish: publish, occurredAt: occurredAt}, &s, state)
}

// publishInRun is the batch run's durable path: the publish activity on its
// retry policy, then the confirmation; when the policy is spent, each
// enrollment goes on in a run of its own.
func publishInRun(ctx workflow.Context, in EnrollmentBatchInput, b decidedBatch, s *saga, state *BatchState) error {
	err := PublishBatch.Execute(publishOptions(ctx), b.publish)
	if temporal.IsCanceledError(err) {
		return err
	}
	if err != nil {
		// The publish policy is spent. Each enrollment goes on in a run of
		// its own, which dead-letters it and waits for an operator, exactly
		// as a single enrollment would; this batch is done with them.
		s.forget()
		state.Status = StatusDeadLettered
		return handOff(ctx, b.granted, b.occurredAt, state)
	}

	// The events are out: the seats belong to the students.
	s.forget()
	cctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	if err := ConfirmBatch.ExecuteLocal(batchLocalOptions(cctx), b.reservedIDs); err != nil {
		return fmt.Errorf("confirm batch %s: %w", in.BatchID, err)
	}
	state.Status = StatusConfirmed
	return nil
}

// fastLocalOptions: one attempt, bounded like the publish activity; the
// durable path owns retries.
func fastLocalOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, fastLocalActivityOptions())
}

func fastLocalActivityOptions() workflow.LocalActivityOptions {
	return workflow.LocalActivityOptions{StartToCloseTimeout: 15 * time.Second, RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1}}
}

// confirmed turns the reserved decisions of a batch whose events are out
// and whose enrollments are confirmed into confirmed ones.
func confirmed(decisions []Decision) []Decision {
	out := slices.Clone(decisions)
	for i := range out {
		if out[i].Status == StatusReserved {
			out[i].Status = StatusConfirmed
		}
	}
	return out
}

// handOff starts an Enrollment run per enrollment, from its publish step on,
// with the batch's event time.
// The children outlive this run (ParentClosePolicy abandon): an operator may
// take days to decide about a dead letter.
func handOff(ctx workflow.Context, granted []EnrollmentInput, occurredAt time.Time, state *BatchState) error {
	var futures []workflow.ChildWorkflowFuture
	for _, c := range granted {
		// Some of the batch's events may be on the topic already (a
		// publish whose acks were lost): the child's copy must match.
		c.Reserved = true
		if c.OccurredAt.IsZero() { // a desk's claims carry their batch's time
			c.OccurredAt = occurredAt
		}
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			// The enrollment ID keeps the child apart from any earlier run
			// of the same student and course still finishing its own work.
			WorkflowID:            EnrollmentWorkflowID(c.CourseID, c.StudentID) + ":" + c.EnrollmentID,
			ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
			TypedSearchAttributes: temporal.NewSearchAttributes(
				SearchCourseID.ValueSet([]string{c.CourseID}),
				SearchStudentID.ValueSet([]string{c.StudentID}),
				SearchClaimStatus.ValueSet(string(StatusReserved)),
			),
		})
		futures = append(futures, workflow.ExecuteChildWorkflow(cctx, Enrollment, c))
		state.HandedOff = append(state.HandedOff, c.EnrollmentID)
	}
	for i, f := range futures {
		// Wait for the start only; the child's outcome is its own.
		if err := f.GetChildWorkflowExecution().Get(ctx, nil); err != nil {
			return fmt.Errorf("hand enrollment %s to its own run: %w", granted[i].EnrollmentID, err)
		}
	}
	slices.Sort(state.HandedOff)
	return nil
}
