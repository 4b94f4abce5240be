package workflows_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/claimflow/claimflow/workflows"
)

// couponFake is an in-memory stand-in for the coupon activities and the
// vendor's payout API, with the contract of package activities: every
// activity is idempotent on its key, refusals are workflows.Refuse errors,
// and the "provider" dedupes payouts on the idempotency key.
type couponFake struct {
	mu  sync.Mutex
	now func() time.Time

	types   map[string]*fakeCouponType
	coupons map[string]*fakeCoupon
	balance map[string]int64 // vendor → cents
	ledger  map[string]workflows.RecordPayoutInput

	// payScript is what the payout API does on successive calls; once it is
	// used up every call is payOK.
	payScript []payOutcome
	// providerPaid is the provider's own record: key → payout ID.
	providerPaid map[string]string
	payCalls     []payCall

	// reserveErr and markErr, when set, are what ReserveCoupon and
	// MarkCouponUsed return (Postgres down).
	reserveErr, markErr error

	calls    map[string]int
	reserves []workflows.ReserveCouponInput
	marks    []workflows.MarkCouponUsedInput
	unmarks  []workflows.UnmarkCouponUsedInput
	revokes  []string

	fakeBroker
}

type fakeCouponType struct {
	Vendor      string
	Stock       int
	Issued      int
	PayoutCents int64
}

type fakeCoupon struct {
	ID     string
	Type   string
	User   string
	Status workflows.CouponStatus
	UseID  string
}

type payOutcome string

const (
	payOK      payOutcome = "ok"
	payDecline payOutcome = "decline"
	payFail    payOutcome = "fail" // 503, nothing paid
	// payLost: the provider pays, then the answer is lost (client timeout).
	payLost payOutcome = "lost"
)

type payCall struct {
	Key     string
	Attempt int32
	At      time.Time
	Outcome payOutcome
}

const (
	cpVendorID     = "ven-1"
	cpTypeID       = "spring-10"
	cpCouponID     = "cpn-1"
	cpUserID       = "usr-1"
	cpOtherUserID  = "usr-2"
	cpPayoutAmount = int64(250)
)

func newCouponFake() *couponFake {
	return &couponFake{
		now:          time.Now,
		types:        map[string]*fakeCouponType{},
		coupons:      map[string]*fakeCoupon{},
		balance:      map[string]int64{},
		ledger:       map[string]workflows.RecordPayoutInput{},
		providerPaid: map[string]string{},
		calls:        map[string]int{},
		fakeBroker:   newFakeBroker(),
	}
}

func (f *couponFake) withType(id string, stock, issued int) *couponFake {
	f.types[id] = &fakeCouponType{Vendor: cpVendorID, Stock: stock, Issued: issued, PayoutCents: cpPayoutAmount}
	return f
}

// withCoupon seeds a coupon of cpTypeID; an unrevoked one counts as issued.
func (f *couponFake) withCoupon(id, user string, status workflows.CouponStatus) *couponFake {
	c := &fakeCoupon{ID: id, Type: cpTypeID, User: user, Status: status}
	if status == workflows.CouponUsing || status == workflows.CouponUsed {
		c.UseID = "use-earlier"
	}
	f.coupons[id] = c
	if status != workflows.CouponRevoked {
		f.types[cpTypeID].Issued++
	}
	return f
}

// register registers the activities the coupon workflows call.
func (f *couponFake) register(env *testsuite.TestWorkflowEnvironment) {
	register(env, workflows.ReserveCoupon, f.ReserveCoupon)
	register(env, workflows.RevokeCoupon, f.RevokeCoupon)
	register(env, workflows.MarkCouponUsed, f.MarkCouponUsed)
	registerNoResult(env, workflows.UnmarkCouponUsed, f.UnmarkCouponUsed)
	register(env, workflows.PayVendor, f.PayVendor)
	register(env, workflows.RecordPayout, f.RecordPayout)
	registerNoResult(env, workflows.Publish, f.Publish)
	register(env, workflows.RecordDeadLetter, f.RecordDeadLetter)
	registerNoResult(env, workflows.ResolveDeadLetter, f.ResolveDeadLetter)
	f.mu.Lock()
	f.now = env.Now
	f.mu.Unlock()
}

func newCouponEnv(t *testing.T, f *couponFake) (*testsuite.TestWorkflowEnvironment, *claimStatuses) {
	t.Helper()
	env := newTestEnv()
	env.RegisterWorkflow(workflows.IssueCoupon)
	env.RegisterWorkflow(workflows.UseCoupon)
	f.register(env)
	return env, recordClaimStatus(env)
}

func (f *couponFake) ReserveCoupon(_ context.Context, in workflows.ReserveCouponInput) (workflows.ReserveCouponResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.ReserveCoupon.Name]++
	f.reserves = append(f.reserves, in)
	if f.reserveErr != nil {
		return workflows.ReserveCouponResult{}, f.reserveErr
	}
	ct, ok := f.types[in.TypeID]
	if !ok {
		return workflows.ReserveCouponResult{}, workflows.Refuse(workflows.RefusalCouponTypeNotFound, "coupon type %q does not exist", in.TypeID)
	}
	res := workflows.ReserveCouponResult{VendorID: ct.Vendor, IssuedAt: f.now()}
	if own, ok := f.coupons[in.CouponID]; ok {
		if own.Status == workflows.CouponRevoked {
			return workflows.ReserveCouponResult{}, workflows.Refuse(workflows.RefusalCouponRevoked, "coupon %s was revoked", in.CouponID)
		}
		return res, nil // a retry
	}
	for _, c := range f.coupons {
		if c.Type == in.TypeID && c.User == in.UserID && c.Status != workflows.CouponRevoked {
			return workflows.ReserveCouponResult{}, workflows.RefusalWithHolder(workflows.RefusalAlreadyIssued, c.ID,
				"user %q already holds a coupon of type %q", in.UserID, in.TypeID)
		}
	}
	if ct.Issued >= ct.Stock {
		return workflows.ReserveCouponResult{}, workflows.Refuse(workflows.RefusalSoldOut, "coupon type %q is sold out", in.TypeID)
	}
	ct.Issued++
	f.coupons[in.CouponID] = &fakeCoupon{ID: in.CouponID, Type: in.TypeID, User: in.UserID, Status: workflows.CouponIssued}
	return res, nil
}

func (f *couponFake) RevokeCoupon(_ context.Context, in workflows.RevokeCouponInput) (workflows.RevokeCouponResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.RevokeCoupon.Name]++
	f.revokes = append(f.revokes, in.CouponID)
	c, ok := f.coupons[in.CouponID]
	if !ok {
		return workflows.RevokeCouponResult{}, nil
	}
	switch c.Status {
	case workflows.CouponRevoked:
		return workflows.RevokeCouponResult{Revoked: true}, nil
	case workflows.CouponIssued:
		c.Status = workflows.CouponRevoked
		f.types[c.Type].Issued--
		return workflows.RevokeCouponResult{Revoked: true}, nil
	}
	return workflows.RevokeCouponResult{}, nil
}

func (f *couponFake) MarkCouponUsed(_ context.Context, in workflows.MarkCouponUsedInput) (workflows.MarkCouponUsedResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.MarkCouponUsed.Name]++
	f.marks = append(f.marks, in)
	if f.markErr != nil {
		return workflows.MarkCouponUsedResult{}, f.markErr
	}
	c, ok := f.coupons[in.CouponID]
	if !ok {
		return workflows.MarkCouponUsedResult{}, workflows.Refuse(workflows.RefusalCouponNotFound, "coupon %s does not exist", in.CouponID)
	}
	ct := f.types[c.Type]
	res := workflows.MarkCouponUsedResult{TypeID: c.Type, VendorID: ct.Vendor, AmountCents: ct.PayoutCents}
	switch {
	case c.User != in.UserID:
		return workflows.MarkCouponUsedResult{}, workflows.Refuse(workflows.RefusalNotOwner, "coupon %s belongs to another user", in.CouponID)
	case c.UseID == in.UseID:
		return res, nil
	case c.Status == workflows.CouponRevoked:
		return workflows.MarkCouponUsedResult{}, workflows.Refuse(workflows.RefusalCouponRevoked, "coupon %s was revoked", in.CouponID)
	case c.Status != workflows.CouponIssued:
		return workflows.MarkCouponUsedResult{}, workflows.Refuse(workflows.RefusalAlreadyUsed, "coupon %s is already %s", in.CouponID, c.Status)
	}
	c.Status, c.UseID = workflows.CouponUsing, in.UseID
	return res, nil
}

func (f *couponFake) UnmarkCouponUsed(_ context.Context, in workflows.UnmarkCouponUsedInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.UnmarkCouponUsed.Name]++
	f.unmarks = append(f.unmarks, in)
	if c, ok := f.coupons[in.CouponID]; ok && c.Status == workflows.CouponUsing && c.UseID == in.UseID {
		c.Status, c.UseID = workflows.CouponIssued, ""
	}
	return nil
}

var errPayoutTimeout = errors.New(`post "http://payouts/payouts": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`)

func (f *couponFake) PayVendor(ctx context.Context, in workflows.PayVendorInput) (workflows.PayVendorResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.PayVendor.Name]++
	outcome := payOK
	if len(f.payScript) > 0 {
		outcome, f.payScript = f.payScript[0], f.payScript[1:]
	}
	f.payCalls = append(f.payCalls, payCall{Key: in.IdempotencyKey, Attempt: activity.GetInfo(ctx).Attempt, At: f.now(), Outcome: outcome})
	switch outcome {
	case payDecline:
		return workflows.PayVendorResult{}, workflows.Refuse(workflows.RefusalPayoutDeclined, "the vendor's payout API declined the payout (402)")
	case payFail:
		return workflows.PayVendorResult{}, temporal.NewApplicationError("provider answered 503", workflows.ErrorTypePayoutUnavailable)
	}
	id, ok := f.providerPaid[in.IdempotencyKey]
	if !ok {
		id = fmt.Sprintf("po_%d", len(f.providerPaid)+1)
		f.providerPaid[in.IdempotencyKey] = id
	}
	if outcome == payLost {
		return workflows.PayVendorResult{}, errPayoutTimeout
	}
	return workflows.PayVendorResult{ProviderPayoutID: id}, nil
}

func (f *couponFake) RecordPayout(_ context.Context, in workflows.RecordPayoutInput) (workflows.RecordPayoutResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.RecordPayout.Name]++
	if _, ok := f.ledger[in.IdempotencyKey]; !ok {
		f.ledger[in.IdempotencyKey] = in
		f.balance[in.VendorID] += in.AmountCents
		if c, ok := f.coupons[in.CouponID]; ok && c.UseID == in.UseID && c.Status == workflows.CouponUsing {
			c.Status = workflows.CouponUsed
		}
	}
	return workflows.RecordPayoutResult{LedgerID: int64(len(f.ledger)), RecordedAt: f.now()}, nil
}

func (f *couponFake) Publish(ctx context.Context, in workflows.PublishInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.Publish.Name]++
	return f.publish(ctx, in, f.now())
}

func (f *couponFake) RecordDeadLetter(_ context.Context, in workflows.DeadLetterInput) (workflows.DeadLetterRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.RecordDeadLetter.Name]++
	return f.recordDeadLetter(in, f.now()), nil
}

func (f *couponFake) ResolveDeadLetter(_ context.Context, in workflows.ResolveDeadLetterInput) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[workflows.ResolveDeadLetter.Name]++
	f.resolveDeadLetter(in)
	return nil
}

// ---- accessors (copies under the lock) ----

func (f *couponFake) coupon(id string) fakeCoupon {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.coupons[id]; ok {
		return *c
	}
	return fakeCoupon{}
}

func (f *couponFake) setCouponStatus(id string, s workflows.CouponStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.coupons[id].Status = s
}

func (f *couponFake) issued(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.types[id].Issued
}

func (f *couponFake) callCount(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *couponFake) payments() []payCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.payCalls)
}

// paidKeys is the provider's record: every key it paid.
func (f *couponFake) paidKeys() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, v := range f.providerPaid {
		out[k] = v
	}
	return out
}

func (f *couponFake) ledgerRows() map[string]workflows.RecordPayoutInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]workflows.RecordPayoutInput{}
	for k, v := range f.ledger {
		out[k] = v
	}
	return out
}

func (f *couponFake) vendorBalance() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.balance[cpVendorID]
}

func (f *couponFake) unmarkCalls() []workflows.UnmarkCouponUsedInput {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.unmarks)
}

type couponDecisionCall = updateCall[workflows.CouponDecision]

// sendCouponDecision sends the decision update (with args) after delay.
func sendCouponDecision(env *testsuite.TestWorkflowEnvironment, updateID string, delay time.Duration, args ...any) *couponDecisionCall {
	return sendUpdate[workflows.CouponDecision](env, updateID, delay, args...)
}

func queryCouponState(t *testing.T, env *testsuite.TestWorkflowEnvironment) workflows.CouponState {
	t.Helper()
	v, err := env.QueryWorkflow(workflows.QueryStatus)
	require.NoError(t, err)
	var s workflows.CouponState
	require.NoError(t, v.Get(&s))
	return s
}
