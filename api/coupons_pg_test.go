package api

// A vendor may neither hold nor use a coupon of its own coupon type (its
// use would pay the vendor itself). The run decides an issue (the
// activity reads the type's vendor in its transaction, so the fake
// Temporal here answers as that run would); a use is refused by the
// handler from the rows it already reads, before any run starts.

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/workflows"
)

func TestVendorsCannotUseTheirOwnCoupons(t *testing.T) {
	db, p := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := ownedRows(ctx, t, db, p)
	// A coupon of the vendor's own type held by the vendor, as one issued
	// before the rule would be.
	ownCoupon := p + "k-own"
	if _, err := db.Exec(ctx, `
		INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
		VALUES ($1, $2, $3, 'issued', 'issue-own', 'run-5', now(), now())`, ownCoupon, o.couponType, o.vendor); err != nil {
		t.Fatal(err)
	}
	a := pgTestAPI(t, db)
	vendor := token(t, o.vendor, RoleVendor, time.Hour)
	vendorNoRole := token(t, o.vendor, "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	student := token(t, o.student, "", time.Hour)
	use := func(coupon, user string) (string, map[string]any) {
		return "/v1/coupons/" + coupon + "/use", map[string]any{"user_id": user}
	}
	issue := func(user string) (string, map[string]any) {
		return "/v1/coupon-types/" + o.couponType + "/coupons", map[string]any{"user_id": user}
	}
	for _, tc := range []struct {
		name       string
		bearer     string
		req        func() (string, map[string]any)
		runRefuses workflows.Refusal // what the fake run answers ("": its default, 404)
		wantStatus int
		wantCode   string
		wantRun    bool // the request reaches Temporal
	}{
		{"the vendor uses a coupon of its own type", vendor, func() (string, map[string]any) { return use(ownCoupon, o.vendor) },
			"", http.StatusForbidden, string(workflows.RefusalOwnCouponType), false},
		{"the vendor's ID without role vendor", vendorNoRole, func() (string, map[string]any) { return use(ownCoupon, o.vendor) },
			"", http.StatusForbidden, string(workflows.RefusalOwnCouponType), false},
		{"an admin uses it for the vendor", admin, func() (string, map[string]any) { return use(ownCoupon, o.vendor) },
			"", http.StatusForbidden, string(workflows.RefusalOwnCouponType), false},
		{"a user uses a coupon of that type", student, func() (string, map[string]any) { return use(o.coupon, o.student) },
			"", http.StatusNotFound, string(workflows.RefusalCouponTypeNotFound), true},
		{"the vendor claims a coupon of its own type", vendor, func() (string, map[string]any) { return issue(o.vendor) },
			workflows.RefusalOwnCouponType, http.StatusForbidden, string(workflows.RefusalOwnCouponType), true},
		{"an admin claims one for the vendor", admin, func() (string, map[string]any) { return issue(o.vendor) },
			workflows.RefusalOwnCouponType, http.StatusForbidden, string(workflows.RefusalOwnCouponType), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.temporal.couponRefusal = tc.runRefuses
			before := a.temporal.Calls()
			path, body := tc.req()
			rec := a.call(http.MethodPost, path, tc.bearer, body)
			if rec.Code != tc.wantStatus || errorOf(t, rec).Code != tc.wantCode {
				t.Fatalf("POST %s = %d %s, want %d %s", path, rec.Code, rec.Body.String(), tc.wantStatus, tc.wantCode)
			}
			if ran := a.temporal.Calls() > before; ran != tc.wantRun {
				t.Fatalf("POST %s reached Temporal: %v, want %v", path, ran, tc.wantRun)
			}
		})
	}
}
