package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

// fakeActivities is an in-memory stand-in for package activities. It keeps
// the same contract as the Postgres/Kafka implementation: every activity is
// idempotent on its key, and business refusals come back as
// workflows.Refuse / workflows.RefusalWithHolder (non-retryable application
// errors whose type is the refusal code).
type fakeActivities struct {
	mu sync.Mutex
	// now is the workflow clock of the test environment the fake is
	// registered with (env.Now), so effects are timestamped in workflow time.
	now func() time.Time

	capacity    map[string]int // course → seats; a course not here does not exist
	enrolled    map[string]int // course → seats taken
	enrollments map[string]*fakeEnrollment
	// waitlist is each course's queue, head first; promotedBy what each
	// promotion step promoted (its retries answer the same).
	waitlist   map[string][]workflows.EnrollmentInput
	promotedBy map[string][]workflows.EnrollmentInput

	// cancelErr, when set, is what CancelEnrollment returns (a fault, not
	// a refusal).
	cancelErr error
	// failMarkConfirmed makes the next n MarkConfirmed calls fail (Postgres down).
	failMarkConfirmed int

	calls     map[string]int
	confirmed []string // MarkConfirmed calls
	released  []string // ReleaseSeat calls
	cancelled []string // CancelEnrollment calls

	fakeBroker
}

type fakeEnrollment struct {
	ID        string
	CourseID  string
	StudentID string
	Status    workflows.EnrollmentStatus
	// Published is published_at: stamped once the confirmed event was acked.
	Published bool
}

// errBrokerDown is what a failing Publish returns: an ordinary (retryable)
// error, as sarama returns when not enough replicas are in sync.
var errBrokerDown = errors.New("kafka: messages are rejected since there are fewer in-sync replicas than required")

func newFake() *fakeActivities {
	return &fakeActivities{
		now:         time.Now,
		capacity:    map[string]int{},
		enrolled:    map[string]int{},
		enrollments: map[string]*fakeEnrollment{},
		calls:       map[string]int{},
		fakeBroker:  newFakeBroker(),
		waitlist:    map[string][]workflows.EnrollmentInput{},
		promotedBy:  map[string][]workflows.EnrollmentInput{},
	}
}

// withCourse adds a course with capacity seats, taken of them already taken.
func (f *fakeActivities) withCourse(id string, capacity, taken int) *fakeActivities {
	f.capacity[id], f.enrolled[id] = capacity, taken
	return f
}

// withEnrollment seeds an enrollment row; an active one takes a seat.
func (f *fakeActivities) withEnrollment(id, course, student string, status workflows.EnrollmentStatus) *fakeActivities {
	f.enrollments[id] = &fakeEnrollment{ID: id, CourseID: course, StudentID: student, Status: status,
		Published: status == workflows.StatusConfirmed}
	if active(status) {
		f.enrolled[course]++
	}
	return f
}

func active(s workflows.EnrollmentStatus) bool {
	return s == workflows.StatusReserved || s == workflows.StatusConfirmed || s == workflows.StatusDeadLettered ||
		s == workflows.StatusWaitlisted
}

// register registers the fake's activities the way the worker registers
// the real ones: by typed reference, so a fake method whose signature
// drifts from its reference does not compile.
func (f *fakeActivities) register(env *testsuite.TestWorkflowEnvironment) {
	registerNoResult(env, workflows.Publish, f.Publish)
	registerNoResult(env, workflows.MarkConfirmed, f.MarkConfirmed)
	registerNoResult(env, workflows.ReleaseSeat, f.ReleaseSeat)
	register(env, workflows.RecordDeadLetter, f.RecordDeadLetter)
	registerNoResult(env, workflows.ResolveDeadLetter, f.ResolveDeadLetter)
	register(env, workflows.CancelEnrollment, f.CancelEnrollment)
	register(env, workflows.PromoteWaitlist, f.PromoteWaitlist)
	f.mu.Lock()
	f.now = env.Now
	f.mu.Unlock()
}

// register and registerNoResult mirror the worker's typed registration.
func register[In, Out any](env *testsuite.TestWorkflowEnvironment, ref workflows.Activity[In, Out],
	fn func(context.Context, In) (Out, error)) {
	env.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: ref.Name})
}

func registerNoResult[In any](env *testsuite.TestWorkflowEnvironment, ref workflows.ActivityNoResult[In],
	fn func(context.Context, In) error) {
	env.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: ref.Name})
}

func (f *fakeActivities) called(name string) {
	f.calls[name]++
}

func (f *fakeActivities) Publish(ctx context.Context, in workflows.PublishInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.Publish.Name)
	if err := f.publish(ctx, in, f.now()); err != nil {
		return err
	}
	if in.StampPublishedFor != "" {
		if e, ok := f.enrollments[in.StampPublishedFor]; ok {
			e.Published = true
		}
	}
	return nil
}

func (f *fakeActivities) MarkConfirmed(_ context.Context, enrollmentID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.MarkConfirmed.Name)
	if f.failMarkConfirmed > 0 {
		f.failMarkConfirmed--
		return errors.New("postgres: connection refused")
	}
	f.confirmed = append(f.confirmed, enrollmentID)
	if e, ok := f.enrollments[enrollmentID]; ok &&
		(e.Status == workflows.StatusReserved || e.Status == workflows.StatusDeadLettered) {
		e.Status = workflows.StatusConfirmed
	}
	return nil
}

func (f *fakeActivities) ReleaseSeat(_ context.Context, in workflows.ReleaseSeatInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.ReleaseSeat.Name)
	f.released = append(f.released, in.EnrollmentID)
	e, ok := f.enrollments[in.EnrollmentID]
	if !ok || (e.Status != workflows.StatusReserved && e.Status != workflows.StatusDeadLettered) {
		return nil // releasing twice frees one seat
	}
	e.Status = workflows.StatusFailed
	f.enrolled[e.CourseID]--
	return nil
}

func (f *fakeActivities) RecordDeadLetter(_ context.Context, in workflows.DeadLetterInput) (workflows.DeadLetterRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.RecordDeadLetter.Name)
	if e, ok := f.enrollments[in.EnrollmentID]; ok && e.Status == workflows.StatusReserved {
		e.Status = workflows.StatusDeadLettered
	}
	return f.recordDeadLetter(in, f.now()), nil
}

func (f *fakeActivities) ResolveDeadLetter(_ context.Context, in workflows.ResolveDeadLetterInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.ResolveDeadLetter.Name)
	f.resolveDeadLetter(in)
	return nil
}

func (f *fakeActivities) CancelEnrollment(_ context.Context, in workflows.CancelEnrollmentInput) (workflows.CancelEnrollmentResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.CancelEnrollment.Name)
	f.cancelled = append(f.cancelled, in.EnrollmentID)
	if f.cancelErr != nil {
		return workflows.CancelEnrollmentResult{}, f.cancelErr
	}
	e, ok := f.enrollments[in.EnrollmentID]
	if !ok {
		return workflows.CancelEnrollmentResult{}, workflows.Refuse(workflows.RefusalEnrollmentNotFound,
			"enrollment %s does not exist", in.EnrollmentID)
	}
	res := workflows.CancelEnrollmentResult{CourseID: e.CourseID, StudentID: e.StudentID, Status: e.Status}
	switch e.Status {
	case workflows.StatusCancelled:
		return res, nil
	case workflows.StatusReserved, workflows.StatusDeadLettered:
		return workflows.CancelEnrollmentResult{}, workflows.Refuse(workflows.RefusalEnrollmentPending,
			"enrollment %s is %s", in.EnrollmentID, e.Status)
	case workflows.StatusFailed:
		return workflows.CancelEnrollmentResult{}, workflows.Refuse(workflows.RefusalEnrollmentInactive,
			"enrollment %s failed and holds no seat", in.EnrollmentID)
	}
	if e.Status == workflows.StatusWaitlisted {
		e.Status = workflows.StatusCancelled
		f.waitlist[e.CourseID] = slices.DeleteFunc(f.waitlist[e.CourseID], func(c workflows.EnrollmentInput) bool {
			return c.EnrollmentID == e.ID
		})
		res.Changed, res.LeftWaitlist, res.Status = true, true, workflows.StatusCancelled
		return res, nil
	}
	e.Status = workflows.StatusCancelled
	f.enrolled[e.CourseID]--
	res.Changed, res.FreedSeat, res.Status = true, true, workflows.StatusCancelled
	return res, nil
}

// withWaitlist queues claims on a course's waitlist, head first.
func (f *fakeActivities) withWaitlist(course string, claims ...workflows.EnrollmentInput) *fakeActivities {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waitlist[course] = append(f.waitlist[course], claims...)
	for _, c := range claims {
		f.enrollments[c.EnrollmentID] = &fakeEnrollment{ID: c.EnrollmentID, CourseID: c.CourseID,
			StudentID: c.StudentID, Status: workflows.StatusWaitlisted}
	}
	return f
}

// PromoteWaitlist moves the head of the queue into the free seats; a retry
// with the same By answers what it promoted before.
func (f *fakeActivities) PromoteWaitlist(_ context.Context, in workflows.PromoteWaitlistInput) (workflows.PromoteWaitlistResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.called(workflows.PromoteWaitlist.Name)
	if done, ok := f.promotedBy[in.By]; ok {
		return workflows.PromoteWaitlistResult{Promoted: done}, nil
	}
	var promoted []workflows.EnrollmentInput
	for f.enrolled[in.CourseID] < f.capacity[in.CourseID] && len(f.waitlist[in.CourseID]) > 0 {
		head := f.waitlist[in.CourseID][0]
		f.waitlist[in.CourseID] = f.waitlist[in.CourseID][1:]
		f.enrolled[in.CourseID]++
		f.enrollments[head.EnrollmentID] = &fakeEnrollment{ID: head.EnrollmentID, CourseID: head.CourseID,
			StudentID: head.StudentID, Status: workflows.StatusReserved}
		promoted = append(promoted, head)
	}
	f.promotedBy[in.By] = promoted
	return workflows.PromoteWaitlistResult{Promoted: promoted}, nil
}

// Accessors copy under the lock; tests read them after the run.

func (f *fakeActivities) callCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

// statusOf is an enrollment's status ("" when there is none).
func (f *fakeActivities) statusOf(id string) workflows.EnrollmentStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.enrollments[id]; ok {
		return e.Status
	}
	return ""
}

func (f *fakeActivities) seatsTaken(course string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enrolled[course]
}

func (f *fakeActivities) enrollment(id string) fakeEnrollment {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.enrollments[id]; ok {
		return *e
	}
	return fakeEnrollment{}
}

func (f *fakeActivities) releases() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.released)
}

func (f *fakeActivities) confirms() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.confirmed)
}

// ---- test environment helpers ----

// testStart is the workflow clock at the start of every run.
var testStart = time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC)

// newEnv runs a saga on the fake with the Promotion child mocked out (see
// newEnvNoPromotion); newEnvWithWaitlist runs promotions for real.
func newEnv(t *testing.T, f *fakeActivities) (*testsuite.TestWorkflowEnvironment, *claimStatuses) {
	env, statuses, _ := newEnvNoPromotion(t, f)
	return env, statuses
}

// newTestEnv is the test environment every workflow test runs in: its
// clock starts at testStart, and its log is discarded (a saga logs at error
// level when it dead-letters).
func newTestEnv() *testsuite.TestWorkflowEnvironment {
	var s testsuite.WorkflowTestSuite
	s.SetLogger(log.NewStructuredLogger(slog.New(slog.DiscardHandler)))
	env := s.NewTestWorkflowEnvironment()
	env.SetStartTime(testStart)
	return env
}

func newEnvWithWaitlist(t *testing.T, f *fakeActivities) (*testsuite.TestWorkflowEnvironment, *claimStatuses) {
	t.Helper()
	env := newTestEnv()
	env.RegisterWorkflow(workflows.Enrollment)
	env.RegisterWorkflow(workflows.Cancellation)
	env.RegisterWorkflow(workflows.Promotion)
	f.register(env)
	return env, recordClaimStatus(env)
}

// newEnvNoPromotion is newEnv with the Promotion child mocked out: the
// tests of a saga alone see only that saga's upserts (a child run's would
// be recorded with them). It records the promotions started.
func newEnvNoPromotion(t *testing.T, f *fakeActivities) (*testsuite.TestWorkflowEnvironment, *claimStatuses, *[]workflows.PromoteWaitlistInput) {
	env, statuses := newEnvWithWaitlist(t, f)
	var started []workflows.PromoteWaitlistInput
	env.OnWorkflow(workflows.Promotion, mock.Anything, mock.Anything).Return(
		func(_ workflow.Context, in workflows.PromoteWaitlistInput) (workflows.PromotionState, error) {
			started = append(started, in)
			return workflows.PromotionState{CourseID: in.CourseID, By: in.By, Status: workflows.StatusConfirmed}, nil
		})
	return env, statuses, &started
}

// claimStatuses records every value the run upserted into ClaimStatus, in
// order, and every upsert whole.
type claimStatuses struct {
	mu      sync.Mutex
	values  []string
	upserts []temporal.SearchAttributes
}

func (c *claimStatuses) all() []temporal.SearchAttributes {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.upserts)
}

func (c *claimStatuses) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.values)
}

func recordClaimStatus(env *testsuite.TestWorkflowEnvironment) *claimStatuses {
	c := &claimStatuses{}
	env.OnUpsertTypedSearchAttributes(mock.Anything).Return().Run(func(args mock.Arguments) {
		sa := args.Get(0).(temporal.SearchAttributes)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.upserts = append(c.upserts, sa)
		if v, ok := sa.GetKeyword(workflows.SearchClaimStatus); ok {
			c.values = append(c.values, v)
		}
	})
	return c
}

// updateCall is what one UpdateDecision request got back; T is what the
// workflow answers with (Decision, CouponDecision, []Decision).
type updateCall[T any] struct {
	mu        sync.Mutex
	accepted  bool
	rejected  error
	completed bool
	value     T
	err       error
}

type decisionCall = updateCall[workflows.Decision]

// callbacks records the update's progress in c.
func (c *updateCall[T]) callbacks() *testsuite.TestUpdateCallback {
	return &testsuite.TestUpdateCallback{
		OnAccept: func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.accepted = true
		},
		OnReject: func(err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.rejected = err
		},
		OnComplete: func(v any, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.completed, c.err = true, err
			if err == nil {
				d, ok := v.(T)
				if !ok {
					c.err = fmt.Errorf("update returned %T, want %T", v, d)
				}
				c.value = d
			}
		},
	}
}

// sendUpdate sends the decision update with updateID (and args) after delay.
func sendUpdate[T any](env *testsuite.TestWorkflowEnvironment, updateID string, delay time.Duration, args ...any) *updateCall[T] {
	c := &updateCall[T]{}
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(workflows.UpdateDecision, updateID, c.callbacks(), args...)
	}, delay)
	return c
}

// sendDecision sends an enrollment's decision update with updateID after delay.
func sendDecision(env *testsuite.TestWorkflowEnvironment, updateID string, delay time.Duration) *decisionCall {
	return sendUpdate[workflows.Decision](env, updateID, delay)
}

// result asserts the update was accepted and completed without error and
// returns its answer.
func (c *updateCall[T]) result(t *testing.T) T {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NoError(t, c.rejected, "decision update rejected")
	require.True(t, c.accepted, "decision update never accepted")
	require.True(t, c.completed, "decision update never completed")
	require.NoError(t, c.err, "decision update failed")
	return c.value
}

func queryStatus(t *testing.T, env *testsuite.TestWorkflowEnvironment) workflows.EnrollmentState {
	t.Helper()
	v, err := env.QueryWorkflow(workflows.QueryStatus)
	require.NoError(t, err)
	var s workflows.EnrollmentState
	require.NoError(t, v.Get(&s))
	return s
}

// signalAt sends a dead-letter decision at workflow time testStart+at,
// first running before (e.g. to mend the fake broker).
func signalAt(env *testsuite.TestWorkflowEnvironment, at time.Duration, action workflows.DeadLetterAction, before func()) {
	env.RegisterDelayedCallback(func() {
		if before != nil {
			before()
		}
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: action})
	}, at)
}
