package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"
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
	// batch run, or by a promotion from the waitlist), so the run starts at
	// the publish step.
	Reserved bool `json:",omitempty"`
	// Waitlist asks, should the course be full, for a place on its
	// waitlist instead of a course_full refusal.
	Waitlist bool `json:",omitempty"`
	// Promoted says the seat came from the waitlist: the run publishes
	// enrollment.promoted before enrollment.confirmed.
	Promoted bool `json:",omitempty"`
	// OccurredAt is the time on the events a batch run may already have
	// published for this enrollment before handing it over: the run
	// publishes the same payload under the same event ID, so copies on the
	// topic stay identical. A desk sets it on each claim to its batch's
	// CollectedAt before it merges the batches of one workflow task. Zero
	// for every other run, which stamps its events with its own workflow
	// time.
	OccurredAt time.Time `json:",omitzero"`
	// StarterUpdateID is the ID of the decision update of the request that
	// starts the run, and AnswerWait how long that request waits for its
	// answer (the API's decision wait): the run answers that update as the
	// claim itself and stays open for it that long (claim.expectStarter).
	// Empty for runs started by other runs, and for runs started before
	// the API named it.
	StarterUpdateID string        `json:",omitempty"`
	AnswerWait      time.Duration `json:",omitempty"`
}

// Decision is the answer to a claim. Refusal is set when Status is refused;
// EnrollmentID then names the enrollment that already holds the claim, if any.
type Decision struct {
	EnrollmentID string
	Status       EnrollmentStatus
	Refusal      Refusal `json:",omitempty"`
	Message      string  `json:",omitempty"`
	// Position is a waitlisted claim's place in the queue, 1 first.
	Position int `json:",omitempty"`
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

// enrollment is one run of the enrollment saga.
type enrollment struct {
	claim[EnrollmentState, Decision]
	in   EnrollmentInput
	saga saga
}

// Enrollment reserves a seat, publishes enrollment.confirmed with acks from
// all replicas and marks the enrollment confirmed. The caller learns the
// outcome through UpdateDecision as soon as the seat is decided.
func Enrollment(ctx workflow.Context, in EnrollmentInput) (EnrollmentState, error) {
	e := &enrollment{in: in}
	e.state = EnrollmentState{
		EnrollmentID: in.EnrollmentID,
		CourseID:     in.CourseID,
		StudentID:    in.StudentID,
		Status:       StatusPending,
	}
	e.onDecide = func(ctx workflow.Context, d Decision) { e.setStatus(ctx, d.Status) }
	e.expectStarter(in.StarterUpdateID, in.AnswerWait)
	if err := e.register(ctx, answerSecondEnrollment); err != nil {
		return e.state, err
	}
	err := e.run(ctx)
	e.end(ctx, err, func(err error) Decision { return undecided(in.EnrollmentID, err) })
	return e.state, err
}

// answerSecondEnrollment: the seat is already this student's, so a second
// claim gets the same answer the database would give once this run is over.
func answerSecondEnrollment(d Decision, first bool) Decision {
	if !first && d.Status == StatusReserved {
		return Decision{EnrollmentID: d.EnrollmentID, Status: StatusRefused, Refusal: RefusalAlreadyEnrolled,
			Message: "student already holds this seat"}
	}
	return d
}

func (e *enrollment) setStatus(ctx workflow.Context, s EnrollmentStatus) {
	e.state.Status = s
	claim := string(s)
	if s == StatusRefused {
		claim = string(e.state.Refusal)
	}
	upsertClaimStatus(ctx, claim)
}

func (e *enrollment) run(ctx workflow.Context) (err error) {
	// A cancelled run (operator `temporal workflow cancel`) gives its seat back.
	defer e.saga.unwindIfCancelled(ctx, &err, e.fail)
	dbCtx := databaseOptions(ctx)

	e.saga.add(func(ctx workflow.Context) error {
		return ReleaseSeat.Execute(compensationOptions(ctx), ReleaseSeatInput{EnrollmentID: e.in.EnrollmentID})
	})
	if e.in.Reserved {
		// A batch run reserved the seat and handed this enrollment over
		// because its publish ran out of retries.
		e.decide(ctx, Decision{EnrollmentID: e.in.EnrollmentID, Status: StatusReserved})
	} else if refused, err := e.reserve(ctx, dbCtx); err != nil || refused {
		return err
	}

	occurredAt := e.in.OccurredAt
	if occurredAt.IsZero() {
		occurredAt = workflow.Now(ctx).UTC()
	}
	if e.in.Promoted {
		// Downstream hears that the seat came from the waitlist, then, as
		// for any enrollment, that it is confirmed.
		promoted := Message{Topic: EnrollmentTopic, Key: e.in.CourseID, Event: Event{
			ID: EventID(e.in.EnrollmentID, EventEnrollmentPromoted), Type: EventEnrollmentPromoted,
			OccurredAt: occurredAt, Data: e.eventData(),
		}}
		action, err := publishOrDeadLetter(ctx, &e.state, promoted, "", e.setStatus)
		if err != nil {
			return err
		}
		if action == ActionCompensate {
			return e.fail(ctx)
		}
	}
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
	e.saga.forget()
	cctx, cancel := workflow.NewDisconnectedContext(dbCtx)
	defer cancel()
	if err := MarkConfirmed.Execute(cctx, e.in.EnrollmentID); err != nil {
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
	// The seat is free again: the course's waitlist takes it. Runs
	// recorded before the waitlist existed replay without the child.
	if workflow.GetVersion(ctx, waitlistChangeID, workflow.DefaultVersion, 1) >= 1 {
		if err := startPromotion(ctx, e.in.CourseID, e.in.EnrollmentID+":failed"); err != nil {
			return err
		}
	}
	failed := Message{Topic: EnrollmentTopic, Key: e.in.CourseID, Event: Event{
		ID:         EventID(e.in.EnrollmentID, EventEnrollmentFailed),
		Type:       EventEnrollmentFailed,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data:       e.eventData(),
	}}
	// Downstream must learn that the seat was given back; this publish
	// retries until Kafka is back rather than dead-lettering again.
	if err := Publish.Execute(compensationOptions(ctx), PublishInput{Message: failed}); err != nil {
		return fmt.Errorf("publish %s: %w", failed.Event.ID, err)
	}
	return resolveDeadLetter(ctx, e.state.DeadLetterID, DeadLetterCompensated)
}

// reserve takes the seat and decides the claim; refused reports a business
// refusal (already decided and answered).
func (e *enrollment) reserve(ctx, dbCtx workflow.Context) (refused bool, err error) {
	info := workflow.GetInfo(ctx)
	res, err := ReserveSeat.Execute(dbCtx, ReserveSeatInput{
		EnrollmentID: e.in.EnrollmentID,
		CourseID:     e.in.CourseID,
		StudentID:    e.in.StudentID,
		WorkflowID:   info.WorkflowExecution.ID,
		RunID:        info.WorkflowExecution.RunID,
		RequestedAt:  e.in.RequestedAt,
		Waitlist:     e.in.Waitlist,
	})
	if r, ok := refusalOf(err); ok {
		// Nothing was reserved, so there is nothing to compensate.
		e.saga.forget()
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
	if res.Position > 0 {
		// On the waitlist: no seat, nothing to publish or compensate. A
		// promotion gives the enrollment a run of its own.
		e.saga.forget()
		e.decide(ctx, Decision{EnrollmentID: e.in.EnrollmentID, Status: StatusWaitlisted, Position: res.Position})
		return true, nil
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
