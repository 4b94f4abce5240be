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
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/claimflow/claimflow/workflows"
)

// fakeSink stands in for the consumer's durable-path activities: a
// notification sink that fails as told, and the dead-letter rows.
type fakeSink struct {
	mu  sync.Mutex
	now func() time.Time
	// fail makes the next n deliveries fail (n < 0: every one).
	fail int
	// done: the notification exists already (delivered meanwhile).
	done bool

	attempts    []deliveryAttempt
	delivered   []workflows.DeliverNotificationInput
	deadLetters []deadLetterAt
	resolutions []workflows.ResolveDeadLetterInput
}

type deliveryAttempt struct {
	At      time.Time
	Attempt int32
	Failed  bool
}

type deadLetterAt struct {
	In workflows.ConsumeDeadLetterInput
	At time.Time
}

var errSinkDown = errors.New("notification webhook answered 503 Service Unavailable")

const deadLetterRowID = 41

func (f *fakeSink) DeliverNotification(ctx context.Context, in workflows.DeliverNotificationInput) (workflows.DeliverNotificationResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := deliveryAttempt{At: f.now(), Attempt: activity.GetInfo(ctx).Attempt}
	if in.Event.Malformed != "" {
		a.Failed = true
		f.attempts = append(f.attempts, a)
		return workflows.DeliverNotificationResult{}, temporal.NewNonRetryableApplicationError(in.Event.Malformed, "malformed_event", nil)
	}
	if f.done {
		f.attempts = append(f.attempts, a)
		return workflows.DeliverNotificationResult{AlreadyDone: true}, nil
	}
	if f.fail != 0 {
		if f.fail > 0 {
			f.fail--
		}
		a.Failed = true
		f.attempts = append(f.attempts, a)
		return workflows.DeliverNotificationResult{}, fmt.Errorf("deliver %s: %w", in.Event.EventID, errSinkDown)
	}
	f.attempts = append(f.attempts, a)
	f.delivered = append(f.delivered, in)
	return workflows.DeliverNotificationResult{Attempts: in.PriorAttempts + int(a.Attempt)}, nil
}

func (f *fakeSink) RecordConsumeDeadLetter(_ context.Context, in workflows.ConsumeDeadLetterInput) (workflows.DeadLetterRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deadLetters = append(f.deadLetters, deadLetterAt{In: in, At: f.now()})
	// As the real one: the row's rounds, the highest recorded.
	rounds := 0
	for _, d := range f.deadLetters {
		rounds = max(rounds, d.In.Round)
	}
	return workflows.DeadLetterRecord{ID: deadLetterRowID, Round: rounds}, nil
}

func (f *fakeSink) ResolveDeadLetter(_ context.Context, in workflows.ResolveDeadLetterInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resolutions = append(f.resolutions, in)
	return nil
}

func (f *fakeSink) setFail(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = n
}

func (f *fakeSink) snapshot() (attempts []deliveryAttempt, delivered []workflows.DeliverNotificationInput,
	dls []deadLetterAt, res []workflows.ResolveDeadLetterInput) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.attempts), slices.Clone(f.delivered), slices.Clone(f.deadLetters), slices.Clone(f.resolutions)
}

func newDeliverEnv(t *testing.T, f *fakeSink) (*testsuite.TestWorkflowEnvironment, *claimStatuses) {
	t.Helper()
	env := newTestEnv()
	// The consumer starts each run under its event's ID.
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: workflows.DeliverEventWorkflowID(confirmedEventID)})
	env.RegisterWorkflow(workflows.DeliverEvent)
	register(env, workflows.DeliverNotification, f.DeliverNotification)
	register(env, workflows.RecordConsumeDeadLetter, f.RecordConsumeDeadLetter)
	registerNoResult(env, workflows.ResolveDeadLetter, f.ResolveDeadLetter)
	f.now = env.Now
	return env, recordClaimStatus(env)
}

func consumed() workflows.ConsumedEvent {
	return workflows.ConsumedEvent{Topic: workflows.EnrollmentTopic, Partition: 3, Offset: 1207, Key: courseID,
		EventID: confirmedEventID, EventType: workflows.EventEnrollmentConfirmed,
		Value: `{"event_id":"` + confirmedEventID + `","type":"enrollment.confirmed","data":{"student_id":"stu-1"}}`}
}

func afterInline() workflows.DeliverEventInput {
	return workflows.DeliverEventInput{Event: consumed(), InlineError: "notification webhook answered 503"}
}

func offsets(attempts []deliveryAttempt) []time.Duration {
	var out []time.Duration
	for _, a := range attempts {
		out = append(out, a.At.Sub(testStart))
	}
	return out
}

func deliveryState(t *testing.T, env *testsuite.TestWorkflowEnvironment) workflows.DeliveryState {
	t.Helper()
	var s workflows.DeliveryState
	require.NoError(t, env.GetWorkflowResult(&s))
	return s
}

func TestDeliverEventWorkflowID(t *testing.T) {
	assert.Equal(t, "deliver:enr-1/enrollment.confirmed", workflows.DeliverEventWorkflowID(confirmedEventID))
}

// The consumer's inline attempt is the first of the policy's four: the
// workflow's attempts come 1 s, 3 s and 7 s after it, the user's
// 1 s → 2 s → 4 s, and then the event is dead-lettered.
func TestDeliverEventRetryTiming(t *testing.T) {
	tests := []struct {
		name         string
		in           workflows.DeliverEventInput
		fail         int
		wantAt       []time.Duration
		wantDeadAt   time.Duration // -1: never dead-lettered
		wantAttempts int           // as recorded on the delivered notification
	}{
		{name: "inline failure, then delivered on the next attempt", in: afterInline(), fail: 0,
			wantAt: []time.Duration{time.Second}, wantDeadAt: -1, wantAttempts: 2},
		{name: "inline failure, two more, then delivered", in: afterInline(), fail: 2,
			wantAt: []time.Duration{time.Second, 3 * time.Second, 7 * time.Second}, wantDeadAt: -1, wantAttempts: 4},
		{name: "inline failure, exhausted", in: afterInline(), fail: -1,
			wantAt: []time.Duration{time.Second, 3 * time.Second, 7 * time.Second}, wantDeadAt: 7 * time.Second},
		{name: "started without an inline attempt: the whole policy", in: workflows.DeliverEventInput{Event: consumed()}, fail: -1,
			wantAt: []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}, wantDeadAt: 7 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeSink{fail: tc.fail}
			env, _ := newDeliverEnv(t, f)
			if tc.wantDeadAt >= 0 {
				env.RegisterDelayedCallback(func() {
					env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: workflows.ActionCompensate})
				}, time.Hour)
			}
			env.ExecuteWorkflow(workflows.DeliverEvent, tc.in)
			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())

			attempts, delivered, dls, _ := f.snapshot()
			assert.Equal(t, tc.wantAt, offsets(attempts))
			if tc.wantDeadAt < 0 {
				require.Len(t, delivered, 1, "delivered exactly once")
				assert.Empty(t, dls)
				st := deliveryState(t, env)
				assert.Equal(t, workflows.DeliveryDelivered, st.Status)
				assert.Equal(t, tc.wantAttempts, st.Attempts)
				return
			}
			assert.Empty(t, delivered)
			require.Len(t, dls, 1)
			assert.Equal(t, tc.wantDeadAt, dls[0].At.Sub(testStart), "dead-lettered right after the last attempt")
			assert.Equal(t, 1, dls[0].In.Round)
			assert.Equal(t, workflows.DeliverEventWorkflowID(confirmedEventID), dls[0].In.WorkflowID,
				"the dead letter names the run an operator's decision goes to")
		})
	}
}

func TestDeliverEventDeadLetterThenRetry(t *testing.T) {
	f := &fakeSink{fail: -1}
	env, claims := newDeliverEnv(t, f)
	var parked workflows.DeliveryState
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(workflows.QueryStatus)
		require.NoError(t, err)
		require.NoError(t, v.Get(&parked))
		f.setFail(0) // the sink recovers
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: workflows.ActionRetry})
	}, time.Minute)

	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())

	assert.Equal(t, workflows.DeliveryDeadLettered, parked.Status)
	assert.Equal(t, int64(deadLetterRowID), parked.DeadLetterID)
	assert.Equal(t, 4, parked.Attempts, "the inline attempt and the workflow's three")
	assert.Contains(t, parked.LastError, "503")

	attempts, delivered, dls, res := f.snapshot()
	assert.Equal(t, []time.Duration{time.Second, 3 * time.Second, 7 * time.Second, time.Minute}, offsets(attempts),
		"the operator's retry delivers at once")
	require.Len(t, delivered, 1)
	assert.Equal(t, 4, delivered[0].PriorAttempts)
	require.Len(t, dls, 1)
	assert.Contains(t, dls[0].In.Error, "503")
	assert.Equal(t, []workflows.ResolveDeadLetterInput{
		{ID: deadLetterRowID, State: workflows.DeadLetterRetrying},
		{ID: deadLetterRowID, State: workflows.DeadLetterResolved},
	}, res)
	st := deliveryState(t, env)
	assert.Equal(t, workflows.DeliveryDelivered, st.Status)
	assert.Equal(t, 5, st.Attempts)
	assert.Empty(t, st.LastError)
	assert.Equal(t, []string{"dead_lettered", "retrying", "delivered"}, claims.get())
}

func TestDeliverEventRetryThatFailsAgainDeadLettersAgain(t *testing.T) {
	f := &fakeSink{fail: -1}
	env, _ := newDeliverEnv(t, f)
	for _, at := range []time.Duration{time.Minute, 5 * time.Minute} {
		action := workflows.ActionRetry
		if at == 5*time.Minute {
			action = workflows.ActionCompensate
		}
		env.RegisterDelayedCallback(func() {
			env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: action})
		}, at)
	}
	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())

	attempts, delivered, dls, res := f.snapshot()
	assert.Len(t, attempts, 3+4, "the retry round runs the whole policy")
	assert.Empty(t, delivered)
	require.Len(t, dls, 2)
	assert.Equal(t, 2, dls[1].In.Round)
	assert.Equal(t, time.Minute+7*time.Second, dls[1].At.Sub(testStart))
	assert.Equal(t, []workflows.ResolveDeadLetterInput{
		{ID: deadLetterRowID, State: workflows.DeadLetterRetrying},
		{ID: deadLetterRowID, State: workflows.DeadLetterDiscarded},
	}, res)
	assert.Equal(t, workflows.DeliveryDiscarded, deliveryState(t, env).Status)
}

func TestDeliverEventCompensateDiscards(t *testing.T) {
	f := &fakeSink{fail: -1}
	env, claims := newDeliverEnv(t, f)
	env.RegisterDelayedCallback(func() {
		f.setFail(0) // even a recovered sink gets nothing: the operator gave up on the event
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: workflows.ActionCompensate})
	}, time.Minute)
	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())

	_, delivered, _, res := f.snapshot()
	assert.Empty(t, delivered)
	assert.Equal(t, []workflows.ResolveDeadLetterInput{{ID: deadLetterRowID, State: workflows.DeadLetterDiscarded}}, res)
	assert.Equal(t, workflows.DeliveryDiscarded, deliveryState(t, env).Status)
	assert.Equal(t, []string{"dead_lettered", "discarded"}, claims.get())
}

// A record that is not an event cannot become a notification however often
// it is tried: it is dead-lettered at once, for an operator to discard.
func TestDeliverEventMalformedIsDeadLetteredAtOnce(t *testing.T) {
	f := &fakeSink{}
	env, _ := newDeliverEnv(t, f)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: workflows.ActionCompensate})
	}, time.Minute)
	in := afterInline()
	in.Event.EventID = "enrollment.events/3@1207"
	in.Event.Value, in.Event.Malformed = "not json", "value is not a JSON event"
	in.InlineError = in.Event.Malformed
	env.ExecuteWorkflow(workflows.DeliverEvent, in)
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())

	attempts, _, dls, _ := f.snapshot()
	assert.Equal(t, []time.Duration{0}, offsets(attempts), "one attempt, no backoff")
	require.Len(t, dls, 1)
	assert.Equal(t, time.Duration(0), dls[0].At.Sub(testStart))
	assert.Contains(t, dls[0].In.Error, "not a JSON event")
	assert.Equal(t, "not json", dls[0].In.Event.Value, "the record is parked as it was")
	assert.Equal(t, workflows.DeliveryDiscarded, deliveryState(t, env).Status)
}

// A redelivered event whose notification exists already (the consumer's
// own retry after a crash got there first) is not sent twice.
func TestDeliverEventAlreadyDeliveredIsNotSentAgain(t *testing.T) {
	f := &fakeSink{done: true}
	env, _ := newDeliverEnv(t, f)
	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	_, delivered, dls, _ := f.snapshot()
	assert.Empty(t, delivered)
	assert.Empty(t, dls)
	st := deliveryState(t, env)
	assert.Equal(t, workflows.DeliveryDelivered, st.Status)
}

// Cancelling a parked delivery gives up on it like compensate: the dead
// letter must not stay open for a run that can no longer take a decision.
func TestDeliverEventCancelledWhileParkedDiscards(t *testing.T) {
	f := &fakeSink{fail: -1}
	env, _ := newDeliverEnv(t, f)
	env.RegisterDelayedCallback(env.CancelWorkflow, time.Minute)
	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	var canceled *temporal.CanceledError
	require.ErrorAs(t, env.GetWorkflowError(), &canceled)
	_, delivered, _, res := f.snapshot()
	assert.Empty(t, delivered)
	assert.Equal(t, []workflows.ResolveDeadLetterInput{{ID: deadLetterRowID, State: workflows.DeadLetterDiscarded}}, res)
}

// An unknown operator decision (a CLI typo) is ignored, not guessed at.
func TestDeliverEventIgnoresUnknownDecision(t *testing.T) {
	f := &fakeSink{fail: -1}
	env, _ := newDeliverEnv(t, f)
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: "retyr"})
	}, time.Minute)
	env.RegisterDelayedCallback(func() {
		f.setFail(0)
		env.SignalWorkflow(workflows.SignalDeadLetter, workflows.DeadLetterDecision{Action: workflows.ActionRetry})
	}, 2*time.Minute)
	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	attempts, delivered, _, _ := f.snapshot()
	require.Len(t, delivered, 1)
	assert.Equal(t, 2*time.Minute, attempts[len(attempts)-1].At.Sub(testStart))
}

// A delivery that never parked gets its ClaimStatus as it closes.
func TestDeliverEventOutcomeWithoutParking(t *testing.T) {
	t.Run("delivered", func(t *testing.T) {
		f := &fakeSink{}
		env, claims := newDeliverEnv(t, f)
		env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
		require.True(t, env.IsWorkflowCompleted())
		require.NoError(t, env.GetWorkflowError())
		assert.Equal(t, []string{"delivered"}, claims.get())
	})
	t.Run("cancelled while retrying", func(t *testing.T) {
		f := &fakeSink{fail: -1}
		env, claims := newDeliverEnv(t, f)
		env.RegisterDelayedCallback(env.CancelWorkflow, 2*time.Second)
		env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
		require.True(t, env.IsWorkflowCompleted())
		require.Error(t, env.GetWorkflowError())
		assert.Equal(t, []string{"discarded"}, claims.get())
	})
}
