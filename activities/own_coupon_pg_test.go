package activities

import (
	"context"
	"testing"

	"github.com/claimflow/claimflow/workflows"
)

// TestVendorsNeverHoldTheirOwnCoupons: the issue and use activities refuse
// a coupon whose user is its type's vendor (own_coupon_type, a
// non-retryable business refusal), whoever asked — the rule is the
// data's, so it holds behind the API's own check and for coupons issued
// before it.
func TestVendorsNeverHoldTheirOwnCoupons(t *testing.T) {
	db, p := testDB(t)
	ctx := context.Background()
	a := testActivities(t, db)
	vendor, typeID := p+"v", p+"ct"
	addCouponType(t, db, vendor, typeID, 10, 100)
	// Another vendor, holding no coupon of its type.
	vendor2, type2 := p+"v2", p+"ct2"
	addCouponType(t, db, vendor2, type2, 10, 100)
	// A coupon the vendor got before the rule, to be used now.
	held := p + "k-held"
	if _, err := db.Exec(ctx, `
		INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
		VALUES ($1, $2, $3, 'issued', 'w', 'r', now(), now())`, held, typeID, vendor); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `UPDATE coupon_types SET issued = 1 WHERE id = $1`, typeID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		run   func() error
		want  string // the refusal; "" succeeds
		stock int    // typeID's coupons not revoked afterwards
	}{
		{"a vendor reserves a coupon of its own type", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-v2", type2, vendor2))
			return err
		}, string(workflows.RefusalOwnCouponType), 1},
		{"the vendor holding one reserves another", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-v", typeID, vendor))
			return err
		}, string(workflows.RefusalOwnCouponType), 1},
		{"a vendor reserves a coupon of another vendor's type", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-v-v2", typeID, vendor2))
			return err
		}, "", 2},
		{"a user reserves one", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-u", typeID, p+"u"))
			return err
		}, "", 3},
		{"the same reservation again (a retry)", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-u", typeID, p+"u"))
			return err
		}, "", 3},
		{"the user's second coupon of the type", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-u2", typeID, p+"u"))
			return err
		}, string(workflows.RefusalAlreadyIssued), 3},
		{"a coupon type that does not exist", func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(p+"k-x", p+"no-such-type", p+"u"))
			return err
		}, string(workflows.RefusalCouponTypeNotFound), 3},
		{"the vendor uses the coupon it holds", func() error {
			_, err := a.MarkCouponUsed(ctx, workflows.MarkCouponUsedInput{CouponID: held, UserID: vendor, UseID: "use-1",
				WorkflowID: "w", RunID: "r"})
			return err
		}, string(workflows.RefusalOwnCouponType), 3},
		{"the user uses its coupon", func() error {
			_, err := a.MarkCouponUsed(ctx, workflows.MarkCouponUsedInput{CouponID: p + "k-u", UserID: p + "u", UseID: "use-2",
				WorkflowID: "w", RunID: "r"})
			return err
		}, "", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if got := refusalOf(err); got != tc.want || (tc.want == "" && err != nil) {
				t.Fatalf("err = %v (refusal %q), want refusal %q", err, got, tc.want)
			}
			assertStock(t, db, typeID, tc.stock)
			assertStock(t, db, type2, 0)
		})
	}
	if status, useID := couponStatus(t, db, held); status != string(workflows.CouponIssued) || useID != "" {
		t.Fatalf("the vendor's coupon is %s (use %q) after a refused use, want issued and unheld", status, useID)
	}
}
