package workflows

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Every enrollment claim is decided on a desk: a run that stays
// (EnrollmentDesk, enrollment-desk:<k>) and decides the batches the API
// sends it as updates. A run per claim, or per batch, would cost the
// Temporal server a start, a first workflow task and a close each; an
// update to a run that is already there costs a fraction of that, and the
// updates that arrive together share one workflow task, which decides
// their batches as one (docs/architecture.md, "The way of a claim").
//
// A batch's saga, in that workflow task: ReserveSeats (one transaction),
// then PublishBatch (acks=all, and the enrollments confirmed in the same
// statement), then the answer "confirmed". When the publish fails, the
// claims keep their seats, the answer is "reserved", and each batch goes on
// in a batch run of its own (EnrollmentBatch), which publishes on the retry
// policy; the desk never waits for the broker.

// UpdateDeskBatch decides one batch on a desk and answers its decisions,
// one per claim, in order.
const UpdateDeskBatch = "decide-batch"

const deskIDPrefix = "enrollment-desk:"

// EnrollmentDeskWorkflowID names desk k.
func EnrollmentDeskWorkflowID(k int) string { return deskIDPrefix + strconv.Itoa(k) }

// IsEnrollmentDesk says whether workflowID names a desk.
func IsEnrollmentDesk(workflowID string) bool { return strings.HasPrefix(workflowID, deskIDPrefix) }

// DeskFullErrorType is the type of the error a desk answers a batch with
// when its search attributes might not list the batch: the desk then
// continues as new, and the sender sends the batch again, to its next run.
const DeskFullErrorType = "DeskFull"

// deskDiscloseWithin bounds the time from a desk run's first decision to
// its close, where its decisions reach visibility.
const deskDiscloseWithin = 5 * time.Second

// DeskBatch is a batch of claims the API collected, sent to a desk.
type DeskBatch struct {
	BatchID string
	Claims  []EnrollmentInput
	// CollectedAt is when the API closed the batch: the time on its
	// events, recorded with each claim, so that a retried workflow task and
	// a batch run that finishes the claims publish the same payload.
	CollectedAt time.Time
}

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
// its largest batches (or did not take one), or its first decision is
// DiscloseWithin old; then it continues as new. An operator's cancel
// closes it after the batches it holds are decided. The run's search
// attributes tell what it decided once it closed (visibility.go).
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
	var outcome deskOutcome
	state := DeskState{Desk: in.Desk}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (DeskState, error) { return state, nil }); err != nil {
		return fmt.Errorf("register status query: %w", err)
	}
	type held struct {
		batch     DeskBatch
		decisions []Decision
	}
	var queue []*held
	var deciding []DeskBatch // taken from the queue, not yet in outcome
	// full: a batch did not fit; the run closes and the batches sent to it
	// from now on go to its next run.
	full := false
	errFull := func(b DeskBatch) error {
		return temporal.NewApplicationError(fmt.Sprintf(
			"desk %d cannot list batch %s's students in its search attributes (%d bytes a value); send it to the desk's next run",
			in.Desk, b.BatchID, budget), DeskFullErrorType)
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateDeskBatch,
		func(ctx workflow.Context, b DeskBatch) ([]Decision, error) {
			pending := append(slices.Clone(deciding), b)
			for _, h := range queue {
				pending = append(pending, h.batch)
			}
			if full || !outcome.fits(budget, pending...) {
				full = true
				return nil, errFull(b)
			}
			h := &held{batch: b}
			queue = append(queue, h)
			if err := awaitAnswer(ctx, func() bool { return h.decisions != nil }); err != nil {
				return nil, err
			}
			return h.decisions, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context, b DeskBatch) error {
			if len(b.Claims) == 0 || b.BatchID == "" || b.CollectedAt.IsZero() {
				return errors.New("a batch needs an ID, its collection time and at least one claim")
			}
			if full { // read only: the run is closing
				return errFull(b)
			}
			return nil
		}},
	); err != nil {
		return fmt.Errorf("register batch update: %w", err)
	}
	// Batches are decided on a disconnected context: a cancel stops the
	// desk between batches, never inside one's saga.
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	decideQueued := func() {
		if len(queue) == 0 {
			return
		}
		taken := queue
		queue = nil
		deciding = make([]DeskBatch, len(taken))
		for i, h := range taken {
			deciding[i] = h.batch
		}
		decisions := decideBatches(dctx, deciding)
		deciding = nil
		for i, h := range taken {
			h.decisions = decisions[i]
			state.Batches++
			state.Claims += len(h.batch.Claims)
			outcome.add(h.batch.Claims, h.decisions)
		}
	}
	// disclose turns true discloseWithin after the run's first decision:
	// one timer a run.
	disclose, timing := false, false
	closeNow := func() bool {
		return full || disclose || outcome.full(budget) || state.Batches >= perRun ||
			workflow.GetInfo(ctx).GetContinueAsNewSuggested()
	}
	cancelled := false
	for !closeNow() {
		if err := workflow.Await(ctx, func() bool { return len(queue) > 0 || disclose || full }); err != nil {
			cancelled = true
			break
		}
		decideQueued()
		if !timing && state.Batches > 0 {
			timing = true
			timer := workflow.NewTimer(ctx, discloseWithin)
			workflow.Go(ctx, func(gctx workflow.Context) {
				_ = timer.Get(gctx, nil) // cancelled with the run: the loop ends anyway
				disclose = true
			})
		}
	}
	// Batches accepted before the close are decided before it; any that
	// reach the run while it closes are refused by the server, and their
	// senders send them to the next run.
	for {
		_ = workflow.Await(dctx, func() bool { return len(queue) > 0 || workflow.AllHandlersFinished(dctx) })
		if len(queue) == 0 {
			break
		}
		decideQueued()
	}
	outcome.upsert(dctx)
	// The loop may end on closeNow before it sees a cancel; the cancel still
	// closes the desk rather than starting its next run.
	if cancelled || ctx.Err() != nil {
		return temporal.NewCanceledError("desk closed by cancel")
	}
	keepOutcomeFromNextRun(ctx)
	return workflow.NewContinueAsNewError(ctx, EnrollmentDesk, in)
}

// decideBatches decides the batches that reached the desk in one workflow
// task as one: one reservation, one publish. Each claim carries its own
// batch's ID and collection time, so its row names its batch and its
// event's payload does not depend on which batches it was decided with. It
// returns the decisions of each batch, in order; claims that end without a
// decision are answered undecided.
func decideBatches(ctx workflow.Context, batches []DeskBatch) [][]Decision {
	var claims []EnrollmentInput
	for _, b := range batches {
		for _, c := range b.Claims {
			c.BatchID, c.OccurredAt = b.BatchID, b.CollectedAt.UTC().Truncate(time.Microsecond) // as Postgres keeps it
			claims = append(claims, c)
		}
	}
	decisions, err := reserveAndPublish(ctx, claims)
	if err != nil {
		workflow.GetLogger(ctx).Warn("desk batches ended without a decision", "batches", len(batches),
			"first_batch_id", batches[0].BatchID, "error", err)
		decisions = make([]Decision, len(claims))
		for i, c := range claims {
			decisions[i] = undecided(c.EnrollmentID, err)
		}
	}
	out := make([][]Decision, len(batches))
	next := 0
	for i, b := range batches {
		out[i] = decisions[next : next+len(b.Claims)]
		next += len(b.Claims)
	}
	return out
}

// reserveAndPublish is the desk's saga for claims: reserve, publish and
// confirm in this workflow task, or, when the publish fails, answer
// "reserved" and hand each batch's reserved claims to a batch run of its
// own. Nothing is compensated here: a reservation's compensation belongs to
// the run that finishes it (EnrollmentBatch), and one that the desk could
// not hand over is found and finished by RecoverReservations.
func reserveAndPublish(ctx workflow.Context, claims []EnrollmentInput) ([]Decision, error) {
	info := workflow.GetInfo(ctx)
	reserved, err := ReserveSeats.ExecuteLocal(localDatabaseOptions(ctx), ReserveSeatsInput{
		Claims: claims, WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID,
	})
	if err != nil {
		return nil, fmt.Errorf("reserve seats: %w", err)
	}
	if len(reserved.Decisions) != len(claims) {
		return nil, fmt.Errorf("reserve seats: %d decisions for %d claims", len(reserved.Decisions), len(claims))
	}
	var granted []EnrollmentInput
	for i, d := range reserved.Decisions {
		if d.Status == StatusReserved {
			granted = append(granted, claims[i])
		}
	}
	if len(granted) == 0 {
		return reserved.Decisions, nil
	}
	// One attempt, in this workflow task, confirming each acknowledged
	// enrollment in the statement that records its publish. ReserveSeats has
	// just read which events are out.
	fast := confirmedEvents(granted)
	fast.FailFast, fast.Confirm = true, true
	fast.PublishedKnown, fast.Published = true, reserved.Published
	if err := PublishBatch.ExecuteLocal(fastLocalOptions(ctx), fast); err == nil {
		return confirmed(reserved.Decisions), nil
	}
	startBatchRuns(ctx, granted)
	return reserved.Decisions, nil
}

// confirmed turns the reserved decisions of claims whose events are out
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

// confirmedEvents is the publish of enrollment.confirmed for each claim,
// stamped with the time its batch was collected.
func confirmedEvents(claims []EnrollmentInput) PublishBatchInput {
	var p PublishBatchInput
	for _, c := range claims {
		p.Messages = append(p.Messages, Message{Topic: EnrollmentTopic, Key: c.CourseID, Event: Event{
			ID:         EventID(c.EnrollmentID, EventEnrollmentConfirmed),
			Type:       EventEnrollmentConfirmed,
			OccurredAt: c.OccurredAt,
			Data:       enrollmentEventData(c),
		}})
		p.EnrollmentIDs = append(p.EnrollmentIDs, c.EnrollmentID)
	}
	return p
}

// startBatchRuns hands the reserved claims of each batch to the batch's
// run (enrollment-batch:<batch id>), which outlives this one, and waits for
// the starts. A batch whose run already exists has its owner: the recovery
// started it first. A batch whose run could not start keeps its claims
// reserved until RecoverReservations finds them.
func startBatchRuns(ctx workflow.Context, claims []EnrollmentInput) {
	var order []string
	byBatch := map[string][]EnrollmentInput{}
	for _, c := range claims {
		if byBatch[c.BatchID] == nil {
			order = append(order, c.BatchID)
		}
		byBatch[c.BatchID] = append(byBatch[c.BatchID], c)
	}
	futures := make([]workflow.ChildWorkflowFuture, len(order))
	for i, id := range order {
		futures[i] = startBatchRun(ctx, EnrollmentBatchInput{BatchID: id, Claims: byBatch[id]})
	}
	for i, f := range futures {
		err := f.GetChildWorkflowExecution().Get(ctx, nil)
		if err != nil && !temporal.IsWorkflowExecutionAlreadyStartedError(err) {
			workflow.GetLogger(ctx).Warn("could not start the batch's run; the reservation recovery will",
				"batch_id", order[i], "error", err)
		}
	}
}

// startBatchRun starts the run that finishes a batch's reserved claims, as
// a child that outlives its starter. Its ID is the batch's, so the desk and
// the recovery start at most one run per batch.
func startBatchRun(ctx workflow.Context, in EnrollmentBatchInput) workflow.ChildWorkflowFuture {
	list := ClaimListOf(in.Claims)
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:            EnrollmentBatchWorkflowID(in.BatchID),
		ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		TypedSearchAttributes: list.startAttributes(StatusReserved),
		StaticSummary:         fmt.Sprintf("batch %s: %d reserved claims to publish and confirm", in.BatchID, len(in.Claims)),
	})
	return workflow.ExecuteChildWorkflow(cctx, EnrollmentBatch, in)
}
