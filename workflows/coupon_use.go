package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// PayoutRetryPolicy is the payout backoff: 1 s → 2 s → 4 s, four
// attempts, then the use is compensated. A decline is never retried.
var PayoutRetryPolicy = &temporal.RetryPolicy{
	InitialInterval:        time.Second,
	BackoffCoefficient:     2,
	MaximumInterval:        4 * time.Second,
	MaximumAttempts:        4,
	NonRetryableErrorTypes: []string{string(RefusalPayoutDeclined)},
}

// MaxPayoutTimeout is the largest PAYOUT_TIMEOUT the configuration accepts;
// a run whose input carries no payout timeout (started before the field
// existed) is bounded as if it were this.
const MaxPayoutTimeout = 15 * time.Second

// payoutAttemptMargin is how much longer the server waits for one PayVendor
// attempt than the activity's HTTP client waits for the payout API, so that
// a hanging payout API ends as the client's timeout (a retry with the same
// idempotency key) rather than as an activity timeout.
const payoutAttemptMargin = 5 * time.Second

// PayoutAttemptTimeout bounds one PayVendor attempt on the server side:
// the configured PAYOUT_TIMEOUT (MaxPayoutTimeout when 0) plus a margin.
func PayoutAttemptTimeout(payoutTimeout time.Duration) time.Duration {
	if payoutTimeout <= 0 {
		payoutTimeout = MaxPayoutTimeout
	}
	return payoutTimeout + payoutAttemptMargin
}

func payoutActivityOptions(payoutTimeout time.Duration) workflow.ActivityOptions {
	return workflow.ActivityOptions{StartToCloseTimeout: PayoutAttemptTimeout(payoutTimeout), RetryPolicy: PayoutRetryPolicy}
}

func payoutOptions(ctx workflow.Context, payoutTimeout time.Duration) workflow.Context {
	return workflow.WithActivityOptions(ctx, payoutActivityOptions(payoutTimeout))
}

// useAttempt is one attempt to use the coupon: the request that started it
// and every request of the same user that arrived while it was queued or in
// flight (a double click, a client retry) share its outcome.
type useAttempt struct {
	req      UseRequest
	done     bool
	decision CouponDecision
}

func (a *useAttempt) finish(d CouponDecision) {
	a.decision, a.done = d, true
}

// use is one run of the use saga.
type use struct {
	claim[CouponState, CouponDecision]
	in        UseCouponInput
	setStatus func(workflow.Context, CouponStatus)
	// attempts in arrival order; the run works through them one at a time.
	attempts []*useAttempt
	next     int
	// usedBy is the attempt that used the coupon, once one did.
	usedBy *useAttempt
	// starterSeen: the update of the request that started the run (the
	// run's input) has reached the run.
	starterSeen bool
	// starterDeadline is when the run stops waiting for that update; zero
	// until the run first falls idle without it (awaitStarter).
	starterDeadline time.Time
	saga            saga
}

// UseCoupon uses a coupon: mark it used (the owner's, still issued) → pay
// the vendor through its payout API with an idempotency key derived here →
// record the payout in the ledger and the vendor's balance → publish
// coupon.used. A declined payout (non-retryable) or one that keeps failing
// (PayoutRetryPolicy) is compensated: the coupon goes back to issued and
// coupon.use_failed is published.
//
// Every request to use one coupon meets in this run (workflow ID
// coupon-use:<coupon>, conflict policy USE_EXISTING) and is answered
// through UpdateDecision, whose argument is the request's UseRequest:
//
//   - The request that starts an attempt gets its outcome: used with the
//     payout, or the refusal (not_owner, already_used, coupon_not_found,
//     coupon_revoked, payout_declined, payout_failed).
//   - A request of the same user that arrives while that attempt is queued
//     or in flight is the same use asked twice: it shares the outcome, except
//     that a success answers it already_used (the coupon was used once, by
//     the other request).
//   - Once the coupon is used, later requests are answered at once:
//     already_used for the owner, not_owner for anyone else.
//   - A request that arrives after an attempt failed and was compensated, or
//     from another user, starts a new attempt (a new UseID, so a new payout
//     key) once the current one is over: attempts never overlap, so the
//     coupon is held by at most one use at a time.
//
// After the vendor is paid nothing is undone: the run then finishes the use
// even if cancelled, and an operator's compensate of a dead-lettered
// coupon.used drops the event (a payout cannot be taken back).
func UseCoupon(ctx workflow.Context, in UseCouponInput) (CouponState, error) {
	u := &use{in: in}
	u.state = CouponState{CouponID: in.CouponID, UserID: in.Request.UserID, Status: CouponPending}
	u.setStatus = couponStatusSetter(&u.state)
	u.attempts = []*useAttempt{{req: in.Request}}
	if err := u.registerHandlers(ctx); err != nil {
		return u.state, err
	}
	var err error
	for {
		// Work until no attempt is queued and every caller has its answer.
		if err = workflow.Await(ctx, func() bool {
			return u.next < len(u.attempts) || workflow.AllHandlersFinished(ctx)
		}); err != nil {
			break
		}
		if u.next == len(u.attempts) {
			if u.starterSeen {
				break
			}
			if u.awaitStarter(ctx) {
				break
			}
			continue
		}
		a := u.attempts[u.next]
		u.next++
		if err = u.attempt(ctx, a); err != nil {
			break
		}
	}
	if err != nil {
		// Cancelled: callers still waiting hear so.
		for _, a := range u.attempts {
			if !a.done {
				a.finish(couponUndecided(in.CouponID, err))
			}
		}
		if u.state.Status != CouponUsed {
			u.setStatus(ctx, CouponFailed)
		}
	}
	// Each attempt answers its own callers, so the run has no one decision.
	u.end(ctx, err, nil)
	return u.state, err
}

// registerHandlers registers the claim's status query and a decision update
// of its own: every request to use the coupon carries its UseRequest and is
// answered by the attempt it joins.
func (u *use) registerHandlers(ctx workflow.Context) error {
	if err := u.register(ctx, nil); err != nil {
		return err
	}
	return workflow.SetUpdateHandler(ctx, UpdateDecision, func(ctx workflow.Context, req UseRequest) (CouponDecision, error) {
		if req.UseID == u.in.Request.UseID {
			u.starterSeen = true
		}
		a := u.attach(req)
		if a == nil {
			return u.afterUse(req), nil
		}
		// Every attempt is finished before the run ends, also when it is
		// cancelled (a cancelled run finishes a use whose payout is in flight).
		if err := awaitAnswer(ctx, func() bool { return a.done }); err != nil {
			return CouponDecision{}, err
		}
		d := a.decision
		if d.Status == CouponUsed && req.UseID != a.req.UseID {
			d = u.afterUse(req)
		}
		return d, nil
	})
}

// awaitStarter keeps an idle run open, up to the starter's own wait
// (AnswerWait from the first time it is idle), until the update of the
// request that started it arrives; it returns true once the wait is over
// (timed out, or the run was cancelled: every attempt is done by then).
// That update is taken in with the start but, under load, can reach the run
// only after the run has done its work (through the client's retry); a run
// that had closed by then would leave it to another run, where the request,
// whose use this run decided, is decided again (a used coupon's own use
// answered already_used). Requests that arrive during the wait are served
// as usual.
func (u *use) awaitStarter(ctx workflow.Context) (over bool) {
	if u.starterDeadline.IsZero() {
		wait := u.in.AnswerWait
		if wait <= 0 {
			wait, _ = DecisionDeadline(ClaimUseCoupon, u.in.PayoutTimeout) // a known kind: no error
		}
		u.starterDeadline = workflow.Now(ctx).Add(wait)
	}
	remaining := u.starterDeadline.Sub(workflow.Now(ctx))
	if remaining <= 0 {
		return true
	}
	// AwaitWithTimeout fails only when ctx is cancelled, which ends the wait.
	arrived, err := workflow.AwaitWithTimeout(ctx, remaining, func() bool {
		return u.starterSeen || u.next < len(u.attempts)
	})
	return err != nil || !arrived
}

// attach finds the attempt that answers req, queueing a new one if needed;
// nil means the coupon is already used and req is answered at once.
func (u *use) attach(req UseRequest) *useAttempt {
	for _, a := range u.attempts {
		if a.req.UseID == req.UseID {
			return a // the request that started this attempt (the run's input)
		}
	}
	if u.usedBy != nil {
		return nil
	}
	for _, a := range u.attempts {
		if !a.done && a.req.UserID == req.UserID {
			return a
		}
	}
	a := &useAttempt{req: req}
	u.attempts = append(u.attempts, a)
	return a
}

// afterUse answers a request for a coupon this run has used.
func (u *use) afterUse(req UseRequest) CouponDecision {
	d := CouponDecision{CouponID: u.in.CouponID, UseID: u.usedBy.req.UseID, Status: CouponRefused,
		Refusal: RefusalAlreadyUsed, Message: fmt.Sprintf("coupon %s is already used", u.in.CouponID)}
	if req.UserID != u.usedBy.req.UserID {
		d.Refusal, d.Message = RefusalNotOwner, fmt.Sprintf("coupon %s belongs to another user", u.in.CouponID)
	}
	return d
}

// attempt runs the saga for one use attempt. It returns an error only when
// the run must stop (cancelled before the vendor could be paid).
func (u *use) attempt(ctx workflow.Context, a *useAttempt) (err error) {
	if u.usedBy != nil {
		a.finish(u.afterUse(a.req))
		return nil
	}
	u.state.UseID, u.state.UserID, u.state.Refusal, u.state.LastError = a.req.UseID, a.req.UserID, "", ""
	u.state.Attempts++
	u.saga = saga{}
	// Cancelled while holding the coupon, before any payout: give it back.
	defer u.saga.unwindIfCancelled(ctx, &err, u.saga.compensate)
	info := workflow.GetInfo(ctx)
	key := PayoutKey(u.in.CouponID, a.req.UseID)

	u.saga.add(func(ctx workflow.Context) error {
		return UnmarkCouponUsed.Execute(compensationOptions(ctx),
			UnmarkCouponUsedInput{CouponID: u.in.CouponID, UseID: a.req.UseID})
	})
	marked, err := MarkCouponUsed.Execute(databaseOptions(ctx), MarkCouponUsedInput{
		CouponID:   u.in.CouponID,
		UserID:     a.req.UserID,
		UseID:      a.req.UseID,
		OrderID:    a.req.OrderID,
		WorkflowID: info.WorkflowExecution.ID,
		RunID:      info.WorkflowExecution.RunID,
	})
	if refused, ok := refusalOf(err); ok {
		// The coupon was not taken, so there is nothing to compensate.
		u.saga.forget()
		u.state.Refusal = refused.Refusal
		u.setStatus(ctx, CouponRefused)
		a.finish(CouponDecision{CouponID: u.in.CouponID, UseID: a.req.UseID, Status: CouponRefused,
			Refusal: refused.Refusal, Message: refused.Message})
		return nil
	}
	if err != nil {
		return fmt.Errorf("mark coupon %s used: %w", u.in.CouponID, err)
	}
	u.state.CouponTypeID, u.state.VendorID = marked.TypeID, marked.VendorID
	upsertCouponAttributes(ctx, marked.TypeID, marked.VendorID)
	u.setStatus(ctx, CouponUsing)

	// From here on the vendor may be paid at any moment, so the use is
	// finished whatever happens to the run: a cancel must not leave a paid
	// use unrecorded, nor hand back a coupon whose payout is in flight.
	dctx, cancel := workflow.NewDisconnectedContext(ctx)
	defer cancel()
	paid, err := PayVendor.Execute(payoutOptions(dctx, u.in.PayoutTimeout), PayVendorInput{
		IdempotencyKey: key,
		CouponID:       u.in.CouponID,
		UseID:          a.req.UseID,
		VendorID:       marked.VendorID,
		AmountCents:    marked.AmountCents,
		OrderID:        a.req.OrderID,
	})
	if err != nil {
		refusal := RefusalPayoutFailed
		message := "the vendor payout did not go through after retries; the coupon is unused and can be used again"
		if r, ok := refusalOf(err); ok && r.Refusal == RefusalPayoutDeclined {
			refusal = RefusalPayoutDeclined
			message = r.Message + "; the coupon is unused and can be used again"
		}
		u.state.LastError = err.Error()
		return u.compensate(dctx, a, marked, refusal, message)
	}

	// The vendor is paid: the coupon is used for good.
	u.saga.forget()
	rec, err := RecordPayout.Execute(databaseOptions(dctx), RecordPayoutInput{
		IdempotencyKey:   key,
		CouponID:         u.in.CouponID,
		UseID:            a.req.UseID,
		VendorID:         marked.VendorID,
		AmountCents:      marked.AmountCents,
		ProviderPayoutID: paid.ProviderPayoutID,
		OrderID:          a.req.OrderID,
		WorkflowID:       info.WorkflowExecution.ID,
		RunID:            info.WorkflowExecution.RunID,
	})
	if err != nil {
		return fmt.Errorf("record payout %s: %w", key, err)
	}
	u.state.Payout = &Payout{
		LedgerID:         rec.LedgerID,
		IdempotencyKey:   key,
		VendorID:         marked.VendorID,
		AmountCents:      marked.AmountCents,
		ProviderPayoutID: paid.ProviderPayoutID,
		RecordedAt:       rec.RecordedAt,
	}
	u.usedBy = a
	u.setStatus(dctx, CouponUsed)
	a.finish(CouponDecision{CouponID: u.in.CouponID, UseID: a.req.UseID, Status: CouponUsed, Payout: u.state.Payout})

	used := Message{Topic: CouponTopic, Key: marked.TypeID, Event: Event{
		ID:         EventID(key, EventCouponUsed),
		Type:       EventCouponUsed,
		OccurredAt: workflow.Now(dctx).UTC(),
		Data:       u.eventData(a, marked),
	}}
	used.Event.Data["amount_cents"] = marked.AmountCents
	used.Event.Data["provider_payout_id"] = paid.ProviderPayoutID
	action, err := publishOrPark(dctx, used, "", parkingFor(&u.state, u.setStatus))
	if err != nil {
		return err
	}
	if action == ActionCompensate {
		// A payout cannot be taken back: the operator's compensate drops
		// the event instead.
		u.setStatus(dctx, CouponUsed)
		return resolveDeadLetter(dctx, u.state.DeadLetterID, DeadLetterDiscarded)
	}
	return nil
}

// compensate gives the coupon back after a payout that was declined or kept
// failing, answers the attempt and publishes coupon.use_failed.
func (u *use) compensate(ctx workflow.Context, a *useAttempt, marked MarkCouponUsedResult, refusal Refusal, message string) error {
	if err := u.saga.compensate(ctx); err != nil {
		return fmt.Errorf("compensate use of coupon %s: %w", u.in.CouponID, err)
	}
	u.state.Refusal = refusal
	u.setStatus(ctx, CouponRefused)
	a.finish(CouponDecision{CouponID: u.in.CouponID, UseID: a.req.UseID, Status: CouponRefused,
		Refusal: refusal, Message: message})
	key := PayoutKey(u.in.CouponID, a.req.UseID)
	failed := Message{Topic: CouponTopic, Key: marked.TypeID, Event: Event{
		ID:         EventID(key, EventCouponUseFailed),
		Type:       EventCouponUseFailed,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data:       u.eventData(a, marked),
	}}
	failed.Event.Data["reason"] = string(refusal)
	// Downstream must learn that the use failed; this publish retries until
	// Kafka is back rather than dead-lettering.
	if err := Publish.Execute(compensationOptions(ctx), PublishInput{Message: failed}); err != nil {
		return fmt.Errorf("publish %s: %w", failed.Event.ID, err)
	}
	return nil
}

func (u *use) eventData(a *useAttempt, marked MarkCouponUsedResult) map[string]any {
	data := map[string]any{
		"coupon_id":      u.in.CouponID,
		"coupon_type_id": marked.TypeID,
		"vendor_id":      marked.VendorID,
		"user_id":        a.req.UserID,
		"use_id":         a.req.UseID,
		"payout_key":     PayoutKey(u.in.CouponID, a.req.UseID),
	}
	if a.req.OrderID != "" {
		data["order_id"] = a.req.OrderID
	}
	return data
}
