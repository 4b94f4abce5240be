package workflows

import (
	"fmt"

	"go.temporal.io/sdk/workflow"
)

// issue is one run of the issue saga.
type issue struct {
	claim[CouponState, CouponDecision]
	in        IssueCouponInput
	setStatus func(workflow.Context, CouponStatus)
	saga      saga
	// revoked is what the compensation found: the coupon was taken back.
	revoked bool
}

// IssueCoupon takes one unit of a coupon type's stock for a user and
// publishes coupon.issued. The caller learns the outcome through
// UpdateDecision as soon as the stock is decided; the coupon is the user's
// from then on. If coupon.issued cannot be published the run dead-letters it
// as enrollments do; the operator's compensate revokes the coupon (stock
// back, coupon.revoked) unless it is already being used, in which case the
// event is discarded.
func IssueCoupon(ctx workflow.Context, in IssueCouponInput) (CouponState, error) {
	is := &issue{in: in}
	is.state = CouponState{CouponID: in.CouponID, CouponTypeID: in.TypeID, UserID: in.UserID, Status: CouponPending}
	is.setStatus = couponStatusSetter(&is.state)
	is.onDecide = func(ctx workflow.Context, d CouponDecision) { is.setStatus(ctx, d.Status) }
	is.expectStarter(in.StarterUpdateID, in.AnswerWait)
	if err := is.register(ctx, answerSecondIssue); err != nil {
		return is.state, err
	}
	err := is.run(ctx)
	is.end(ctx, err, func(err error) CouponDecision { return couponUndecided(in.CouponID, err) })
	return is.state, err
}

// answerSecondIssue: the coupon is already this user's, so a second claim
// gets the answer the database gives once this run is over.
func answerSecondIssue(d CouponDecision, first bool) CouponDecision {
	if !first && d.Status == CouponIssued {
		return CouponDecision{CouponID: d.CouponID, Status: CouponRefused, Refusal: RefusalAlreadyIssued,
			Message: "user already holds a coupon of this type"}
	}
	return d
}

func (is *issue) run(ctx workflow.Context) (err error) {
	// A cancelled run (operator `temporal workflow cancel`) gives its stock back.
	defer is.saga.unwindIfCancelled(ctx, &err, is.fail)
	info := workflow.GetInfo(ctx)

	is.saga.add(func(ctx workflow.Context) error {
		res, err := RevokeCoupon.Execute(compensationOptions(ctx), RevokeCouponInput{CouponID: is.in.CouponID})
		is.revoked = res.Revoked
		return err
	})
	reserved, err := ReserveCoupon.Execute(databaseOptions(ctx), ReserveCouponInput{
		CouponID:    is.in.CouponID,
		TypeID:      is.in.TypeID,
		UserID:      is.in.UserID,
		WorkflowID:  info.WorkflowExecution.ID,
		RunID:       info.WorkflowExecution.RunID,
		RequestedAt: is.in.RequestedAt,
	})
	if refused, ok := refusalOf(err); ok {
		// Nothing was taken, so there is nothing to compensate.
		is.saga.forget()
		is.state.Refusal = refused.Refusal
		d := CouponDecision{CouponID: is.in.CouponID, Status: CouponRefused, Refusal: refused.Refusal, Message: refused.Message}
		if refused.Holder != "" {
			d.CouponID = refused.Holder
		}
		is.decide(ctx, d)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reserve coupon: %w", err)
	}
	is.state.VendorID = reserved.VendorID
	upsertCouponAttributes(ctx, is.in.TypeID, reserved.VendorID)
	is.decide(ctx, CouponDecision{CouponID: is.in.CouponID, Status: CouponIssued})

	issued := Message{Topic: CouponTopic, Key: is.in.TypeID, Event: Event{
		ID:         EventID(is.in.CouponID, EventCouponIssued),
		Type:       EventCouponIssued,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data:       is.eventData(),
	}}
	action, err := publishOrPark(ctx, issued, "", parkingFor(&is.state, is.setStatus))
	if err != nil {
		return err
	}
	if action == ActionCompensate {
		return is.fail(ctx)
	}
	// coupon.issued is out: nothing is compensated any more.
	is.saga.forget()
	return nil
}

// fail takes the coupon back (if it is still unused), tells downstream and
// settles the dead letter. Both the operator's compensate and a cancelled
// run end here; on cancel ctx is disconnected.
func (is *issue) fail(ctx workflow.Context) error {
	if err := is.saga.compensate(ctx); err != nil {
		return fmt.Errorf("compensate coupon %s: %w", is.in.CouponID, err)
	}
	if is.decision == nil || is.decision.Status != CouponIssued {
		// Undecided (cancelled while reserving): any stock taken is back.
		is.setStatus(ctx, CouponFailed)
		return nil
	}
	if !is.revoked {
		// The user is already using (or has used) the coupon: it cannot be
		// taken back, so the operator's compensate drops the event instead.
		is.setStatus(ctx, CouponIssued)
		return resolveDeadLetter(ctx, is.state.DeadLetterID, DeadLetterDiscarded)
	}
	is.setStatus(ctx, CouponRevoked)
	revoked := Message{Topic: CouponTopic, Key: is.in.TypeID, Event: Event{
		ID:         EventID(is.in.CouponID, EventCouponRevoked),
		Type:       EventCouponRevoked,
		OccurredAt: workflow.Now(ctx).UTC(),
		Data:       is.eventData(),
	}}
	// Downstream must learn that the coupon was taken back; this publish
	// retries until Kafka is back rather than dead-lettering again.
	if err := Publish.Execute(compensationOptions(ctx), PublishInput{Message: revoked}); err != nil {
		return fmt.Errorf("publish %s: %w", revoked.Event.ID, err)
	}
	return resolveDeadLetter(ctx, is.state.DeadLetterID, DeadLetterCompensated)
}

func (is *issue) eventData() map[string]any {
	return map[string]any{
		"coupon_id":      is.in.CouponID,
		"coupon_type_id": is.in.TypeID,
		"vendor_id":      is.state.VendorID,
		"user_id":        is.in.UserID,
	}
}
