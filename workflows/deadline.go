package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
)

// ClaimKind names the claims a caller waits on for a decision.
type ClaimKind string

const (
	ClaimEnrollment   ClaimKind = "enrollment"   // a claim in a batch on a desk
	ClaimCancellation ClaimKind = "cancellation" // a Cancellation run
	ClaimIssueCoupon  ClaimKind = "issue_coupon"
	ClaimUseCoupon    ClaimKind = "use_coupon"
)

// DecisionStep is one activity a run executes before it decides, with the
// options it executes it with.
type DecisionStep struct {
	Activity     string
	Local        bool
	StartToClose time.Duration
	Policy       *temporal.RetryPolicy
}

// Bound is the longest the step can take: every attempt its policy allows
// runs to its start-to-close timeout, with the policy's backoff between
// attempts. A step whose policy retries without limit (the database steps)
// is bounded by one attempt: Unbounded says so.
func (s DecisionStep) Bound() (d time.Duration, unbounded bool) {
	attempts := int32(1)
	if s.Policy != nil {
		attempts = s.Policy.MaximumAttempts
	}
	if attempts <= 0 {
		return s.StartToClose, true
	}
	d = time.Duration(attempts) * s.StartToClose
	for i := int32(1); i < attempts; i++ {
		d += backoff(s.Policy, i)
	}
	return d, false
}

// backoff is the wait before attempt n+1, as the server computes it (with
// the SDK's defaults for fields left zero).
func backoff(p *temporal.RetryPolicy, n int32) time.Duration {
	initial := p.InitialInterval
	if initial <= 0 {
		initial = time.Second
	}
	coef := p.BackoffCoefficient
	if coef < 1 {
		coef = 2
	}
	maxInterval := p.MaximumInterval
	if maxInterval <= 0 {
		maxInterval = 100 * initial
	}
	d := float64(initial)
	for i := int32(1); i < n; i++ {
		d *= coef
		if d >= float64(maxInterval) {
			return maxInterval
		}
	}
	return min(time.Duration(d), maxInterval)
}

// DecisionSteps lists, for a claim of kind, the steps on the longest way to
// its decision, with the options the workflow executes them with (built by
// the same functions). payoutTimeout is the PAYOUT_TIMEOUT a use runs with
// (UseCouponInput.PayoutTimeout).
func DecisionSteps(kind ClaimKind, payoutTimeout time.Duration) ([]DecisionStep, error) {
	db := databaseActivityOptions()
	step := func(name string, stc time.Duration, p *temporal.RetryPolicy) DecisionStep {
		return DecisionStep{Activity: name, StartToClose: stc, Policy: p}
	}
	switch kind {
	case ClaimEnrollment:
		// The desk decides after its one publish attempt; when that fails
		// it answers "reserved" at once.
		reserve, fast := localDatabaseActivityOptions(), fastLocalActivityOptions()
		return []DecisionStep{
			{Activity: ReserveSeats.Name, Local: true, StartToClose: reserve.StartToCloseTimeout, Policy: reserve.RetryPolicy},
			{Activity: PublishBatch.Name, Local: true, StartToClose: fast.StartToCloseTimeout, Policy: fast.RetryPolicy},
		}, nil
	case ClaimCancellation:
		return []DecisionStep{step(CancelEnrollment.Name, db.StartToCloseTimeout, db.RetryPolicy)}, nil
	case ClaimIssueCoupon:
		return []DecisionStep{step(ReserveCoupon.Name, db.StartToCloseTimeout, db.RetryPolicy)}, nil
	case ClaimUseCoupon:
		// Mark used, then pay; a payout that keeps failing is compensated
		// before the refusal is answered, a paid one recorded before the
		// use is: the longer of the two (the compensation) counts.
		pay, comp := payoutActivityOptions(payoutTimeout), compensationActivityOptions()
		last := step(UnmarkCouponUsed.Name, comp.StartToCloseTimeout, comp.RetryPolicy)
		if rec := databaseActivityOptions(); rec.StartToCloseTimeout > comp.StartToCloseTimeout {
			last = step(RecordPayout.Name, rec.StartToCloseTimeout, rec.RetryPolicy)
		}
		return []DecisionStep{
			step(MarkCouponUsed.Name, db.StartToCloseTimeout, db.RetryPolicy),
			step(PayVendor.Name, pay.StartToCloseTimeout, pay.RetryPolicy),
			last,
		}, nil
	}
	return nil, fmt.Errorf("unknown claim kind %q", kind)
}

// DecisionDeadline is the longest a caller waits for the decision of a
// claim of kind while the database answers: the sum of DecisionSteps'
// bounds, each bounded step (publish, payout) using its whole retry policy
// and each database step one attempt. A database outage has no bound (its
// steps retry until it is back), and neither has the wait of a use request
// queued behind another attempt on the same coupon; a caller that has
// waited DecisionDeadline answers with the claim's status URL (202), and
// the claim finishes on its own.
//
// Values with the options in force: enrollment 25 s, cancellation 10 s,
// issue coupon 10 s; use coupon 10 s + 4 × (PAYOUT_TIMEOUT + 5 s) + 7 s of
// backoff + 15 s, that is 72 s for the default 5 s and 112 s for 15 s.
func DecisionDeadline(kind ClaimKind, payoutTimeout time.Duration) (time.Duration, error) {
	steps, err := DecisionSteps(kind, payoutTimeout)
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, s := range steps {
		d, _ := s.Bound()
		total += d
	}
	return total, nil
}
