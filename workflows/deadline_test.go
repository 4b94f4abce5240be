package workflows_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/claimflow/claimflow/workflows"
)

func TestDecisionDeadlineValues(t *testing.T) {
	for _, tc := range []struct {
		kind   workflows.ClaimKind
		payout time.Duration
		want   time.Duration
	}{
		{workflows.ClaimEnrollment, 0, 25 * time.Second},
		{workflows.ClaimCancellation, 0, 10 * time.Second},
		{workflows.ClaimIssueCoupon, 0, 10 * time.Second},
		// 10 s mark used + 4 × (payout + 5 s) + 1 + 2 + 4 s backoff + 15 s compensation
		{workflows.ClaimUseCoupon, 5 * time.Second, 72 * time.Second},
		{workflows.ClaimUseCoupon, 15 * time.Second, 112 * time.Second},
		{workflows.ClaimUseCoupon, 0, 112 * time.Second}, // no payout timeout: the largest
	} {
		got, err := workflows.DecisionDeadline(tc.kind, tc.payout)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%s with PAYOUT_TIMEOUT %s", tc.kind, tc.payout)
	}
	_, err := workflows.DecisionDeadline("bogus", 0)
	assert.Error(t, err)
}

func TestPayoutAttemptTimeoutOutlastsTheHTTPClient(t *testing.T) {
	for _, p := range []time.Duration{time.Second, 5 * time.Second, workflows.MaxPayoutTimeout} {
		assert.Greater(t, workflows.PayoutAttemptTimeout(p), p)
	}
	assert.Equal(t, 20*time.Second, workflows.PayoutAttemptTimeout(0), "no payout timeout: the largest's attempt")
}

// stepRecorder records the activity info of every attempt, by activity,
// and, through its interceptor, the options each workflow scheduled each
// activity with.
type stepRecorder struct {
	interceptor.WorkerInterceptorBase
	mu      sync.Mutex
	infos   map[string][]activity.Info
	options map[string]workflow.ActivityOptions
	local   map[string]workflow.LocalActivityOptions
}

func (r *stepRecorder) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &optionsInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}, r: r}
}

type optionsInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	r *stepRecorder
}

func (i *optionsInbound) Init(out interceptor.WorkflowOutboundInterceptor) error {
	return i.Next.Init(&optionsOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: out}, r: i.r})
}

type optionsOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	r *stepRecorder
}

func (o *optionsOutbound) ExecuteActivity(ctx workflow.Context, name string, args ...any) workflow.Future {
	o.r.mu.Lock()
	if _, seen := o.r.options[name]; !seen {
		o.r.options[name] = workflow.GetActivityOptions(ctx)
	}
	o.r.mu.Unlock()
	return o.Next.ExecuteActivity(ctx, name, args...)
}

func (o *optionsOutbound) ExecuteLocalActivity(ctx workflow.Context, name string, args ...any) workflow.Future {
	o.r.mu.Lock()
	if _, seen := o.r.local[name]; !seen {
		o.r.local[name] = workflow.GetLocalActivityOptions(ctx)
	}
	o.r.mu.Unlock()
	return o.Next.ExecuteLocalActivity(ctx, name, args...)
}

func (r *stepRecorder) record(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	info := activity.GetInfo(ctx)
	r.infos[info.ActivityType.Name] = append(r.infos[info.ActivityType.Name], info)
}

// The deadline is derived from the options the workflows really use: run
// each kind of claim, its payout failing every attempt, and compare the
// options of every step DecisionSteps names with the activity's own info,
// and the payout's attempts and backoff with the steps' bound.
func TestDecisionStepsAreTheWorkflowsOptions(t *testing.T) {
	const payout = 7 * time.Second
	errDown := errors.New("payout API down")
	for _, kind := range []workflows.ClaimKind{workflows.ClaimEnrollment, workflows.ClaimCancellation,
		workflows.ClaimIssueCoupon, workflows.ClaimUseCoupon} {
		t.Run(string(kind), func(t *testing.T) {
			env := newTestEnv()
			r := &stepRecorder{infos: map[string][]activity.Info{}, options: map[string]workflow.ActivityOptions{},
				local: map[string]workflow.LocalActivityOptions{}}
			env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{r}})
			var payAt []time.Time
			reg := func(name string, fn any) { env.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name}) }
			reg(workflows.CancelEnrollment.Name, func(ctx context.Context, in workflows.CancelEnrollmentInput) (workflows.CancelEnrollmentResult, error) {
				r.record(ctx)
				return workflows.CancelEnrollmentResult{Changed: true, CourseID: courseID, StudentID: "stu-1",
					Status: workflows.StatusCancelled, LeftWaitlist: true}, nil
			})
			reg(workflows.ReserveSeats.Name, func(ctx context.Context, in workflows.ReserveSeatsInput) (workflows.ReserveSeatsResult, error) {
				r.record(ctx)
				var res workflows.ReserveSeatsResult
				for _, c := range in.Claims {
					res.Decisions = append(res.Decisions, workflows.Decision{EnrollmentID: c.EnrollmentID, Status: workflows.StatusReserved})
				}
				return res, nil
			})
			reg(workflows.PublishBatch.Name, func(ctx context.Context, _ workflows.PublishBatchInput) error { r.record(ctx); return nil })
			reg(workflows.ConfirmBatch.Name, func(ctx context.Context, _ []string) error { return nil })
			reg(workflows.ReleaseSeats.Name, func(ctx context.Context, _ []string) error { return nil })
			reg(workflows.Publish.Name, func(ctx context.Context, _ workflows.PublishInput) error { return nil })
			reg(workflows.MarkConfirmed.Name, func(ctx context.Context, _ string) error { return nil })
			reg(workflows.ReleaseSeat.Name, func(ctx context.Context, _ workflows.ReleaseSeatInput) error { return nil })
			reg(workflows.ReserveCoupon.Name, func(ctx context.Context, _ workflows.ReserveCouponInput) (workflows.ReserveCouponResult, error) {
				r.record(ctx)
				return workflows.ReserveCouponResult{VendorID: "v-1"}, nil
			})
			reg(workflows.RevokeCoupon.Name, func(ctx context.Context, _ workflows.RevokeCouponInput) (workflows.RevokeCouponResult, error) {
				return workflows.RevokeCouponResult{}, nil
			})
			reg(workflows.MarkCouponUsed.Name, func(ctx context.Context, _ workflows.MarkCouponUsedInput) (workflows.MarkCouponUsedResult, error) {
				r.record(ctx)
				return workflows.MarkCouponUsedResult{TypeID: "t-1", VendorID: "v-1", AmountCents: 100}, nil
			})
			reg(workflows.PayVendor.Name, func(ctx context.Context, _ workflows.PayVendorInput) (workflows.PayVendorResult, error) {
				r.record(ctx)
				payAt = append(payAt, env.Now())
				return workflows.PayVendorResult{}, errDown
			})
			reg(workflows.UnmarkCouponUsed.Name, func(ctx context.Context, _ workflows.UnmarkCouponUsedInput) error {
				r.record(ctx)
				return nil
			})
			reg(workflows.RecordPayout.Name, func(ctx context.Context, _ workflows.RecordPayoutInput) (workflows.RecordPayoutResult, error) {
				r.record(ctx)
				return workflows.RecordPayoutResult{}, nil
			})

			switch kind {
			case workflows.ClaimEnrollment:
				sendDeskBatch(env, deskBatch(batchID, pairClaims()...), 0)
				env.ExecuteWorkflow(workflows.EnrollmentDesk, workflows.EnrollmentDeskInput{BatchesPerRun: 1})
			case workflows.ClaimCancellation:
				env.ExecuteWorkflow(workflows.Cancellation, workflows.CancellationInput{EnrollmentID: "enr-1"})
			case workflows.ClaimIssueCoupon:
				env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())
			case workflows.ClaimUseCoupon:
				in := workflows.UseCouponInput{CouponID: cpCouponID, Request: useReq("use-1", "u-1"), PayoutTimeout: payout}
				env.ExecuteWorkflow(workflows.UseCoupon, in)
			}
			require.True(t, env.IsWorkflowCompleted())
			if err := env.GetWorkflowError(); kind != workflows.ClaimEnrollment || !workflow.IsContinueAsNewError(err) {
				require.NoError(t, err) // a desk continues as new after its batch
			}

			steps, err := workflows.DecisionSteps(kind, payout)
			require.NoError(t, err)
			for _, step := range steps {
				infos := r.infos[step.Activity]
				if step.Activity == workflows.RecordPayout.Name {
					continue // the paid path; this run's payout failed
				}
				require.NotEmpty(t, infos, "%s ran", step.Activity)
				info := infos[0]
				assert.Equal(t, step.StartToClose, info.StartToCloseTimeout, "%s start-to-close", step.Activity)
				// What the workflow scheduled: its options bound the step
				// exactly as DecisionSteps says (the SDK fills a local
				// activity's policy with the defaults Bound assumes).
				used := workflows.DecisionStep{Activity: step.Activity, Local: step.Local}
				if step.Local {
					o, ok := r.local[step.Activity]
					require.True(t, ok, "%s is a local activity", step.Activity)
					used.StartToClose, used.Policy = o.StartToCloseTimeout, o.RetryPolicy
				} else {
					o, ok := r.options[step.Activity]
					require.True(t, ok, "%s is an activity", step.Activity)
					used.StartToClose, used.Policy = o.StartToCloseTimeout, o.RetryPolicy
				}
				wantBound, wantUnbounded := step.Bound()
				gotBound, gotUnbounded := used.Bound()
				assert.Equal(t, wantBound, gotBound, "%s bound", step.Activity)
				assert.Equal(t, wantUnbounded, gotUnbounded, "%s retries without limit", step.Activity)
				assert.Equal(t, step.StartToClose, used.StartToClose, "%s start-to-close", step.Activity)
				if step.Activity == workflows.PayVendor.Name {
					bound, unbounded := step.Bound()
					require.False(t, unbounded)
					require.Len(t, payAt, int(step.Policy.MaximumAttempts), "every attempt the policy allows")
					backoffs := payAt[len(payAt)-1].Sub(payAt[0])
					assert.Equal(t, bound, backoffs+time.Duration(len(payAt))*step.StartToClose,
						"the bound is the attempts at their timeout plus the backoff the test server waited")
					assert.Equal(t, workflows.PayoutAttemptTimeout(payout), info.StartToCloseTimeout,
						"the payout's attempt timeout derives from the run's PAYOUT_TIMEOUT")
				}
			}
		})
	}
}
