package workflows_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/claimflow/claimflow/workflows"
)

// A dead-letter decision names the dead letter and round it is for. Two
// operators deciding at once (or one client retrying its request) must not
// decide twice: the first decision is taken, every other one sent for the
// same round is ignored, and none of them is applied to a later round.
// Decisions without an ID (the CLI's bulk signal) apply to the dead letter
// open when the run takes them; one that arrives while none is open (the
// run is retrying) is dropped.
func TestDeadLetterDecisionsNameWhatTheyDecide(t *testing.T) {
	const (
		dlID     = 101         // the fake's first dead-letter row
		dlAt     = time.Minute // the first round is open from 7 s
		retryEnd = dlAt + 7*time.Second
		laterAt  = 5 * time.Minute // the second round is open from dlAt+7s
	)
	named := func(a workflows.DeadLetterAction, round int) workflows.DeadLetterDecision {
		return workflows.DeadLetterDecision{Action: a, DeadLetterID: dlID, Round: round}
	}
	unnamed := func(a workflows.DeadLetterAction) workflows.DeadLetterDecision {
		return workflows.DeadLetterDecision{Action: a}
	}
	tests := []struct {
		name string
		// at dlAt, all in one batch, as two API calls racing would arrive
		first []workflows.DeadLetterDecision
		// during the retry that the first decision may have started
		duringRetry []workflows.DeadLetterDecision
		// at laterAt, if the run is still parked
		later []workflows.DeadLetterDecision
		// the rounds recorded, the resolutions, and whether the second
		// round was still parked just before laterAt
		wantRounds      int
		wantResolutions []workflows.DeadLetterState
		wantParkedLater bool
	}{
		{
			name:            "two concurrent compensate calls: one compensation",
			first:           []workflows.DeadLetterDecision{named(workflows.ActionCompensate, 1), named(workflows.ActionCompensate, 1)},
			wantRounds:      1,
			wantResolutions: []workflows.DeadLetterState{workflows.DeadLetterCompensated},
		},
		{
			name:  "two concurrent retries: the second is not applied to the next round",
			first: []workflows.DeadLetterDecision{named(workflows.ActionRetry, 1), named(workflows.ActionRetry, 1)},
			later: []workflows.DeadLetterDecision{named(workflows.ActionCompensate, 2)},
			// without the names the second retry would start a third round at once
			wantRounds:      2,
			wantResolutions: []workflows.DeadLetterState{workflows.DeadLetterRetrying, workflows.DeadLetterCompensated},
			wantParkedLater: true,
		},
		{
			name:            "retry and compensate racing: the first wins, the other is stale",
			first:           []workflows.DeadLetterDecision{named(workflows.ActionRetry, 1), named(workflows.ActionCompensate, 1)},
			later:           []workflows.DeadLetterDecision{named(workflows.ActionCompensate, 2)},
			wantRounds:      2,
			wantResolutions: []workflows.DeadLetterState{workflows.DeadLetterRetrying, workflows.DeadLetterCompensated},
			wantParkedLater: true,
		},
		{
			name:  "a decision for another dead letter or a past round is ignored",
			first: []workflows.DeadLetterDecision{{Action: workflows.ActionCompensate, DeadLetterID: 999, Round: 1}, named(workflows.ActionCompensate, 7), named(workflows.ActionRetry, 1)},
			later: []workflows.DeadLetterDecision{named(workflows.ActionCompensate, 1), named(workflows.ActionCompensate, 2)},
			// the retry is the only one for round 1; round 2 takes only its own
			wantRounds:      2,
			wantResolutions: []workflows.DeadLetterState{workflows.DeadLetterRetrying, workflows.DeadLetterCompensated},
			wantParkedLater: true,
		},
		{
			name:            "two CLI signals without an ID: the open dead letter takes one, the other is dropped",
			first:           []workflows.DeadLetterDecision{unnamed(workflows.ActionRetry), unnamed(workflows.ActionRetry)},
			later:           []workflows.DeadLetterDecision{unnamed(workflows.ActionCompensate)},
			wantRounds:      2,
			wantResolutions: []workflows.DeadLetterState{workflows.DeadLetterRetrying, workflows.DeadLetterCompensated},
			wantParkedLater: true,
		},
		{
			name:        "a CLI signal while the run retries (no dead letter open) is dropped",
			first:       []workflows.DeadLetterDecision{unnamed(workflows.ActionRetry)},
			duringRetry: []workflows.DeadLetterDecision{unnamed(workflows.ActionCompensate)},
			later:       []workflows.DeadLetterDecision{named(workflows.ActionCompensate, 2)},
			wantRounds:  2,
			wantResolutions: []workflows.DeadLetterState{workflows.DeadLetterRetrying,
				workflows.DeadLetterCompensated},
			wantParkedLater: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := reservedFake(30, 0)
			f.failPublish[workflows.EventEnrollmentConfirmed] = -1
			env, _ := newEnv(t, f)
			r := &enrollRun{t: t, env: env, fake: f}
			signal := func(at time.Duration, ds []workflows.DeadLetterDecision) {
				if len(ds) == 0 {
					return
				}
				env.RegisterDelayedCallback(func() {
					for _, d := range ds {
						env.SignalWorkflow(workflows.SignalDeadLetter, d)
					}
				}, at)
			}
			signal(dlAt, tc.first)
			signal(dlAt+2*time.Second, tc.duringRetry)
			r.queryAt(laterAt - time.Second)
			signal(laterAt, tc.later)
			// A run still parked after everything was sent has taken no
			// decision it should not have; end it so the test returns.
			env.RegisterDelayedCallback(env.CancelWorkflow, time.Hour)

			env.ExecuteWorkflow(workflows.Enrollment, enrollInput())
			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError(), "the run ended on a decision, not on the test's cancel")

			dls := f.deadLetterInputs()
			require.Len(t, dls, tc.wantRounds, "dead-letter rounds recorded")
			for i, dl := range dls {
				assertDeadLetterInput(t, dl.In, i+1)
			}
			if tc.wantRounds > 1 {
				assert.True(t, dls[1].At.Equal(testStart.Add(retryEnd)),
					"the second round follows the one retry, at %v", dls[1].At.Sub(testStart))
			}
			var got []workflows.DeadLetterState
			for _, res := range f.resolved() {
				assert.Equal(t, int64(dlID), res.ID)
				got = append(got, res.State)
			}
			assert.Equal(t, tc.wantResolutions, got, "what the run did with its dead letter")
			if tc.wantParkedLater {
				require.NotNil(t, r.dlState, "the run was still open before the later decision")
				assert.Equal(t, workflows.StatusDeadLettered, r.dlState.Status, "round 2 waited for its own decision")
			}
			assertCompensated(t, f, dlID)
			assert.Len(t, f.attemptsOf(workflows.EventEnrollmentConfirmed), 4*tc.wantRounds,
				"four publish attempts per round, none after the compensation")
		})
	}
}

// DeliverEvent waits on the same decisions: a duplicate retry of its first
// round is not applied to the second.
func TestDeliverEventIgnoresADuplicateDecision(t *testing.T) {
	f := &fakeSink{fail: -1}
	env, _ := newDeliverEnv(t, f)
	decide := func(at time.Duration, ds ...workflows.DeadLetterDecision) {
		env.RegisterDelayedCallback(func() {
			for _, d := range ds {
				env.SignalWorkflow(workflows.SignalDeadLetter, d)
			}
		}, at)
	}
	retry1 := workflows.DeadLetterDecision{Action: workflows.ActionRetry, DeadLetterID: deadLetterRowID, Round: 1}
	decide(time.Minute, retry1, retry1)
	var parked workflows.DeliveryState
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(workflows.QueryStatus)
		require.NoError(t, err)
		require.NoError(t, v.Get(&parked))
		f.setFail(0)
	}, 5*time.Minute-time.Second)
	decide(5*time.Minute, workflows.DeadLetterDecision{Action: workflows.ActionRetry, DeadLetterID: deadLetterRowID, Round: 2})

	env.ExecuteWorkflow(workflows.DeliverEvent, afterInline())
	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())

	_, delivered, dls, res := f.snapshot()
	require.Len(t, dls, 2, "the duplicate retry did not start a third round")
	assert.Equal(t, workflows.DeliveryDeadLettered, parked.Status, "round 2 waited for its own decision")
	assert.Len(t, delivered, 1)
	var states []workflows.DeadLetterState
	for _, r := range res {
		states = append(states, r.State)
	}
	assert.Equal(t, []workflows.DeadLetterState{workflows.DeadLetterRetrying, workflows.DeadLetterRetrying,
		workflows.DeadLetterResolved}, states)
}
