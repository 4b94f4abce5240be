package workflows_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/workflows"
)

func issueInput() workflows.IssueCouponInput {
	return workflows.IssueCouponInput{CouponID: cpCouponID, TypeID: cpTypeID, UserID: cpUserID,
		RequestedAt: testStart.Add(-time.Second)}
}

func useReq(useID, user string) workflows.UseRequest {
	return workflows.UseRequest{UseID: useID, UserID: user, OrderID: "ord-" + useID, RequestedAt: testStart}
}

func useInput(useID, user string) workflows.UseCouponInput {
	return workflows.UseCouponInput{CouponID: cpCouponID, Request: useReq(useID, user)}
}

func cpKey(useID string) string { return workflows.PayoutKey(cpCouponID, useID) }

func couponRefusal(id string, r workflows.Refusal) workflows.CouponDecision {
	return workflows.CouponDecision{CouponID: id, Status: workflows.CouponRefused, Refusal: r}
}

// withoutMessage drops the human-readable message, which tests do not pin.
func withoutMessage(d workflows.CouponDecision) workflows.CouponDecision {
	d.Message = ""
	return d
}

func issuedEventData() map[string]any {
	return map[string]any{"coupon_id": cpCouponID, "coupon_type_id": cpTypeID, "vendor_id": cpVendorID, "user_id": cpUserID}
}

// ---- IssueCoupon ----

func TestIssueCouponIssuesAndPublishes(t *testing.T) {
	f := newCouponFake().withType(cpTypeID, 100, 5)
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-1", 0)

	env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.CouponDecision{CouponID: cpCouponID, Status: workflows.CouponIssued}, call.result(t))
	var state workflows.CouponState
	require.NoError(t, env.GetWorkflowResult(&state))
	assert.Equal(t, workflows.CouponState{CouponID: cpCouponID, CouponTypeID: cpTypeID, VendorID: cpVendorID,
		UserID: cpUserID, Status: workflows.CouponIssued}, state)
	assert.Equal(t, []string{"issued"}, claims.get())

	require.Len(t, f.reserves, 1)
	assert.Equal(t, workflows.ReserveCouponInput{CouponID: cpCouponID, TypeID: cpTypeID, UserID: cpUserID,
		WorkflowID: testWorkflowID, RunID: f.reserves[0].RunID, RequestedAt: issueInput().RequestedAt}, f.reserves[0])
	assert.Equal(t, 6, f.issued(cpTypeID))
	assert.Equal(t, workflows.CouponIssued, f.coupon(cpCouponID).Status)

	pub := f.publishedMessages()
	require.Len(t, pub, 1, "coupon.issued published exactly once")
	assert.Equal(t, workflows.CouponTopic, pub[0].Topic)
	assert.Equal(t, cpTypeID, pub[0].Key, "coupon events are keyed by coupon type")
	assert.Equal(t, workflows.EventID(cpCouponID, workflows.EventCouponIssued), pub[0].Event.ID)
	assert.Equal(t, workflows.EventCouponIssued, pub[0].Event.Type)
	assert.True(t, pub[0].Event.OccurredAt.Equal(testStart))
	assert.Equal(t, issuedEventData(), pub[0].Event.Data)
	assert.Zero(t, f.callCount(workflows.RevokeCoupon.Name))
}

func TestIssueCouponRefusals(t *testing.T) {
	tests := []struct {
		name string
		fake func() *couponFake
		want workflows.CouponDecision
	}{
		{"sold out", func() *couponFake { return newCouponFake().withType(cpTypeID, 100, 100) },
			couponRefusal(cpCouponID, workflows.RefusalSoldOut)},
		{"already issued points at the holder", func() *couponFake {
			return newCouponFake().withType(cpTypeID, 100, 0).withCoupon("cpn-holder", cpUserID, workflows.CouponUsed)
		}, couponRefusal("cpn-holder", workflows.RefusalAlreadyIssued)},
		{"already issued takes precedence over sold out", func() *couponFake {
			return newCouponFake().withType(cpTypeID, 1, 0).withCoupon("cpn-holder", cpUserID, workflows.CouponIssued)
		}, couponRefusal("cpn-holder", workflows.RefusalAlreadyIssued)},
		{"unknown type", newCouponFake, couponRefusal(cpCouponID, workflows.RefusalCouponTypeNotFound)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			before := map[string]int{}
			for id, ct := range f.types {
				before[id] = ct.Issued
			}
			env, claims := newCouponEnv(t, f)
			call := sendCouponDecision(env, "u-1", 0)

			env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError(), "a refusal is an answer, not a failure")
			d := call.result(t)
			assert.NotEmpty(t, d.Message)
			assert.Equal(t, tc.want, withoutMessage(d))
			assert.Equal(t, []string{string(tc.want.Refusal)}, claims.get())
			for id, n := range before {
				assert.Equal(t, n, f.issued(id), "no stock taken")
			}
			assert.Empty(t, f.publishedMessages())
			assert.Zero(t, f.callCount(workflows.RevokeCoupon.Name), "nothing to compensate")
		})
	}
}

func TestIssueCouponSecondClaimOfTheSameUserIsAlreadyIssued(t *testing.T) {
	f := newCouponFake().withType(cpTypeID, 100, 0)
	env, _ := newCouponEnv(t, f)
	first := sendCouponDecision(env, "u-1", 0)
	second := sendCouponDecision(env, "u-2", 0)

	env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

	require.True(t, env.IsWorkflowCompleted())
	assert.Equal(t, workflows.CouponIssued, first.result(t).Status)
	assert.Equal(t, couponRefusal(cpCouponID, workflows.RefusalAlreadyIssued), withoutMessage(second.result(t)))
	assert.Equal(t, 1, f.issued(cpTypeID))
	assert.Len(t, f.publishedMessages(), 1)
}

// The run knows its starter's update by ID (StarterUpdateID): it answers
// that request as the claim whichever update comes first, and stays open
// for it when it comes late, so a late starter is not left to a new run
// that would answer it already_issued.
func TestIssueCouponStarterUpdate(t *testing.T) {
	const answerWait = time.Minute
	tests := []struct {
		name          string
		starterID     string        // the input's StarterUpdateID
		starterAt     time.Duration // when the starter's update arrives; < 0: never
		otherAt       time.Duration // a second claim of the same user
		otherFirst    bool          // the second claim is sent before the starter's, at the same time
		wantStarter   workflows.CouponStatus
		wantOtherRefd bool          // the second claim is answered already_issued
		wantEnd       time.Duration // the run closes this long after it started
	}{
		{"with the start", "u-start", 0, 0, false, workflows.CouponIssued, true, 0},
		{"with the start, the second claim handled first", "u-start", 0, 0, true, workflows.CouponIssued, true, 0},
		{"after the decision, the second claim before it", "u-start", 20 * time.Second, 10 * time.Second, false,
			workflows.CouponIssued, true, 20 * time.Second},
		{"never", "u-start", -1, 10 * time.Second, false, "", true, answerWait},
		{"no starter named: the first update is the claim", "", 0, 0, true, workflows.CouponRefused, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCouponFake().withType(cpTypeID, 100, 0)
			env, _ := newCouponEnv(t, f)
			var starter, other *couponDecisionCall
			if tt.otherFirst {
				other = sendCouponDecision(env, "u-other", tt.otherAt)
			}
			if tt.starterAt >= 0 {
				starter = sendCouponDecision(env, "u-start", tt.starterAt)
			}
			if !tt.otherFirst {
				other = sendCouponDecision(env, "u-other", tt.otherAt)
			}
			in := issueInput()
			in.StarterUpdateID, in.AnswerWait = tt.starterID, answerWait

			env.ExecuteWorkflow(workflows.IssueCoupon, in)

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			if starter != nil {
				assert.Equal(t, tt.wantStarter, starter.result(t).Status, "the starter's answer")
			}
			if tt.wantOtherRefd {
				assert.Equal(t, couponRefusal(cpCouponID, workflows.RefusalAlreadyIssued), withoutMessage(other.result(t)))
			} else {
				assert.Equal(t, workflows.CouponIssued, other.result(t).Status, "the first update is the claim")
			}
			assert.Equal(t, tt.wantEnd, env.Now().Sub(testStart).Round(time.Second), "when the run closed")
			assert.Equal(t, 1, f.issued(cpTypeID), "one coupon taken")
			assert.Len(t, f.publishedMessages(), 1)
		})
	}
}

func TestIssueCouponDeadLetterRetryPublishesTheSameEvent(t *testing.T) {
	f := newCouponFake().withType(cpTypeID, 100, 0)
	f.failPublish[workflows.EventCouponIssued] = -1
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-1", 0)
	var parked workflows.CouponState
	env.RegisterDelayedCallback(func() { parked = queryCouponState(t, env) }, 59*time.Second)
	signalAt(env, time.Minute, workflows.ActionRetry, func() { f.failPublishing(workflows.EventCouponIssued, 0) })

	env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.CouponIssued, call.result(t).Status, "the user was answered before the publish")
	assert.Equal(t, workflows.CouponDeadLettered, parked.Status)
	assert.Equal(t, int64(101), parked.DeadLetterID)
	assert.Contains(t, parked.LastError, "fewer in-sync replicas")
	assert.Equal(t, []string{"issued", "dead_lettered", "issued"}, claims.get())

	dls := f.deadLetterInputs()
	require.Len(t, dls, 1)
	assert.Equal(t, workflows.CouponTopic, dls[0].In.Message.Topic)
	assert.Empty(t, dls[0].In.EnrollmentID)
	assert.True(t, dls[0].At.Equal(testStart.Add(7*time.Second)), "dead-lettered after 1s+2s+4s")
	assert.Len(t, f.attemptsOf(workflows.EventCouponIssued), 5)
	pub := f.publishedMessages()
	require.Len(t, pub, 1)
	assert.Equal(t, dls[0].In.Message, pub[0], "the republished event is the dead-lettered one")
	assert.Equal(t, []workflows.ResolveDeadLetterInput{
		{ID: 101, State: workflows.DeadLetterRetrying}, {ID: 101, State: workflows.DeadLetterResolved},
	}, f.resolved())
	assert.Equal(t, workflows.CouponIssued, f.coupon(cpCouponID).Status)
}

func TestIssueCouponDeadLetterCompensateRevokes(t *testing.T) {
	f := newCouponFake().withType(cpTypeID, 100, 3)
	f.failPublish[workflows.EventCouponIssued] = -1
	env, claims := newCouponEnv(t, f)
	sendCouponDecision(env, "u-1", 0)
	signalAt(env, time.Minute, workflows.ActionCompensate, func() {
		assert.Equal(t, 4, f.issued(cpTypeID), "stock held while dead-lettered")
	})

	env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, []string{"issued", "dead_lettered", "revoked"}, claims.get())
	assert.Equal(t, workflows.CouponRevoked, f.coupon(cpCouponID).Status)
	assert.Equal(t, 3, f.issued(cpTypeID), "the stock is back")
	revoked := f.publishedOf(workflows.EventCouponRevoked)
	require.Len(t, revoked, 1)
	assert.Equal(t, workflows.EventID(cpCouponID, workflows.EventCouponRevoked), revoked[0].Event.ID)
	assert.Equal(t, cpTypeID, revoked[0].Key)
	assert.Empty(t, f.publishedOf(workflows.EventCouponIssued))
	assert.Equal(t, []workflows.ResolveDeadLetterInput{{ID: 101, State: workflows.DeadLetterCompensated}}, f.resolved())
}

func TestIssueCouponDeadLetterCompensateOfAUsedCouponDiscardsTheEvent(t *testing.T) {
	f := newCouponFake().withType(cpTypeID, 100, 0)
	f.failPublish[workflows.EventCouponIssued] = -1
	env, claims := newCouponEnv(t, f)
	sendCouponDecision(env, "u-1", 0)
	signalAt(env, time.Minute, workflows.ActionCompensate, func() {
		f.setCouponStatus(cpCouponID, workflows.CouponUsed) // the user used it meanwhile
	})

	env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, []string{"issued", "dead_lettered", "issued"}, claims.get())
	assert.Equal(t, workflows.CouponUsed, f.coupon(cpCouponID).Status, "a used coupon is not taken back")
	assert.Equal(t, 1, f.issued(cpTypeID))
	assert.Empty(t, f.publishedOf(workflows.EventCouponRevoked))
	assert.Equal(t, []workflows.ResolveDeadLetterInput{{ID: 101, State: workflows.DeadLetterDiscarded}}, f.resolved())
}

func TestIssueCouponCancelledWhileDeadLetteredRevokes(t *testing.T) {
	f := newCouponFake().withType(cpTypeID, 100, 0)
	f.failPublish[workflows.EventCouponIssued] = -1
	env, claims := newCouponEnv(t, f)
	sendCouponDecision(env, "u-1", 0)
	env.RegisterDelayedCallback(env.CancelWorkflow, time.Minute)

	env.ExecuteWorkflow(workflows.IssueCoupon, issueInput())

	require.True(t, env.IsWorkflowCompleted())
	require.Error(t, env.GetWorkflowError())
	assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()))
	assert.Equal(t, []string{"issued", "dead_lettered", "revoked"}, claims.get())
	assert.Equal(t, 0, f.issued(cpTypeID))
	assert.Len(t, f.publishedOf(workflows.EventCouponRevoked), 1)
	assert.Equal(t, []workflows.ResolveDeadLetterInput{{ID: 101, State: workflows.DeadLetterCompensated}}, f.resolved())
}

// ---- UseCoupon ----

func issuedCoupon() *couponFake {
	return newCouponFake().withType(cpTypeID, 100, 0).withCoupon(cpCouponID, cpUserID, workflows.CouponIssued)
}

// usedDecision is the answer of a use recorded in the ledger at
// testStart+recordedAt.
func usedDecision(useID, providerID string, ledgerID int64, recordedAt time.Duration) workflows.CouponDecision {
	return workflows.CouponDecision{CouponID: cpCouponID, UseID: useID, Status: workflows.CouponUsed,
		Payout: &workflows.Payout{LedgerID: ledgerID, IdempotencyKey: cpKey(useID), VendorID: cpVendorID,
			AmountCents: cpPayoutAmount, ProviderPayoutID: providerID, RecordedAt: testStart.Add(recordedAt)}}
}

func TestUseCouponPaysRecordsAndPublishes(t *testing.T) {
	f := issuedCoupon()
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	got := call.result(t)
	want := usedDecision("use-0", "po_1", 1, 0)
	assert.Equal(t, want, got)
	assert.Equal(t, []string{"using", "used"}, claims.get())
	var state workflows.CouponState
	require.NoError(t, env.GetWorkflowResult(&state))
	assert.Equal(t, workflows.CouponState{CouponID: cpCouponID, CouponTypeID: cpTypeID, VendorID: cpVendorID,
		UserID: cpUserID, Status: workflows.CouponUsed, UseID: "use-0", Attempts: 1, Payout: want.Payout}, state)

	require.Len(t, f.marks, 1)
	assert.Equal(t, workflows.MarkCouponUsedInput{CouponID: cpCouponID, UserID: cpUserID, UseID: "use-0",
		OrderID: "ord-use-0", WorkflowID: testWorkflowID, RunID: f.marks[0].RunID}, f.marks[0])
	pays := f.payments()
	require.Len(t, pays, 1)
	assert.Equal(t, cpKey("use-0"), pays[0].Key, "the idempotency key is derived from coupon and use")
	assert.Equal(t, "cpn-1/use/use-0", pays[0].Key)
	assert.Equal(t, map[string]workflows.RecordPayoutInput{cpKey("use-0"): {
		IdempotencyKey: cpKey("use-0"), CouponID: cpCouponID, UseID: "use-0", VendorID: cpVendorID,
		AmountCents: cpPayoutAmount, ProviderPayoutID: "po_1", OrderID: "ord-use-0",
		WorkflowID: testWorkflowID, RunID: f.marks[0].RunID,
	}}, f.ledgerRows())
	assert.Equal(t, cpPayoutAmount, f.vendorBalance())
	assert.Equal(t, workflows.CouponUsed, f.coupon(cpCouponID).Status)
	assert.Empty(t, f.unmarkCalls())

	pub := f.publishedMessages()
	require.Len(t, pub, 1)
	assert.Equal(t, workflows.CouponTopic, pub[0].Topic)
	assert.Equal(t, cpTypeID, pub[0].Key)
	assert.Equal(t, workflows.EventID(cpKey("use-0"), workflows.EventCouponUsed), pub[0].Event.ID)
	assert.Equal(t, map[string]any{"coupon_id": cpCouponID, "coupon_type_id": cpTypeID, "vendor_id": cpVendorID,
		"user_id": cpUserID, "use_id": "use-0", "order_id": "ord-use-0", "payout_key": cpKey("use-0"),
		"amount_cents": float64(cpPayoutAmount), "provider_payout_id": "po_1"}, pub[0].Event.Data)
}

func TestUseCouponRefusals(t *testing.T) {
	tests := []struct {
		name string
		fake func() *couponFake
		want workflows.Refusal
	}{
		{"not the owner", func() *couponFake {
			return newCouponFake().withType(cpTypeID, 100, 0).withCoupon(cpCouponID, cpOtherUserID, workflows.CouponIssued)
		}, workflows.RefusalNotOwner},
		{"already used", func() *couponFake {
			return newCouponFake().withType(cpTypeID, 100, 0).withCoupon(cpCouponID, cpUserID, workflows.CouponUsed)
		}, workflows.RefusalAlreadyUsed},
		{"being used by another use", func() *couponFake {
			return newCouponFake().withType(cpTypeID, 100, 0).withCoupon(cpCouponID, cpUserID, workflows.CouponUsing)
		}, workflows.RefusalAlreadyUsed},
		{"revoked", func() *couponFake {
			return newCouponFake().withType(cpTypeID, 100, 0).withCoupon(cpCouponID, cpUserID, workflows.CouponRevoked)
		}, workflows.RefusalCouponRevoked},
		{"unknown coupon", func() *couponFake { return newCouponFake().withType(cpTypeID, 100, 0) }, workflows.RefusalCouponNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.fake()
			env, claims := newCouponEnv(t, f)
			call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))

			env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			d := call.result(t)
			assert.NotEmpty(t, d.Message)
			d.Message = ""
			assert.Equal(t, workflows.CouponDecision{CouponID: cpCouponID, UseID: "use-0", Status: workflows.CouponRefused,
				Refusal: tc.want}, d)
			assert.Equal(t, []string{string(tc.want)}, claims.get())
			assert.Empty(t, f.payments(), "no payout")
			assert.Empty(t, f.ledgerRows())
			assert.Empty(t, f.unmarkCalls(), "nothing to compensate")
			assert.Empty(t, f.publishedMessages())
		})
	}
}

// assertUseCompensated checks a use that ended in refusal r after its
// payout: the coupon is issued again, nothing is in the ledger and
// coupon.use_failed says why.
func assertUseCompensated(t *testing.T, f *couponFake, useID string, r workflows.Refusal) {
	t.Helper()
	assert.Equal(t, workflows.CouponIssued, f.coupon(cpCouponID).Status, "the coupon is the user's again")
	assert.Empty(t, f.coupon(cpCouponID).UseID)
	assert.Contains(t, f.unmarkCalls(), workflows.UnmarkCouponUsedInput{CouponID: cpCouponID, UseID: useID})
	assert.NotContains(t, f.ledgerRows(), cpKey(useID), "no ledger row")
	assert.Zero(t, f.vendorBalance())
	var failed []workflows.Message
	for _, m := range f.publishedOf(workflows.EventCouponUseFailed) {
		if m.Event.Data["use_id"] == useID {
			failed = append(failed, m)
		}
	}
	require.Len(t, failed, 1, "coupon.use_failed published once")
	assert.Equal(t, workflows.EventID(cpKey(useID), workflows.EventCouponUseFailed), failed[0].Event.ID)
	assert.Equal(t, string(r), failed[0].Event.Data["reason"])
	assert.Equal(t, cpTypeID, failed[0].Key)
	assert.Empty(t, f.publishedOf(workflows.EventCouponUsed))
}

func TestUseCouponPayoutDeclinedIsCompensatedWithoutRetry(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payDecline}
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	d := call.result(t)
	assert.Equal(t, workflows.RefusalPayoutDeclined, d.Refusal)
	assert.Contains(t, d.Message, "declined")
	assert.Len(t, f.payments(), 1, "a decline is not retried")
	assert.Equal(t, []string{"using", "payout_declined"}, claims.get())
	assertUseCompensated(t, f, "use-0", workflows.RefusalPayoutDeclined)
}

func TestUseCouponPayout5xxTwiceThenPaidOnce(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payFail, payFail}
	env, _ := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	assert.Equal(t, usedDecision("use-0", "po_1", 1, 3*time.Second), call.result(t))
	pays := f.payments()
	require.Len(t, pays, 3)
	for i, p := range pays {
		assert.Equal(t, cpKey("use-0"), p.Key, "every attempt carries the same idempotency key")
		assert.Equal(t, int32(i+1), p.Attempt)
	}
	assert.True(t, pays[1].At.Equal(testStart.Add(time.Second)), "retried after 1s")
	assert.True(t, pays[2].At.Equal(testStart.Add(3*time.Second)), "then after 2s")
	assert.Len(t, f.paidKeys(), 1)
	assert.Len(t, f.ledgerRows(), 1)
	assert.Equal(t, cpPayoutAmount, f.vendorBalance())
	assert.Len(t, f.publishedOf(workflows.EventCouponUsed), 1)
}

func TestUseCouponPayoutFailingFourTimesIsCompensated(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payFail, payFail, payFail, payFail, payOK}
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	d := call.result(t)
	assert.Equal(t, workflows.RefusalPayoutFailed, d.Refusal)
	pays := f.payments()
	require.Len(t, pays, 4, "the payout policy makes 4 attempts")
	for i, at := range []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second} {
		assert.True(t, pays[i].At.Equal(testStart.Add(at)), "attempt %d at %v, want %v", i+1, pays[i].At.Sub(testStart), at)
	}
	assert.Equal(t, []string{"using", "payout_failed"}, claims.get())
	assertUseCompensated(t, f, "use-0", workflows.RefusalPayoutFailed)
	var state workflows.CouponState
	require.NoError(t, env.GetWorkflowResult(&state))
	assert.Contains(t, state.LastError, "503")
}

func TestUseCouponResponseLostAfterProcessingPaysOnce(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payLost}
	env, _ := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	assert.Equal(t, usedDecision("use-0", "po_1", 1, time.Second), call.result(t), "paid on the retry after 1 s")
	pays := f.payments()
	require.Len(t, pays, 2)
	assert.Equal(t, pays[0].Key, pays[1].Key, "the retry carries the same key")
	assert.Equal(t, map[string]string{cpKey("use-0"): "po_1"}, f.paidKeys(), "the provider paid once")
	assert.Len(t, f.ledgerRows(), 1)
	assert.Equal(t, cpPayoutAmount, f.vendorBalance())
}

func TestUseCouponFiftyConcurrentUsesUseItOnce(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payFail} // keep the first use in flight for a second
	env, _ := newCouponEnv(t, f)
	calls := []*couponDecisionCall{sendCouponDecision(env, "u-00", 0, useReq("use-00", cpUserID))}
	for i := 1; i < 50; i++ {
		delay := time.Duration(i%5) * 200 * time.Millisecond // 0 … 800 ms: all while the first is in flight
		calls = append(calls, sendCouponDecision(env, fmt.Sprintf("u-%02d", i), delay, useReq(fmt.Sprintf("use-%02d", i), cpUserID)))
	}

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-00", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	used, already := 0, 0
	for i, c := range calls {
		d := c.result(t)
		switch {
		case d.Status == workflows.CouponUsed:
			used++
			assert.Equal(t, 0, i, "the request that started the use gets the outcome")
			assert.Equal(t, cpKey("use-00"), d.Payout.IdempotencyKey)
		case d.Refusal == workflows.RefusalAlreadyUsed:
			already++
		default:
			t.Errorf("request %d: %+v", i, d)
		}
	}
	assert.Equal(t, 1, used)
	assert.Equal(t, 49, already)
	assert.Len(t, f.marks, 1, "one use attempt")
	assert.Len(t, f.paidKeys(), 1)
	assert.Len(t, f.ledgerRows(), 1)
	assert.Equal(t, cpPayoutAmount, f.vendorBalance())
	assert.Len(t, f.publishedOf(workflows.EventCouponUsed), 1)
}

// Requests that arrive while an attempt is in flight: the same user's share
// its fate; another user's is queued as its own attempt and refused.
func TestUseCouponRequestsDuringAFailingAttempt(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payFail, payFail, payFail, payFail}
	env, claims := newCouponEnv(t, f)
	first := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	twin := sendCouponDecision(env, "u-1", 500*time.Millisecond, useReq("use-1", cpUserID))
	intruder := sendCouponDecision(env, "u-2", 600*time.Millisecond, useReq("use-2", cpOtherUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	d0, d1 := first.result(t), twin.result(t)
	assert.Equal(t, workflows.RefusalPayoutFailed, d0.Refusal)
	assert.Equal(t, d0, d1, "a duplicate of an in-flight request shares its outcome")
	d2 := intruder.result(t)
	assert.Equal(t, workflows.RefusalNotOwner, d2.Refusal)
	assert.Equal(t, "use-2", d2.UseID)
	require.Len(t, f.marks, 2, "the intruder got an attempt of its own")
	assert.Equal(t, cpOtherUserID, f.marks[1].UserID)
	for _, p := range f.payments() {
		assert.Equal(t, cpKey("use-0"), p.Key)
	}
	assert.Equal(t, []string{"using", "payout_failed", "not_owner"}, claims.get())
	assertUseCompensated(t, f, "use-0", workflows.RefusalPayoutFailed)
}

// After a compensated attempt the coupon is unused again: a later request of
// the owner in the same run is a new attempt with a new payout key.
func TestUseCouponNewAttemptAfterCompensation(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payDecline}
	// coupon.use_failed takes ~3 s to get out, keeping the run open.
	f.failPublish[workflows.EventCouponUseFailed] = 5
	env, claims := newCouponEnv(t, f)
	first := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	again := sendCouponDecision(env, "u-1", time.Second, useReq("use-1", cpUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.RefusalPayoutDeclined, first.result(t).Refusal)
	// use_failed is acked at 0.1+0.2+0.4+0.8+1.6 s; then the new attempt runs.
	assert.Equal(t, usedDecision("use-1", "po_1", 1, 3100*time.Millisecond), again.result(t))
	pays := f.payments()
	require.Len(t, pays, 2)
	assert.Equal(t, []string{cpKey("use-0"), cpKey("use-1")}, []string{pays[0].Key, pays[1].Key})
	assert.Equal(t, []string{"using", "payout_declined", "using", "used"}, claims.get())
	assert.Len(t, f.publishedOf(workflows.EventCouponUseFailed), 1)
	assert.Len(t, f.publishedOf(workflows.EventCouponUsed), 1)
	assert.Equal(t, workflows.CouponUsed, f.coupon(cpCouponID).Status)
	assert.Equal(t, map[string]string{cpKey("use-1"): "po_1"}, f.paidKeys())
	var state workflows.CouponState
	require.NoError(t, env.GetWorkflowResult(&state))
	assert.Equal(t, 2, state.Attempts)
}

// Once used, later requests in the same run are answered at once.
func TestUseCouponRequestsAfterTheUse(t *testing.T) {
	f := issuedCoupon()
	f.failPublish[workflows.EventCouponUsed] = 2 // published at 3 s
	env, _ := newCouponEnv(t, f)
	sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	owner := sendCouponDecision(env, "u-1", time.Second, useReq("use-1", cpUserID))
	other := sendCouponDecision(env, "u-2", 1500*time.Millisecond, useReq("use-2", cpOtherUserID))

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	assert.Equal(t, workflows.CouponDecision{CouponID: cpCouponID, UseID: "use-0", Status: workflows.CouponRefused,
		Refusal: workflows.RefusalAlreadyUsed}, withoutMessage(owner.result(t)))
	assert.Equal(t, workflows.RefusalNotOwner, other.result(t).Refusal)
	assert.Len(t, f.marks, 1, "answered without touching the database")
	assert.Len(t, f.publishedOf(workflows.EventCouponUsed), 1)
}

// The update of the request that started the run can reach it after the run
// did its work (under load, through the client's retry). The run waits for
// it, up to the starter's own wait, and answers it with its use; a run that
// closed first would leave it to another run, where the request's own use
// answers it already_used.
func TestUseCouponStarterUpdateArrivingLate(t *testing.T) {
	const answerWait = time.Minute
	tests := []struct {
		name      string
		starterAt time.Duration // when the starter's update arrives; < 0: never
		otherAt   time.Duration // another request of the owner, meanwhile
		wantEnd   time.Duration // the run closes this long after it started
	}{
		{"with the start", 0, 0, 0},
		{"after the use", 20 * time.Second, 10 * time.Second, 20 * time.Second},
		{"never", -1, 10 * time.Second, answerWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := issuedCoupon()
			env, _ := newCouponEnv(t, f)
			var starter *couponDecisionCall
			if tt.starterAt >= 0 {
				starter = sendCouponDecision(env, "u-0", tt.starterAt, useReq("use-0", cpUserID))
			}
			other := sendCouponDecision(env, "u-1", tt.otherAt, useReq("use-1", cpUserID))
			in := useInput("use-0", cpUserID)
			in.AnswerWait = answerWait

			env.ExecuteWorkflow(workflows.UseCoupon, in)

			require.True(t, env.IsWorkflowCompleted())
			require.NoError(t, env.GetWorkflowError())
			if starter != nil {
				assert.Equal(t, usedDecision("use-0", "po_1", 1, 0), starter.result(t))
			}
			assert.Equal(t, workflows.RefusalAlreadyUsed, other.result(t).Refusal)
			assert.Equal(t, tt.wantEnd, env.Now().Sub(testStart).Round(time.Second), "when the run closed")
			assert.Len(t, f.marks, 1, "one use attempt")
			assert.Len(t, f.paidKeys(), 1)
		})
	}
}

func TestUseCouponUsedEventDeadLetterRetry(t *testing.T) {
	f := issuedCoupon()
	f.failPublish[workflows.EventCouponUsed] = -1
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	signalAt(env, time.Minute, workflows.ActionRetry, func() { f.failPublishing(workflows.EventCouponUsed, 0) })

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, workflows.CouponUsed, call.result(t).Status, "answered before the publish")
	assert.Equal(t, []string{"using", "used", "dead_lettered", "used"}, claims.get())
	dls := f.deadLetterInputs()
	require.Len(t, dls, 1)
	assert.Equal(t, workflows.EventID(cpKey("use-0"), workflows.EventCouponUsed), dls[0].In.Message.Event.ID)
	assert.Equal(t, []workflows.ResolveDeadLetterInput{
		{ID: 101, State: workflows.DeadLetterRetrying}, {ID: 101, State: workflows.DeadLetterResolved},
	}, f.resolved())
	assert.Len(t, f.publishedOf(workflows.EventCouponUsed), 1)
	assert.Len(t, f.ledgerRows(), 1)
}

func TestUseCouponUsedEventDeadLetterCompensateDiscardsTheEvent(t *testing.T) {
	f := issuedCoupon()
	f.failPublish[workflows.EventCouponUsed] = -1
	env, claims := newCouponEnv(t, f)
	sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	signalAt(env, time.Minute, workflows.ActionCompensate, nil)

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	require.NoError(t, env.GetWorkflowError())
	assert.Equal(t, []string{"using", "used", "dead_lettered", "used"}, claims.get())
	assert.Equal(t, []workflows.ResolveDeadLetterInput{{ID: 101, State: workflows.DeadLetterDiscarded}}, f.resolved())
	assert.Equal(t, workflows.CouponUsed, f.coupon(cpCouponID).Status, "a paid use is not undone")
	assert.Empty(t, f.unmarkCalls())
	assert.Len(t, f.ledgerRows(), 1)
	assert.Empty(t, f.publishedOf(workflows.EventCouponUseFailed))
}

// A cancel while the payout is in flight does not abandon it: the use is
// finished (paid, recorded, published).
func TestUseCouponCancelDuringPayoutFinishesTheUse(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payFail}
	env, _ := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	env.RegisterDelayedCallback(env.CancelWorkflow, 500*time.Millisecond)

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	assert.NoError(t, env.GetWorkflowError(), "the run completes the use it had started")
	assert.Equal(t, usedDecision("use-0", "po_1", 1, time.Second), call.result(t))
	assert.Len(t, f.payments(), 2)
	assert.Len(t, f.ledgerRows(), 1)
	assert.Equal(t, workflows.CouponUsed, f.coupon(cpCouponID).Status)
	assert.Empty(t, f.unmarkCalls())
	assert.Len(t, f.publishedOf(workflows.EventCouponUsed), 1)
}

// A cancel before the vendor could be paid gives the coupon back.
func TestUseCouponCancelWhileMarkingGivesTheCouponBack(t *testing.T) {
	f := issuedCoupon()
	f.markErr = fmt.Errorf("postgres: connection refused")
	env, claims := newCouponEnv(t, f)
	call := sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	env.RegisterDelayedCallback(env.CancelWorkflow, 2*time.Second)

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	assert.True(t, temporal.IsCanceledError(env.GetWorkflowError()))
	d := call.result(t)
	assert.Equal(t, workflows.CouponFailed, d.Status, "the caller hears the run ended undecided")
	assert.Equal(t, []workflows.UnmarkCouponUsedInput{{CouponID: cpCouponID, UseID: "use-0"}}, f.unmarkCalls())
	assert.Empty(t, f.payments())
	assert.Equal(t, []string{"failed"}, claims.get())
}

func TestUseCouponStatusQueryWhilePaying(t *testing.T) {
	f := issuedCoupon()
	f.payScript = []payOutcome{payFail}
	env, _ := newCouponEnv(t, f)
	sendCouponDecision(env, "u-0", 0, useReq("use-0", cpUserID))
	var mid workflows.CouponState
	env.RegisterDelayedCallback(func() { mid = queryCouponState(t, env) }, 500*time.Millisecond)

	env.ExecuteWorkflow(workflows.UseCoupon, useInput("use-0", cpUserID))

	require.True(t, env.IsWorkflowCompleted())
	assert.Equal(t, workflows.CouponUsing, mid.Status)
	assert.Equal(t, "use-0", mid.UseID)
	assert.Equal(t, cpTypeID, mid.CouponTypeID)
	assert.Equal(t, cpVendorID, mid.VendorID)
	assert.Equal(t, 1, mid.Attempts)
	assert.Nil(t, mid.Payout)
}

func TestCouponWorkflowIDsAreReadable(t *testing.T) {
	assert.Equal(t, "coupon-issue:spring-10:usr-1", workflows.IssueCouponWorkflowID(cpTypeID, cpUserID))
	assert.Equal(t, "coupon-use:cpn-1", workflows.UseCouponWorkflowID(cpCouponID))
}
