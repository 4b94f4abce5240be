package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/claimflow/claimflow/workflows"
)

var cancelledEventID = workflows.EventID(enrollmentID, workflows.EventEnrollmentCancelled)

func TestCancellation(t *testing.T) {
	const dlAt = time.Minute
	withEnrollment := func(s workflows.EnrollmentStatus) func() *fakeActivities {
		return func() *fakeActivities {
			return newFake().withCourse(courseID, 30, 4).withEnrollment(enrollmentID, courseID, studentID, s)
		}
	}
	// cancelled is the state of a run that cancelled the enrollment.
	cancelled := workflows.EnrollmentState{EnrollmentID: enrollmentID, CourseID: courseID, StudentID: studentID,
		Status: workflows.StatusCancelled}
	refused := func(r workflows.Refusal) workflows.EnrollmentState {
		return workflows.EnrollmentState{EnrollmentID: enrollmentID, Status: workflows.StatusRefused, Refusal: r}
	}
	tests := []struct {
		name string
		fake func() *fakeActivities
		// act schedules operator signals; mend runs before the signal.
		action       workflows.DeadLetterAction
		mend         bool
		wantDecision workflows.Decision
		wantState    workflows.EnrollmentState
		wantClaims   []string
		wantSeats    int // seats taken in courseID afterwards
		wantEvents   int // enrollment.cancelled events published
		check        func(t *testing.T, f *fakeActivities)
	}{
		{
			name:         "confirmed enrollment is cancelled and its seat freed",
			fake:         withEnrollment(workflows.StatusConfirmed),
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled},
			wantState:    cancelled,
			wantClaims:   []string{"cancelled"},
			wantSeats:    4,
			wantEvents:   1,
			check: func(t *testing.T, f *fakeActivities) {
				pub := f.publishedMessages()
				require.Len(t, pub, 1)
				wantEvent(t, pub[0], workflows.EventEnrollmentCancelled)
				assert.Equal(t, cancelledEventID, pub[0].Event.ID)
				assert.True(t, pub[0].Event.OccurredAt.Equal(testStart))
				assert.Equal(t, workflows.StatusCancelled, f.enrollment(enrollmentID).Status)
				assert.Empty(t, f.deadLetterInputs())
				assert.Empty(t, f.resolved())
			},
		},
		{
			name:         "already cancelled changes nothing and publishes nothing",
			fake:         withEnrollment(workflows.StatusCancelled),
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled},
			wantState:    cancelled,
			wantClaims:   []string{"cancelled"},
			wantSeats:    4,
			wantEvents:   0,
			check: func(t *testing.T, f *fakeActivities) {
				assert.Zero(t, f.callCount(workflows.Publish.Name))
			},
		},
		{
			name:         "unknown enrollment is refused",
			fake:         func() *fakeActivities { return newFake().withCourse(courseID, 30, 4) },
			wantDecision: refusal(enrollmentID, workflows.RefusalEnrollmentNotFound),
			wantState:    refused(workflows.RefusalEnrollmentNotFound),
			wantClaims:   []string{"refused"},
			wantSeats:    4,
		},
		{
			name:         "reserved enrollment is refused as pending",
			fake:         withEnrollment(workflows.StatusReserved),
			wantDecision: refusal(enrollmentID, workflows.RefusalEnrollmentPending),
			wantState:    refused(workflows.RefusalEnrollmentPending),
			wantClaims:   []string{"refused"},
			wantSeats:    5,
			check: func(t *testing.T, f *fakeActivities) {
				assert.Equal(t, workflows.StatusReserved, f.enrollment(enrollmentID).Status, "left alone")
			},
		},
		{
			name:         "dead-lettered enrollment is refused as pending",
			fake:         withEnrollment(workflows.StatusDeadLettered),
			wantDecision: refusal(enrollmentID, workflows.RefusalEnrollmentPending),
			wantState:    refused(workflows.RefusalEnrollmentPending),
			wantClaims:   []string{"refused"},
			wantSeats:    5,
		},
		{
			name:         "failed enrollment is refused as not active",
			fake:         withEnrollment(workflows.StatusFailed),
			wantDecision: refusal(enrollmentID, workflows.RefusalEnrollmentInactive),
			wantState:    refused(workflows.RefusalEnrollmentInactive),
			wantClaims:   []string{"refused"},
			wantSeats:    4,
		},
		{
			name: "exhausted publish is dead-lettered, operator retry publishes it",
			fake: func() *fakeActivities {
				f := withEnrollment(workflows.StatusConfirmed)()
				f.failPublish[workflows.EventEnrollmentCancelled] = -1
				return f
			},
			action:       workflows.ActionRetry,
			mend:         true,
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled},
			wantState:    withDeadLetter(cancelled, 101),
			wantClaims:   []string{"cancelled", "dead_lettered", "cancelled"},
			wantSeats:    4,
			wantEvents:   1,
			check: func(t *testing.T, f *fakeActivities) {
				dls := f.deadLetterInputs()
				require.Len(t, dls, 1)
				assert.Equal(t, 1, dls[0].In.Round)
				assert.Equal(t, cancelledEventID, dls[0].In.Message.Event.ID)
				assert.Empty(t, dls[0].In.EnrollmentID, "a cancellation does not mark the enrollment dead-lettered")
				assert.Equal(t, workflows.StatusCancelled, f.enrollment(enrollmentID).Status)
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentCancelled), 5)
				assert.Equal(t, dls[0].In.Message, f.publishedMessages()[0], "same event republished")
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterRetrying},
					{ID: 101, State: workflows.DeadLetterResolved},
				}, f.resolved())
			},
		},
		{
			name: "exhausted publish, operator compensate discards the event but keeps the cancellation",
			fake: func() *fakeActivities {
				f := withEnrollment(workflows.StatusConfirmed)()
				f.failPublish[workflows.EventEnrollmentCancelled] = -1
				return f
			},
			action:       workflows.ActionCompensate,
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled},
			wantState:    withDeadLetter(cancelled, 101),
			wantClaims:   []string{"cancelled", "dead_lettered", "cancelled"},
			wantSeats:    4,
			wantEvents:   0,
			check: func(t *testing.T, f *fakeActivities) {
				assert.Len(t, f.deadLetterInputs(), 1)
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentCancelled), 4)
				assert.Equal(t, workflows.StatusCancelled, f.enrollment(enrollmentID).Status, "a cancellation is not undone")
				assert.Zero(t, f.callCount(workflows.ReleaseSeat.Name))
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterDiscarded},
				}, f.resolved())
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, claims := newEnv(t, f)
			decision := sendDecision(env, "id-1", 0)
			if tc.action != "" {
				signalAt(env, dlAt, tc.action, func() {
					if tc.mend {
						f.failPublishing(workflows.EventEnrollmentCancelled, 0)
					}
				})
			}

			env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			d := decision.result(t)
			if tc.wantDecision.Status == workflows.StatusRefused {
				assert.NotEmpty(t, d.Message)
				d.Message = ""
			}
			assert.Equal(t, tc.wantDecision, d)
			var got workflows.EnrollmentState
			require.NoError(t, env.GetWorkflowResult(&got))
			got.LastError = ""
			assert.Equal(t, tc.wantState, got)
			assert.Equal(t, tc.wantClaims, claims.get(), "ClaimStatus upserts")
			assert.Equal(t, tc.wantSeats, f.seatsTaken(courseID))
			assert.Equal(t, 1, f.callCount(workflows.CancelEnrollment.Name), "a refusal is not retried")
			var events int
			for _, m := range f.publishedMessages() {
				if m.Event.Type == workflows.EventEnrollmentCancelled {
					events++
				}
			}
			assert.Equal(t, tc.wantEvents, events, "enrollment.cancelled events")
			if tc.wantEvents == 0 && tc.action == "" {
				assert.Zero(t, f.callCount(workflows.Publish.Name))
				assert.Zero(t, f.callCount(workflows.RecordDeadLetter.Name))
			}
			if tc.check != nil {
				tc.check(t, f)
			}
		})
	}
}

// TestCancellationTwice: the second cancellation of the same enrollment
// reports it unchanged, frees no second seat and publishes no second event.
func TestCancellationTwice(t *testing.T) {
	f := newFake().withCourse(courseID, 30, 4).withEnrollment(enrollmentID, courseID, studentID, workflows.StatusConfirmed)
	var decisions []workflows.Decision
	for range 2 {
		env, _ := newEnv(t, f)
		d := sendDecision(env, "id-1", 0)
		env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})
		require.True(t, env.IsWorkflowCompleted())
		require.NoError(t, env.GetWorkflowError())
		decisions = append(decisions, d.result(t))
	}
	want := workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled}
	assert.Equal(t, []workflows.Decision{want, want}, decisions)
	assert.Equal(t, 4, f.seatsTaken(courseID), "one seat freed, not two")
	pub := f.publishedMessages()
	require.Len(t, pub, 1, "enrollment.cancelled published once across both runs")
	assert.Equal(t, cancelledEventID, pub[0].Event.ID)
	assert.Equal(t, 2, f.callCount(workflows.CancelEnrollment.Name))
}
