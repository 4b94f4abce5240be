package workflows_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/claimflow/claimflow/workflows"
)

// errPostgresDown is a retryable fault: the step retries until the cancel.
var errPostgresDown = errors.New("postgres: connection refused")

// answer is a decision of any workflow, reduced to what the handler rule is
// about.
type answer struct {
	Status  string
	Message string
}

// The handler-drain rule of the claim scaffold: a run cancelled while a
// caller's decision update waits still decides (undecided at the latest),
// and the caller hears that decision, not a cancellation of its update.
// Before the rule was decided once, only the coupon workflows did this.
func TestCancelledRunAnswersTheWaitingCaller(t *testing.T) {
	const cancelAt = 250 * time.Millisecond // between the retries of the first step
	tests := []struct {
		name string
		// start sets up a run whose first step keeps failing, sends the
		// decision update at once and returns the workflow, its input and
		// a way to read the caller's answers.
		start func(t *testing.T) (env *testsuite.TestWorkflowEnvironment, claims *claimStatuses, wf, in any, answers func(t *testing.T) []answer)
		// wantClaim is the last ClaimStatus ("" for a workflow without one).
		wantClaim string
	}{
		{
			name: "Cancellation",
			start: func(t *testing.T) (*testsuite.TestWorkflowEnvironment, *claimStatuses, any, any, func(*testing.T) []answer) {
				f := newFake()
				f.cancelErr = errPostgresDown
				env, claims := newEnv(t, f)
				call := sendDecision(env, "id-1", 0)
				return env, claims, workflows.Cancellation, workflows.CancellationInput{EnrollmentID: enrollmentID},
					func(t *testing.T) []answer {
						d := call.result(t)
						return []answer{{string(d.Status), d.Message}}
					}
			},
			wantClaim: "failed",
		},
		{
			name: "IssueCoupon",
			start: func(t *testing.T) (*testsuite.TestWorkflowEnvironment, *claimStatuses, any, any, func(*testing.T) []answer) {
				f := newCouponFake().withType(cpTypeID, 10, 0)
				f.reserveErr = errPostgresDown
				env, claims := newCouponEnv(t, f)
				call := sendCouponDecision(env, "id-1", 0)
				return env, claims, workflows.IssueCoupon, issueInput(), func(t *testing.T) []answer {
					d := call.result(t)
					return []answer{{string(d.Status), d.Message}}
				}
			},
			wantClaim: "failed",
		},
		{
			name: "UseCoupon",
			start: func(t *testing.T) (*testsuite.TestWorkflowEnvironment, *claimStatuses, any, any, func(*testing.T) []answer) {
				f := issuedCoupon()
				f.markErr = errPostgresDown
				env, claims := newCouponEnv(t, f)
				first := sendCouponDecision(env, "id-1", 0, useReq("use-0", cpUserID))
				// A double click while the first request waits shares its outcome.
				again := sendCouponDecision(env, "id-2", 50*time.Millisecond, useReq("use-1", cpUserID))
				return env, claims, workflows.UseCoupon, useInput("use-0", cpUserID), func(t *testing.T) []answer {
					d1, d2 := first.result(t), again.result(t)
					return []answer{{string(d1.Status), d1.Message}, {string(d2.Status), d2.Message}}
				}
			},
			wantClaim: "failed",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env, claims, wf, in, answers := tc.start(t)
			env.RegisterDelayedCallback(env.CancelWorkflow, cancelAt)

			env.ExecuteWorkflow(wf, in)

			require.True(t, env.IsWorkflowCompleted())
			err := env.GetWorkflowError()
			assert.True(t, temporal.IsCanceledError(err), "want a cancelled run, got %v", err)
			got := answers(t)
			require.NotEmpty(t, got)
			for _, a := range got {
				assert.Equal(t, "failed", a.Status, "every waiting caller hears the run ended undecided")
				assert.Contains(t, a.Message, "the claim ended without a decision")
				assert.Contains(t, a.Message, "canceled", "the answer says why")
			}
			if tc.wantClaim != "" {
				c := claims.get()
				require.NotEmpty(t, c)
				assert.Equal(t, tc.wantClaim, c[len(c)-1], "ClaimStatus follows the undecided answer")
			}
		})
	}
}
