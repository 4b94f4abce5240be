package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// batchFake adds the desk's and the batch run's activities to the fake of
// the other sagas. Both work on one in-memory database, so the Enrollment
// runs a batch hands its enrollments to find the seats the desk reserved.
type batchFake struct {
	*fakeActivities

	// failBatch makes PublishBatch fail: n > 0 fails the next n attempts,
	// n < 0 fails every attempt. A fail-fast attempt fails while failBatch
	// is not 0 without using one up, as the real one does after a failed
	// send: it does not try.
	failBatch int
	// lostReserves makes ReserveSeats commit and then report a fault, as
	// when the connection drops after COMMIT: n > 0 the next n, n < 0 all.
	lostReserves int

	// reserveErr, when set, is what ReserveSeats returns (a fault).
	reserveErr error
	// waitlistRoom bounds a course's waitlist (no bound when absent): a
	// claim that would queue past it is refused waitlist_full.
	waitlistRoom map[string]int
	// holdReserve, when set, runs at the start of every ReserveSeats call
	// (1 the first), outside the lock: a test blocks in it to keep a desk
	// inside a decision while more batches or a cancel reach the desk.
	holdReserve  func(call int)
	reserveCalls int
	// stranded is what FindStrandedReservations answers.
	stranded  []workflows.StrandedBatch
	findErr   error // what FindStrandedReservations fails with, when set
	findCalls []workflows.RecoverReservationsInput

	reserveSeatsInputs []workflows.ReserveSeatsInput
	fastAttempts       []batchAttempt // PublishBatch with FailFast
	batchAttempts      []batchAttempt // the batch run's attempts, on the retry policy
	confirmBatches     [][]string     // ConfirmBatch calls
	releaseSeatSets    [][]string     // ReleaseSeats calls
}

type batchAttempt struct {
	In      workflows.PublishBatchInput
	Attempt int32
	At      time.Time
	Failed  bool
}

func newBatchFake() *batchFake { return &batchFake{fakeActivities: newFake()} }

func (b *batchFake) withCourse(id string, capacity, taken int) *batchFake {
	b.fakeActivities.withCourse(id, capacity, taken)
	return b
}

func (b *batchFake) withEnrollment(id, course, student string, status workflows.EnrollmentStatus) *batchFake {
	b.fakeActivities.withEnrollment(id, course, student, status)
	return b
}

// newBatchEnv is newEnv plus the batch workflow and its activities. The
// batch calls its local activities by name, so they are registered by name
// like the rest.
func newBatchEnv(t *testing.T, b *batchFake) (*testsuite.TestWorkflowEnvironment, *claimStatuses) {
	t.Helper()
	env, claims := newEnv(t, b.fakeActivities)
	env.RegisterWorkflow(workflows.EnrollmentBatch)
	env.RegisterWorkflow(workflows.EnrollmentDesk)
	env.RegisterWorkflow(workflows.RecoverReservations)
	register(env, workflows.ReserveSeats, b.ReserveSeats)
	register(env, workflows.FindStrandedReservations, b.FindStrandedReservations)
	registerNoResult(env, workflows.PublishBatch, b.PublishBatch)
	registerNoResult(env, workflows.ConfirmBatch, b.ConfirmBatch)
	registerNoResult(env, workflows.ReleaseSeats, b.ReleaseSeats)
	return env, claims
}

// holder is the active enrollment of student in course, if any. Callers hold mu.
func (b *batchFake) holder(course, student string) string {
	for _, e := range b.enrollments {
		if e.CourseID == course && e.StudentID == student && active(e.Status) {
			return e.ID
		}
	}
	return ""
}

// ReserveSeats decides the claims in order, in one step, with the rules of
// the Postgres implementation: the batch's own rows answer a retry; then an
// unknown course, a seat the student already holds (in the database or
// earlier in this batch) and a full course are refused, in that order.
func (b *batchFake) ReserveSeats(_ context.Context, in workflows.ReserveSeatsInput) (workflows.ReserveSeatsResult, error) {
	b.mu.Lock()
	b.reserveCalls++
	hold, n := b.holdReserve, b.reserveCalls
	b.mu.Unlock()
	if hold != nil {
		hold(n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.called(workflows.ReserveSeats.Name)
	b.reserveSeatsInputs = append(b.reserveSeatsInputs, in)
	if b.reserveErr != nil {
		return workflows.ReserveSeatsResult{}, b.reserveErr
	}
	res := workflows.ReserveSeatsResult{Decisions: make([]workflows.Decision, len(in.Claims))}
	for i, c := range in.Claims {
		d := &res.Decisions[i]
		d.EnrollmentID = c.EnrollmentID
		if own, ok := b.enrollments[c.EnrollmentID]; ok {
			if own.Status == workflows.StatusFailed || own.Status == workflows.StatusCancelled {
				d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalEnrollmentInactive
				d.Message = fmt.Sprintf("enrollment %s is already %s", c.EnrollmentID, own.Status)
			} else {
				d.Status = workflows.StatusReserved
			}
			if own.Published {
				res.Published = append(res.Published, c.EnrollmentID)
			}
			continue
		}
		_, exists := b.capacity[c.CourseID]
		switch holder := b.holder(c.CourseID, c.StudentID); {
		case !exists:
			d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalCourseNotFound
			d.Message = fmt.Sprintf("course %q does not exist", c.CourseID)
		case holder != "":
			d.Status, d.Refusal, d.EnrollmentID = workflows.StatusRefused, workflows.RefusalAlreadyEnrolled, holder
			d.Message = fmt.Sprintf("student %q is already enrolled in %q", c.StudentID, c.CourseID)
		case (b.enrolled[c.CourseID] >= b.capacity[c.CourseID] || len(b.waitlist[c.CourseID]) > 0) && c.Waitlist:
			if room, bounded := b.waitlistRoom[c.CourseID]; bounded && len(b.waitlist[c.CourseID]) >= room {
				d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalWaitlistFull
				d.Message = fmt.Sprintf("course %q is full and so is its waitlist", c.CourseID)
				continue
			}
			b.waitlist[c.CourseID] = append(b.waitlist[c.CourseID], c)
			b.enrollments[c.EnrollmentID] = &fakeEnrollment{ID: c.EnrollmentID, CourseID: c.CourseID,
				StudentID: c.StudentID, Status: workflows.StatusWaitlisted}
			d.Status, d.Position = workflows.StatusWaitlisted, len(b.waitlist[c.CourseID])
		case b.enrolled[c.CourseID] >= b.capacity[c.CourseID] || len(b.waitlist[c.CourseID]) > 0:
			d.Status, d.Refusal = workflows.StatusRefused, workflows.RefusalCourseFull
			d.Message = fmt.Sprintf("course %q has no seat left", c.CourseID)
		default:
			d.Status = workflows.StatusReserved
			b.enrolled[c.CourseID]++
			b.enrollments[c.EnrollmentID] = &fakeEnrollment{ID: c.EnrollmentID, CourseID: c.CourseID,
				StudentID: c.StudentID, Status: workflows.StatusReserved}
		}
	}
	if b.lostReserves != 0 {
		if b.lostReserves > 0 {
			b.lostReserves--
		}
		return workflows.ReserveSeatsResult{}, errors.New("read tcp 10.0.0.7:5432: connection reset by peer")
	}
	return res, nil
}

// PublishBatch sends every event whose enrollment is not stamped published
// yet and stamps them, or fails as a whole. Like the real one, it takes
// the input's word for what is out when the input says it knows.
func (b *batchFake) PublishBatch(ctx context.Context, in workflows.PublishBatchInput) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.called(workflows.PublishBatch.Name)
	attempt := batchAttempt{In: in, Attempt: activity.GetInfo(ctx).Attempt, At: b.now()}
	if len(in.Messages) != len(in.EnrollmentIDs) {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("%d messages for %d enrollments",
			len(in.Messages), len(in.EnrollmentIDs)), "bad_input", nil)
	}
	if in.FailFast {
		attempt.Failed = b.failBatch != 0
		b.fastAttempts = append(b.fastAttempts, attempt)
		if attempt.Failed {
			return errors.New("publish batch: not sent, the broker failed a send 5ms ago")
		}
		b.publish(in)
		if in.Confirm {
			for _, id := range in.EnrollmentIDs {
				if e, ok := b.enrollments[id]; ok &&
					(e.Status == workflows.StatusReserved || e.Status == workflows.StatusDeadLettered) {
					e.Status = workflows.StatusConfirmed
				}
			}
		}
		return nil
	}
	if b.failBatch != 0 {
		if b.failBatch > 0 {
			b.failBatch--
		}
		attempt.Failed = true
		b.batchAttempts = append(b.batchAttempts, attempt)
		return fmt.Errorf("publish batch: %d of %d events not acknowledged: %w",
			len(in.Messages), len(in.Messages), errBrokerDown)
	}
	b.batchAttempts = append(b.batchAttempts, attempt)
	b.publish(in)
	return nil
}

func (b *batchFake) publish(in workflows.PublishBatchInput) {
	for i, m := range in.Messages {
		e := b.enrollments[in.EnrollmentIDs[i]]
		out := e != nil && e.Published
		if in.PublishedKnown {
			out = slices.Contains(in.Published, in.EnrollmentIDs[i])
		}
		if out {
			continue
		}
		b.published = append(b.published, m)
		if e != nil {
			e.Published = true
		}
	}
}

func (b *batchFake) ConfirmBatch(_ context.Context, ids []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.called(workflows.ConfirmBatch.Name)
	b.confirmBatches = append(b.confirmBatches, slices.Clone(ids))
	for _, id := range ids {
		if e, ok := b.enrollments[id]; ok &&
			(e.Status == workflows.StatusReserved || e.Status == workflows.StatusDeadLettered) {
			e.Status = workflows.StatusConfirmed
		}
	}
	return nil
}

func (b *batchFake) ReleaseSeats(_ context.Context, ids []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.called(workflows.ReleaseSeats.Name)
	b.releaseSeatSets = append(b.releaseSeatSets, slices.Clone(ids))
	for _, id := range ids {
		e, ok := b.enrollments[id]
		if !ok || (e.Status != workflows.StatusReserved && e.Status != workflows.StatusDeadLettered) {
			continue // releasing twice frees one seat
		}
		e.Status = workflows.StatusFailed
		b.enrolled[e.CourseID]--
	}
	return nil
}

func (b *batchFake) FindStrandedReservations(_ context.Context, in workflows.RecoverReservationsInput) (workflows.FindStrandedResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.called(workflows.FindStrandedReservations.Name)
	b.findCalls = append(b.findCalls, in)
	if b.findErr != nil {
		return workflows.FindStrandedResult{}, b.findErr
	}
	return workflows.FindStrandedResult{Batches: b.stranded}, nil
}

func (b *batchFake) findInputs() []workflows.RecoverReservationsInput {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.findCalls)
}

func (b *batchFake) reserveSeatsCalls() []workflows.ReserveSeatsInput {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.reserveSeatsInputs)
}

func (b *batchFake) publishBatchAttempts() []batchAttempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.batchAttempts)
}

func (b *batchFake) fastPublishAttempts() []batchAttempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.fastAttempts)
}

func (b *batchFake) confirmBatchCalls() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.confirmBatches)
}

func (b *batchFake) releaseSeatsCalls() [][]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.releaseSeatSets)
}

// batchDecisionCall is what a desk answered one batch.
type batchDecisionCall = updateCall[[]workflows.Decision]

// ---- test data ----

const (
	batchID  = "0198a0c2-batch"
	course2  = "ma201"
	noCourse = "xx999"
)

func claim(id, course, student string) workflows.EnrollmentInput {
	return workflows.EnrollmentInput{EnrollmentID: id, CourseID: course, StudentID: student,
		RequestedAt: testStart.Add(-time.Second)}
}

// pairClaims: two newcomers on cs101 and one claim on a course that does not
// exist. The IDs are out of order on purpose: HandedOff is sorted.
func pairClaims() []workflows.EnrollmentInput {
	return []workflows.EnrollmentInput{
		claim("enr-2", courseID, "stu-2"),
		claim("enr-1", courseID, "stu-1"),
		claim("enr-3", noCourse, "stu-3"),
	}
}

func reserved(id string) workflows.Decision {
	return workflows.Decision{EnrollmentID: id, Status: workflows.StatusReserved}
}

func confirmedDecision(id string) workflows.Decision {
	return workflows.Decision{EnrollmentID: id, Status: workflows.StatusConfirmed}
}

func idsOf(claims []workflows.EnrollmentInput) []string {
	var ids []string
	for _, c := range claims {
		ids = append(ids, c.EnrollmentID)
	}
	return ids
}

// wantBatchEvents asserts msgs are the enrollment.confirmed events of claims,
// in claim order, stamped with their batch's time.
func wantBatchEvents(t *testing.T, msgs []workflows.Message, claims []workflows.EnrollmentInput, at time.Time) {
	t.Helper()
	require.Len(t, msgs, len(claims))
	for i, c := range claims {
		m := msgs[i]
		assert.Equal(t, workflows.EnrollmentTopic, m.Topic, "event %d", i)
		assert.Equal(t, c.CourseID, m.Key, "event %d is keyed by course", i)
		assert.Equal(t, workflows.EventID(c.EnrollmentID, workflows.EventEnrollmentConfirmed), m.Event.ID, "event %d", i)
		assert.Equal(t, workflows.EventEnrollmentConfirmed, m.Event.Type, "event %d", i)
		assert.True(t, m.Event.OccurredAt.Equal(at), "event %d occurred_at %v, want %v", i, m.Event.OccurredAt, at)
		assert.Equal(t, map[string]any{"enrollment_id": c.EnrollmentID, "course_id": c.CourseID,
			"student_id": c.StudentID}, m.Event.Data, "event %d", i)
	}
}

// enrollmentChild is an Enrollment run a batch run handed a claim to.
type enrollmentChild struct {
	In     workflows.EnrollmentInput
	Parent string
}

// recordEnrollmentChildren records the Enrollment runs started in env, by
// workflow ID; the Promotion a compensated child starts is not a hand-off.
func recordEnrollmentChildren(t *testing.T, env *testsuite.TestWorkflowEnvironment) func() map[string]enrollmentChild {
	var mu sync.Mutex
	children := map[string]enrollmentChild{}
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, args converter.EncodedValues) {
		if info.WorkflowType.Name != "Enrollment" {
			return
		}
		var c enrollmentChild
		assert.NoError(t, args.Get(&c.In), "child input")
		if info.ParentWorkflowExecution != nil {
			c.Parent = info.ParentWorkflowExecution.ID
		}
		mu.Lock()
		defer mu.Unlock()
		children[info.WorkflowExecution.ID] = c
	})
	return func() map[string]enrollmentChild {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(children)
	}
}

// collectedAt is when the API closed the batch of the batch runs' claims:
// the time on their events.
var collectedAt = testStart.Add(-2 * time.Second)

// batchClaims are reserved claims of one batch, as a desk hands them over.
func batchClaims() []workflows.EnrollmentInput {
	var out []workflows.EnrollmentInput
	for _, c := range []workflows.EnrollmentInput{claim("enr-2", courseID, "stu-2"), claim("enr-1", courseID, "stu-1")} {
		c.BatchID, c.OccurredAt = batchID, collectedAt
		out = append(out, c)
	}
	return out
}

// reservedBatchFake holds the batch's reservations, as the desk left them.
func reservedBatchFake() *batchFake {
	f := newBatchFake().withCourse(courseID, 30, 0)
	for _, c := range batchClaims() {
		f.withEnrollment(c.EnrollmentID, c.CourseID, c.StudentID, workflows.StatusReserved)
	}
	return f
}

// TestEnrollmentBatch: a batch run publishes its reserved claims' events on
// the retry policy and confirms them; when the policy is spent, each goes
// on in an Enrollment run of its own; a cancel gives the seats back.
func TestEnrollmentBatch(t *testing.T) {
	tests := []struct {
		name         string
		failBatch    int
		cancelAt     time.Duration // 0: no cancel
		wantState    workflows.BatchState
		wantClaim    string
		wantAttempts int
		wantChildren bool
	}{
		{name: "published and confirmed", wantAttempts: 1, wantClaim: "confirmed",
			wantState: workflows.BatchState{BatchID: batchID, Claims: 2, Status: workflows.StatusConfirmed}},
		{name: "transient failures are retried by the policy", failBatch: 2, wantAttempts: 3, wantClaim: "confirmed",
			wantState: workflows.BatchState{BatchID: batchID, Claims: 2, Status: workflows.StatusConfirmed}},
		{name: "the policy spent: each enrollment handed to a run of its own", failBatch: -1, wantAttempts: 4,
			wantClaim: "handed_off", wantChildren: true,
			wantState: workflows.BatchState{BatchID: batchID, Claims: 2, Status: workflows.StatusHandedOff,
				HandedOff: []string{"enr-1", "enr-2"}}},
		{name: "cancelled while publishing gives the seats back", failBatch: -1, cancelAt: 1500 * time.Millisecond,
			wantAttempts: 2, wantClaim: "failed",
			wantState: workflows.BatchState{BatchID: batchID, Claims: 2, Status: workflows.StatusFailed}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := reservedBatchFake()
			f.failBatch = tc.failBatch
			env, claims := newBatchEnv(t, f)
			startedChildren := recordEnrollmentChildren(t, env)
			env.OnWorkflow(workflows.Enrollment, mock.Anything, mock.Anything).Return(workflows.EnrollmentState{}, nil)
			if tc.cancelAt > 0 {
				env.RegisterDelayedCallback(env.CancelWorkflow, tc.cancelAt)
			}

			env.ExecuteWorkflow(workflows.EnrollmentBatch, workflows.EnrollmentBatchInput{BatchID: batchID, Claims: batchClaims()})

			require.True(t, env.IsWorkflowCompleted())
			if tc.cancelAt > 0 {
				assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()), "got %v", env.GetWorkflowError())
			} else {
				require.NoError(t, env.GetWorkflowError())
				var got workflows.BatchState
				require.NoError(t, env.GetWorkflowResult(&got))
				assert.Equal(t, tc.wantState, got)
			}
			v, err := env.QueryWorkflow(workflows.QueryStatus)
			require.NoError(t, err)
			var queried workflows.BatchState
			require.NoError(t, v.Get(&queried))
			assert.Equal(t, tc.wantState, queried, "the status query")
			assert.Equal(t, []string{tc.wantClaim}, claims.get(), "ClaimStatus set once, as the run closes")

			attempts := f.publishBatchAttempts()
			require.Len(t, attempts, tc.wantAttempts)
			for i, a := range attempts {
				assert.False(t, a.In.FailFast, "the batch run waits out the broker")
				assert.Equal(t, idsOf(batchClaims()), a.In.EnrollmentIDs)
				if i > 0 {
					assert.Equal(t, time.Second<<(i-1), a.At.Sub(attempts[i-1].At), "attempt %d on the policy's backoff", i+1)
				}
			}
			wantBatchEvents(t, attempts[0].In.Messages, batchClaims(), collectedAt)

			children := startedChildren()
			switch {
			case tc.wantChildren:
				require.Len(t, children, 2)
				for _, c := range batchClaims() {
					child, ok := children[workflows.EnrollmentWorkflowID(c)]
					require.True(t, ok, "%s handed to %s", c.EnrollmentID, workflows.EnrollmentWorkflowID(c))
					assert.Equal(t, c, child.In, "the run publishes the same payload: the batch's time")
					assert.Equal(t, testWorkflowID, child.Parent)
				}
				assert.Empty(t, f.confirmBatchCalls())
			case tc.cancelAt > 0:
				assert.Empty(t, children)
				assert.Equal(t, [][]string{idsOf(batchClaims())}, f.releaseSeatsCalls(), "the compensation, once")
				assert.Equal(t, 0, f.seatsTaken(courseID))
			default:
				assert.Empty(t, children)
				assert.Equal(t, [][]string{idsOf(batchClaims())}, f.confirmBatchCalls())
				for _, c := range batchClaims() {
					assert.Equal(t, workflows.StatusConfirmed, f.statusOf(c.EnrollmentID))
				}
				assert.Len(t, f.publishedMessages(), 2, "each event once")
				assert.Empty(t, f.releaseSeatsCalls())
			}
		})
	}
}

// recoveryWorkflowID is the recovery run's ID when a test runs it as a
// child of recoverAfterDesk.
const recoveryWorkflowID = workflows.ReservationRecoveryWorkflowID + "-test"

// recoverAfterDesk is a test's parent run: it starts the run of batch
// owned first, as a desk whose publish failed does, then runs the
// recovery as its child.
func recoverAfterDesk(ctx workflow.Context, owned string, in workflows.RecoverReservationsInput) (workflows.RecoveryState, error) {
	var state workflows.RecoveryState
	bctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: workflows.EnrollmentBatchWorkflowID(owned)})
	if err := workflow.ExecuteChildWorkflow(bctx, workflows.EnrollmentBatch, workflows.EnrollmentBatchInput{BatchID: owned}).
		Get(ctx, nil); err != nil {
		return state, err
	}
	rctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{WorkflowID: recoveryWorkflowID})
	err := workflow.ExecuteChildWorkflow(rctx, workflows.RecoverReservations, in).Get(ctx, &state)
	return state, err
}

// TestRecoverReservations: the recovery starts the run of each batch whose
// reservations nobody finishes, and counts those that have one already.
func TestRecoverReservations(t *testing.T) {
	stranded := func(batch string, ids ...string) workflows.StrandedBatch {
		b := workflows.StrandedBatch{BatchID: batch, Oldest: testStart.Add(-2 * time.Minute)}
		for _, id := range ids {
			c := claim(id, courseID, "stu-"+id)
			c.BatchID, c.OccurredAt = batch, collectedAt
			b.Claims = append(b.Claims, c)
		}
		return b
	}
	in := workflows.RecoverReservationsInput{OlderThan: time.Minute, Limit: 100}
	tests := []struct {
		name  string
		found []workflows.StrandedBatch
		// owned: a batch whose run a desk started before the recovery ran.
		owned string
		want  workflows.RecoveryState
	}{
		{name: "nothing stranded: nothing started"},
		{name: "each stranded batch's run started",
			found: []workflows.StrandedBatch{stranded("b-1", "enr-1", "enr-2"), stranded("b-2", "enr-3")},
			want:  workflows.RecoveryState{Found: 3, Started: []string{"b-1", "b-2"}}},
		{name: "a batch whose run exists already is owned",
			found: []workflows.StrandedBatch{stranded("b-1", "enr-1", "enr-2"), stranded("b-2", "enr-3")},
			owned: "b-1",
			want:  workflows.RecoveryState{Found: 3, Started: []string{"b-2"}, Owned: []string{"b-1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBatchFake()
			f.stranded = tc.found
			env, _ := newBatchEnv(t, f)
			children := recordBatchChildren(t, env, true)

			recovery := testWorkflowID
			if tc.owned != "" {
				recovery = recoveryWorkflowID
				env.RegisterWorkflow(recoverAfterDesk)
				env.ExecuteWorkflow(recoverAfterDesk, tc.owned, in)
			} else {
				env.ExecuteWorkflow(workflows.RecoverReservations, in)
			}

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			var got workflows.RecoveryState
			require.NoError(t, env.GetWorkflowResult(&got))
			assert.Equal(t, tc.want, got)
			assert.Equal(t, []workflows.RecoverReservationsInput{in}, f.findInputs())
			started := map[string]batchChild{}
			for id, c := range batchChildrenByID(*children) {
				if c.Parent == recovery {
					started[id] = c
				}
			}
			require.Len(t, started, len(tc.want.Started))
			for _, id := range tc.want.Started {
				b := tc.found[slices.IndexFunc(tc.found, func(b workflows.StrandedBatch) bool { return b.BatchID == id })]
				run, ok := started[workflows.EnrollmentBatchWorkflowID(id)]
				require.True(t, ok, "the run of %s, named by the batch", id)
				assert.Equal(t, workflows.EnrollmentBatchInput{BatchID: id, Claims: b.Claims}, run.In)
				assert.Equal(t, "reserved", run.Status)
			}
		})
	}

	t.Run("a failed search fails the run", func(t *testing.T) {
		f := newBatchFake()
		f.findErr = errSchema
		env, _ := newBatchEnv(t, f)
		children := recordBatchChildren(t, env, true)

		env.ExecuteWorkflow(workflows.RecoverReservations, in)

		require.True(t, env.IsWorkflowCompleted())
		assert.ErrorContains(t, env.GetWorkflowError(), "find stranded reservations")
		assert.Empty(t, *children)
	})
}
