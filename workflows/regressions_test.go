package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/claimflow/claimflow/workflows"
)

// Regression tests for saga bugs found while writing the workflow tests.

// Cancelling a dead-lettered run compensates like the operator's
// "compensate": the dead letter ends compensated, ClaimStatus says failed and
// downstream learns the enrollment failed.
func TestCancelWhileDeadLetteredSettlesTheDeadLetter(t *testing.T) {
	f := reservedFake(30, 0)
	f.failPublish[workflows.EventEnrollmentConfirmed] = -1
	env, claims := newEnv(t, f)
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
	f := reservedFake(30, 0)
	f.failMarkConfirmed = 3 // attempts at 0 s, 100 ms, 300 ms fail
	env, _ := newEnv(t, f)
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
