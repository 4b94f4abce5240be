package activities

// The coupon guards, contended where they live: issue (stock, one coupon per
// user and type), revoke, the single use and the one payout per use, called
// directly from many goroutines with every call retried on the same input.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/workflows"
)

// addCouponType creates a vendor and a coupon type of it.
func addCouponType(t *testing.T, db *pgxpool.Pool, vendor, typeID string, stock int, payout int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `INSERT INTO vendors (id, name) VALUES ($1, $1) ON CONFLICT DO NOTHING`, vendor); err != nil {
		t.Fatalf("create vendor %s: %v", vendor, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO coupon_types (id, vendor_id, name, stock, payout_cents) VALUES ($1, $2, $1, $3, $4)`,
		typeID, vendor, stock, payout); err != nil {
		t.Fatalf("create coupon type %s: %v", typeID, err)
	}
}

type stockState struct {
	stock, issued, held int
}

// stockOf reads a coupon type's counter and its coupons not revoked.
func stockOf(t *testing.T, db *pgxpool.Pool, typeID string) stockState {
	t.Helper()
	var s stockState
	err := db.QueryRow(context.Background(), `
		SELECT t.stock, t.issued, (SELECT count(*) FROM coupons c WHERE c.type_id = t.id AND c.status <> 'revoked')
		FROM coupon_types t WHERE t.id = $1`, typeID).Scan(&s.stock, &s.issued, &s.held)
	if err != nil {
		t.Fatalf("read coupon type %s: %v", typeID, err)
	}
	return s
}

func assertStock(t *testing.T, db *pgxpool.Pool, typeID string, want int) {
	t.Helper()
	s := stockOf(t, db, typeID)
	if s.issued != s.held {
		t.Errorf("coupon type %s: issued = %d but %d coupons not revoked", typeID, s.issued, s.held)
	}
	if s.held > s.stock {
		t.Errorf("coupon type %s issued beyond its stock: %d coupons, stock %d", typeID, s.held, s.stock)
	}
	if s.held != want {
		t.Errorf("coupon type %s: %d coupons not revoked, want %d", typeID, s.held, want)
	}
}

func couponInput(couponID, typeID, user string) workflows.ReserveCouponInput {
	return workflows.ReserveCouponInput{CouponID: couponID, TypeID: typeID, UserID: user,
		WorkflowID: "coupon-" + couponID, RunID: "run-1", RequestedAt: time.Now()}
}

func couponStatus(t *testing.T, db *pgxpool.Pool, couponID string) (status, useID string) {
	t.Helper()
	var use *string
	if err := db.QueryRow(context.Background(), `SELECT status, use_id FROM coupons WHERE id = $1`, couponID).Scan(&status, &use); err != nil {
		t.Fatalf("coupon %s: %v", couponID, err)
	}
	if use != nil {
		useID = *use
	}
	return status, useID
}

// Many users ask for the last coupons of a type at once, each request sent
// twice together and once more afterwards: exactly stock coupons exist, the
// others are refused sold_out, the attempts of one request agree, and the
// counter matches the rows.
func TestReserveCouponNeverExceedsStock(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		stock, users int
	}{
		{"last coupon", 1, 12},
		{"few coupons", 4, 20},
		{"sold out", 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			typeID := p + sanitize(tc.name)
			addCouponType(t, db, p+"vendor", typeID, tc.stock, 500)
			const copies = 2
			got := make([][]string, tc.users)
			for i := range got {
				got[i] = make([]string, copies+1)
			}
			in := func(u int) workflows.ReserveCouponInput {
				return couponInput(fmt.Sprintf("%s-k%d", typeID, u), typeID, fmt.Sprintf("u%d", u))
			}
			concurrently(tc.users*copies, func(i int) {
				_, err := a.ReserveCoupon(ctx, in(i/copies))
				got[i/copies][i%copies] = outcome(err)
			})
			for u := range tc.users {
				_, err := a.ReserveCoupon(ctx, in(u))
				got[u][copies] = outcome(err)
			}
			ok := countGranted(t, "user", got, workflows.RefusalSoldOut)
			if ok != tc.stock {
				t.Errorf("%d coupons issued, want %d (the stock)", ok, tc.stock)
			}
			assertStock(t, db, typeID, tc.stock)
		})
	}
}

// One user asks for a coupon of one type many times at once, under
// different coupon IDs: one coupon. Revoking it many times at once returns
// one unit of stock; the user may then be issued another, and the revoked
// coupon's retry is refused without taking stock.
func TestReserveCouponOnePerUserAndRevokeOnce(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	typeID := p + "type"
	addCouponType(t, db, p+"vendor", typeID, 20, 500)
	for i := range 3 { // other users hold coupons, so a double revoke would show
		if _, err := a.ReserveCoupon(ctx, couponInput(fmt.Sprintf("%sother%d", p, i), typeID, fmt.Sprintf("other%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	const requests, copies = 10, 2
	results := make([]string, requests*copies)
	concurrently(requests*copies, func(i int) {
		results[i] = outcome(untilAnswered(func() error {
			_, err := a.ReserveCoupon(ctx, couponInput(fmt.Sprintf("%sk%d", p, i/copies), typeID, "u1"))
			return err
		}))
	})
	holder := ""
	for i := 0; i < len(results); i += copies {
		if results[i] != results[i+1] {
			t.Errorf("request %d: attempts answered %s and %s", i/copies, results[i], results[i+1])
		}
		switch results[i] {
		case "ok":
			if holder != "" {
				t.Errorf("coupons %s and k%d both issued to u1", holder, i/copies)
			}
			holder = fmt.Sprintf("%sk%d", p, i/copies)
		case string(workflows.RefusalAlreadyIssued):
		default:
			t.Errorf("request %d: %s", i/copies, results[i])
		}
	}
	assertStock(t, db, typeID, 4)
	if holder == "" {
		t.Fatal("no coupon was issued to u1")
	}

	var mu sync.Mutex
	revoked := 0
	concurrently(6, func(int) {
		res, err := a.RevokeCoupon(ctx, workflows.RevokeCouponInput{CouponID: holder})
		if err != nil {
			t.Errorf("revoke: %v", err)
			return
		}
		if res.Revoked {
			mu.Lock()
			revoked++
			mu.Unlock()
		}
	})
	if revoked != 6 {
		t.Errorf("%d of 6 revocations answered revoked", revoked)
	}
	assertStock(t, db, typeID, 3)
	if _, err := a.ReserveCoupon(ctx, couponInput(holder, typeID, "u1")); refusalOf(err) != string(workflows.RefusalCouponRevoked) {
		t.Errorf("retry of a revoked coupon's issue = %v, want %s", err, workflows.RefusalCouponRevoked)
	}
	if _, err := a.ReserveCoupon(ctx, couponInput(p+"again", typeID, "u1")); err != nil {
		t.Errorf("issue again after the revoke: %v", err)
	}
	assertStock(t, db, typeID, 4)
}

// A coupon is used once: many use attempts at once (each retried) — one
// holds it; another user cannot take it; the compensation of an attempt
// that does not hold it changes nothing; the payout is recorded once however
// often it is retried; a second payout of the coupon, under another key, is
// refused; a key names one payout; a used coupon can be neither given back
// nor revoked.
func TestCouponUsedOncePaidOnce(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	typeID, vendor := p+"type", p+"vendor"
	const amount = 750
	addCouponType(t, db, vendor, typeID, 10, amount)
	coupon, other := p+"k1", p+"k2"
	for _, in := range []workflows.ReserveCouponInput{couponInput(coupon, typeID, "u1"), couponInput(other, typeID, "u2")} {
		if _, err := a.ReserveCoupon(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	use := func(user, useID string) workflows.MarkCouponUsedInput {
		return workflows.MarkCouponUsedInput{CouponID: coupon, UserID: user, UseID: useID,
			WorkflowID: "use-" + coupon, RunID: "run-" + useID}
	}

	// Another user's attempt is refused and leaves the coupon issued.
	if _, err := a.MarkCouponUsed(ctx, use("u2", "thief")); refusalOf(err) != string(workflows.RefusalNotOwner) {
		t.Errorf("u2 using u1's coupon = %v, want %s", err, workflows.RefusalNotOwner)
	}
	if s, _ := couponStatus(t, db, coupon); s != "issued" {
		t.Fatalf("after a refused use by another user the coupon is %s", s)
	}

	const uses, copies = 8, 2
	results := make([]string, uses*copies)
	concurrently(uses*copies, func(i int) {
		results[i] = outcome(untilAnswered(func() error {
			_, err := a.MarkCouponUsed(ctx, use("u1", fmt.Sprintf("use-%d", i/copies)))
			return err
		}))
	})
	winner := ""
	for i := 0; i < len(results); i += copies {
		if results[i] != results[i+1] {
			t.Errorf("use %d: attempts answered %s and %s", i/copies, results[i], results[i+1])
		}
		switch results[i] {
		case "ok":
			if winner != "" {
				t.Errorf("uses %s and use-%d both hold the coupon", winner, i/copies)
			}
			winner = fmt.Sprintf("use-%d", i/copies)
		case string(workflows.RefusalAlreadyUsed):
		default:
			t.Errorf("use %d: %s", i/copies, results[i])
		}
	}
	if s, held := couponStatus(t, db, coupon); s != "using" || held != winner || winner == "" {
		t.Fatalf("coupon is %s held by %q, want using held by the one winner %q", s, held, winner)
	}

	// The compensation of a losing attempt gives nothing back.
	if err := a.UnmarkCouponUsed(ctx, workflows.UnmarkCouponUsedInput{CouponID: coupon, UseID: "use-loser"}); err != nil {
		t.Fatal(err)
	}
	if s, held := couponStatus(t, db, coupon); s != "using" || held != winner {
		t.Fatalf("a losing attempt's compensation left the coupon %s held by %q", s, held)
	}

	// The payout, retried at once and afterwards: one row, one credit.
	key := p + "payout-" + winner
	payout := workflows.RecordPayoutInput{IdempotencyKey: key, CouponID: coupon, UseID: winner, VendorID: vendor,
		AmountCents: amount, ProviderPayoutID: "po-1", WorkflowID: "use-" + coupon, RunID: "run-" + winner}
	ledger := make([]int64, 6)
	concurrently(len(ledger), func(i int) {
		err := untilAnswered(func() error {
			res, err := a.RecordPayout(ctx, payout)
			ledger[i] = res.LedgerID
			return err
		})
		if err != nil {
			t.Errorf("record payout: %v", err)
		}
	})
	for _, id := range ledger {
		if id != ledger[0] || id == 0 {
			t.Errorf("attempts of one payout answered ledger rows %v", ledger)
			break
		}
	}
	// A second payout of the coupon under another key: refused.
	second := payout
	second.IdempotencyKey, second.UseID, second.ProviderPayoutID = p+"payout-second", "use-second", "po-2"
	if _, err := a.RecordPayout(ctx, second); err == nil {
		t.Error("a second payout of a used coupon under another key was accepted")
	}
	// The same key for another coupon does not record a second payment.
	reused := payout
	reused.CouponID, reused.UseID = other, "use-other"
	_, _ = a.RecordPayout(ctx, reused)

	var rows, ofKey, ofOther int
	var balance int64
	err := db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM payouts WHERE coupon_id = $1),
			(SELECT count(*) FROM payouts WHERE idempotency_key = $2),
			(SELECT count(*) FROM payouts WHERE coupon_id = $3),
			(SELECT balance_cents FROM vendors WHERE id = $4)`, coupon, key, other, vendor).Scan(&rows, &ofKey, &ofOther, &balance)
	if err != nil {
		t.Fatal(err)
	}
	if rows != 1 || ofKey != 1 || ofOther != 0 {
		t.Errorf("payouts: %d of the coupon, %d under its key, %d of the other coupon; want 1, 1, 0", rows, ofKey, ofOther)
	}
	if balance != amount {
		t.Errorf("vendor balance %d cents, want one payout of %d", balance, amount)
	}
	if s, held := couponStatus(t, db, coupon); s != "used" || held != winner {
		t.Errorf("after the payout the coupon is %s held by %q, want used by %q", s, held, winner)
	}

	// Used: no compensation, use or revoke changes it.
	if err := a.UnmarkCouponUsed(ctx, workflows.UnmarkCouponUsedInput{CouponID: coupon, UseID: winner}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.MarkCouponUsed(ctx, use("u1", "use-late")); refusalOf(err) != string(workflows.RefusalAlreadyUsed) {
		t.Errorf("a use after the payout = %v, want %s", err, workflows.RefusalAlreadyUsed)
	}
	if res, err := a.RevokeCoupon(ctx, workflows.RevokeCouponInput{CouponID: coupon}); err != nil || res.Revoked {
		t.Errorf("revoking a used coupon = %+v, %v; want not revoked", res, err)
	}
	if s, held := couponStatus(t, db, coupon); s != "used" || held != winner {
		t.Errorf("the used coupon became %s held by %q", s, held)
	}
	assertStock(t, db, typeID, 2)
}

// An attempt that holds the coupon and was not paid gives it back once;
// another attempt may then use it.
func TestUnmarkCouponUsedGivesBackOnlyItsOwnHold(t *testing.T) {
	db, p := testDB(t)
	a := testActivities(t, db)
	ctx := context.Background()
	typeID := p + "type"
	addCouponType(t, db, p+"vendor", typeID, 1, 100)
	coupon := p + "k"
	if _, err := a.ReserveCoupon(ctx, couponInput(coupon, typeID, "u1")); err != nil {
		t.Fatal(err)
	}
	mark := func(useID string) error {
		_, err := a.MarkCouponUsed(ctx, workflows.MarkCouponUsedInput{CouponID: coupon, UserID: "u1", UseID: useID,
			WorkflowID: "use", RunID: useID})
		return err
	}
	if err := mark("first"); err != nil {
		t.Fatal(err)
	}
	concurrently(4, func(int) {
		if err := a.UnmarkCouponUsed(ctx, workflows.UnmarkCouponUsedInput{CouponID: coupon, UseID: "first"}); err != nil {
			t.Errorf("unmark: %v", err)
		}
	})
	if s, held := couponStatus(t, db, coupon); s != "issued" || held != "" {
		t.Fatalf("after its holder's compensation the coupon is %s held by %q", s, held)
	}
	if err := mark("second"); err != nil {
		t.Fatalf("a new attempt after the compensation: %v", err)
	}
	// The first attempt's compensation, retried late, leaves the second's hold.
	if err := a.UnmarkCouponUsed(ctx, workflows.UnmarkCouponUsedInput{CouponID: coupon, UseID: "first"}); err != nil {
		t.Fatal(err)
	}
	if s, held := couponStatus(t, db, coupon); s != "using" || held != "second" {
		t.Errorf("a stale compensation left the coupon %s held by %q, want using by second", s, held)
	}
}
