package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// A full course with a waitlist: a claim on a desk that asks to wait gets a
// place (decision waitlisted, with its position) and publishes nothing;
// without the flag the answer stays course_full.
func TestEnrollmentJoinsTheWaitlist(t *testing.T) {
	f := newBatchFake().withCourse(courseID, 1, 1)
	env, _ := newBatchEnv(t, f)
	waits := claim(enrollmentID, courseID, studentID)
	waits.Waitlist = true
	call := sendDeskBatch(env, deskBatch("b-1", waits, claim("enr-plain", courseID, "stu-plain")), 0)

	env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{BatchesPerRun: 1})

	got := call.result(t)
	require.Len(t, got, 2)
	assert.Equal(t, workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusWaitlisted, Position: 1}, got[0])
	assert.Equal(t, workflows.RefusalCourseFull, got[1].Refusal, "someone waits: no seat for a newcomer")
	assert.Empty(t, f.publishedMessages(), "a place on the waitlist is not an event")
	assert.Equal(t, workflows.StatusWaitlisted, f.statusOf(enrollmentID))
}

// A cancellation frees a seat; its Promotion child gives it to the head of
// the waitlist, whose own Enrollment run publishes enrollment.promoted,
// then enrollment.confirmed, and confirms it. The next in line waits on.
func TestCancellationPromotesTheHeadOfTheWaitlist(t *testing.T) {
	f := newFake().withCourse(courseID, 1, 0).
		withEnrollment(enrollmentID, courseID, studentID, workflows.StatusConfirmed).
		withWaitlist(courseID,
			workflows.EnrollmentInput{EnrollmentID: "enr-w1", CourseID: courseID, StudentID: "stu-w1", RequestedAt: testStart},
			workflows.EnrollmentInput{EnrollmentID: "enr-w2", CourseID: courseID, StudentID: "stu-w2", RequestedAt: testStart})
	env, _ := newEnvWithWaitlist(t, f)
	var children []string
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, _ converter.EncodedValues) {
		children = append(children, info.WorkflowType.Name+" "+info.WorkflowExecution.ID)
	})
	cancelled := sendDecision(env, "id-1", 0)
	env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.StatusCancelled, cancelled.result(t).Status)

	w1 := workflows.EnrollmentInput{EnrollmentID: "enr-w1", CourseID: courseID, StudentID: "stu-w1"}
	assert.Equal(t, []string{
		"Promotion " + workflows.PromotionWorkflowID(courseID, enrollmentID+":cancelled"),
		"Enrollment " + workflows.EnrollmentWorkflowID(w1),
	}, children)
	var events []string
	for _, m := range f.publishedMessages() {
		events = append(events, m.Event.ID)
	}
	assert.Contains(t, events, workflows.EventID(enrollmentID, workflows.EventEnrollmentCancelled))
	promoted := indexOf(events, workflows.EventID("enr-w1", workflows.EventEnrollmentPromoted))
	confirmed := indexOf(events, workflows.EventID("enr-w1", workflows.EventEnrollmentConfirmed))
	require.True(t, promoted >= 0 && confirmed > promoted, "w1's promoted event, then its confirmed one: %v", events)
	assert.NotContains(t, events, workflows.EventID("enr-w2", workflows.EventEnrollmentPromoted))
	assert.Equal(t, 1, f.seatsTaken(courseID), "the freed seat is w1's")
	assert.Equal(t, workflows.StatusConfirmed, f.statusOf("enr-w1"))
	assert.Equal(t, workflows.StatusWaitlisted, f.statusOf("enr-w2"))
}

// A promoted enrollment whose promotion cannot be published dead-letters
// like any other; the operator's compensate gives the seat back, and that
// starts the next promotion: w2 gets it.
func TestPromotedEnrollmentCompensatedPromotesTheNext(t *testing.T) {
	f := newFake().withCourse(courseID, 1, 0).
		withEnrollment("enr-w1", courseID, "stu-w1", workflows.StatusReserved).
		withWaitlist(courseID,
			workflows.EnrollmentInput{EnrollmentID: "enr-w2", CourseID: courseID, StudentID: "stu-w2", RequestedAt: testStart})
	f.failPublish[workflows.EventEnrollmentPromoted] = -1 // never acked: it dead-letters
	env, _ := newEnvWithWaitlist(t, f)
	var children []string
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, _ converter.EncodedValues) {
		children = append(children, info.WorkflowType.Name+" "+info.WorkflowExecution.ID)
	})
	// The dead letter is open well before a minute; the operator compensates.
	env.RegisterDelayedCallback(func() {
		assert.Len(t, f.deadLetterInputs(), 1, "the promotion's event is parked")
		f.failPublishing(workflows.EventEnrollmentPromoted, 0) // the broker is back for w2
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: workflows.ActionCompensate})
	}, time.Minute)
	env.ExecuteWorkflow(workflows.Enrollment, workflows.EnrollmentInput{EnrollmentID: "enr-w1", CourseID: courseID,
		StudentID: "stu-w1", RequestedAt: testStart, Promoted: true})
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.StatusFailed, f.statusOf("enr-w1"))
	w2 := workflows.EnrollmentInput{EnrollmentID: "enr-w2", CourseID: courseID, StudentID: "stu-w2"}
	assert.Equal(t, []string{
		"Promotion " + workflows.PromotionWorkflowID(courseID, "enr-w1:failed"),
		"Enrollment " + workflows.EnrollmentWorkflowID(w2),
	}, children)
	assert.Equal(t, 1, f.seatsTaken(courseID), "the seat went to w2")
}

func indexOf(list []string, v string) int {
	for i, x := range list {
		if x == v {
			return i
		}
	}
	return -1
}

// Leaving the waitlist frees no seat, publishes nothing and promotes
// nobody.
func TestCancellationLeavesTheWaitlist(t *testing.T) {
	f := newFake().withCourse(courseID, 1, 0).
		withEnrollment("enr-held", courseID, "stu-held", workflows.StatusConfirmed).
		withWaitlist(courseID, workflows.EnrollmentInput{EnrollmentID: enrollmentID, CourseID: courseID, StudentID: studentID})
	env, _, promotions := newEnvNoPromotion(t, f)
	got := sendDecision(env, "id-1", 0)
	env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.StatusCancelled, got.result(t).Status)
	assert.Empty(t, f.publishedMessages())
	assert.Empty(t, *promotions)
	assert.Equal(t, 1, f.seatsTaken(courseID))
}
