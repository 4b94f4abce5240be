package workflows

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// A desk is a run that stays and decides batches sent to it as updates
// (ENROLL_MODE=desk). A batch run (EnrollmentBatch) costs the Temporal
// server a start, a first workflow task and a close, so a batch waits for
// the run before its own. An update to a run that is already there costs
// a fraction of that, and the server hands the updates that arrive
// together to one workflow task (claimflow-bench floor --long-lived,
// docs/performance.md), which decides their batches as one. Each keeps the
// batch run's saga (runBatch): the same reservation, the same fast path,
// the same compensations; only the durable path moves to batch runs of
// their own (publishInChildren), so that a broker outage never holds the
// desk.

// UpdateDeskBatch decides one batch on a desk and answers its decisions,
// one per claim, in order.
const UpdateDeskBatch = "decide-batch"

// EnrollmentDeskWorkflowID names desk k.
func EnrollmentDeskWorkflowID(k int) string { return "enrollment-desk:" + strconv.Itoa(k) }

type EnrollmentDeskInput struct {
	Desk int
	// BatchesPerRun bounds a run's batches (CLAIM_DESK_BATCHES); the run
	// continues as new sooner when the server suggests it, and only then
	// when BatchesPerRun is 0.
	BatchesPerRun int `json:",omitempty"`
	// AttrBytes is the size a search attribute value of the run may reach
	// (CLAIM_BATCH_ATTR_BYTES, within the server's limit); DefaultAttrBytes
	// when 0.
	AttrBytes int `json:",omitempty"`
	// DiscloseWithin bounds the time from a run's first decision to its
	// close, where its decisions reach visibility; deskDiscloseWithin when 0.
	DiscloseWithin time.Duration `json:",omitempty"`
}

// DeskState is what a desk's status query returns.
type DeskState struct {
	Desk    int
	Batches int // decided by this run
	Claims  int
}

// EnrollmentDesk decides the batches sent to it until it has decided
// BatchesPerRun of them, its search attributes might not take two more of
// its largest batches, or its first
// decision is DiscloseWithin old, then continues as new. An operator's
// cancel closes it after the batches it holds are decided. The run's
// search attributes tell what it decided once it closed (desk_outcome.go).
func EnrollmentDesk(ctx workflow.Context, in EnrollmentDeskInput) error {
	perRun := in.BatchesPerRun
	if perRun <= 0 {
		perRun = math.MaxInt
	}
	budget := in.AttrBytes
	if budget <= 0 {
		budget = DefaultAttrBytes
	}
	discloseWithin := in.DiscloseWithin
	if discloseWithin <= 0 {
		discloseWithin = deskDiscloseWithin
	}
	tells := workflow.GetVersion(ctx, deskOutcomeChangeID, workflow.DefaultVersion, 1) >= 1
	if tells {
		clearInherited(ctx)
	}
	var outcome deskOutcome
	state := DeskState{Desk: in.Desk}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (DeskState, error) { return state, nil }); err != nil {
		return fmt.Errorf("register status query: %w", err)
	}
	type held struct {
		in        EnrollmentBatchInput
		decisions []Decision
	}
	var queue []*held
	var deciding []EnrollmentBatchInput // taken from the queue, not yet in outcome
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateDeskBatch,
		func(ctx workflow.Context, b EnrollmentBatchInput) ([]Decision, error) {
			h := &held{in: b}
			queue = append(queue, h)
			if err := awaitAnswer(ctx, func() bool { return h.decisions != nil }); err != nil {
				return nil, err
			}
			return h.decisions, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context, b EnrollmentBatchInput) error {
			if len(b.Claims) == 0 || b.BatchID == "" {
				return errors.New("a batch needs an ID and at least one claim")
			}
			if tells {
				batches := append([]EnrollmentBatchInput{b}, deciding...)
				for _, h := range queue {
					batches = append(batches, h.in)
				}
				if !outcome.fits(budget, batches...) {
					return temporal.NewApplicationError(fmt.Sprintf(
						"desk %d cannot list batch %s's students in its search attributes (%d bytes a value) until it continues as new; decide it in a run of its own",
						in.Desk, b.BatchID, budget), DeskFullErrorType)
				}
			}
			return nil
		}},
	); err != nil {
		return fmt.Errorf("register batch update: %w", err)
	}
	// Batches are decided on a disconnected context: a cancel stops the
	// desk between batches, never inside one's saga. It is never cancelled
	// either: the batch runs a desk hands batches to are started on it, and
	// cancelling it as the desk closes would ask them to cancel too.
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	decideQueued := func() {
		if len(queue) == 0 {
			return
		}
		taken := queue
		queue = nil
		batches := make([]EnrollmentBatchInput, len(taken))
		for i, h := range taken {
			batches[i] = h.in
		}
		deciding = batches
		decisions := deskDecide(dctx, batches)
		deciding = nil
		for i, h := range taken {
			h.decisions = decisions[i]
			state.Batches++
			state.Claims += len(h.in.Claims)
			outcome.add(h.in.Claims, h.decisions)
		}
	}
	// disclose turns true discloseWithin after the run's first
	// decision: one timer a run.
	disclose, timing := false, false
	closeNow := func() bool {
		return state.Batches >= perRun || workflow.GetInfo(ctx).GetContinueAsNewSuggested() ||
			tells && (disclose || outcome.full(budget))
	}
	cancelled := false
	for !closeNow() {
		if err := workflow.Await(ctx, func() bool { return len(queue) > 0 || disclose }); err != nil {
			cancelled = true
			break
		}
		decideQueued()
		if tells && !timing && state.Batches > 0 {
			timing = true
			timer := workflow.NewTimer(ctx, discloseWithin)
			workflow.Go(ctx, func(gctx workflow.Context) {
				_ = timer.Get(gctx, nil) // cancelled with the run: the loop ends anyway
				disclose = true
			})
		}
	}
	// Batches accepted before the close are decided before it; any that
	// reach the run while it closes are aborted by the server, and their
	// callers send them to the next run.
	for {
		_ = workflow.Await(dctx, func() bool { return len(queue) > 0 || workflow.AllHandlersFinished(dctx) })
		if len(queue) == 0 {
			break
		}
		decideQueued()
	}
	if tells {
		outcome.upsert(dctx)
	}
	if cancelled {
		return temporal.NewCanceledError("desk closed by cancel")
	}
	return workflow.NewContinueAsNewError(ctx, EnrollmentDesk, in)
}

// deskDecide decides the batches that reached the desk in one workflow
// task as one: one reservation, one fast-path publish, as a batch run of
// all their claims would. Each claim carries its own batch's CollectedAt,
// so its event's payload does not depend on which batches it was merged
// with. It returns the decisions of each batch, in order; claims that end
// without a decision are decided undecided.
func deskDecide(ctx workflow.Context, batches []EnrollmentBatchInput) [][]Decision {
	merged := EnrollmentBatchInput{BatchID: batches[0].BatchID, ConfirmBeforeAnswer: batches[0].ConfirmBeforeAnswer,
		CollectedAt: batches[0].CollectedAt}
	batchOf := map[string]int{} // enrollment ID → its batch
	for i, b := range batches {
		for _, c := range b.Claims {
			if c.OccurredAt.IsZero() {
				c.OccurredAt = b.CollectedAt
			}
			merged.Claims = append(merged.Claims, c)
			batchOf[c.EnrollmentID] = i
		}
	}
	var decisions []Decision
	state := BatchState{BatchID: merged.BatchID, Claims: len(merged.Claims), Status: StatusPending}
	durable := func(ctx workflow.Context, _ EnrollmentBatchInput, b decidedBatch, s *saga, state *BatchState) error {
		return publishInChildren(ctx, batches, batchOf, b, s, state)
	}
	err := runBatch(ctx, merged, &state, func(d []Decision) { decisions = d }, durable)
	if decisions == nil {
		decisions = make([]Decision, len(merged.Claims))
		for i, c := range merged.Claims {
			decisions[i] = undecided(c.EnrollmentID, err)
		}
	}
	if err != nil {
		workflow.GetLogger(ctx).Warn("desk batches ended with an error", "batches", len(batches), "first_batch_id", merged.BatchID, "error", err)
	}
	out := make([][]Decision, len(batches))
	next := 0
	for i, b := range batches {
		out[i] = decisions[next : next+len(b.Claims)]
		next += len(b.Claims)
	}
	return out
}

// publishInChildren is the desk's durable path: the reserved enrollments of
// each batch go on in a batch run of their own (EnrollmentBatch without the
// fast path, named by the batch, its search attributes within the bound
// the API built the batch to), which publishes on the retry policy,
// confirms, and hands each enrollment to its own run when the policy is
// spent. The desk waits for their starts only. Those runs' reservations
// find the seats the desk took.
func publishInChildren(ctx workflow.Context, batches []EnrollmentBatchInput, batchOf map[string]int, b decidedBatch, s *saga, state *BatchState) error {
	granted := make([][]EnrollmentInput, len(batches))
	for _, c := range b.granted {
		i := batchOf[c.EnrollmentID]
		granted[i] = append(granted[i], c)
	}
	started := make([]workflow.ChildWorkflowFuture, len(batches)) // nil: nothing to hand over
	for i, claims := range granted {
		if len(claims) > 0 {
			started[i] = startBatchRun(ctx, batches[i].BatchID, claims, batches[i].CollectedAt)
		}
	}
	failed := map[string]bool{} // enrollment IDs no batch run took
	for i, f := range started {
		if f == nil {
			continue
		}
		if err := f.GetChildWorkflowExecution().Get(ctx, nil); err != nil {
			workflow.GetLogger(ctx).Warn("could not hand a batch to a run of its own; publishing in the desk",
				"batch_id", batches[i].BatchID, "error", err)
			for _, c := range granted[i] {
				failed[c.EnrollmentID] = true
			}
		}
	}
	if len(failed) == 0 {
		s.forget()
		state.Status = StatusReserved
		return nil
	}
	// The callers were told "reserved": the events must go out. The desk
	// publishes those it could not hand over itself, as a batch run would.
	rest := decidedBatch{occurredAt: b.occurredAt}
	for _, c := range b.granted {
		if failed[c.EnrollmentID] {
			rest.granted = append(rest.granted, c)
		}
	}
	for i, id := range b.publish.EnrollmentIDs {
		if failed[id] {
			rest.publish.Messages = append(rest.publish.Messages, b.publish.Messages[i])
			rest.publish.EnrollmentIDs = append(rest.publish.EnrollmentIDs, id)
			rest.reservedIDs = append(rest.reservedIDs, id)
		}
	}
	return publishInRun(ctx, EnrollmentBatchInput{BatchID: batches[0].BatchID}, rest, s, state)
}

// startBatchRun starts the batch run that takes a desk batch's durable path.
func startBatchRun(ctx workflow.Context, batchID string, claims []EnrollmentInput, collectedAt time.Time) workflow.ChildWorkflowFuture {
	child := EnrollmentBatchInput{BatchID: batchID, Claims: claims, CollectedAt: collectedAt}
	var courses, students []string
	for _, c := range claims {
		courses, students = appendNew(courses, c.CourseID), appendNew(students, c.StudentID)
	}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:            EnrollmentBatchWorkflowID(batchID),
		ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SearchCourseID.ValueSet(courses),
			SearchStudentID.ValueSet(students),
			SearchClaimStatus.ValueSet(string(StatusReserved)),
		),
	})
	return workflow.ExecuteChildWorkflow(cctx, EnrollmentBatch, child)
}
