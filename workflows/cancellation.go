package workflows

import (
	"fmt"

	"go.temporal.io/sdk/workflow"
)

type CancellationInput struct {
	EnrollmentID string
}

// Cancellation frees the seat of a confirmed enrollment, marks it cancelled
// and publishes enrollment.cancelled. A second cancellation of the same
// enrollment changes nothing and publishes nothing.
func Cancellation(ctx workflow.Context, in CancellationInput) (EnrollmentState, error) {
	c := &claim[EnrollmentState, Decision]{state: EnrollmentState{EnrollmentID: in.EnrollmentID, Status: StatusPending}}
	// Unlike an enrollment's, a cancellation's ClaimStatus shows "refused"
	// rather than the refusal's code; recorded histories hold these values,
	// so they stay.
	setStatus := func(ctx workflow.Context, s EnrollmentStatus) {
		c.state.Status = s
		upsertClaimStatus(ctx, string(s))
	}
	c.onDecide = func(ctx workflow.Context, d Decision) { setStatus(ctx, d.Status) }
	if err := c.register(ctx, same[Decision]); err != nil {
		return c.state, err
	}
	err := runCancellation(ctx, in, c, setStatus)
	c.end(ctx, err, func(err error) Decision { return undecided(in.EnrollmentID, err) })
	return c.state, err
}

func runCancellation(ctx workflow.Context, in CancellationInput, c *claim[EnrollmentState, Decision],
	setStatus func(workflow.Context, EnrollmentStatus)) error {
	state := &c.state
	result, err := CancelEnrollment.Execute(databaseOptions(ctx), CancelEnrollmentInput{
		EnrollmentID: in.EnrollmentID, RunID: workflow.GetInfo(ctx).WorkflowExecution.RunID,
	})
	if refused, ok := refusalOf(err); ok {
		state.Refusal = refused.Refusal
		c.decide(ctx, Decision{EnrollmentID: in.EnrollmentID, Status: StatusRefused, Refusal: refused.Refusal, Message: refused.Message})
		return nil
	}
	if err != nil {
		return fmt.Errorf("cancel enrollment %s: %w", in.EnrollmentID, err)
	}
	state.CourseID, state.StudentID = result.CourseID, result.StudentID
	if err := workflow.UpsertTypedSearchAttributes(ctx,
		SearchCourseID.ValueSet([]string{result.CourseID}), SearchStudentID.ValueSet([]string{result.StudentID})); err != nil {
		workflow.GetLogger(ctx).Warn("upsert search attributes failed", "error", err)
	}
	c.decide(ctx, Decision{EnrollmentID: in.EnrollmentID, Status: result.Status})
	if !result.Changed || result.LeftWaitlist {
		// A waitlisted enrollment held no seat, and downstream never heard
		// of it: leaving the queue frees nothing and tells nobody.
		return nil
	}
	if result.FreedSeat {
		// The seat goes to the head of the waitlist before the cancellation
		// is published: a broker outage must not keep it free.
		if err := startPromotion(ctx, result.CourseID, in.EnrollmentID+":cancelled"); err != nil {
			return err
		}
	}

	cancelled := Message{Topic: EnrollmentTopic, Key: result.CourseID, Event: Event{
		ID:         EventID(in.EnrollmentID, EventEnrollmentCancelled),
		Type:       EventEnrollmentCancelled,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data: map[string]any{
			"enrollment_id": in.EnrollmentID,
			"course_id":     result.CourseID,
			"student_id":    result.StudentID,
		},
	}}
	action, err := publishOrDeadLetter(ctx, state, cancelled, "", setStatus)
	if err != nil {
		return err
	}
	if action == ActionCompensate {
		// A cancellation cannot be undone: the seat may already belong to
		// someone else. The operator's "compensate" drops the event instead.
		setStatus(ctx, StatusCancelled)
		return resolveDeadLetter(ctx, state.DeadLetterID, DeadLetterDiscarded)
	}
	return nil
}
