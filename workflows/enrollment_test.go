package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/claimflow/claimflow/workflows"
)

const (
	enrollmentID = "enr-1"
	courseID     = "cs101"
	studentID    = "stu-1"
	// testWorkflowID is the ID the test environment gives the run.
	testWorkflowID = "default-test-workflow-id"
)

var (
	confirmedEventID = workflows.EventID(enrollmentID, workflows.EventEnrollmentConfirmed)
	failedEventID    = workflows.EventID(enrollmentID, workflows.EventEnrollmentFailed)
)

func enrollInput() workflows.EnrollmentInput {
	return workflows.EnrollmentInput{EnrollmentID: enrollmentID, CourseID: courseID, StudentID: studentID,
		RequestedAt: testStart.Add(-time.Second)}
}

// wantEvent asserts msg is the event of eventType for enrollInput().
func wantEvent(t *testing.T, msg workflows.Message, eventType string) {
	t.Helper()
	assert.Equal(t, workflows.EnrollmentTopic, msg.Topic)
	assert.Equal(t, courseID, msg.Key, "events are keyed by course")
	assert.Equal(t, workflows.EventID(enrollmentID, eventType), msg.Event.ID)
	assert.Equal(t, eventType, msg.Event.Type)
	assert.Equal(t, map[string]any{"enrollment_id": enrollmentID, "course_id": courseID, "student_id": studentID},
		msg.Event.Data)
}

type enrollRun struct {
	t        *testing.T
	env      *testsuite.TestWorkflowEnvironment
	fake     *fakeActivities
	claims   *claimStatuses
	decision *decisionCall
	// dlState is the status query taken while the run waited dead-lettered.
	dlState *workflows.EnrollmentState
}

// queryAt records the status query at workflow time testStart+at.
func (r *enrollRun) queryAt(at time.Duration) {
	r.env.RegisterDelayedCallback(func() {
		s := queryStatus(r.t, r.env)
		r.dlState = &s
	}, at)
}

func TestEnrollment(t *testing.T) {
	const (
		dlAt     = time.Minute     // operator's first signal; the first dead letter is at 7s
		secondAt = 5 * time.Minute // operator's second signal
	)
	tests := []struct {
		name string
		fake func() *fakeActivities
		// act schedules signals, queries and cancellations.
		act          func(r *enrollRun)
		wantDecision workflows.Decision
		wantState    workflows.EnrollmentState
		wantCanceled bool
		// wantClaims is every ClaimStatus upserted, in order (nil: not checked here)
		wantClaims []string
		check      func(t *testing.T, r *enrollRun)
	}{
		{
			name:         "seat reserved, event published, enrollment confirmed",
			fake:         func() *fakeActivities { return newFake().withCourse(courseID, 30, 5) },
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantState:    state(workflows.StatusConfirmed),
			wantClaims:   []string{"reserved", "confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				require.Len(t, f.reserveInputs, 1)
				assert.Equal(t, workflows.ReserveSeatInput{EnrollmentID: enrollmentID, CourseID: courseID,
					StudentID: studentID, WorkflowID: testWorkflowID, RunID: f.reserveInputs[0].RunID,
					RequestedAt: enrollInput().RequestedAt}, f.reserveInputs[0])
				assert.NotEmpty(t, f.reserveInputs[0].RunID)
				assert.Equal(t, 6, f.seatsTaken(courseID))

				pub := f.publishedMessages()
				require.Len(t, pub, 1, "enrollment.confirmed is published exactly once")
				wantEvent(t, pub[0], workflows.EventEnrollmentConfirmed)
				assert.Equal(t, confirmedEventID, pub[0].Event.ID)
				assert.True(t, pub[0].Event.OccurredAt.Equal(testStart), "occurred_at is the workflow time")
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 1)

				assert.Equal(t, []string{enrollmentID}, f.confirms(), "MarkConfirmed called once")
				assert.Equal(t, fakeEnrollment{ID: enrollmentID, CourseID: courseID, StudentID: studentID,
					Status: workflows.StatusConfirmed, Published: true}, f.enrollment(enrollmentID))
				assert.Empty(t, f.releases())
				assert.Empty(t, f.deadLetterInputs())
				assert.Empty(t, f.resolved(), "no dead letter, nothing to resolve")
			},
		},
		{
			name:         "course full is refused",
			fake:         func() *fakeActivities { return newFake().withCourse(courseID, 2, 2) },
			wantDecision: refusal(enrollmentID, workflows.RefusalCourseFull),
			wantState:    refusedState(workflows.RefusalCourseFull),
			wantClaims:   []string{"course_full"},
			check: func(t *testing.T, r *enrollRun) {
				assert.Equal(t, 2, r.fake.seatsTaken(courseID))
				assertNoSideEffects(t, r.fake)
			},
		},
		{
			name: "student already enrolled is refused and pointed at the holder",
			fake: func() *fakeActivities {
				return newFake().withCourse(courseID, 30, 0).
					withEnrollment("enr-holder", courseID, studentID, workflows.StatusConfirmed)
			},
			wantDecision: refusal("enr-holder", workflows.RefusalAlreadyEnrolled),
			wantState:    refusedState(workflows.RefusalAlreadyEnrolled),
			wantClaims:   []string{"already_enrolled"},
			check: func(t *testing.T, r *enrollRun) {
				assert.Equal(t, 1, r.fake.seatsTaken(courseID), "no second seat")
				assert.Empty(t, r.fake.enrollment(enrollmentID).ID, "no enrollment row for the refused claim")
				assertNoSideEffects(t, r.fake)
			},
		},
		{
			name: "already enrolled takes precedence over a full course",
			fake: func() *fakeActivities {
				return newFake().withCourse(courseID, 1, 0).
					withEnrollment("enr-holder", courseID, studentID, workflows.StatusDeadLettered)
			},
			wantDecision: refusal("enr-holder", workflows.RefusalAlreadyEnrolled),
			wantState:    refusedState(workflows.RefusalAlreadyEnrolled),
			wantClaims:   []string{"already_enrolled"},
			check:        func(t *testing.T, r *enrollRun) { assertNoSideEffects(t, r.fake) },
		},
		{
			name:         "unknown course is refused",
			fake:         newFake,
			wantDecision: refusal(enrollmentID, workflows.RefusalCourseNotFound),
			wantState:    refusedState(workflows.RefusalCourseNotFound),
			wantClaims:   []string{"course_not_found"},
			check:        func(t *testing.T, r *enrollRun) { assertNoSideEffects(t, r.fake) },
		},
		{
			name: "an enrollment ID that already failed is refused",
			fake: func() *fakeActivities {
				return newFake().withCourse(courseID, 30, 0).
					withEnrollment(enrollmentID, courseID, studentID, workflows.StatusFailed)
			},
			wantDecision: refusal(enrollmentID, workflows.RefusalEnrollmentInactive),
			wantState:    refusedState(workflows.RefusalEnrollmentInactive),
			wantClaims:   []string{"enrollment_not_active"},
			check: func(t *testing.T, r *enrollRun) {
				assert.Equal(t, 0, r.fake.seatsTaken(courseID))
				assertNoSideEffects(t, r.fake)
			},
		},
		{
			name: "transient publish failures are retried by the policy",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = 2
				return f
			},
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantState:    state(workflows.StatusConfirmed),
			wantClaims:   []string{"reserved", "confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				attempts := f.attemptsOf(workflows.EventEnrollmentConfirmed)
				require.Len(t, attempts, 3, "two failures and one success")
				for i, a := range attempts {
					assert.Equal(t, int32(i+1), a.Attempt, "attempt %d", i)
					assert.Equal(t, i < 2, a.Failed, "attempt %d failed", i)
					assert.Equal(t, confirmedEventID, a.EventID, "every attempt carries the same event ID")
				}
				pub := f.publishedMessages()
				require.Len(t, pub, 1)
				wantEvent(t, pub[0], workflows.EventEnrollmentConfirmed)
				assert.Empty(t, f.deadLetterInputs(), "retries within the policy do not dead-letter")
				assert.Equal(t, []string{enrollmentID}, f.confirms())
				assert.Equal(t, workflows.StatusConfirmed, f.enrollment(enrollmentID).Status)
				assert.Empty(t, f.releases())
			},
		},
		{
			name: "exhausted publish is dead-lettered; operator retry publishes the same event",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				r.queryAt(dlAt - time.Second)
				signalAt(r.env, dlAt, workflows.ActionRetry, func() {
					assert.Len(r.t, r.fake.attemptsOf(workflows.EventEnrollmentConfirmed), 4,
						"no publish while the run waits for an operator")
					assert.Equal(r.t, workflows.StatusDeadLettered, r.fake.enrollment(enrollmentID).Status)
					r.fake.failPublishing(workflows.EventEnrollmentConfirmed, 0) // Kafka is back
				})
			},
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantState:    withDeadLetter(state(workflows.StatusConfirmed), 101),
			wantClaims:   []string{"reserved", "dead_lettered", "reserved", "confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				requireDeadLettered(t, r, 101)
				dls := f.deadLetterInputs()
				require.Len(t, dls, 1, "RecordDeadLetter called once")
				assertDeadLetterInput(t, dls[0].In, 1)

				attempts := f.attemptsOf(workflows.EventEnrollmentConfirmed)
				require.Len(t, attempts, 5, "4 attempts of the policy, then one after the operator's retry")
				assert.True(t, attempts[4].At.Equal(testStart.Add(dlAt)), "republished when the signal came")
				pub := f.publishedMessages()
				require.Len(t, pub, 1, "published once")
				wantEvent(t, pub[0], workflows.EventEnrollmentConfirmed)
				assert.Equal(t, dls[0].In.Message, pub[0], "the republished event is the dead-lettered one, same ID")

				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterRetrying},
					{ID: 101, State: workflows.DeadLetterResolved},
				}, f.resolved())
				assert.Equal(t, workflows.DeadLetterResolved, f.deadLetter(101).State)
				assert.Equal(t, []string{enrollmentID}, f.confirms())
				assert.Equal(t, fakeEnrollment{ID: enrollmentID, CourseID: courseID, StudentID: studentID,
					Status: workflows.StatusConfirmed, Published: true}, f.enrollment(enrollmentID))
				assert.Empty(t, f.releases())
				assert.Equal(t, 1, f.seatsTaken(courseID))
			},
		},
		{
			name: "dead letter compensated: seat released and enrollment.failed published",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 3)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				r.queryAt(dlAt - time.Second)
				signalAt(r.env, dlAt, workflows.ActionCompensate, func() {
					assert.Equal(r.t, 4, r.fake.seatsTaken(courseID), "seat held while dead-lettered")
				})
			},
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantState:    withDeadLetter(state(workflows.StatusFailed), 101),
			wantClaims:   []string{"reserved", "dead_lettered", "failed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				requireDeadLettered(t, r, 101)
				assertCompensated(t, f, 101)
				require.Len(t, f.deadLetterInputs(), 1)
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 4, "no publish after compensate")
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterCompensated},
				}, f.resolved())
			},
		},
		{
			name: "retry that fails again dead-letters a second round, then compensate",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				signalAt(r.env, dlAt, workflows.ActionRetry, nil)
				r.queryAt(secondAt - time.Second)
				signalAt(r.env, secondAt, workflows.ActionCompensate, nil)
			},
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantState:    withDeadLetter(state(workflows.StatusFailed), 101),
			wantClaims:   []string{"reserved", "dead_lettered", "dead_lettered", "failed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				requireDeadLettered(t, r, 101)
				dls := f.deadLetterInputs()
				require.Len(t, dls, 2)
				assertDeadLetterInput(t, dls[0].In, 1)
				assertDeadLetterInput(t, dls[1].In, 2)
				assert.Equal(t, dls[0].In.Message, dls[1].In.Message, "the same event is dead-lettered again")
				assert.True(t, dls[1].At.Equal(testStart.Add(dlAt+7*time.Second)),
					"second round dead-letters after another 1s+2s+4s, at %v", dls[1].At.Sub(testStart))
				assert.Equal(t, 2, f.deadLetter(101).Rounds)
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 8, "two rounds of 4 attempts")
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterRetrying},
					{ID: 101, State: workflows.DeadLetterCompensated},
				}, f.resolved())
				assertCompensated(t, f, 101)
			},
		},
		{
			name: "compensation publishes enrollment.failed through a Kafka outage without dead-lettering it",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				f.failPublish[workflows.EventEnrollmentFailed] = 5
				return f
			},
			act:          func(r *enrollRun) { signalAt(r.env, dlAt, workflows.ActionCompensate, nil) },
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantState:    withDeadLetter(state(workflows.StatusFailed), 101),
			wantClaims:   []string{"reserved", "dead_lettered", "failed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentFailed), 6, "5 failures, then acked")
				assert.Len(t, f.deadLetterInputs(), 1, "enrollment.failed is never dead-lettered")
				assertCompensated(t, f, 101)
			},
		},
		{
			name: "cancelled while dead-lettered gives the seat back",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				r.queryAt(dlAt - time.Second)
				r.env.RegisterDelayedCallback(r.env.CancelWorkflow, dlAt)
			},
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantCanceled: true,
			wantState:    withDeadLetter(state(workflows.StatusFailed), 101),
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				claims := r.claims.get()
				require.GreaterOrEqual(t, len(claims), 2)
				assert.Equal(t, []string{"reserved", "dead_lettered"}, claims[:2])
				requireDeadLettered(t, r, 101)
				assert.Equal(t, []string{enrollmentID}, f.releases(), "ReleaseSeat ran once on the disconnected context")
				assert.Equal(t, 0, f.seatsTaken(courseID), "seat given back")
				assert.Equal(t, workflows.StatusFailed, f.enrollment(enrollmentID).Status)
				assert.Empty(t, f.confirms())
				for _, m := range f.publishedMessages() {
					assert.NotEqual(t, confirmedEventID, m.Event.ID, "enrollment.confirmed never went out")
				}
			},
		},
		{
			name: "cancelled between publish attempts gives the seat back",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act:          func(r *enrollRun) { r.env.RegisterDelayedCallback(r.env.CancelWorkflow, 1500*time.Millisecond) },
			wantDecision: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantCanceled: true,
			wantState:    state(workflows.StatusFailed),
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				claims := r.claims.get()
				require.NotEmpty(t, claims)
				assert.Equal(t, "reserved", claims[0])
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 2, "attempts at 0s and 1s, none after")
				assert.Empty(t, f.deadLetterInputs())
				assert.Equal(t, []string{enrollmentID}, f.releases())
				assert.Equal(t, 0, f.seatsTaken(courseID))
				assert.Equal(t, workflows.StatusFailed, f.enrollment(enrollmentID).Status)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, claims := newEnv(t, f)
			r := &enrollRun{t: t, env: env, fake: f, claims: claims}
			r.decision = sendDecision(env, "id-1", 0)
			if tc.act != nil {
				tc.act(r)
			}

			env.ExecuteWorkflow(workflows.Enrollment, enrollInput())

			require.True(t, env.IsWorkflowCompleted())
			d := r.decision.result(t)
			if tc.wantDecision.Status == workflows.StatusRefused {
				assert.NotEmpty(t, d.Message, "a refusal explains itself")
				d.Message = ""
			}
			assert.Equal(t, tc.wantDecision, d)

			var got workflows.EnrollmentState
			if tc.wantCanceled {
				err := env.GetWorkflowError()
				require.Error(t, err)
				assert.True(t, temporal.IsCanceledError(err), "want a cancelled run, got %v", err)
				got = queryStatus(t, env)
			} else {
				require.NoError(t, env.GetWorkflowError())
				require.NoError(t, env.GetWorkflowResult(&got))
				assert.Equal(t, got, queryStatus(t, env), "the status query agrees with the result")
			}
			if tc.wantState.DeadLetterID != 0 {
				assert.Contains(t, got.LastError, "in-sync replicas")
			}
			got.LastError = ""
			assert.Equal(t, tc.wantState, got)
			if tc.wantClaims != nil {
				assert.Equal(t, tc.wantClaims, claims.get(), "ClaimStatus upserts")
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func state(s workflows.EnrollmentStatus) workflows.EnrollmentState {
	return workflows.EnrollmentState{EnrollmentID: enrollmentID, CourseID: courseID, StudentID: studentID, Status: s}
}

func refusedState(r workflows.Refusal) workflows.EnrollmentState {
	s := state(workflows.StatusRefused)
	s.Refusal = r
	return s
}

func withDeadLetter(s workflows.EnrollmentState, id int64) workflows.EnrollmentState {
	s.DeadLetterID = id
	return s
}

func refusal(holder string, r workflows.Refusal) workflows.Decision {
	return workflows.Decision{EnrollmentID: holder, Status: workflows.StatusRefused, Refusal: r}
}

// assertNoSideEffects: a refusal reserves nothing, so nothing is published,
// confirmed, compensated or dead-lettered.
func assertNoSideEffects(t *testing.T, f *fakeActivities) {
	t.Helper()
	assert.Equal(t, 1, f.callCount(workflows.ReserveSeat.Name), "a refusal is not retried")
	assert.Zero(t, f.callCount(workflows.Publish.Name), "nothing published")
	assert.Zero(t, f.callCount(workflows.MarkConfirmed.Name))
	assert.Zero(t, f.callCount(workflows.ReleaseSeat.Name), "nothing to compensate")
	assert.Zero(t, f.callCount(workflows.RecordDeadLetter.Name))
	assert.Zero(t, f.callCount(workflows.ResolveDeadLetter.Name))
}

// requireDeadLettered checks the status query taken while the run waited.
func requireDeadLettered(t *testing.T, r *enrollRun, id int64) {
	t.Helper()
	require.NotNil(t, r.dlState, "status was not queried while dead-lettered")
	s := *r.dlState
	assert.Equal(t, workflows.StatusDeadLettered, s.Status)
	assert.Equal(t, id, s.DeadLetterID)
	assert.Contains(t, s.LastError, "in-sync replicas")
}

func assertDeadLetterInput(t *testing.T, in workflows.DeadLetterInput, round int) {
	t.Helper()
	assert.Equal(t, round, in.Round)
	assert.Equal(t, confirmedEventID, in.Message.Event.ID)
	assert.Equal(t, courseID, in.Message.Key)
	assert.Equal(t, workflows.EnrollmentTopic, in.Message.Topic)
	assert.Equal(t, enrollmentID, in.EnrollmentID)
	assert.Equal(t, testWorkflowID, in.WorkflowID)
	assert.NotEmpty(t, in.RunID)
	assert.Contains(t, in.Error, "in-sync replicas")
}

// assertCompensated: the seat is back, enrollment.failed (and only it) was
// published once, the dead letter ended compensated.
func assertCompensated(t *testing.T, f *fakeActivities, deadLetterID int64) {
	t.Helper()
	assert.Equal(t, []string{enrollmentID}, f.releases(), "ReleaseSeat called once")
	assert.Equal(t, workflows.StatusFailed, f.enrollment(enrollmentID).Status)
	pub := f.publishedMessages()
	require.Len(t, pub, 1, "only enrollment.failed is published")
	wantEvent(t, pub[0], workflows.EventEnrollmentFailed)
	assert.Equal(t, failedEventID, pub[0].Event.ID)
	assert.Empty(t, f.confirms(), "never confirmed")
	assert.Equal(t, workflows.DeadLetterCompensated, f.deadLetter(deadLetterID).State)
	last := f.resolved()
	require.NotEmpty(t, last)
	assert.Equal(t, workflows.ResolveDeadLetterInput{ID: deadLetterID, State: workflows.DeadLetterCompensated},
		last[len(last)-1])
}

// TestSecondDecision: a second claim of the same seat by the same student
// joins the running claim and is told already_enrolled, however it arrives.
func TestSecondDecision(t *testing.T) {
	tests := []struct {
		name string
		fake func() *fakeActivities
		// second is sent after the first at this workflow time
		secondAt   time.Duration
		secondID   string
		act        func(env *testsuite.TestWorkflowEnvironment)
		wantFirst  workflows.Decision
		wantSecond workflows.Decision
	}{
		{
			name:       "concurrent second claim",
			fake:       func() *fakeActivities { return newFake().withCourse(courseID, 30, 0) },
			secondID:   "id-2",
			wantFirst:  workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantSecond: refusal(enrollmentID, workflows.RefusalAlreadyEnrolled),
		},
		{
			name: "second claim while the first is dead-lettered",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			secondAt: 30 * time.Second,
			secondID: "id-2",
			act: func(env *testsuite.TestWorkflowEnvironment) {
				signalAt(env, time.Minute, workflows.ActionCompensate, nil)
			},
			wantFirst:  workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantSecond: refusal(enrollmentID, workflows.RefusalAlreadyEnrolled),
		},
		{
			name:       "the same update ID again is deduplicated, not refused",
			fake:       func() *fakeActivities { return newFake().withCourse(courseID, 30, 0) },
			secondID:   "id-1",
			wantFirst:  workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
			wantSecond: workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved},
		},
		{
			name:       "a refusal is repeated, not turned into already_enrolled",
			fake:       func() *fakeActivities { return newFake().withCourse(courseID, 1, 1) },
			secondID:   "id-2",
			wantFirst:  refusal(enrollmentID, workflows.RefusalCourseFull),
			wantSecond: refusal(enrollmentID, workflows.RefusalCourseFull),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, _ := newEnv(t, f)
			first := sendDecision(env, "id-1", 0)
			second := sendDecision(env, tc.secondID, tc.secondAt)
			if tc.act != nil {
				tc.act(env)
			}

			env.ExecuteWorkflow(workflows.Enrollment, enrollInput())

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			d1, d2 := first.result(t), second.result(t)
			d1.Message, d2.Message = "", ""
			assert.Equal(t, tc.wantFirst, d1, "first claim")
			assert.Equal(t, tc.wantSecond, d2, "second claim")
			assert.Equal(t, 1, f.callCount(workflows.ReserveSeat.Name), "a second claim reserves nothing")
		})
	}
}

// An enrollment run started by the API names its starter's update: a
// second claim handled before it is the second claim, and a starter's
// update that comes after the run's work is still answered as the claim
// (the run waits for it, up to AnswerWait).
func TestEnrollmentStarterUpdateArrivingLate(t *testing.T) {
	f := newFake().withCourse(courseID, 30, 0)
	env, _ := newEnv(t, f)
	second := sendDecision(env, "id-2", 10*time.Second)
	starter := sendDecision(env, "id-start", 20*time.Second)
	in := enrollInput()
	in.StarterUpdateID, in.AnswerWait = "id-start", time.Minute

	env.ExecuteWorkflow(workflows.Enrollment, in)

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	d1, d2 := starter.result(t), second.result(t)
	d1.Message, d2.Message = "", ""
	assert.Equal(t, workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusReserved}, d1, "the starter")
	assert.Equal(t, refusal(enrollmentID, workflows.RefusalAlreadyEnrolled), d2, "the second claim")
	assert.Equal(t, 20*time.Second, env.Now().Sub(testStart).Round(time.Second), "closed once the starter was answered")
	assert.Equal(t, 1, f.callCount(workflows.ReserveSeat.Name))
}

// TestPublishRetryTiming: the publish attempts follow PublishRetryPolicy in
// workflow time, 1s → 2s → 4s, and the message is dead-lettered right after
// the fourth.
func TestPublishRetryTiming(t *testing.T) {
	tests := []struct {
		name         string
		failures     int
		wantGaps     []time.Duration
		wantDeadAt   time.Duration // -1: never dead-lettered
		wantAttempts []int32
	}{
		{name: "exhausted", failures: -1, wantGaps: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second},
			wantDeadAt: 7 * time.Second, wantAttempts: []int32{1, 2, 3, 4}},
		{name: "two failures", failures: 2, wantGaps: []time.Duration{time.Second, 2 * time.Second},
			wantDeadAt: -1, wantAttempts: []int32{1, 2, 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake().withCourse(courseID, 30, 0)
			f.failPublish[workflows.EventEnrollmentConfirmed] = tc.failures
			env, _ := newEnv(t, f)
			sendDecision(env, "id-1", 0)
			if tc.wantDeadAt >= 0 {
				signalAt(env, time.Hour, workflows.ActionCompensate, nil)
			}

			env.ExecuteWorkflow(workflows.Enrollment, enrollInput())
			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())

			attempts := f.attemptsOf(workflows.EventEnrollmentConfirmed)
			require.Len(t, attempts, len(tc.wantAttempts))
			assert.True(t, attempts[0].At.Equal(testStart), "first attempt at once, at %v", attempts[0].At.Sub(testStart))
			var gaps []time.Duration
			var nums []int32
			for i, a := range attempts {
				nums = append(nums, a.Attempt)
				if i > 0 {
					gaps = append(gaps, a.At.Sub(attempts[i-1].At))
				}
			}
			assert.Equal(t, tc.wantGaps, gaps)
			assert.Equal(t, tc.wantAttempts, nums)

			dls := f.deadLetterInputs()
			if tc.wantDeadAt < 0 {
				assert.Empty(t, dls)
				return
			}
			require.Len(t, dls, 1)
			assert.Equal(t, tc.wantDeadAt, dls[0].At.Sub(testStart), "dead-lettered right after the last attempt")
		})
	}
}

// errSchema is a fault that is neither a refusal nor retried.
var errSchema = temporal.NewNonRetryableApplicationError(`relation "enrollments" does not exist`, "schema", nil)

// TestUndecidedRunAnswersTheCaller: a run that ends before deciding (a fault
// that is not a refusal) still answers the caller waiting on the decision
// update, with Status failed, instead of blocking on AllHandlersFinished.
func TestUndecidedRunAnswersTheCaller(t *testing.T) {
	tests := []struct {
		name       string
		fake       func() *fakeActivities
		workflow   any
		input      any
		wantClaims []string
		wantSeats  int
	}{
		{
			name: "enrollment",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0)
				f.reserveErr = errSchema
				return f
			},
			workflow:   workflows.Enrollment,
			input:      enrollInput(),
			wantClaims: []string{"failed"},
		},
		{
			name: "cancellation",
			fake: func() *fakeActivities {
				f := newFake().withCourse(courseID, 30, 0).
					withEnrollment(enrollmentID, courseID, studentID, workflows.StatusConfirmed)
				f.cancelErr = errSchema
				return f
			},
			workflow:  workflows.Cancellation,
			input:     workflows.CancellationInput{EnrollmentID: enrollmentID},
			wantSeats: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, claims := newEnv(t, f)
			decision := sendDecision(env, "id-1", 0)

			env.ExecuteWorkflow(tc.workflow, tc.input)

			require.True(t, env.IsWorkflowCompleted())
			err := env.GetWorkflowError()
			require.Error(t, err)
			assert.Contains(t, err.Error(), "does not exist", "the run fails with its own error, not a timeout")
			d := decision.result(t)
			assert.Equal(t, enrollmentID, d.EnrollmentID)
			assert.Equal(t, workflows.StatusFailed, d.Status)
			assert.Empty(t, d.Refusal)
			assert.Contains(t, d.Message, "does not exist", "the caller learns why")
			if tc.wantClaims != nil {
				assert.Equal(t, tc.wantClaims, claims.get())
			}
			assert.Zero(t, f.callCount(workflows.Publish.Name), "nothing published")
			assert.Zero(t, f.callCount(workflows.ReleaseSeat.Name), "nothing reserved, nothing released")
			assert.Equal(t, tc.wantSeats, f.seatsTaken(courseID), "seats untouched")
		})
	}
}

// TestEnrollThenCancel runs the two sagas against one fake database.
func TestEnrollThenCancel(t *testing.T) {
	f := newFake().withCourse(courseID, 1, 0)

	env, _ := newEnv(t, f)
	enrolled := sendDecision(env, "id-1", 0)
	env.ExecuteWorkflow(workflows.Enrollment, enrollInput())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.StatusReserved, enrolled.result(t).Status)
	require.Equal(t, 1, f.seatsTaken(courseID))

	env, _ = newEnv(t, f)
	cancelled := sendDecision(env, "id-1", 0)
	env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled},
		cancelled.result(t))
	assert.Equal(t, 0, f.seatsTaken(courseID), "the seat is free again")

	// The freed seat can be claimed by someone else.
	env, _ = newEnv(t, f)
	other := sendDecision(env, "id-1", 0)
	env.ExecuteWorkflow(workflows.Enrollment, workflows.EnrollmentInput{EnrollmentID: "enr-2", CourseID: courseID,
		StudentID: "stu-2", RequestedAt: testStart})
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.Decision{EnrollmentID: "enr-2", Status: workflows.StatusReserved}, other.result(t))

	var types []string
	for _, m := range f.publishedMessages() {
		types = append(types, m.Event.ID)
	}
	assert.Equal(t, []string{confirmedEventID, workflows.EventID(enrollmentID, workflows.EventEnrollmentCancelled),
		workflows.EventID("enr-2", workflows.EventEnrollmentConfirmed)}, types)
}
