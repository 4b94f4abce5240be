package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Names of the handlers clients and operators use.
const (
	// UpdateDecision returns the definitive answer of a claim as soon as it is
	// decided, while the rest of the saga goes on durably.
	UpdateDecision = "decision"
	// QueryStatus returns the run's current EnrollmentState.
	QueryStatus = "status"
	// SignalDeadLetter carries an operator's DeadLetterDecision.
	SignalDeadLetter = "dead-letter"
)

// EnrollmentWorkflowID is built from the business key, so concurrent
// requests of one student for one course meet in one run.
func EnrollmentWorkflowID(courseID, studentID string) string {
	return "enrollment:" + courseID + ":" + studentID
}

// CancellationWorkflowID makes a second cancellation of the same enrollment
// join (or follow) the first.
func CancellationWorkflowID(enrollmentID string) string {
	return "cancellation:" + enrollmentID
}

type EnrollmentInput struct {
	// EnrollmentID is chosen by the caller so it survives a reset of the run.
	EnrollmentID string
	CourseID     string
	StudentID    string
	RequestedAt  time.Time
	// Reserved says the seat is already taken for this enrollment (by a
	// batch run), so the run starts at the publish step.
	Reserved bool `json:",omitempty"`
}

// Decision is the answer to a claim. Refusal is set when Status is refused;
// EnrollmentID then names the enrollment that already holds the claim, if any.
type Decision struct {
	EnrollmentID string
	Status       EnrollmentStatus
	Refusal      Refusal `json:",omitempty"`
	Message      string  `json:",omitempty"`
}

// EnrollmentState is what the status query returns.
type EnrollmentState struct {
	EnrollmentID string
	CourseID     string
	StudentID    string
	Status       EnrollmentStatus
	Refusal      Refusal `json:",omitempty"`
	DeadLetterID int64   `json:",omitempty"`
	LastError    string  `json:",omitempty"`
}

// DeadLetterAction is an operator's choice for a parked message.
type DeadLetterAction string

const (
	ActionRetry      DeadLetterAction = "retry"
	ActionCompensate DeadLetterAction = "compensate"
)

type DeadLetterDecision struct {
	Action DeadLetterAction
}

// PublishRetryPolicy is the user's consumer backoff, 1 s → 2 s → 4 s: four
// attempts, then the message is dead-lettered.
var PublishRetryPolicy = &temporal.RetryPolicy{
	InitialInterval:    time.Second,
	BackoffCoefficient: 2,
	MaximumInterval:    4 * time.Second,
	MaximumAttempts:    4,
}

// Database steps retry until Postgres is back: an outage must delay a claim,
// never drop it. Refusals are non-retryable errors and end at once.
var databaseRetryPolicy = &temporal.RetryPolicy{
	InitialInterval:    100 * time.Millisecond,
	BackoffCoefficient: 2,
	MaximumInterval:    10 * time.Second,
}

func databaseOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         databaseRetryPolicy,
	})
}

func publishOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 15 * time.Second,
		RetryPolicy:         PublishRetryPolicy,
	})
}

// compensationOptions has no ScheduleToClose bound: a compensation must
// finish eventually, however long an outage lasts.
func compensationOptions(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 15 * time.Second,
		RetryPolicy:         databaseRetryPolicy,
	})
}

// saga collects compensations and runs them last-in first-out.
type saga struct {
	compensations []func(workflow.Context) error
}

// add registers a compensation; call it before the step it undoes, so a step
// that took effect but reported failure is still undone.
func (s *saga) add(c func(workflow.Context) error) {
	s.compensations = append(s.compensations, c)
}

// compensate runs on a disconnected context so that it also completes after
// the run was cancelled.
func (s *saga) compensate(ctx workflow.Context) error {
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	var errs []error
	for i := len(s.compensations) - 1; i >= 0; i-- {
		if err := s.compensations[i](dctx); err != nil {
			errs = append(errs, err)
		}
	}
	s.compensations = nil
	return errors.Join(errs...)
}

// enrollment is one run of the enrollment saga.
type enrollment struct {
	in       EnrollmentInput
	state    EnrollmentState
	decision *Decision
	// answered counts decision requests: the first is the claim itself, any
	// later one is a second claim of the same seat by the same student.
	answered int
	saga     saga
}

// Enrollment reserves a seat, publishes enrollment.confirmed with acks from
// all replicas and marks the enrollment confirmed. The caller learns the
// outcome through UpdateDecision as soon as the seat is decided.
func Enrollment(ctx workflow.Context, in EnrollmentInput) (EnrollmentState, error) {
	e := &enrollment{
		in: in,
		state: EnrollmentState{
			EnrollmentID: in.EnrollmentID,
			CourseID:     in.CourseID,
			StudentID:    in.StudentID,
			Status:       StatusPending,
		},
	}
	if err := e.registerHandlers(ctx); err != nil {
		return e.state, err
	}
	err := e.run(ctx)
	if e.decision == nil {
		// The run ends without a decision (a fault that is not a refusal, or
		// an operator's cancel): callers waiting on it must hear so.
		e.decide(ctx, undecided(e.in.EnrollmentID, err))
	}
	// Every caller waiting on the decision gets it before the run closes.
	_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
	return e.state, err
}

func undecided(id string, err error) Decision {
	msg := "the claim ended without a decision"
	if err != nil {
		msg += ": " + err.Error()
	}
	return Decision{EnrollmentID: id, Status: StatusFailed, Message: msg}
}

func (e *enrollment) registerHandlers(ctx workflow.Context) error {
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (EnrollmentState, error) {
		return e.state, nil
	}); err != nil {
		return fmt.Errorf("register status query: %w", err)
	}
	return workflow.SetUpdateHandler(ctx, UpdateDecision, func(ctx workflow.Context) (Decision, error) {
		e.answered++
		first := e.answered == 1
		if err := workflow.Await(ctx, func() bool { return e.decision != nil }); err != nil {
			return Decision{}, err
		}
		d := *e.decision
		if !first && d.Status == StatusReserved {
			// The seat is already this student's: a second claim gets the
			// same answer the database would give once this run is over.
			d = Decision{EnrollmentID: d.EnrollmentID, Status: StatusRefused, Refusal: RefusalAlreadyEnrolled,
				Message: "student already holds this seat"}
		}
		return d, nil
	})
}

func (e *enrollment) decide(ctx workflow.Context, d Decision) {
	e.decision = &d
	e.setStatus(ctx, d.Status)
}

func (e *enrollment) setStatus(ctx workflow.Context, s EnrollmentStatus) {
	e.state.Status = s
	claim := string(s)
	if s == StatusRefused {
		claim = string(e.state.Refusal)
	}
	// A failed upsert only makes the UI filter stale; it must not fail the saga.
	if err := workflow.UpsertTypedSearchAttributes(ctx, SearchClaimStatus.ValueSet(claim)); err != nil {
		workflow.GetLogger(ctx).Warn("upsert ClaimStatus failed", "error", err)
	}
}

func (e *enrollment) run(ctx workflow.Context) (err error) {
	defer func() {
		// A cancelled run (operator `temporal workflow cancel`) gives its seat back.
		if temporal.IsCanceledError(err) && len(e.saga.compensations) > 0 {
			dctx, cancel := workflow.NewDisconnectedContext(ctx)
			defer cancel()
			if cerr := e.fail(dctx); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}()
	dbCtx := databaseOptions(ctx)

	e.saga.add(func(ctx workflow.Context) error {
		return workflow.ExecuteActivity(compensationOptions(ctx), ActivityReleaseSeat,
			ReleaseSeatInput{EnrollmentID: e.in.EnrollmentID}).Get(ctx, nil)
	})
	if e.in.Reserved {
		// A batch run reserved the seat and handed this enrollment over
		// because its publish ran out of retries.
		e.decide(ctx, Decision{EnrollmentID: e.in.EnrollmentID, Status: StatusReserved})
	} else if refused, err := e.reserve(ctx, dbCtx); err != nil || refused {
		return err
	}

	occurredAt := workflow.Now(ctx).UTC()
	confirmed := Message{
		Topic: EnrollmentTopic,
		Key:   e.in.CourseID,
		Event: Event{
			ID:         EventID(e.in.EnrollmentID, EventEnrollmentConfirmed),
			Type:       EventEnrollmentConfirmed,
			OccurredAt: occurredAt,
			Data:       e.eventData(),
		},
	}
	action, err := publishOrDeadLetter(ctx, &e.state, confirmed, e.in.EnrollmentID, e.setStatus)
	if err != nil {
		return err
	}
	if action == ActionCompensate {
		return e.fail(ctx)
	}

	// enrollment.confirmed is out: the seat is the student's. Nothing is
	// compensated any more, and the run finishes even if cancelled now.
	e.saga.compensations = nil
	cctx, cancel := workflow.NewDisconnectedContext(dbCtx)
	defer cancel()
	if err := workflow.ExecuteActivity(cctx, ActivityMarkConfirmed, e.in.EnrollmentID).Get(cctx, nil); err != nil {
		return fmt.Errorf("mark %s confirmed: %w", e.in.EnrollmentID, err)
	}
	e.setStatus(ctx, StatusConfirmed)
	return nil
}

// fail gives the seat back, tells downstream (if the seat had been granted)
// and settles the dead letter. Both the operator's compensate and a
// cancelled run end here; on cancel ctx is disconnected.
func (e *enrollment) fail(ctx workflow.Context) error {
	if err := e.saga.compensate(ctx); err != nil {
		return fmt.Errorf("compensate enrollment %s: %w", e.in.EnrollmentID, err)
	}
	e.setStatus(ctx, StatusFailed)
	if e.decision == nil || e.decision.Status != StatusReserved {
		return nil
	}
	failed := Message{Topic: EnrollmentTopic, Key: e.in.CourseID, Event: Event{
		ID:         EventID(e.in.EnrollmentID, EventEnrollmentFailed),
		Type:       EventEnrollmentFailed,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data:       e.eventData(),
	}}
	// Downstream must learn that the seat was given back; this publish
	// retries until Kafka is back rather than dead-lettering again.
	if err := workflow.ExecuteActivity(compensationOptions(ctx), ActivityPublish,
		PublishInput{Message: failed}).Get(ctx, nil); err != nil {
		return fmt.Errorf("publish %s: %w", failed.Event.ID, err)
	}
	return resolveDeadLetter(ctx, e.state.DeadLetterID, DeadLetterCompensated)
}

// reserve takes the seat and decides the claim; refused reports a business
// refusal (already decided and answered).
func (e *enrollment) reserve(ctx, dbCtx workflow.Context) (refused bool, err error) {
	info := workflow.GetInfo(ctx)
	var reserved ReserveSeatResult
	err = workflow.ExecuteActivity(dbCtx, ActivityReserveSeat, ReserveSeatInput{
		EnrollmentID: e.in.EnrollmentID,
		CourseID:     e.in.CourseID,
		StudentID:    e.in.StudentID,
		WorkflowID:   info.WorkflowExecution.ID,
		RunID:        info.WorkflowExecution.RunID,
		RequestedAt:  e.in.RequestedAt,
	}).Get(ctx, &reserved)
	if r, ok := refusalOf(err); ok {
		// Nothing was reserved, so there is nothing to compensate.
		e.saga.compensations = nil
		e.state.Refusal = r.Refusal
		d := Decision{EnrollmentID: e.in.EnrollmentID, Status: StatusRefused, Refusal: r.Refusal, Message: r.Message}
		if r.Holder != "" {
			d.EnrollmentID = r.Holder
		}
		e.decide(ctx, d)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reserve seat: %w", err)
	}
	e.decide(ctx, Decision{EnrollmentID: e.in.EnrollmentID, Status: StatusReserved})
	return false, nil
}

func (e *enrollment) eventData() map[string]any {
	return map[string]any{
		"enrollment_id": e.in.EnrollmentID,
		"course_id":     e.in.CourseID,
		"student_id":    e.in.StudentID,
	}
}

// publishOrDeadLetter publishes msg on the publish retry policy. When the
// policy is exhausted it parks the message (a dead-letter row, a copy on the
// .DLT topic, status dead_lettered) and waits for an operator: retry publishes
// again with the same event ID, compensate returns ActionCompensate to the
// caller. It returns "" once the message is published (and any dead letter
// it left on the way is resolved).
func publishOrDeadLetter(ctx workflow.Context, state *EnrollmentState, msg Message, stampFor string,
	setStatus func(workflow.Context, EnrollmentStatus)) (DeadLetterAction, error) {
	statusBefore := state.Status
	return publishOrPark(ctx, msg, stampFor, parking{
		deadLetterID: &state.DeadLetterID,
		lastError:    &state.LastError,
		park:         func(ctx workflow.Context) { setStatus(ctx, StatusDeadLettered) },
		unpark:       func(ctx workflow.Context) { setStatus(ctx, statusBefore) },
	})
}

// parking is the part of a run's state the publish-or-dead-letter loop keeps
// current, whatever the saga: the open dead letter, the last error, and how
// the run shows that it is parked (status dead_lettered) and no longer is.
type parking struct {
	deadLetterID *int64
	lastError    *string
	park, unpark func(workflow.Context)
}

// publishOrPark is publishOrDeadLetter for any saga. stampFor names the
// enrollment whose published_at and dead-letter status are kept ("" for
// none).
func publishOrPark(ctx workflow.Context, msg Message, stampFor string, p parking) (DeadLetterAction, error) {
	info := workflow.GetInfo(ctx)
	deadLetters := workflow.GetSignalChannel(ctx, SignalDeadLetter)
	for round := 1; ; round++ {
		err := workflow.ExecuteActivity(publishOptions(ctx), ActivityPublish,
			PublishInput{Message: msg, StampPublishedFor: stampFor}).Get(ctx, nil)
		if err == nil {
			if *p.deadLetterID == 0 {
				return "", nil
			}
			// Resolve before the caller moves on, so that whoever sees the
			// enrollment confirmed also sees its dead letter resolved.
			p.unpark(ctx)
			return "", resolveDeadLetter(ctx, *p.deadLetterID, DeadLetterResolved)
		}
		if temporal.IsCanceledError(err) {
			return "", err
		}
		*p.lastError = err.Error()
		var record DeadLetterRecord
		if err := workflow.ExecuteActivity(databaseOptions(ctx), ActivityRecordDeadLetter, DeadLetterInput{
			Message:      msg,
			WorkflowID:   info.WorkflowExecution.ID,
			RunID:        info.WorkflowExecution.RunID,
			EnrollmentID: stampFor,
			Error:        *p.lastError,
			Round:        round,
		}).Get(ctx, &record); err != nil {
			return "", fmt.Errorf("record dead letter for %s: %w", msg.Event.ID, err)
		}
		*p.deadLetterID = record.ID
		p.park(ctx)
		workflow.GetLogger(ctx).Error("event dead-lettered; waiting for an operator",
			"event_id", msg.Event.ID, "dead_letter_id", record.ID, "error", *p.lastError)

		action, err := awaitOperator(ctx, deadLetters)
		if err != nil {
			return "", err
		}
		if action == ActionCompensate {
			return ActionCompensate, nil
		}
		if err := resolveDeadLetter(ctx, record.ID, DeadLetterRetrying); err != nil {
			return "", err
		}
	}
}

// awaitOperator blocks until an operator decides; a decision it does not know
// (a typo on the CLI) is logged and ignored rather than guessed at.
func awaitOperator(ctx workflow.Context, decisions workflow.ReceiveChannel) (DeadLetterAction, error) {
	for {
		var decision DeadLetterDecision
		cancelled := false
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(decisions, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, &decision) })
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) { cancelled = true })
		sel.Select(ctx)
		if cancelled {
			return "", temporal.NewCanceledError()
		}
		switch decision.Action {
		case ActionRetry, ActionCompensate:
			return decision.Action, nil
		}
		workflow.GetLogger(ctx).Warn("ignoring unknown dead-letter decision; send retry or compensate",
			"action", decision.Action)
	}
}

func resolveDeadLetter(ctx workflow.Context, id int64, state DeadLetterState) error {
	if id == 0 {
		return nil
	}
	err := workflow.ExecuteActivity(databaseOptions(ctx), ActivityResolveDeadLetter,
		ResolveDeadLetterInput{ID: id, State: state}).Get(ctx, nil)
	if err != nil {
		return fmt.Errorf("mark dead letter %d %s: %w", id, state, err)
	}
	return nil
}
