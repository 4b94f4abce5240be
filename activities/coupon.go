package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/workflows"
)

// ReserveCoupon takes one unit of a coupon type's stock and records the
// coupon in one transaction. The conditional UPDATE cannot issue beyond the
// stock; the partial unique index cannot issue a user two coupons of one
// type; the coupon ID makes a retry a no-op. The INSERT takes only a type
// of another vendor than the user: a vendor may not hold a coupon that
// pays itself (own_coupon_type).
func (a *Activities) ReserveCoupon(ctx context.Context, in workflows.ReserveCouponInput) (workflows.ReserveCouponResult, error) {
	var res workflows.ReserveCouponResult
	err := pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `
			INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
			SELECT $1::text, t.id, $3::text, 'issued', $4::text, $5::text, $6::timestamptz, clock_timestamp()
			FROM coupon_types t WHERE t.id = $2 AND t.vendor_id <> $3::text
			ON CONFLICT DO NOTHING`,
			in.CouponID, in.TypeID, in.UserID, in.WorkflowID, in.RunID, in.RequestedAt)
		if pgCode(err) == pgForeignKeyViolation {
			return workflows.Refuse(workflows.RefusalCouponTypeNotFound, "coupon type %q does not exist", in.TypeID)
		}
		if err != nil {
			return fmt.Errorf("insert coupon %s: %w", in.CouponID, err)
		}
		if tag.RowsAffected() == 0 {
			return explainCouponConflict(ctx, tx, in, &res)
		}
		tag, err = tx.Exec(ctx, `UPDATE coupon_types SET issued = issued + 1 WHERE id = $1 AND issued < stock`, in.TypeID)
		if err != nil {
			return fmt.Errorf("take a coupon of %s: %w", in.TypeID, err)
		}
		if tag.RowsAffected() == 0 {
			return workflows.Refuse(workflows.RefusalSoldOut, "coupon type %q is sold out", in.TypeID)
		}
		return tx.QueryRow(ctx, `
			SELECT t.vendor_id, c.issued_at FROM coupons c JOIN coupon_types t ON t.id = c.type_id
			WHERE c.id = $1`, in.CouponID).Scan(&res.VendorID, &res.IssuedAt)
	})
	return res, err
}

// explainCouponConflict tells a retried reservation (our own row is there)
// from a type that does not exist, a type of the user's own (the user is
// its vendor) and a second coupon of the same type for the same user.
func explainCouponConflict(ctx context.Context, tx pgx.Tx, in workflows.ReserveCouponInput, res *workflows.ReserveCouponResult) error {
	var status string
	err := tx.QueryRow(ctx, `
		SELECT c.status, t.vendor_id, c.issued_at FROM coupons c JOIN coupon_types t ON t.id = c.type_id
		WHERE c.id = $1`, in.CouponID).Scan(&status, &res.VendorID, &res.IssuedAt)
	if err == nil {
		if status == string(workflows.CouponRevoked) {
			return workflows.Refuse(workflows.RefusalCouponRevoked, "coupon %s was revoked", in.CouponID)
		}
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up coupon %s: %w", in.CouponID, err)
	}
	var vendor string
	err = tx.QueryRow(ctx, `SELECT vendor_id FROM coupon_types WHERE id = $1`, in.TypeID).Scan(&vendor)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return workflows.Refuse(workflows.RefusalCouponTypeNotFound, "coupon type %q does not exist", in.TypeID)
	case err != nil:
		return fmt.Errorf("look up coupon type %s: %w", in.TypeID, err)
	case vendor == in.UserID:
		return workflows.Refuse(workflows.RefusalOwnCouponType,
			"user %q is the vendor of coupon type %q: a vendor may not hold its own coupons", in.UserID, in.TypeID)
	}
	var holder string
	err = tx.QueryRow(ctx, `
		SELECT id FROM coupons WHERE type_id = $1 AND user_id = $2 AND status <> 'revoked'`,
		in.TypeID, in.UserID).Scan(&holder)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up coupon of %s for %s: %w", in.TypeID, in.UserID, err)
	}
	if holder == "" {
		// The holder was revoked between our insert and this read: a retry
		// will find the way free.
		return fmt.Errorf("coupon of %s for %s changed concurrently; retrying", in.TypeID, in.UserID)
	}
	return workflows.RefusalWithHolder(workflows.RefusalAlreadyIssued, holder,
		"user %q already holds a coupon of type %q", in.UserID, in.TypeID)
}

// RevokeCoupon is the compensation of ReserveCoupon: an issued coupon is
// revoked and its stock returned. A coupon being used or used cannot be
// taken back (Revoked false); revoking twice returns one unit.
func (a *Activities) RevokeCoupon(ctx context.Context, in workflows.RevokeCouponInput) (workflows.RevokeCouponResult, error) {
	var res workflows.RevokeCouponResult
	err := pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		var typeID string
		err := tx.QueryRow(ctx, `
			UPDATE coupons SET status = 'revoked', revoked_at = clock_timestamp(), updated_at = now()
			WHERE id = $1 AND status = 'issued'
			RETURNING type_id`, in.CouponID).Scan(&typeID)
		if errors.Is(err, pgx.ErrNoRows) {
			var status string
			err := tx.QueryRow(ctx, `SELECT status FROM coupons WHERE id = $1`, in.CouponID).Scan(&status)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("look up coupon %s: %w", in.CouponID, err)
			}
			res.Revoked = status == string(workflows.CouponRevoked)
			return nil
		}
		if err != nil {
			return fmt.Errorf("revoke coupon %s: %w", in.CouponID, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE coupon_types SET issued = issued - 1 WHERE id = $1`, typeID); err != nil {
			return fmt.Errorf("give back the stock of coupon %s: %w", in.CouponID, err)
		}
		res.Revoked = true
		return nil
	})
	return res, err
}

// MarkCouponUsed holds a coupon for one use attempt: a conditional UPDATE
// that only an issued coupon of this user passes. A retry of the same
// attempt finds the coupon already held by its use ID and succeeds.
func (a *Activities) MarkCouponUsed(ctx context.Context, in workflows.MarkCouponUsedInput) (workflows.MarkCouponUsedResult, error) {
	var res workflows.MarkCouponUsedResult
	var orderID *string
	if in.OrderID != "" {
		orderID = &in.OrderID
	}
	err := a.DB.QueryRow(ctx, `
		UPDATE coupons c SET status = 'using', use_id = $3, order_id = $4, use_workflow_id = $5, use_run_id = $6,
			using_at = clock_timestamp(), updated_at = now()
		FROM coupon_types t
		WHERE c.id = $1 AND c.user_id = $2 AND c.status = 'issued' AND t.id = c.type_id AND t.vendor_id <> c.user_id
		RETURNING c.type_id, t.vendor_id, t.payout_cents`,
		in.CouponID, in.UserID, in.UseID, orderID, in.WorkflowID, in.RunID).
		Scan(&res.TypeID, &res.VendorID, &res.AmountCents)
	if err == nil {
		return res, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return res, fmt.Errorf("mark coupon %s used: %w", in.CouponID, err)
	}
	// Nothing changed: say why.
	var owner, status string
	var useID *string
	err = a.DB.QueryRow(ctx, `
		SELECT c.user_id, c.status, c.use_id, c.type_id, t.vendor_id, t.payout_cents
		FROM coupons c JOIN coupon_types t ON t.id = c.type_id WHERE c.id = $1`, in.CouponID).
		Scan(&owner, &status, &useID, &res.TypeID, &res.VendorID, &res.AmountCents)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return res, workflows.Refuse(workflows.RefusalCouponNotFound, "coupon %s does not exist", in.CouponID)
	case err != nil:
		return res, fmt.Errorf("look up coupon %s: %w", in.CouponID, err)
	case owner != in.UserID:
		return res, workflows.Refuse(workflows.RefusalNotOwner, "coupon %s belongs to another user", in.CouponID)
	case useID != nil && *useID == in.UseID:
		return res, nil // a retry: this attempt already holds the coupon
	case owner == res.VendorID:
		// A coupon its vendor holds (issued before the rule): using it
		// would pay the vendor itself.
		return res, workflows.Refuse(workflows.RefusalOwnCouponType,
			"coupon %s is of its holder's own coupon type: a vendor may not use its own coupons", in.CouponID)
	case status == string(workflows.CouponRevoked):
		return res, workflows.Refuse(workflows.RefusalCouponRevoked, "coupon %s was revoked", in.CouponID)
	case status == string(workflows.CouponIssued):
		// Given back between the UPDATE and this read; try again.
		return res, fmt.Errorf("coupon %s changed concurrently; retrying", in.CouponID)
	}
	return res, workflows.Refuse(workflows.RefusalAlreadyUsed, "coupon %s is already %s", in.CouponID, status)
}

// UnmarkCouponUsed is the compensation of MarkCouponUsed: the coupon goes
// back to issued only while this attempt holds it unpaid, so it can never
// hand back a used coupon or another attempt's hold.
func (a *Activities) UnmarkCouponUsed(ctx context.Context, in workflows.UnmarkCouponUsedInput) error {
	_, err := a.DB.Exec(ctx, `
		UPDATE coupons SET status = 'issued', use_id = NULL, order_id = NULL, use_workflow_id = NULL, use_run_id = NULL,
			using_at = NULL, updated_at = now()
		WHERE id = $1 AND status = 'using' AND use_id = $2`, in.CouponID, in.UseID)
	if err != nil {
		return fmt.Errorf("give coupon %s back: %w", in.CouponID, err)
	}
	return nil
}

// RecordPayout writes the ledger row, credits the vendor's balance and marks
// the coupon used, in one transaction. The idempotency key is unique in the
// ledger, so a retry finds its row and credits nothing twice.
func (a *Activities) RecordPayout(ctx context.Context, in workflows.RecordPayoutInput) (workflows.RecordPayoutResult, error) {
	var res workflows.RecordPayoutResult
	var orderID *string
	if in.OrderID != "" {
		orderID = &in.OrderID
	}
	err := pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO payouts (idempotency_key, coupon_id, use_id, vendor_id, amount_cents, provider_payout_id,
				order_id, workflow_id, run_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT DO NOTHING
			RETURNING id, recorded_at`,
			in.IdempotencyKey, in.CouponID, in.UseID, in.VendorID, in.AmountCents, in.ProviderPayoutID,
			orderID, in.WorkflowID, in.RunID).Scan(&res.LedgerID, &res.RecordedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			// Recorded by an earlier attempt of this activity; a row of
			// another key for this coupon would be a second payout, which
			// MarkCouponUsed makes impossible.
			err = tx.QueryRow(ctx, `SELECT id, recorded_at FROM payouts WHERE idempotency_key = $1`, in.IdempotencyKey).
				Scan(&res.LedgerID, &res.RecordedAt)
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("coupon %s already has a payout under another key than %s", in.CouponID, in.IdempotencyKey)
			}
			if err != nil {
				return fmt.Errorf("look up payout %s: %w", in.IdempotencyKey, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("record payout %s: %w", in.IdempotencyKey, err)
		}
		if _, err := tx.Exec(ctx, `
			UPDATE vendors SET balance_cents = balance_cents + $2, updated_at = now() WHERE id = $1`,
			in.VendorID, in.AmountCents); err != nil {
			return fmt.Errorf("credit vendor %s: %w", in.VendorID, err)
		}
		if _, err := tx.Exec(ctx, `
			UPDATE coupons SET status = 'used', used_at = clock_timestamp(), updated_at = now()
			WHERE id = $1 AND use_id = $2 AND status = 'using'`, in.CouponID, in.UseID); err != nil {
			return fmt.Errorf("mark coupon %s used: %w", in.CouponID, err)
		}
		return nil
	})
	return res, err
}
