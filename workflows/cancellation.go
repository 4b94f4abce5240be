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
	state := EnrollmentState{EnrollmentID: in.EnrollmentID, Status: StatusPending}
	var decision *Decision
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (EnrollmentState, error) {
		return state, nil
	}); err != nil {
		return state, fmt.Errorf("register status query: %w", err)
	}
	if err := workflow.SetUpdateHandler(ctx, UpdateDecision, func(ctx workflow.Context) (Decision, error) {
		if err := workflow.Await(ctx, func() bool { return decision != nil }); err != nil {
			return Decision{}, err
		}
		return *decision, nil
	}); err != nil {
		return state, fmt.Errorf("register decision update: %w", err)
	}
	setStatus := func(ctx workflow.Context, s EnrollmentStatus) {
		state.Status = s
		if err := workflow.UpsertTypedSearchAttributes(ctx, SearchClaimStatus.ValueSet(string(s))); err != nil {
			workflow.GetLogger(ctx).Warn("upsert ClaimStatus failed", "error", err)
		}
	}

	err := runCancellation(ctx, in, &state, setStatus, func(d Decision) { decision = &d })
	if decision == nil {
		d := undecided(in.EnrollmentID, err)
		decision = &d
		setStatus(ctx, StatusFailed)
	}
	_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
	return state, err
}

func runCancellation(ctx workflow.Context, in CancellationInput, state *EnrollmentState,
	setStatus func(workflow.Context, EnrollmentStatus), decide func(Decision)) error {
	var result CancelEnrollmentResult
	err := workflow.ExecuteActivity(databaseOptions(ctx), ActivityCancelEnrollment,
		CancelEnrollmentInput{EnrollmentID: in.EnrollmentID}).Get(ctx, &result)
	if refused, ok := refusalOf(err); ok {
		state.Refusal = refused.Refusal
		setStatus(ctx, StatusRefused)
		decide(Decision{EnrollmentID: in.EnrollmentID, Status: StatusRefused, Refusal: refused.Refusal, Message: refused.Message})
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
	setStatus(ctx, result.Status)
	decide(Decision{EnrollmentID: in.EnrollmentID, Status: result.Status})
	if !result.Changed {
		return nil
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
