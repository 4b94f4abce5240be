package activities

// The schema's last lines of defence, asked directly: should any code path
// forget its guard, Postgres itself refuses the oversell, the over-issue,
// the negative counter, the hold without a holder and the second active
// claim. (The activities' own guards stop these first; the tests above
// contend those.)

import (
	"context"
	"testing"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

const (
	pgCheckViolation = "23514"
)

func TestSchemaRefusesWhatTheGuardsForbid(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	course, typeID, vendor := p+"c", p+"type", p+"vendor"
	addCourse(t, db, course, 2)
	addCouponType(t, db, vendor, typeID, 2, 100)
	if _, err := reserveSeat(ctx, a, seatInput(p, "e1", course, "s1")); err != nil {
		t.Fatal(err)
	}
	coupon := p + "k1"
	if _, err := a.ReserveCoupon(ctx, couponInput(coupon, typeID, "u1")); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, tc := range []struct {
		name string
		code string
		run  func() error
	}{
		{"enrolled beyond capacity", pgCheckViolation, func() error {
			_, err := db.Exec(ctx, `UPDATE courses SET enrolled = capacity + 1 WHERE id = $1`, course)
			return err
		}},
		{"enrolled below zero", pgCheckViolation, func() error {
			_, err := db.Exec(ctx, `UPDATE courses SET enrolled = -1 WHERE id = $1`, course)
			return err
		}},
		{"issued beyond stock", pgCheckViolation, func() error {
			_, err := db.Exec(ctx, `UPDATE coupon_types SET issued = stock + 1 WHERE id = $1`, typeID)
			return err
		}},
		{"issued below zero", pgCheckViolation, func() error {
			_, err := db.Exec(ctx, `UPDATE coupon_types SET issued = -1 WHERE id = $1`, typeID)
			return err
		}},
		{"a coupon in use without its use", pgCheckViolation, func() error {
			_, err := db.Exec(ctx, `UPDATE coupons SET status = 'using' WHERE id = $1`, coupon)
			return err
		}},
		{"a vendor balance below zero", pgCheckViolation, func() error {
			_, err := db.Exec(ctx, `UPDATE vendors SET balance_cents = -1 WHERE id = $1`, vendor)
			return err
		}},
		{"a second active enrollment of a student", pgUniqueViolation, func() error {
			_, err := db.Exec(ctx, `
				INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at)
				VALUES ($1, $2, 's1', 'confirmed', 'w', 'r', $3, $3)`, p+"e2", course, now)
			return err
		}},
		{"a second coupon of a type for a user", pgUniqueViolation, func() error {
			_, err := db.Exec(ctx, `
				INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
				VALUES ($1, $2, 'u1', 'issued', 'w', 'r', $3, $3)`, p+"k2", typeID, now)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); pgCode(err) != tc.code {
				t.Errorf("= %v, want SQLSTATE %s", err, tc.code)
			}
		})
	}
	// Nothing above changed the rows.
	assertSeats(t, db, course, 1)
	assertStock(t, db, typeID, 1)
	if s, _ := couponStatus(t, db, coupon); s != string(workflows.CouponIssued) {
		t.Errorf("coupon is %s", s)
	}
}
