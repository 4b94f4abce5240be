package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/claimflow/claimflow/workflows"
)

// Regression tests for saga bugs found while writing the workflow tests.

// A second claim that joins a run which ended undecided must hear the same
// failure, not already_enrolled: no seat is held. The handler turns every
// non-refusal decision into already_enrolled for a second claim
// (enrollment.go, `if !first && d.Refusal == ""`), so since undecided runs
// answer Status failed, a second claim is pointed at a failed enrollment.
func TestSecondClaimOfUndecidedRunIsNotAlreadyEnrolled(t *testing.T) {
	f := newFake().withCourse(courseID, 30, 0)
	f.reserveErr = errSchema
	env, _ := newEnv(t, f)
	first := sendDecision(env, "id-1", 0)
	second := sendDecision(env, "id-2", 0)

	env.ExecuteWorkflow(workflows.Enrollment, enrollInput())

	require.True(t, env.IsWorkflowCompleted())
	d1, d2 := first.result(t), second.result(t)
	assert.Equal(t, workflows.StatusFailed, d1.Status)
	assert.Equal(t, d1, d2, "the second claim gets the same failure")
}

// Cancelling a dead-lettered run compensates like the operator's
// "compensate": the dead letter ends compensated, ClaimStatus says failed and
// downstream learns the enrollment failed.
func TestCancelWhileDeadLetteredSettlesTheDeadLetter(t *testing.T) {
	f := newFake().withCourse(courseID, 30, 0)
	f.failPublish[workflows.EventEnrollmentConfirmed] = -1
	env, claims := newEnv(t, f)
	sendDecision(env, "id-1", 0)
	env.RegisterDelayedCallback(env.CancelWorkflow, time.Minute)

	env.ExecuteWorkflow(workflows.Enrollment, enrollInput())

	require.True(t, env.IsWorkflowCompleted())
	assert.Equal(t, []string{enrollmentID}, f.releases())
	got := claims.get()
	require.NotEmpty(t, got)
	assert.Equal(t, "failed", got[len(got)-1], "ClaimStatus follows the status")
	assert.Equal(t, workflows.DeadLetterCompensated, f.deadLetter(101).State, "the dead letter is not left open")
	var failed int
	for _, m := range f.publishedMessages() {
		if m.Event.ID == failedEventID {
			failed++
		}
	}
	assert.Equal(t, 1, failed, "enrollment.failed published once, as on the operator's compensate")
}

// Once enrollment.confirmed is published the seat is the student's: a
// cancellation of the run (while MarkConfirmed retries through a Postgres
// outage) must not release it behind the consumers' back.
func TestCancelAfterConfirmedEventKeepsTheSeat(t *testing.T) {
	f := newFake().withCourse(courseID, 30, 0)
	f.failMarkConfirmed = 3 // attempts at 0 s, 100 ms, 300 ms fail
	env, _ := newEnv(t, f)
	sendDecision(env, "id-1", 0)
	env.RegisterDelayedCallback(env.CancelWorkflow, 150*time.Millisecond)

	env.ExecuteWorkflow(workflows.Enrollment, enrollInput())

	require.True(t, env.IsWorkflowCompleted())
	pub := f.publishedMessages()
	require.Len(t, pub, 1)
	assert.Equal(t, confirmedEventID, pub[0].Event.ID)
	assert.Empty(t, f.releases(), "a published confirmation is not compensated")
	assert.Equal(t, 1, f.seatsTaken(courseID))
	assert.Equal(t, workflows.StatusConfirmed, f.enrollment(enrollmentID).Status)
}
