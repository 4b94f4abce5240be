package workflows

import (
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// The waitlist's promotions. Whatever frees a seat — a cancellation, the
// compensation of an enrollment after its dead letter, an admin raising a
// course's capacity — starts a Promotion run for the course (as a child
// that outlives it, or from the API). The run promotes the head of the
// queue into every free seat in one transaction (PromoteWaitlist) and
// hands each promoted enrollment to an Enrollment run of its own, which
// publishes enrollment.promoted and enrollment.confirmed, dead-letters and
// compensates exactly like any enrollment. Its compensation frees the seat
// again, and that starts the next Promotion.

// Events of the waitlist.
const EventEnrollmentPromoted = "enrollment.promoted"

// PromotionWorkflowID: one promotion per seat-freeing step, so a replayed
// or retried step joins the promotion it started.
func PromotionWorkflowID(courseID, by string) string {
	return "promotion:" + courseID + ":" + by
}

// PromotionState is what the status query of a Promotion returns.
type PromotionState struct {
	CourseID string
	By       string
	Promoted []string `json:",omitempty"`
	Status   EnrollmentStatus
}

// Promotion promotes the head of a course's waitlist into its free seats.
func Promotion(ctx workflow.Context, in PromoteWaitlistInput) (PromotionState, error) {
	c := &claim[PromotionState, struct{}]{state: PromotionState{CourseID: in.CourseID, By: in.By, Status: StatusPending}}
	if err := c.register(ctx, nil); err != nil {
		return c.state, err
	}
	err := promote(ctx, in, &c.state)
	c.end(ctx, err, nil)
	if err != nil {
		c.state.Status = StatusFailed
	}
	// In the task that closes the run, so it costs no visibility write of
	// its own (visibility.go).
	upsertClaimStatus(ctx, string(c.state.Status))
	return c.state, err
}

func promote(ctx workflow.Context, in PromoteWaitlistInput, state *PromotionState) error {
	res, err := PromoteWaitlist.Execute(databaseOptions(ctx), in)
	if err != nil {
		return fmt.Errorf("promote from the waitlist of %s: %w", in.CourseID, err)
	}
	var futures []workflow.ChildWorkflowFuture
	for _, p := range res.Promoted {
		p.Promoted = true
		futures = append(futures, startEnrollment(ctx, p))
		state.Promoted = append(state.Promoted, p.EnrollmentID)
	}
	for i, f := range futures {
		// Wait for the start only; each promoted enrollment's outcome is
		// its own run's.
		if err := f.GetChildWorkflowExecution().Get(ctx, nil); err != nil && !temporal.IsWorkflowExecutionAlreadyStartedError(err) {
			return fmt.Errorf("start the run of promoted enrollment %s: %w", res.Promoted[i].EnrollmentID, err)
		}
	}
	state.Status = StatusConfirmed
	return nil
}

// startPromotion starts the Promotion of the seats a step freed, as a
// child that outlives the caller, and waits for its start only.
func startPromotion(ctx workflow.Context, courseID, by string) error {
	in := PromoteWaitlistInput{CourseID: courseID, By: by}
	cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
		WorkflowID:            PromotionWorkflowID(courseID, by),
		ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SearchCourseID.ValueSet([]string{courseID}),
			SearchClaimStatus.ValueSet(string(StatusPending)),
		),
	})
	err := workflow.ExecuteChildWorkflow(cctx, Promotion, in).GetChildWorkflowExecution().Get(ctx, nil)
	if err != nil && !temporal.IsWorkflowExecutionAlreadyStartedError(err) {
		return fmt.Errorf("start the promotion of %s's waitlist: %w", courseID, err)
	}
	return nil
}
