package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"
)

// EnrollmentWorkflowID names the run of one reserved enrollment: its course
// and student, for operators, and its ID, which keeps it apart from the
// student's earlier enrollments in the course.
func EnrollmentWorkflowID(c EnrollmentInput) string {
	return "enrollment:" + c.CourseID + ":" + c.StudentID + ":" + c.EnrollmentID
}

// CancellationWorkflowID makes a second cancellation of the same enrollment
// join (or follow) the first.
func CancellationWorkflowID(enrollmentID string) string {
	return "cancellation:" + enrollmentID
}

// EnrollmentInput is one enrollment claim: in a batch the API sends a desk,
// and as the input of the run that finishes one reserved enrollment.
type EnrollmentInput struct {
	// EnrollmentID is chosen by the API, so it survives a reset of the run.
	EnrollmentID string
	CourseID     string
	StudentID    string
	RequestedAt  time.Time
	// Waitlist asks, should the course be full, for a place on its
	// waitlist instead of a course_full refusal.
	Waitlist bool `json:",omitempty"`
	// BatchID names the batch that decided the claim; a desk sets it.
	BatchID string `json:",omitempty"`
	// TraceParent is the W3C traceparent of the claim's wait in the API,
	// set when tracing is on: the activities that decide the claim link
	// their spans to it, whichever run's trace they belong to.
	TraceParent string `json:",omitempty"`
	// OccurredAt is the time on the claim's events: its batch's
	// CollectedAt, set by the desk and recorded with the reservation, so
	// every copy of an event carries the same payload whichever run sends
	// it. Zero for a promoted enrollment, whose run stamps its events with
	// its own workflow time.
	OccurredAt time.Time `json:",omitzero"`
	// Promoted says the seat came from the waitlist: the run publishes
	// enrollment.promoted before enrollment.confirmed.
	Promoted bool `json:",omitempty"`
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
	claim[EnrollmentState, struct{}]
	in   EnrollmentInput
	saga saga
}

// Enrollment finishes one enrollment whose seat is reserved (by a batch
// whose publish ran out of retries, or by a promotion from the waitlist):
// it publishes enrollment.confirmed with acks from all replicas, parking it
// as a dead letter when the policy is spent, and marks the enrollment
// confirmed; an operator's compensate gives the seat back.
func Enrollment(ctx workflow.Context, in EnrollmentInput) (EnrollmentState, error) {
	e := &enrollment{in: in}
	e.state = EnrollmentState{
		EnrollmentID: in.EnrollmentID,
		CourseID:     in.CourseID,
		StudentID:    in.StudentID,
		Status:       StatusReserved,
	}
	if err := e.register(ctx, nil); err != nil {
		return e.state, err
	}
	err := e.run(ctx)
	e.end(ctx, err, nil)
	return e.state, err
}

func (e *enrollment) setStatus(ctx workflow.Context, s EnrollmentStatus) {
	e.state.Status = s
	upsertClaimStatus(ctx, string(s))
}

func (e *enrollment) run(ctx workflow.Context) (err error) {
	// A cancelled run (operator `temporal workflow cancel`) gives its seat back.
	defer e.saga.unwindIfCancelled(ctx, &err, e.fail)
	e.saga.add(func(ctx workflow.Context) error {
		return ReleaseSeat.Execute(compensationOptions(ctx), ReleaseSeatInput{EnrollmentID: e.in.EnrollmentID})
	})

	occurredAt := e.in.OccurredAt
	if occurredAt.IsZero() {
		occurredAt = workflow.Now(ctx).UTC()
	}
	if e.in.Promoted {
		// Downstream hears that the seat came from the waitlist, then, as
		// for any enrollment, that it is confirmed.
		promoted := Message{Topic: EnrollmentTopic, Key: e.in.CourseID, Event: Event{
			ID: EventID(e.in.EnrollmentID, EventEnrollmentPromoted), Type: EventEnrollmentPromoted,
			OccurredAt: occurredAt, Data: enrollmentEventData(e.in),
		}}
		action, err := publishOrDeadLetter(ctx, &e.state, promoted, "", e.setStatus)
		if err != nil {
			return err
		}
		if action == ActionCompensate {
			return e.fail(ctx)
		}
	}
	confirmed := Message{Topic: EnrollmentTopic, Key: e.in.CourseID, Event: Event{
		ID:         EventID(e.in.EnrollmentID, EventEnrollmentConfirmed),
		Type:       EventEnrollmentConfirmed,
		OccurredAt: occurredAt,
		Data:       enrollmentEventData(e.in),
	}}
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
	cctx, cancel := workflow.NewDisconnectedContext(databaseOptions(ctx))
	defer cancel()
	if err := MarkConfirmed.Execute(cctx, e.in.EnrollmentID); err != nil {
		return fmt.Errorf("mark %s confirmed: %w", e.in.EnrollmentID, err)
	}
	e.setStatus(ctx, StatusConfirmed)
	return nil
}

// fail gives the seat back, hands it to the course's waitlist, tells
// downstream and settles the dead letter. Both the operator's compensate
// and a cancelled run end here; on cancel ctx is disconnected.
func (e *enrollment) fail(ctx workflow.Context) error {
	if err := e.saga.compensate(ctx); err != nil {
		return fmt.Errorf("compensate enrollment %s: %w", e.in.EnrollmentID, err)
	}
	e.setStatus(ctx, StatusFailed)
	if err := startPromotion(ctx, e.in.CourseID, e.in.EnrollmentID+":failed"); err != nil {
		return err
	}
	failed := Message{Topic: EnrollmentTopic, Key: e.in.CourseID, Event: Event{
		ID:         EventID(e.in.EnrollmentID, EventEnrollmentFailed),
		Type:       EventEnrollmentFailed,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data:       enrollmentEventData(e.in),
	}}
	// Downstream must learn that the seat was given back; this publish
	// retries until Kafka is back rather than dead-lettering again.
	if err := Publish.Execute(compensationOptions(ctx), PublishInput{Message: failed}); err != nil {
		return fmt.Errorf("publish %s: %w", failed.Event.ID, err)
	}
	return resolveDeadLetter(ctx, e.state.DeadLetterID, DeadLetterCompensated)
}

// enrollmentEventData is the data of every event about an enrollment.
func enrollmentEventData(c EnrollmentInput) map[string]any {
	return map[string]any{
		"enrollment_id": c.EnrollmentID,
		"course_id":     c.CourseID,
		"student_id":    c.StudentID,
	}
}
