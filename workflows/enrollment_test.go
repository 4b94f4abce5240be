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
	t      *testing.T
	env    *testsuite.TestWorkflowEnvironment
	fake   *fakeActivities
	claims *claimStatuses
	// promotions are the Promotion children the run started.
	promotions *[]workflows.PromoteWaitlistInput
	// dlState is the status query taken while the run waited dead-lettered.
	dlState *workflows.EnrollmentState
}

// reservedFake is a course with an enrollment of enrollInput() reserved in
// it (by a batch that handed it over, or a promotion), taken more seats
// taken besides.
func reservedFake(capacity, taken int) *fakeActivities {
	return newFake().withCourse(courseID, capacity, taken).
		withEnrollment(enrollmentID, courseID, studentID, workflows.StatusReserved)
}

// queryAt records the status query at workflow time testStart+at.
func (r *enrollRun) queryAt(at time.Duration) {
	r.env.RegisterDelayedCallback(func() {
		s := queryStatus(r.t, r.env)
		r.dlState = &s
	}, at)
}

// TestEnrollment: the run of one reserved enrollment publishes
// enrollment.confirmed and confirms it; a spent publish policy parks it as a
// dead letter until an operator retries or compensates; a cancel gives the
// seat back.
func TestEnrollment(t *testing.T) {
	const (
		dlAt     = time.Minute     // operator's first signal; the first dead letter is at 7s
		secondAt = 5 * time.Minute // operator's second signal
	)
	tests := []struct {
		name string
		fake func() *fakeActivities
		in   func() workflows.EnrollmentInput // enrollInput() when nil
		// act schedules signals, queries and cancellations.
		act          func(r *enrollRun)
		wantState    workflows.EnrollmentState
		wantCanceled bool
		// wantClaims is every ClaimStatus upserted, in order (nil: not checked here)
		wantClaims []string
		check      func(t *testing.T, r *enrollRun)
	}{
		{
			name:       "event published, enrollment confirmed",
			fake:       func() *fakeActivities { return reservedFake(30, 5) },
			wantState:  state(workflows.StatusConfirmed),
			wantClaims: []string{"confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				assert.Equal(t, 6, f.seatsTaken(courseID), "the seat it holds, no other")
				pub := f.publishedMessages()
				require.Len(t, pub, 1, "enrollment.confirmed is published exactly once")
				wantEvent(t, pub[0], workflows.EventEnrollmentConfirmed)
				assert.True(t, pub[0].Event.OccurredAt.Equal(testStart), "occurred_at is the workflow time")
				assert.Equal(t, []string{enrollmentID}, f.confirms(), "MarkConfirmed called once")
				assert.Equal(t, fakeEnrollment{ID: enrollmentID, CourseID: courseID, StudentID: studentID,
					Status: workflows.StatusConfirmed, Published: true}, f.enrollment(enrollmentID))
				assert.Empty(t, f.releases())
				assert.Empty(t, f.deadLetterInputs())
				assert.Empty(t, f.resolved(), "no dead letter, nothing to resolve")
				assert.Empty(t, *r.promotions)
			},
		},
		{
			name: "a handed-off enrollment's event carries its batch's time",
			fake: func() *fakeActivities { return reservedFake(30, 0) },
			in: func() workflows.EnrollmentInput {
				in := enrollInput()
				in.BatchID, in.OccurredAt = batchID, collectedAt
				return in
			},
			wantState:  state(workflows.StatusConfirmed),
			wantClaims: []string{"confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				pub := r.fake.publishedMessages()
				require.Len(t, pub, 1)
				assert.True(t, pub[0].Event.OccurredAt.Equal(collectedAt),
					"the same payload as any copy the batch sent: occurred_at %v", pub[0].Event.OccurredAt)
			},
		},
		{
			name: "a promoted enrollment tells enrollment.promoted, then enrollment.confirmed",
			fake: func() *fakeActivities { return reservedFake(30, 0) },
			in: func() workflows.EnrollmentInput {
				in := enrollInput()
				in.Promoted = true
				return in
			},
			wantState:  state(workflows.StatusConfirmed),
			wantClaims: []string{"confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				pub := r.fake.publishedMessages()
				require.Len(t, pub, 2)
				wantEvent(t, pub[0], workflows.EventEnrollmentPromoted)
				wantEvent(t, pub[1], workflows.EventEnrollmentConfirmed)
				assert.Equal(t, workflows.StatusConfirmed, r.fake.statusOf(enrollmentID))
			},
		},
		{
			// The dead letter of enrollment.promoted is resolved once, when
			// its retry publishes it; enrollment.confirmed, published at
			// once after it, has no dead letter to resolve.
			name: "a promoted enrollment's enrollment.promoted dead-lettered, retried, then confirmed",
			fake: func() *fakeActivities {
				f := reservedFake(30, 0)
				f.failPublish[workflows.EventEnrollmentPromoted] = -1
				return f
			},
			in: func() workflows.EnrollmentInput {
				in := enrollInput()
				in.Promoted = true
				return in
			},
			act: func(r *enrollRun) {
				r.queryAt(dlAt - time.Second)
				signalAt(r.env, dlAt, workflows.ActionRetry, func() {
					r.fake.failPublishing(workflows.EventEnrollmentPromoted, 0)
				})
			},
			wantState:  withDeadLetter(state(workflows.StatusConfirmed), 101),
			wantClaims: []string{"dead_lettered", "reserved", "confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				requireDeadLettered(t, r, 101)
				pub := f.publishedMessages()
				require.Len(t, pub, 2)
				wantEvent(t, pub[0], workflows.EventEnrollmentPromoted)
				wantEvent(t, pub[1], workflows.EventEnrollmentConfirmed)
				dls := f.deadLetterInputs()
				require.Len(t, dls, 1)
				assert.Equal(t, workflows.EventID(enrollmentID, workflows.EventEnrollmentPromoted), dls[0].In.Message.Event.ID)
				assert.Equal(t, workflows.DeadLetterResolved, f.deadLetter(101).State)
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterRetrying},
					{ID: 101, State: workflows.DeadLetterResolved},
				}, f.resolved(), "each state of the dead letter once")
				assert.Equal(t, []string{enrollmentID}, f.confirms())
			},
		},
		{
			name: "transient publish failures are retried by the policy",
			fake: func() *fakeActivities {
				f := reservedFake(30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = 2
				return f
			},
			wantState:  state(workflows.StatusConfirmed),
			wantClaims: []string{"confirmed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				attempts := f.attemptsOf(workflows.EventEnrollmentConfirmed)
				require.Len(t, attempts, 3, "two failures and one success")
				for i, a := range attempts {
					assert.Equal(t, int32(i+1), a.Attempt, "attempt %d", i)
					assert.Equal(t, i < 2, a.Failed, "attempt %d failed", i)
					assert.Equal(t, confirmedEventID, a.EventID, "every attempt carries the same event ID")
				}
				assert.Empty(t, f.deadLetterInputs(), "retries within the policy do not dead-letter")
				assert.Equal(t, []string{enrollmentID}, f.confirms())
			},
		},
		{
			name: "exhausted publish is dead-lettered; operator retry publishes the same event",
			fake: func() *fakeActivities {
				f := reservedFake(30, 0)
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
			wantState:  withDeadLetter(state(workflows.StatusConfirmed), 101),
			wantClaims: []string{"dead_lettered", "reserved", "confirmed"},
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
				assert.Equal(t, dls[0].In.Message, pub[0], "the republished event is the dead-lettered one, same ID")
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterRetrying},
					{ID: 101, State: workflows.DeadLetterResolved},
				}, f.resolved())
				assert.Equal(t, []string{enrollmentID}, f.confirms())
				assert.Empty(t, f.releases())
				assert.Equal(t, 1, f.seatsTaken(courseID))
			},
		},
		{
			name: "dead letter compensated: seat released, waitlist promoted, enrollment.failed published",
			fake: func() *fakeActivities {
				f := reservedFake(30, 3)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				r.queryAt(dlAt - time.Second)
				signalAt(r.env, dlAt, workflows.ActionCompensate, func() {
					assert.Equal(r.t, 4, r.fake.seatsTaken(courseID), "seat held while dead-lettered")
				})
			},
			wantState:  withDeadLetter(state(workflows.StatusFailed), 101),
			wantClaims: []string{"dead_lettered", "failed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				requireDeadLettered(t, r, 101)
				assertCompensated(t, f, 101)
				assert.Equal(t, 3, f.seatsTaken(courseID), "the seat is free")
				assert.Equal(t, []workflows.PromoteWaitlistInput{{CourseID: courseID, By: enrollmentID + ":failed"}}, *r.promotions,
					"the freed seat goes to the waitlist")
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 4, "no publish after compensate")
				assert.Equal(t, []workflows.ResolveDeadLetterInput{
					{ID: 101, State: workflows.DeadLetterCompensated},
				}, f.resolved())
			},
		},
		{
			name: "retry that fails again dead-letters a second round, then compensate",
			fake: func() *fakeActivities {
				f := reservedFake(30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				signalAt(r.env, dlAt, workflows.ActionRetry, nil)
				r.queryAt(secondAt - time.Second)
				signalAt(r.env, secondAt, workflows.ActionCompensate, nil)
			},
			wantState:  withDeadLetter(state(workflows.StatusFailed), 101),
			wantClaims: []string{"dead_lettered", "dead_lettered", "failed"},
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				requireDeadLettered(t, r, 101)
				dls := f.deadLetterInputs()
				require.Len(t, dls, 2)
				assertDeadLetterInput(t, dls[0].In, 1)
				assertDeadLetterInput(t, dls[1].In, 2)
				assert.True(t, dls[1].At.Equal(testStart.Add(dlAt+7*time.Second)),
					"second round dead-letters after another 1s+2s+4s, at %v", dls[1].At.Sub(testStart))
				assert.Equal(t, 2, f.deadLetter(101).Rounds)
				assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 8, "two rounds of 4 attempts")
				assertCompensated(t, f, 101)
			},
		},
		{
			name: "compensation publishes enrollment.failed through a Kafka outage without dead-lettering it",
			fake: func() *fakeActivities {
				f := reservedFake(30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				f.failPublish[workflows.EventEnrollmentFailed] = 5
				return f
			},
			act:        func(r *enrollRun) { signalAt(r.env, dlAt, workflows.ActionCompensate, nil) },
			wantState:  withDeadLetter(state(workflows.StatusFailed), 101),
			wantClaims: []string{"dead_lettered", "failed"},
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
				f := reservedFake(30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act: func(r *enrollRun) {
				r.queryAt(dlAt - time.Second)
				r.env.RegisterDelayedCallback(r.env.CancelWorkflow, dlAt)
			},
			wantCanceled: true,
			wantState:    withDeadLetter(state(workflows.StatusFailed), 101),
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
				claims := r.claims.get()
				require.NotEmpty(t, claims)
				assert.Equal(t, "dead_lettered", claims[0])
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
				f := reservedFake(30, 0)
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1
				return f
			},
			act:          func(r *enrollRun) { r.env.RegisterDelayedCallback(r.env.CancelWorkflow, 1500*time.Millisecond) },
			wantCanceled: true,
			wantState:    state(workflows.StatusFailed),
			check: func(t *testing.T, r *enrollRun) {
				f := r.fake
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
			env, claims, promotions := newEnvNoPromotion(t, f)
			r := &enrollRun{t: t, env: env, fake: f, claims: claims, promotions: promotions}
			if tc.act != nil {
				tc.act(r)
			}
			in := enrollInput()
			if tc.in != nil {
				in = tc.in()
			}

			env.ExecuteWorkflow(workflows.Enrollment, in)

			require.True(t, env.IsWorkflowCompleted())
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

func withDeadLetter(s workflows.EnrollmentState, id int64) workflows.EnrollmentState {
	s.DeadLetterID = id
	return s
}

func refusal(holder string, r workflows.Refusal) workflows.Decision {
	return workflows.Decision{EnrollmentID: holder, Status: workflows.StatusRefused, Refusal: r}
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
			f := reservedFake(30, 0)
			f.failPublish[workflows.EventEnrollmentConfirmed] = tc.failures
			env, _ := newEnv(t, f)
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

// TestUndecidedRunAnswersTheCaller: a cancellation that ends before
// deciding (a fault that is not a refusal) still answers the caller waiting
// on the decision update, with Status failed, instead of blocking on
// AllHandlersFinished.
func TestUndecidedRunAnswersTheCaller(t *testing.T) {
	f := newFake().withCourse(courseID, 30, 0).withEnrollment(enrollmentID, courseID, studentID, workflows.StatusConfirmed)
	f.cancelErr = errSchema
	env, _ := newEnv(t, f)
	decision := sendDecision(env, "id-1", 0)

	env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})

	require.True(t, env.IsWorkflowCompleted())
	err := env.GetWorkflowError()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not exist", "the run fails with its own error, not a timeout")
	d := decision.result(t)
	assert.Equal(t, enrollmentID, d.EnrollmentID)
	assert.Equal(t, workflows.StatusFailed, d.Status)
	assert.Empty(t, d.Refusal)
	assert.Contains(t, d.Message, "does not exist", "the caller learns why")
	assert.Zero(t, f.callCount(workflows.Publish.Name), "nothing published")
	assert.Equal(t, 1, f.seatsTaken(courseID), "seats untouched")
}

// TestEnrollThenCancel runs the two sagas against one fake database: a
// reserved enrollment confirmed by its run, then cancelled.
func TestEnrollThenCancel(t *testing.T) {
	f := reservedFake(1, 0)

	env, _ := newEnv(t, f)
	env.ExecuteWorkflow(workflows.Enrollment, enrollInput())
	require.NoError(t, env.GetWorkflowError())
	require.Equal(t, workflows.StatusConfirmed, f.statusOf(enrollmentID))
	require.Equal(t, 1, f.seatsTaken(courseID))

	env, _ = newEnv(t, f)
	cancelled := sendDecision(env, "id-1", 0)
	env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID})
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.Decision{EnrollmentID: enrollmentID, Status: workflows.StatusCancelled},
		cancelled.result(t))
	assert.Equal(t, 0, f.seatsTaken(courseID), "the seat is free again")

	var types []string
	for _, m := range f.publishedMessages() {
		types = append(types, m.Event.ID)
	}
	assert.Equal(t, []string{confirmedEventID, workflows.EventID(enrollmentID, workflows.EventEnrollmentCancelled)}, types)
}
