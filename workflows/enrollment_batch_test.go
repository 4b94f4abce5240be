package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// batchFake adds the group-commit activities to the single-enrollment fake.
// Both work on one in-memory database, so the Enrollment runs a batch hands
// its enrollments to find the seats the batch reserved.
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

	reserveSeatsInputs []workflows.ReserveSeatsInput
	fastAttempts       []batchAttempt // PublishBatch with FailFast
	batchAttempts      []batchAttempt // the durable path's attempts
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
	register(env, workflows.ReserveSeats, b.ReserveSeats)
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
		case b.enrolled[c.CourseID] >= b.capacity[c.CourseID]:
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

// attemptsOfEvent is every single-message Publish attempt of one event.
func (b *batchFake) attemptsOfEvent(eventID string) []publishAttempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []publishAttempt
	for _, a := range b.publishAttempts {
		if a.EventID == eventID {
			out = append(out, a)
		}
	}
	return out
}

// deadLetterOf is the dead letter of an enrollment's confirmed event.
func (b *batchFake) deadLetterOf(enrollmentID string) fakeDeadLetter {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range b.deadLetters {
		if d.EnrollmentID == enrollmentID {
			return *d
		}
	}
	return fakeDeadLetter{}
}

// ---- the decision update of a batch ----

type batchDecisionCall = updateCall[[]workflows.Decision]

// sendBatchDecision sends the decision update with updateID after delay; a
// batch answers it with one Decision per claim.
func sendBatchDecision(env *testsuite.TestWorkflowEnvironment, updateID string, delay time.Duration) *batchDecisionCall {
	return sendUpdate[[]workflows.Decision](env, updateID, delay)
}

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

// assertFastPathFailed: the batch tried the fast path once, fail-fast, with
// the granted events, and it did not send.
func assertFastPathFailed(t *testing.T, f *batchFake, granted []workflows.EnrollmentInput) {
	t.Helper()
	fast := f.fastPublishAttempts()
	require.Len(t, fast, 1, "one fast-path attempt")
	assert.True(t, fast[0].Failed)
	assert.True(t, fast[0].In.FailFast)
	assert.Equal(t, idsOf(granted), fast[0].In.EnrollmentIDs)
	assert.True(t, fast[0].At.Equal(testStart), "tried at once")
}

func idsOf(claims []workflows.EnrollmentInput) []string {
	var ids []string
	for _, c := range claims {
		ids = append(ids, c.EnrollmentID)
	}
	return ids
}

// wantBatchEvents asserts msgs are the enrollment.confirmed events of claims,
// in claim order, stamped with the batch's workflow time.
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

// batchRun is one EnrollmentBatch run under test.
type batchRun struct {
	t         *testing.T
	env       *testsuite.TestWorkflowEnvironment
	fake      *batchFake
	claims    []workflows.EnrollmentInput
	decisions *batchDecisionCall

	mu sync.Mutex
	// children are the Enrollment runs the batch started, by workflow ID.
	children map[string]workflows.EnrollmentInput
	// childParents are the parent workflow IDs the children report.
	childParents []string
}

func (r *batchRun) startedChildren() map[string]workflows.EnrollmentInput {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]workflows.EnrollmentInput{}
	for k, v := range r.children {
		out[k] = v
	}
	return out
}

func (r *batchRun) recordChildren() {
	r.children = map[string]workflows.EnrollmentInput{}
	r.env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, args converter.EncodedValues) {
		if info.WorkflowType.Name == "Promotion" {
			return // a compensated child's seat going to the waitlist: not a hand-off
		}
		var in workflows.EnrollmentInput
		err := args.Get(&in)
		r.mu.Lock()
		defer r.mu.Unlock()
		assert.NoError(r.t, err, "child input")
		assert.Equal(r.t, "Enrollment", info.WorkflowType.Name)
		r.children[info.WorkflowExecution.ID] = in
		if info.ParentWorkflowExecution != nil {
			r.childParents = append(r.childParents, info.ParentWorkflowExecution.ID)
		}
	})
}

// assertNoHandOff: nothing went the single-enrollment way.
func assertNoHandOff(t *testing.T, r *batchRun) {
	t.Helper()
	f := r.fake
	assert.Empty(t, r.startedChildren(), "no Enrollment run started")
	assert.Zero(t, f.callCount(workflows.ReserveSeat.Name))
	assert.Zero(t, f.callCount(workflows.Publish.Name))
	assert.Zero(t, f.callCount(workflows.MarkConfirmed.Name))
	assert.Zero(t, f.callCount(workflows.ReleaseSeat.Name))
	assert.Zero(t, f.callCount(workflows.RecordDeadLetter.Name))
	assert.Zero(t, f.callCount(workflows.ResolveDeadLetter.Name))
}

func TestEnrollmentBatch(t *testing.T) {
	// mixed: two courses; cs101 has 2 seats left for 3 newcomers, stu-1
	// claims ma201 twice in the batch, stu-9 holds ma201 already, xx999
	// does not exist, and stu-2 claims cs101 again once it is full.
	mixed := []workflows.EnrollmentInput{
		claim("enr-a", courseID, "stu-1"),
		claim("enr-b", course2, "stu-1"),
		claim("enr-c", courseID, "stu-2"),
		claim("enr-d", courseID, "stu-3"),
		claim("enr-e", course2, "stu-1"),
		claim("enr-f", course2, "stu-9"),
		claim("enr-g", noCourse, "stu-4"),
		claim("enr-h", course2, "stu-5"),
		claim("enr-i", courseID, "stu-2"),
	}
	mixedGranted := []workflows.EnrollmentInput{mixed[0], mixed[1], mixed[2], mixed[7]}
	pair := pairClaims()
	pairGranted := pair[:2]
	pairDecisions := []workflows.Decision{reserved("enr-2"), reserved("enr-1"),
		refusal("enr-3", workflows.RefusalCourseNotFound)}
	const (
		dlAt       = time.Minute // operators decide about the children's dead letters
		childQuery = 30 * time.Second
	)
	child := func(c workflows.EnrollmentInput) string {
		return workflows.EnrollmentWorkflowID(c.CourseID, c.StudentID) + ":" + c.EnrollmentID
	}

	tests := []struct {
		name          string
		fake          func() *batchFake
		claims        []workflows.EnrollmentInput
		act           func(r *batchRun)
		wantDecisions []workflows.Decision
		wantState     workflows.BatchState
		wantCanceled  bool
		// answerFirst runs the batch as recorded before the fast path:
		// answer after the reservation, then publish in an activity.
		answerFirst bool
		check       func(t *testing.T, r *batchRun)
	}{
		{
			name: "mixed batch: decisions in claim order, granted seats published and confirmed before the answer",
			fake: func() *batchFake {
				return newBatchFake().withCourse(courseID, 3, 1).withCourse(course2, 10, 0).
					withEnrollment("enr-old", course2, "stu-9", workflows.StatusConfirmed)
			},
			claims: mixed,
			wantDecisions: []workflows.Decision{
				confirmedDecision("enr-a"),
				confirmedDecision("enr-b"),
				confirmedDecision("enr-c"),
				refusal("enr-d", workflows.RefusalCourseFull),
				refusal("enr-b", workflows.RefusalAlreadyEnrolled),   // the holder is the batch's own earlier claim
				refusal("enr-old", workflows.RefusalAlreadyEnrolled), // the holder is in the database
				refusal("enr-g", workflows.RefusalCourseNotFound),
				confirmedDecision("enr-h"),
				refusal("enr-c", workflows.RefusalAlreadyEnrolled), // already enrolled beats course full
			},
			wantState: workflows.BatchState{BatchID: batchID, Claims: 9, Reserved: 4, Refused: 5,
				Status: workflows.StatusConfirmed},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				reserves := f.reserveSeatsCalls()
				require.Len(t, reserves, 1, "one ReserveSeats for the whole batch")
				assert.Equal(t, mixed, reserves[0].Claims)
				assert.Equal(t, testWorkflowID, reserves[0].WorkflowID)
				assert.NotEmpty(t, reserves[0].RunID)

				assert.Equal(t, 3, f.seatsTaken(courseID), "1 taken before + 2 granted")
				assert.Equal(t, 3, f.seatsTaken(course2), "enr-old + 2 granted")
				assert.Zero(t, f.seatsTaken(noCourse))

				attempts := f.fastPublishAttempts()
				require.Len(t, attempts, 1, "one PublishBatch, on the fast path")
				assert.Empty(t, f.publishBatchAttempts(), "nothing left for the durable path")
				assert.Equal(t, int32(1), attempts[0].Attempt)
				assert.Equal(t, idsOf(mixedGranted), attempts[0].In.EnrollmentIDs)
				wantBatchEvents(t, attempts[0].In.Messages, mixedGranted, testStart)
				assert.Equal(t, attempts[0].In.Messages, f.publishedMessages(), "exactly the granted events went out")

				assert.True(t, attempts[0].In.Confirm, "the fast path confirms in the statement that records the publish")
				assert.Empty(t, f.confirmBatchCalls(), "no separate ConfirmBatch")
				for _, c := range mixedGranted {
					assert.Equal(t, fakeEnrollment{ID: c.EnrollmentID, CourseID: c.CourseID, StudentID: c.StudentID,
						Status: workflows.StatusConfirmed, Published: true}, f.enrollment(c.EnrollmentID))
				}
				for _, id := range []string{"enr-d", "enr-e", "enr-f", "enr-g", "enr-i"} {
					assert.Empty(t, f.enrollment(id).ID, "no row for refused claim %s", id)
				}
				assert.Equal(t, workflows.StatusConfirmed, f.enrollment("enr-old").Status, "the holder is untouched")
				assert.Empty(t, f.releaseSeatsCalls())
				assertNoHandOff(t, r)
			},
		},
		{
			name: "a batch from before the fast path answers reserved, then publishes and confirms",
			fake: func() *batchFake {
				return newBatchFake().withCourse(courseID, 30, 0)
			},
			claims:        pair,
			answerFirst:   true,
			wantDecisions: pairDecisions,
			wantState: workflows.BatchState{BatchID: batchID, Claims: 3, Reserved: 2, Refused: 1,
				Status: workflows.StatusConfirmed},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				assert.Empty(t, f.fastPublishAttempts(), "no fast path")
				attempts := f.publishBatchAttempts()
				require.Len(t, attempts, 1)
				assert.False(t, attempts[0].In.FailFast)
				assert.False(t, attempts[0].In.Confirm)
				wantBatchEvents(t, f.publishedMessages(), pairGranted, testStart)
				assert.Equal(t, [][]string{idsOf(pairGranted)}, f.confirmBatchCalls())
				for _, c := range pairGranted {
					assert.Equal(t, workflows.StatusConfirmed, f.enrollment(c.EnrollmentID).Status)
				}
				assertNoHandOff(t, r)
			},
		},
		{
			name: "run again after one event went out: the fast path sends the others, told by ReserveSeats",
			fake: func() *batchFake {
				// enr-1's event is out and confirmed (an earlier attempt's
				// worker died before its workflow task completed).
				return newBatchFake().withCourse(courseID, 30, 0).
					withEnrollment("enr-1", courseID, "stu-1", workflows.StatusConfirmed)
			},
			claims:        pair,
			wantDecisions: []workflows.Decision{confirmedDecision("enr-2"), confirmedDecision("enr-1"), refusal("enr-3", workflows.RefusalCourseNotFound)},
			wantState: workflows.BatchState{BatchID: batchID, Claims: 3, Reserved: 2, Refused: 1,
				Status: workflows.StatusConfirmed},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				attempts := f.fastPublishAttempts()
				require.Len(t, attempts, 1)
				assert.True(t, attempts[0].In.PublishedKnown, "ReserveSeats has just read what is out")
				assert.Equal(t, []string{"enr-1"}, attempts[0].In.Published)
				wantBatchEvents(t, f.publishedMessages(), pairGranted[:1], testStart)
				assertNoHandOff(t, r)
			},
		},
		{
			name: "all refused: nothing is published, confirmed or released",
			fake: func() *batchFake {
				return newBatchFake().withCourse(courseID, 1, 1).withCourse(course2, 10, 0).
					withEnrollment("enr-old", course2, "stu-9", workflows.StatusConfirmed).
					withEnrollment("enr-gone", course2, "stu-7", workflows.StatusFailed)
			},
			claims: []workflows.EnrollmentInput{
				claim("enr-1", courseID, "stu-1"),
				claim("enr-2", noCourse, "stu-2"),
				claim("enr-3", course2, "stu-9"),
				claim("enr-gone", course2, "stu-7"),
			},
			wantDecisions: []workflows.Decision{
				refusal("enr-1", workflows.RefusalCourseFull),
				refusal("enr-2", workflows.RefusalCourseNotFound),
				refusal("enr-old", workflows.RefusalAlreadyEnrolled),
				refusal("enr-gone", workflows.RefusalEnrollmentInactive),
			},
			wantState: workflows.BatchState{BatchID: batchID, Claims: 4, Reserved: 0, Refused: 4,
				Status: workflows.StatusRefused},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				assert.Equal(t, 1, f.callCount(workflows.ReserveSeats.Name), "refusals are not retried")
				assert.Zero(t, f.callCount(workflows.PublishBatch.Name), "no publish")
				assert.Empty(t, f.publishedMessages())
				assert.Zero(t, f.callCount(workflows.ConfirmBatch.Name))
				assert.Zero(t, f.callCount(workflows.ReleaseSeats.Name), "nothing reserved, nothing to release")
				assert.Equal(t, 1, f.seatsTaken(courseID))
				assert.Equal(t, 1, f.seatsTaken(course2))
				assertNoHandOff(t, r)
			},
		},
		{
			name: "PublishBatch fails twice, the policy retries after 1s and 2s, then confirms",
			fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 30, 0)
				f.failBatch = 2
				return f
			},
			claims:        pair,
			wantDecisions: pairDecisions,
			wantState: workflows.BatchState{BatchID: batchID, Claims: 3, Reserved: 2, Refused: 1,
				Status: workflows.StatusConfirmed},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				assertFastPathFailed(t, f, pairGranted)
				attempts := f.publishBatchAttempts()
				require.Len(t, attempts, 3, "two failures and one success")
				var at []time.Duration
				for i, a := range attempts {
					assert.Equal(t, int32(i+1), a.Attempt, "attempt %d", i)
					assert.Equal(t, i < 2, a.Failed, "attempt %d failed", i)
					assert.Equal(t, attempts[0].In, a.In, "every attempt sends the same events, same IDs")
					at = append(at, a.At.Sub(testStart))
				}
				assert.Equal(t, []time.Duration{0, time.Second, 3 * time.Second}, at, "attempts at 0s, +1s, +2s")
				wantBatchEvents(t, attempts[0].In.Messages, pairGranted, testStart)
				assert.Equal(t, attempts[0].In.Messages, f.publishedMessages(), "each event published once")
				assert.Equal(t, [][]string{idsOf(pairGranted)}, f.confirmBatchCalls())
				for _, c := range pairGranted {
					assert.Equal(t, workflows.StatusConfirmed, f.enrollment(c.EnrollmentID).Status)
				}
				assert.Equal(t, 2, f.seatsTaken(courseID))
				assert.Empty(t, f.releaseSeatsCalls())
				assertNoHandOff(t, r)
			},
		},
		{
			name: "PublishBatch exhausted: each reserved enrollment goes on in its own Enrollment run",
			fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 30, 4)
				f.failBatch = -1
				f.failPublish[workflows.EventEnrollmentConfirmed] = -1 // Kafka is down for the children too
				return f
			},
			claims: pair,
			act: func(r *batchRun) {
				// While the children wait for an operator, the batch is over.
				r.env.RegisterDelayedCallback(func() {
					t := r.t
					assert.True(t, r.env.IsWorkflowCompleted(), "the batch does not wait for its children")
					for _, c := range pairGranted {
						v, err := r.env.QueryWorkflowByID(child(c), workflows.QueryStatus)
						if assert.NoError(t, err, "query %s", child(c)) {
							var s workflows.EnrollmentState
							assert.NoError(t, v.Get(&s))
							assert.Equal(t, workflows.StatusDeadLettered, s.Status, "%s", c.EnrollmentID)
							assert.NotZero(t, s.DeadLetterID, "%s", c.EnrollmentID)
							assert.Contains(t, s.LastError, "in-sync replicas")
						}
						assert.Equal(t, workflows.StatusDeadLettered, r.fake.enrollment(c.EnrollmentID).Status)
					}
					assert.Equal(t, 6, r.fake.seatsTaken(courseID), "seats held while dead-lettered")
					assert.Empty(t, r.fake.releases(), "the abandoned children were not cancelled")
				}, childQuery)
				// Kafka is back: one operator retries enr-1, another compensates enr-2.
				r.env.RegisterDelayedCallback(func() {
					r.fake.failPublishing(workflows.EventEnrollmentConfirmed, 0)
					assert.NoError(r.t, r.env.SignalWorkflowByID(child(pair[1]), workflows.SignalDeadLetter,
						workflows.DeadLetterDecision{Action: workflows.ActionRetry}))
					assert.NoError(r.t, r.env.SignalWorkflowByID(child(pair[0]), workflows.SignalDeadLetter,
						workflows.DeadLetterDecision{Action: workflows.ActionCompensate}))
				}, dlAt)
			},
			wantDecisions: pairDecisions,
			wantState: workflows.BatchState{BatchID: batchID, Claims: 3, Reserved: 2, Refused: 1,
				Status: workflows.StatusDeadLettered, HandedOff: []string{"enr-1", "enr-2"}},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				assertFastPathFailed(t, f, pairGranted)
				attempts := f.publishBatchAttempts()
				require.Len(t, attempts, 4, "the publish policy's 4 attempts")
				var at []time.Duration
				for i, a := range attempts {
					assert.True(t, a.Failed)
					assert.Equal(t, int32(i+1), a.Attempt)
					at = append(at, a.At.Sub(testStart))
				}
				assert.Equal(t, []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}, at)
				handOffAt := testStart.Add(7 * time.Second)

				// One child per reserved enrollment, none for the refused claim.
				children := r.startedChildren()
				require.Len(t, children, 2)
				for _, c := range pairGranted {
					want := c
					want.Reserved, want.OccurredAt = true, testStart
					assert.Equal(t, want, children[child(c)], "child %s starts at its publish step, with the batch's event time", child(c))
				}
				assert.Equal(t, []string{testWorkflowID, testWorkflowID}, r.childParents)
				assert.Zero(t, f.callCount(workflows.ReserveSeat.Name), "children reserve nothing again")
				assert.Equal(t, 1, f.callCount(workflows.ReserveSeats.Name))

				// Each child published on its own policy, then dead-lettered its event.
				dls := f.deadLetterInputs()
				require.Len(t, dls, 2, "one dead letter per handed-off enrollment")
				byEnrollment := map[string]deadLetterCall{}
				for _, d := range dls {
					byEnrollment[d.In.EnrollmentID] = d
				}
				for _, c := range pairGranted {
					eventID := workflows.EventID(c.EnrollmentID, workflows.EventEnrollmentConfirmed)
					d, ok := byEnrollment[c.EnrollmentID]
					require.True(t, ok, "dead letter of %s", c.EnrollmentID)
					assert.Equal(t, eventID, d.In.Message.Event.ID, "the child's event has the batch's event ID")
					// A batch publish may have reached the topic with its
					// acks lost: the child's copy must be the same record.
					var batchCopy *workflows.Message
					for i, m := range attempts[0].In.Messages {
						if m.Event.ID == eventID {
							batchCopy = &attempts[0].In.Messages[i]
						}
					}
					require.NotNil(t, batchCopy, "the batch published %s", eventID)
					assert.True(t, d.In.Message.Event.OccurredAt.Equal(batchCopy.Event.OccurredAt),
						"%s: the child's occurred_at %v, the batch's %v", eventID, d.In.Message.Event.OccurredAt, batchCopy.Event.OccurredAt)
					assert.Equal(t, batchCopy.Event.Data, d.In.Message.Event.Data, "%s: the child's data is the batch's", eventID)
					assert.Equal(t, c.CourseID, d.In.Message.Key)
					assert.Equal(t, child(c), d.In.WorkflowID, "dead-lettered by the child run")
					assert.Equal(t, 1, d.In.Round)
					assert.Equal(t, 7*time.Second, d.At.Sub(handOffAt), "dead-lettered after the child's own 1s+2s+4s")
					childAttempts := f.attemptsOfEvent(eventID)
					require.GreaterOrEqual(t, len(childAttempts), 4, "%s", c.EnrollmentID)
					for i, a := range childAttempts[:4] {
						assert.True(t, a.Failed, "%s attempt %d", c.EnrollmentID, i)
						assert.Equal(t, int32(i+1), a.Attempt)
					}
					assert.True(t, childAttempts[0].At.Equal(handOffAt), "the child publishes once handed off")
				}
				assert.Len(t, f.attemptsOfEvent(workflows.EventID("enr-1", workflows.EventEnrollmentConfirmed)), 5,
					"enr-1: 4 attempts, then the operator's retry")
				assert.Len(t, f.attemptsOfEvent(workflows.EventID("enr-2", workflows.EventEnrollmentConfirmed)), 4,
					"enr-2: compensated, not republished")

				// The operators' decisions ran in the children, not in the batch.
				assert.Equal(t, []string{"enr-1"}, f.confirms(), "MarkConfirmed of the retried child")
				assert.Equal(t, []string{"enr-2"}, f.releases(), "ReleaseSeat of the compensated child")
				assert.Equal(t, workflows.StatusConfirmed, f.enrollment("enr-1").Status)
				assert.Equal(t, workflows.StatusFailed, f.enrollment("enr-2").Status)
				assert.Equal(t, 5, f.seatsTaken(courseID))
				var pub []string
				for _, m := range f.publishedMessages() {
					pub = append(pub, m.Event.ID)
				}
				assert.ElementsMatch(t, []string{
					workflows.EventID("enr-1", workflows.EventEnrollmentConfirmed),
					workflows.EventID("enr-2", workflows.EventEnrollmentFailed),
				}, pub)
				assert.Equal(t, workflows.DeadLetterResolved, f.deadLetterOf("enr-1").State)
				assert.Equal(t, workflows.DeadLetterCompensated, f.deadLetterOf("enr-2").State)
				assert.Empty(t, f.confirmBatchCalls(), "the batch confirms nothing it handed off")
				assert.Empty(t, f.releaseSeatsCalls(), "the batch releases nothing it handed off")
			},
		},
		{
			name: "cancelled while PublishBatch retries: ReleaseSeats gives the reserved seats back once",
			fake: func() *batchFake {
				f := newBatchFake().withCourse(courseID, 30, 3)
				f.failBatch = -1
				return f
			},
			claims: pair,
			act: func(r *batchRun) {
				r.env.RegisterDelayedCallback(r.env.CancelWorkflow, 1500*time.Millisecond)
			},
			wantDecisions: pairDecisions,
			wantCanceled:  true,
			wantState: workflows.BatchState{BatchID: batchID, Claims: 3, Reserved: 2, Refused: 1,
				Status: workflows.StatusFailed},
			check: func(t *testing.T, r *batchRun) {
				f := r.fake
				assertFastPathFailed(t, f, pairGranted)
				assert.Len(t, f.publishBatchAttempts(), 2, "attempts at 0s and 1s, none after the cancel")
				assert.Equal(t, [][]string{idsOf(pairGranted)}, f.releaseSeatsCalls(),
					"ReleaseSeats once, with exactly the reserved IDs")
				assert.Equal(t, 3, f.seatsTaken(courseID), "seats given back")
				for _, c := range pairGranted {
					assert.Equal(t, workflows.StatusFailed, f.enrollment(c.EnrollmentID).Status)
				}
				assert.Empty(t, f.confirmBatchCalls())
				assert.Empty(t, f.publishedMessages())
				assertNoHandOff(t, r)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, _ := newBatchEnv(t, f)
			r := &batchRun{t: t, env: env, fake: f, claims: tc.claims}
			r.recordChildren()
			r.decisions = sendBatchDecision(env, "update-1", 0)
			if tc.act != nil {
				tc.act(r)
			}

			env.ExecuteWorkflow(workflows.EnrollmentBatch, workflows.EnrollmentBatchInput{BatchID: batchID, Claims: tc.claims,
				ConfirmBeforeAnswer: !tc.answerFirst})

			require.True(t, env.IsWorkflowCompleted())
			got := r.decisions.result(t)
			require.Len(t, got, len(tc.claims), "one decision per claim")
			for i := range got {
				if got[i].Status == workflows.StatusRefused {
					assert.NotEmpty(t, got[i].Message, "refusal %d explains itself", i)
					got[i].Message = ""
				}
			}
			assert.Equal(t, tc.wantDecisions, got, "decisions in claim order")

			var state workflows.BatchState
			if tc.wantCanceled {
				err := env.GetWorkflowError()
				require.Error(t, err)
				assert.True(t, temporal.IsCanceledError(err), "want a cancelled run, got %v", err)
				v, qerr := env.QueryWorkflow(workflows.QueryStatus)
				require.NoError(t, qerr)
				require.NoError(t, v.Get(&state))
			} else {
				require.NoError(t, env.GetWorkflowError())
				require.NoError(t, env.GetWorkflowResult(&state))
				v, qerr := env.QueryWorkflow(workflows.QueryStatus)
				require.NoError(t, qerr)
				var queried workflows.BatchState
				require.NoError(t, v.Get(&queried))
				assert.Equal(t, state, queried, "the status query agrees with the result")
			}
			assert.Equal(t, tc.wantState, state)
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// TestEnrollmentBatchCancelledWhileReserveSeatsRetries: ReserveSeats
// committed but its answer was lost, and the run is cancelled before a retry
// brings the decisions. The seats it took must still be given back.
//
// Local-activity backoff runs on the wall clock while the cancel comes on
// the test's clock, so a loaded machine (CI under -race) can cancel before
// the retry. The run is repeated, up to five times, until one of them
// retried before the cancel; every run, retried or not, must give back
// exactly what it took.
func TestEnrollmentBatchCancelledWhileReserveSeatsRetries(t *testing.T) {
	retried := false
	for try := 1; try <= 5 && !retried; try++ {
		calls := cancelledWhileReserveSeatsRetries(t)
		t.Logf("try %d: %d ReserveSeats attempts before the cancel", try, calls)
		retried = calls >= 2
	}
	assert.True(t, retried, "no try retried ReserveSeats before the cancel: the retry path was never exercised")
}

// cancelledWhileReserveSeatsRetries runs the case once and returns the
// ReserveSeats attempts made.
func cancelledWhileReserveSeatsRetries(t *testing.T) int {
	t.Helper()
	f := newBatchFake().withCourse(courseID, 30, 2)
	f.lostReserves = -1 // every attempt commits (idempotently) and loses its answer
	env, _ := newBatchEnv(t, f)
	decisions := sendBatchDecision(env, "update-1", 0)
	// Local activity attempts at 0 and 100ms; the next would be at 300ms.
	env.RegisterDelayedCallback(env.CancelWorkflow, 250*time.Millisecond)

	env.ExecuteWorkflow(workflows.EnrollmentBatch, workflows.EnrollmentBatchInput{BatchID: batchID, Claims: pairClaims()})

	require.True(t, env.IsWorkflowCompleted())
	err := env.GetWorkflowError()
	require.Error(t, err)
	assert.True(t, temporal.IsCanceledError(err), "want a cancelled run, got %v", err)
	decisions.mu.Lock()
	assert.True(t, decisions.completed, "the caller hears of the cancel")
	decisions.mu.Unlock()

	releases := f.releaseSeatsCalls()
	require.Len(t, releases, 1, "ReleaseSeats once")
	assert.Subset(t, releases[0], []string{"enr-1", "enr-2"}, "the committed reservations are released")
	assert.Equal(t, 2, f.seatsTaken(courseID), "no seat leaks")
	assert.Equal(t, workflows.StatusFailed, f.enrollment("enr-1").Status)
	assert.Equal(t, workflows.StatusFailed, f.enrollment("enr-2").Status)
	assert.Zero(t, f.callCount(workflows.PublishBatch.Name))
	return f.callCount(workflows.ReserveSeats.Name)
}
