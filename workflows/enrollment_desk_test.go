package workflows_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// sendDeskBatch sends b to the desk after delay, as the API does: the
// batch's ID is the update's.
func sendDeskBatch(env *testsuite.TestWorkflowEnvironment, b workflows.DeskBatch, delay time.Duration) *batchDecisionCall {
	c := &batchDecisionCall{}
	env.RegisterDelayedCallback(func() { updateDesk(env, b.BatchID, b, c) }, delay)
	return c
}

// updateDesk sends b to the desk at once under updateID, recording the
// answer in c; call it from a delayed callback.
func updateDesk(env *testsuite.TestWorkflowEnvironment, updateID string, b workflows.DeskBatch, c *batchDecisionCall) {
	env.UpdateWorkflow(workflows.UpdateDeskBatch, updateID, c.callbacks(), b)
}

// whileDeciding sends first to the desk and keeps the desk's decision of
// it inside ReserveSeats while the batches more reach the desk, each in a
// workflow task of its own, and then runs (a cancel, say); then the
// decision goes on. So more are held by the desk, queued, before its first
// decision ends, and then runs while the desk holds them: as on a server,
// where the batches that arrive while a desk decides wait for its next
// workflow task.
func whileDeciding(t *testing.T, env *testsuite.TestWorkflowEnvironment, f *batchFake, first workflows.DeskBatch,
	then func(), more ...workflows.DeskBatch) (*batchDecisionCall, []*batchDecisionCall) {
	t.Helper()
	release := make(chan struct{})
	f.mu.Lock()
	f.holdReserve = func(call int) {
		if call != 1 {
			return
		}
		select {
		case <-release:
		case <-time.After(2 * time.Second):
			t.Errorf("the desk's first decision was never let go")
		}
	}
	f.mu.Unlock()
	firstCall := sendDeskBatch(env, first, 0)
	calls := make([]*batchDecisionCall, len(more))
	for i := range more {
		calls[i] = &batchDecisionCall{}
	}
	// While a local activity runs, the environment fires this by the wall
	// clock.
	env.RegisterDelayedCallback(func() {
		for i, b := range more {
			updateDesk(env, b.BatchID, b, calls[i])
		}
		if then != nil {
			then()
		}
		// The updates (and a cancel) are queued in the environment by now;
		// the decision's end queues behind them.
		close(release)
	}, time.Millisecond)
	return firstCall, calls
}

func deskBatch(id string, claims ...workflows.EnrollmentInput) workflows.DeskBatch {
	return workflows.DeskBatch{BatchID: id, Claims: claims, CollectedAt: testStart}
}

// deskBatchAt is a batch the API collected at.
func deskBatchAt(id string, at time.Time, claims ...workflows.EnrollmentInput) workflows.DeskBatch {
	return workflows.DeskBatch{BatchID: id, Claims: claims, CollectedAt: at}
}

// requireContinuedAsNew asserts the desk closed by continuing as new, as
// the same desk with the same input.
func requireContinuedAsNew(t *testing.T, env *testsuite.TestWorkflowEnvironment, in workflows.EnrollmentDeskInput) {
	t.Helper()
	require.True(t, env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "want continue-as-new, got %v", env.GetWorkflowError())
	assert.Equal(t, "EnrollmentDesk", can.WorkflowType.Name)
	var next workflows.EnrollmentDeskInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	assert.Equal(t, in, next, "the next run is the same desk")
}

// withoutMessages drops the decisions' messages, which are for people.
func withoutMessages(ds []workflows.Decision) []workflows.Decision {
	out := make([]workflows.Decision, len(ds))
	for i, d := range ds {
		d.Message = ""
		out[i] = d
	}
	return out
}

// batchChild is an EnrollmentBatch run a desk or the recovery started.
type batchChild struct {
	ID     string
	Parent string
	In     workflows.EnrollmentBatchInput
	// The search attributes it started with.
	Students, Courses []string
	Status            string
}

// batchChildrenByID maps the batch runs started to their workflow IDs; the
// environment starts the children of one workflow task in no set order.
func batchChildrenByID(started []batchChild) map[string]batchChild {
	out := map[string]batchChild{}
	for _, c := range started {
		out[c.ID] = c
	}
	return out
}

// recordBatchChildren records the EnrollmentBatch runs started in env;
// mocked tells the environment to run a stand-in that ends at once
// instead of the workflow.
func recordBatchChildren(t *testing.T, env *testsuite.TestWorkflowEnvironment, mocked bool) *[]batchChild {
	var started []batchChild
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, ctx workflow.Context, args converter.EncodedValues) {
		if info.WorkflowType.Name != "EnrollmentBatch" {
			return
		}
		c := batchChild{ID: info.WorkflowExecution.ID}
		if info.ParentWorkflowExecution != nil {
			c.Parent = info.ParentWorkflowExecution.ID
		}
		assert.NoError(t, args.Get(&c.In))
		sa := workflow.GetTypedSearchAttributes(ctx)
		c.Students, _ = sa.GetKeywordList(workflows.SearchStudentID)
		c.Courses, _ = sa.GetKeywordList(workflows.SearchCourseID)
		c.Status, _ = sa.GetKeyword(workflows.SearchClaimStatus)
		started = append(started, c)
	})
	if mocked {
		env.OnWorkflow(workflows.EnrollmentBatch, mock.Anything, mock.Anything).Return(workflows.BatchState{}, nil)
	}
	return &started
}

// TestEnrollmentDesk: how a desk decides the batches sent to it and
// answers each claim.
func TestEnrollmentDesk(t *testing.T) {
	t.Run("a batch confirmed: its claims carry its ID and time, one publish attempt confirms them", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 5)
		env, _ := newBatchEnv(t, f)
		children := recordBatchChildren(t, env, false)
		// The API's clock, in its zone, to the nanosecond: the claims and
		// their events carry it in UTC to the microsecond, as Postgres
		// keeps it.
		collected := time.Date(2026, 1, 5, 10, 59, 58, 123456789, time.FixedZone("CET", 3600))
		at := collected.UTC().Truncate(time.Microsecond)
		claims := []workflows.EnrollmentInput{claim("enr-2", courseID, "stu-2"), claim("enr-1", courseID, "stu-1")}
		call := sendDeskBatch(env, deskBatchAt("b-1", collected, claims...), 0)
		in := workflows.EnrollmentDeskInput{Desk: 3, BatchesPerRun: 1}

		env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

		requireContinuedAsNew(t, env, in)
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-2"), confirmedDecision("enr-1")}, call.result(t),
			"one answer a claim, in order")
		reserves := f.reserveSeatsCalls()
		require.Len(t, reserves, 1)
		assert.Equal(t, testWorkflowID, reserves[0].WorkflowID, "the rows name the desk's run")
		assert.NotEmpty(t, reserves[0].RunID)
		require.Len(t, reserves[0].Claims, 2)
		for i, c := range reserves[0].Claims {
			assert.Equal(t, claims[i].EnrollmentID, c.EnrollmentID)
			assert.Equal(t, "b-1", c.BatchID, "claim %d names its batch", i)
			assert.Equal(t, at, c.OccurredAt, "claim %d carries its batch's CollectedAt in UTC, to the µs", i)
		}
		fast := f.fastPublishAttempts()
		require.Len(t, fast, 1, "one publish for the batch")
		assert.True(t, fast[0].In.FailFast && fast[0].In.Confirm && fast[0].In.PublishedKnown,
			"one attempt, confirming as it publishes, told what is out")
		assert.Empty(t, fast[0].In.Published, "nothing was out before")
		assert.Equal(t, []string{"enr-2", "enr-1"}, fast[0].In.EnrollmentIDs)
		wantBatchEvents(t, f.publishedMessages(), claims, at)
		for _, m := range f.publishedMessages() {
			assert.Equal(t, time.UTC, m.Event.OccurredAt.Location(), "%s: occurred_at in UTC", m.Event.ID)
		}
		for _, c := range claims {
			assert.Equal(t, workflows.StatusConfirmed, f.statusOf(c.EnrollmentID))
		}
		assert.Equal(t, 7, f.seatsTaken(courseID))
		assert.Empty(t, f.publishBatchAttempts(), "no publish on the retry policy")
		assert.Empty(t, f.confirmBatchCalls(), "the publish confirmed them")
		assert.Empty(t, *children, "no batch run")
	})

	t.Run("each claim is answered as ReserveSeats decided it", func(t *testing.T) {
		waits := func(c workflows.EnrollmentInput) workflows.EnrollmentInput { c.Waitlist = true; return c }
		for _, tc := range []struct {
			name  string
			fake  func() *batchFake
			claim workflows.EnrollmentInput
			want  workflows.Decision
		}{
			{name: "course full", fake: func() *batchFake { return newBatchFake().withCourse(courseID, 2, 2) },
				claim: claim("enr-1", courseID, "stu-1"), want: refusal("enr-1", workflows.RefusalCourseFull)},
			{name: "already enrolled: the answer names the enrollment that holds the seat",
				fake: func() *batchFake {
					return newBatchFake().withCourse(courseID, 30, 0).withEnrollment("enr-0", courseID, "stu-1", workflows.StatusConfirmed)
				},
				claim: claim("enr-1", courseID, "stu-1"), want: refusal("enr-0", workflows.RefusalAlreadyEnrolled)},
			{name: "course not found", fake: func() *batchFake { return newBatchFake().withCourse(courseID, 30, 0) },
				claim: claim("enr-1", noCourse, "stu-1"), want: refusal("enr-1", workflows.RefusalCourseNotFound)},
			{name: "waitlist full", fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 2, 2)
				f.waitlistRoom = map[string]int{courseID: 1}
				f.withWaitlist(courseID, claim("enr-w", courseID, "stu-w"))
				return f
			}, claim: waits(claim("enr-1", courseID, "stu-1")), want: refusal("enr-1", workflows.RefusalWaitlistFull)},
			{name: "waitlisted, behind those already waiting", fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 2, 2)
				f.withWaitlist(courseID, claim("enr-w", courseID, "stu-w"))
				return f
			}, claim: waits(claim("enr-1", courseID, "stu-1")),
				want: workflows.Decision{EnrollmentID: "enr-1", Status: workflows.StatusWaitlisted, Position: 2}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := tc.fake()
				env, upserts := newBatchEnv(t, f)
				children := recordBatchChildren(t, env, false)
				call := sendDeskBatch(env, deskBatch("b-1", tc.claim), 0)
				in := workflows.EnrollmentDeskInput{BatchesPerRun: 1}

				env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

				requireContinuedAsNew(t, env, in)
				got := call.result(t)
				require.Len(t, got, 1)
				if tc.want.Status == workflows.StatusRefused {
					assert.NotEmpty(t, got[0].Message, "a refusal says why")
				}
				assert.Equal(t, []workflows.Decision{tc.want}, withoutMessages(got))
				assert.Empty(t, f.fastPublishAttempts(), "nothing reserved, nothing to publish")
				assert.Empty(t, f.publishedMessages())
				assert.Empty(t, *children)
				all := upserts.all()
				require.Len(t, all, 1)
				assert.Equal(t, outcome{ClaimStatus: "refused", Refused: []string{"stu-1"}}, outcomeOf(all[0]),
					"refused and waitlisted students are listed as refused")
			})
		}
	})

	// The batches that reach a desk while it decides wait for its next
	// workflow task, which decides them as one: one ReserveSeats, one
	// publish. A claim of one batch meets those of the other.
	t.Run("the batches of one workflow task are decided by one ReserveSeats", func(t *testing.T) {
		t1, t2 := testStart.Add(time.Second), testStart.Add(2*time.Second)
		b0 := deskBatch("b-0", claim("enr-0", courseID, "stu-0"))
		b1 := deskBatchAt("b-1", t1, claim("enr-1", courseID, "stu-1"))
		b2 := deskBatchAt("b-2", t2, claim("enr-2", courseID, "stu-2"), claim("enr-3", courseID, "stu-1"))
		stamped := func(c workflows.EnrollmentInput, batch string, at time.Time) workflows.EnrollmentInput {
			c.BatchID, c.OccurredAt = batch, at
			return c
		}
		want1 := []workflows.EnrollmentInput{stamped(claim("enr-1", courseID, "stu-1"), "b-1", t1)}
		want2 := []workflows.EnrollmentInput{stamped(claim("enr-2", courseID, "stu-2"), "b-2", t2),
			stamped(claim("enr-3", courseID, "stu-1"), "b-2", t2)}
		for _, tc := range []struct {
			name      string
			failBatch int
			want1     []workflows.Decision
			want2     []workflows.Decision
		}{
			{name: "published: confirmed", want1: []workflows.Decision{confirmedDecision("enr-1")},
				want2: []workflows.Decision{confirmedDecision("enr-2"), refusal("enr-1", workflows.RefusalAlreadyEnrolled)}},
			{name: "publish failed: reserved, one batch run per batch", failBatch: -1,
				want1: []workflows.Decision{reserved("enr-1")},
				want2: []workflows.Decision{reserved("enr-2"), refusal("enr-1", workflows.RefusalAlreadyEnrolled)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = tc.failBatch
				env, _ := newBatchEnv(t, f)
				children := recordBatchChildren(t, env, true)
				_, calls := whileDeciding(t, env, f, b0, nil, b1, b2)
				in := workflows.EnrollmentDeskInput{BatchesPerRun: 3}

				env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

				requireContinuedAsNew(t, env, in)
				assert.Equal(t, tc.want1, withoutMessages(calls[0].result(t)), "b-1")
				assert.Equal(t, tc.want2, withoutMessages(calls[1].result(t)), "b-2: stu-1 holds a seat from b-1")
				reserves := f.reserveSeatsCalls()
				require.Len(t, reserves, 2, "b-0, then b-1 and b-2 together")
				assert.Equal(t, append(want1, want2...), reserves[1].Claims, "each claim carries its own batch's ID and time")
				fast := f.fastPublishAttempts()
				require.Len(t, fast, 2)
				assert.Equal(t, []string{"enr-1", "enr-2"}, fast[1].In.EnrollmentIDs, "one publish for both batches")
				if tc.failBatch == 0 {
					pub := f.publishedMessages()
					require.Len(t, pub, 3, "enr-0's event, then those of enr-1 and enr-2")
					wantBatchEvents(t, pub[1:2], want1, t1)
					wantBatchEvents(t, pub[2:], want2[:1], t2)
					assert.Empty(t, *children)
					return
				}
				assert.Empty(t, f.publishedMessages())
				require.Len(t, *children, 3, "one batch run a batch")
				got := batchChildrenByID(*children)
				for _, want := range []workflows.EnrollmentBatchInput{
					{BatchID: "b-0", Claims: []workflows.EnrollmentInput{stamped(claim("enr-0", courseID, "stu-0"), "b-0", testStart)}},
					{BatchID: "b-1", Claims: want1},
					{BatchID: "b-2", Claims: want2[:1]},
				} {
					run, ok := got[workflows.EnrollmentBatchWorkflowID(want.BatchID)]
					require.True(t, ok, "the run of %s, named by the batch", want.BatchID)
					assert.Equal(t, want, run.In, "%s: the batch's reserved claims alone", want.BatchID)
					assert.Equal(t, testWorkflowID, run.Parent)
					assert.Equal(t, "reserved", run.Status, "%s starts listed as reserved", want.BatchID)
					assert.Equal(t, []string{want.Claims[0].StudentID}, run.Students, "%s lists its students", want.BatchID)
					assert.Equal(t, []string{courseID}, run.Courses)
				}
			})
		}
	})

	t.Run("a failed publish answers reserved and the batch's own run publishes and confirms", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 2)
		f.failBatch = 1 // the fast attempt does not send; the batch run's first attempt fails, its retry sends
		env, _ := newBatchEnv(t, f)
		children := recordBatchChildren(t, env, false)
		granted := pairClaims()[:2]
		call := sendDeskBatch(env, deskBatch("b-1", pairClaims()...), 0)
		// The desk stays until the batch run is done: the test environment
		// ends a closed parent's children, which the server does not
		// (ParentClosePolicy abandon).
		env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{DiscloseWithin: time.Hour})

		require.True(t, env.IsWorkflowCompleted())
		assert.Equal(t, []workflows.Decision{reserved("enr-2"), reserved("enr-1"),
			refusal("enr-3", workflows.RefusalCourseNotFound)}, withoutMessages(call.result(t)),
			"reserved at once, the refusal as it is")
		require.Len(t, *children, 1)
		run := (*children)[0]
		assert.Equal(t, workflows.EnrollmentBatchWorkflowID("b-1"), run.ID)
		assert.Equal(t, "b-1", run.In.BatchID)
		assert.Equal(t, idsOf(granted), idsOf(run.In.Claims), "the reserved claims alone")
		for _, c := range run.In.Claims {
			assert.True(t, c.OccurredAt.Equal(testStart) && c.BatchID == "b-1", "%s carries its batch and time", c.EnrollmentID)
		}
		for _, c := range granted {
			assert.Equal(t, workflows.StatusConfirmed, f.enrollment(c.EnrollmentID).Status, "the batch run published and confirmed")
		}
		assert.Len(t, f.publishBatchAttempts(), 2, "the batch run's two attempts")
		assert.Equal(t, [][]string{idsOf(granted)}, f.confirmBatchCalls())
		wantBatchEvents(t, f.publishedMessages(), granted, testStart)
		assert.Equal(t, 4, f.seatsTaken(courseID), "two seats taken, by the desk alone")
	})

	// A batch's run may exist before the desk starts it: the recovery
	// started it first, or (as here) a decision before this one. The desk
	// leaves it to its owner and answers reserved as usual.
	t.Run("a batch whose run already exists is left to it", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		f.failBatch = -1
		env, _ := newBatchEnv(t, f)
		children := recordBatchChildren(t, env, true)
		b := deskBatch("b-1", claim("enr-1", courseID, "stu-1"))
		first := sendDeskBatch(env, b, 0)
		again := &batchDecisionCall{}
		env.RegisterDelayedCallback(func() { updateDesk(env, "b-1 sent again", b, again) }, time.Second)
		in := workflows.EnrollmentDeskInput{BatchesPerRun: 2}

		env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

		requireContinuedAsNew(t, env, in)
		assert.Equal(t, []workflows.Decision{reserved("enr-1")}, first.result(t))
		assert.Equal(t, []workflows.Decision{reserved("enr-1")}, again.result(t), "the claim's own row answers the resend")
		require.Len(t, *children, 1, "one run for the batch")
		assert.Equal(t, workflows.EnrollmentBatchWorkflowID("b-1"), (*children)[0].ID)
		assert.Len(t, f.reserveSeatsCalls(), 2)
		assert.Equal(t, 1, f.seatsTaken(courseID), "the resend took no second seat")
	})

	// ReserveSeats retries until Postgres answers; a reservation that
	// committed and then lost its answer is answered by its own rows on
	// the retry.
	t.Run("a reservation whose answer was lost holds one seat and is confirmed", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		f.lostReserves = 1
		env, _ := newBatchEnv(t, f)
		// The test environment times a local activity's retry from its
		// workflow clock and waits for it by the wall clock: they must
		// agree for a retry to have its StartToClose.
		env.SetStartTime(time.Now())
		call := sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), 0)
		in := workflows.EnrollmentDeskInput{BatchesPerRun: 1}

		env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

		requireContinuedAsNew(t, env, in)
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1")}, call.result(t))
		assert.Len(t, f.reserveSeatsCalls(), 2, "the attempt whose answer was lost, and its retry")
		assert.Equal(t, 1, f.seatsTaken(courseID), "one seat")
		assert.Len(t, f.publishedMessages(), 1)
	})

	t.Run("a fault that is not retried answers every claim undecided, and the desk goes on", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		f.reserveErr = errSchema
		env, upserts := newBatchEnv(t, f)
		call := sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")), 0)
		next := sendDeskBatch(env, deskBatch("b-2", claim("enr-3", courseID, "stu-3")), time.Second)
		in := workflows.EnrollmentDeskInput{BatchesPerRun: 2}

		env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

		requireContinuedAsNew(t, env, in)
		for _, got := range [][]workflows.Decision{call.result(t), next.result(t)} {
			for _, d := range got {
				assert.Equal(t, workflows.StatusFailed, d.Status, "%s", d.EnrollmentID)
				assert.Contains(t, d.Message, "the claim ended without a decision")
				assert.Contains(t, d.Message, `relation "enrollments" does not exist`, "the caller learns why")
			}
		}
		assert.Equal(t, []string{"enr-1", "enr-2"}, idsOf(f.reserveSeatsCalls()[0].Claims))
		assert.Empty(t, f.fastPublishAttempts())
		all := upserts.all()
		require.Len(t, all, 1)
		assert.Equal(t, outcome{ClaimStatus: "handed_off"}, outcomeOf(all[0]), "a run that decided nothing lists nobody")
	})

	t.Run("the validator rejects a batch without an ID, claims or a collection time", func(t *testing.T) {
		ok := claim("enr-1", courseID, "stu-1")
		for _, tc := range []struct {
			name  string
			batch workflows.DeskBatch
		}{
			{"no ID", workflows.DeskBatch{Claims: []workflows.EnrollmentInput{ok}, CollectedAt: testStart}},
			{"no claims", workflows.DeskBatch{BatchID: "b-0", CollectedAt: testStart}},
			{"no collection time", workflows.DeskBatch{BatchID: "b-0", Claims: []workflows.EnrollmentInput{ok}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				env, _ := newBatchEnv(t, f)
				bad := &batchDecisionCall{}
				env.RegisterDelayedCallback(func() { updateDesk(env, "bad", tc.batch, bad) }, 0)
				good := sendDeskBatch(env, deskBatch("b-1", claim("enr-2", courseID, "stu-2")), time.Second)
				in := workflows.EnrollmentDeskInput{BatchesPerRun: 1}

				env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

				requireContinuedAsNew(t, env, in)
				bad.mu.Lock()
				assert.ErrorContains(t, bad.rejected, "a batch needs an ID, its collection time and at least one claim")
				assert.False(t, bad.accepted)
				bad.mu.Unlock()
				assert.Equal(t, []workflows.Decision{confirmedDecision("enr-2")}, good.result(t), "the desk goes on")
				reserves := f.reserveSeatsCalls()
				require.Len(t, reserves, 1)
				assert.Equal(t, []string{"enr-2"}, idsOf(reserves[0].Claims), "the rejected batch reserved nothing")
			})
		}
	})
}

// TestEnrollmentDeskCloses: when and how a desk run ends.
func TestEnrollmentDeskCloses(t *testing.T) {
	t.Run("continues as new after BatchesPerRun batches", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, _ := newBatchEnv(t, f)
		var calls []*batchDecisionCall
		for i := range 3 {
			id := fmt.Sprint(i + 1)
			calls = append(calls, sendDeskBatch(env, deskBatch("b-"+id, claim("enr-"+id, courseID, "stu-"+id)), time.Duration(i)*time.Second))
		}
		in := workflows.EnrollmentDeskInput{Desk: 1, BatchesPerRun: 2}

		env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

		requireContinuedAsNew(t, env, in)
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1")}, calls[0].result(t))
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-2")}, calls[1].result(t))
		calls[2].mu.Lock()
		assert.False(t, calls[2].accepted, "the third batch goes to the next run")
		calls[2].mu.Unlock()
		assert.Len(t, f.reserveSeatsCalls(), 2)
		v, err := env.QueryWorkflow(workflows.QueryStatus)
		require.NoError(t, err)
		var st workflows.DeskState
		require.NoError(t, v.Get(&st))
		assert.Equal(t, workflows.DeskState{Desk: 1, Batches: 2, Claims: 2}, st, "the status query")
	})

	t.Run("closes DiscloseWithin after its first decision", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			within time.Duration
			want   time.Duration
		}{
			{"5 s by default", 0, 5 * time.Second},
			{"as configured", 2 * time.Second, 2 * time.Second},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				env, upserts := newBatchEnv(t, f)
				sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), time.Minute)
				late := sendDeskBatch(env, deskBatch("b-2", claim("enr-2", courseID, "stu-2")), time.Minute+tc.want+time.Second)
				began := env.Now()
				in := workflows.EnrollmentDeskInput{DiscloseWithin: tc.within}

				env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

				requireContinuedAsNew(t, env, in)
				assert.Equal(t, time.Minute+tc.want, env.Now().Sub(began),
					"idle for a minute, then closed %s after its first decision", tc.want)
				late.mu.Lock()
				assert.False(t, late.accepted, "the batch after the close goes to the next run")
				late.mu.Unlock()
				all := upserts.all()
				require.Len(t, all, 1)
				assert.Equal(t, []string{"stu-1"}, outcomeOf(all[0]).StudentIDs)
			})
		}
	})

	// Each student is 8 bytes ("stu-1" quoted, a comma), the course 8; the
	// budget is 50 bytes.
	t.Run("a batch its search attributes might not list is turned away DeskFull; a nearly full run closes", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			// batches sent one second apart
			batches []workflows.DeskBatch
			// wantDecided: how many batches the run decided; with
			// wantFull the next one is turned away DeskFull by the handler.
			wantDecided  int
			wantFull     bool
			wantStudents []string
			wantClosedAt time.Duration
		}{
			{
				// 16 + 40 bytes do not fit.
				name: "too large: turned away",
				batches: []workflows.DeskBatch{
					deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")),
					deskBatch("b-2", claim("enr-3", courseID, "stu-3"), claim("enr-4", courseID, "stu-4"),
						claim("enr-5", courseID, "stu-5"), claim("enr-6", courseID, "stu-6"), claim("enr-7", courseID, "stu-7")),
					deskBatch("b-3", claim("enr-8", courseID, "stu-8")),
				},
				wantDecided: 1, wantFull: true, wantStudents: []string{"stu-1", "stu-2"}, wantClosedAt: time.Second,
			},
			{
				// The largest batch decided adds 16 bytes: after 16 + 8
				// the list leaves less than 2 × 16 of 50, and the run
				// closes without turning anything away.
				name: "nearly full: closes",
				batches: []workflows.DeskBatch{
					deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")),
					deskBatch("b-2", claim("enr-3", courseID, "stu-3")),
					deskBatch("b-3", claim("enr-4", courseID, "stu-4")),
				},
				wantDecided: 2, wantStudents: []string{"stu-1", "stu-2", "stu-3"}, wantClosedAt: time.Second,
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				env, upserts := newBatchEnv(t, f)
				var calls []*batchDecisionCall
				for i, b := range tc.batches {
					calls = append(calls, sendDeskBatch(env, b, time.Duration(i)*time.Second))
				}
				began := env.Now()
				in := workflows.EnrollmentDeskInput{AttrBytes: 50, DiscloseWithin: time.Hour}

				env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

				requireContinuedAsNew(t, env, in)
				assert.Equal(t, tc.wantClosedAt, env.Now().Sub(began), "closed with the last batch it took, not by the hour's timer")
				for i, c := range calls {
					c.mu.Lock()
					switch {
					case i < tc.wantDecided:
						assert.True(t, c.completed && c.err == nil, "batch %d decided (%v)", i, c.err)
					case i == tc.wantDecided && tc.wantFull:
						assert.True(t, c.accepted, "batch %d accepted, then turned away", i)
						assertDeskFull(t, c.err)
					default:
						assert.False(t, c.accepted, "batch %d after the close goes to the next run", i)
					}
					c.mu.Unlock()
				}
				all := upserts.all()
				require.Len(t, all, 1)
				assert.Equal(t, tc.wantStudents, outcomeOf(all[0]).StudentIDs)
				assert.Len(t, f.reserveSeatsCalls(), tc.wantDecided, "what was turned away reserved nothing")
			})
		}
	})

	t.Run("a batch sent while the desk closes is rejected DeskFull by the validator", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, upserts := newBatchEnv(t, f)
		// b-1 is in its decision when b-2, which would pass the budget
		// with it, arrives: b-2 is turned away and the run closes once
		// b-1 is decided; b-3 arrives meanwhile.
		first, more := whileDeciding(t, env, f,
			deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")), nil,
			deskBatch("b-2", claim("enr-3", courseID, "stu-3"), claim("enr-4", courseID, "stu-4"),
				claim("enr-5", courseID, "stu-5"), claim("enr-6", courseID, "stu-6"), claim("enr-7", courseID, "stu-7")),
			deskBatch("b-3", claim("enr-8", courseID, "stu-8")))
		in := workflows.EnrollmentDeskInput{AttrBytes: 50}

		env.ExecuteWorkflow(workflows.EnrollmentDesk, in)

		requireContinuedAsNew(t, env, in)
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1"), confirmedDecision("enr-2")}, first.result(t),
			"the batch the desk held is decided before it closes")
		more[0].mu.Lock()
		assert.True(t, more[0].accepted)
		assertDeskFull(t, more[0].err)
		more[0].mu.Unlock()
		more[1].mu.Lock()
		assert.False(t, more[1].accepted, "not taken while the run closes")
		assertDeskFull(t, more[1].rejected)
		more[1].mu.Unlock()
		assert.Len(t, f.reserveSeatsCalls(), 1)
		all := upserts.all()
		require.Len(t, all, 1)
		assert.Equal(t, []string{"stu-1", "stu-2"}, outcomeOf(all[0]).StudentIDs)
	})

	t.Run("a cancel closes an idle desk", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, upserts := newBatchEnv(t, f)
		call := sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), 0)
		env.RegisterDelayedCallback(env.CancelWorkflow, time.Second)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{})

		require.True(t, env.IsWorkflowCompleted())
		assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()), "got %v", env.GetWorkflowError())
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1")}, call.result(t))
		all := upserts.all()
		require.Len(t, all, 1, "the outcome, as it closes")
		assert.Equal(t, []string{"stu-1"}, outcomeOf(all[0]).StudentIDs)
	})

	// The cancel reaches the desk while it decides b-1 and holds b-2: it
	// decides both, answers them, and closes cancelled, not continued as
	// new (which would drop the operator's cancel: the next run does not
	// inherit it).
	t.Run("a cancel closes the desk after the batches it holds", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 30, 0)
		env, upserts := newBatchEnv(t, f)
		first, more := whileDeciding(t, env, f, deskBatch("b-1", claim("enr-1", courseID, "stu-1")), env.CancelWorkflow,
			deskBatch("b-2", claim("enr-2", courseID, "stu-2")))

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{})

		require.True(t, env.IsWorkflowCompleted())
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-1")}, first.result(t))
		assert.Equal(t, []workflows.Decision{confirmedDecision("enr-2")}, more[0].result(t), "held, so decided")
		all := upserts.all()
		require.Len(t, all, 1)
		assert.Equal(t, []string{"stu-1", "stu-2"}, outcomeOf(all[0]).StudentIDs)
		assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()),
			"an operator's cancel closes the desk; got %v", env.GetWorkflowError())
	})
}

// assertDeskFull asserts err is the desk's DeskFull application error.
func assertDeskFull(t *testing.T, err error) {
	t.Helper()
	var app *temporal.ApplicationError
	if assert.True(t, errors.As(err, &app), "want a DeskFull application error, got %v", err) {
		assert.Equal(t, workflows.DeskFullErrorType, app.Type())
	}
}

// TestEnrollmentDeskTellsWhatItDecided: the search attributes a desk run
// closes with (visibility.go).
func TestEnrollmentDeskTellsWhatItDecided(t *testing.T) {
	t.Run("the closing run lists the students it confirmed and refused", func(t *testing.T) {
		f := newBatchFake().withCourse(courseID, 3, 1)
		env, upserts := newBatchEnv(t, f)
		sendDeskBatch(env, deskBatch("b-1", claim("enr-1", courseID, "stu-1"), claim("enr-2", courseID, "stu-2")), 0)
		// The course has two seats left: the third claim is refused.
		sendDeskBatch(env, deskBatch("b-2", claim("enr-3", courseID, "stu-3"), claim("enr-4", noCourse, "stu-4")), time.Second)

		env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{BatchesPerRun: 2})

		requireContinuedAsNew(t, env, workflows.EnrollmentDeskInput{BatchesPerRun: 2})
		all := upserts.all()
		require.Len(t, all, 1, "one upsert, in the closing task")
		assert.Equal(t, outcome{ClaimStatus: "confirmed", StudentIDs: []string{"stu-1", "stu-2"}, CourseIDs: []string{courseID},
			Refused: []string{"stu-3", "stu-4"}}, outcomeOf(all[0]))
	})

	t.Run("a desk that only refused says refused; one that reserved only says handed_off", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			failBatch int
			claims    []workflows.EnrollmentInput
			want      outcome
		}{
			{"refused", 0, []workflows.EnrollmentInput{claim("enr-1", noCourse, "stu-1")},
				outcome{ClaimStatus: "refused", Refused: []string{"stu-1"}}},
			{"handed off", 1, []workflows.EnrollmentInput{claim("enr-1", courseID, "stu-1")},
				outcome{ClaimStatus: "handed_off"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = tc.failBatch
				env, upserts := newBatchEnv(t, f)
				sendDeskBatch(env, deskBatch("b-1", tc.claims...), 0)
				// Closed by a cancel once a handed-off batch's run is done
				// (the test environment ends a closed parent's children),
				// so the desk's upsert is the last.
				env.RegisterDelayedCallback(env.CancelWorkflow, 10*time.Minute)

				env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{DiscloseWithin: time.Hour})

				assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()), "got %v", env.GetWorkflowError())
				all := upserts.all()
				require.NotEmpty(t, all)
				assert.Equal(t, tc.want, outcomeOf(all[len(all)-1]))
			})
		}
	})
}
