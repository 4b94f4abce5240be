package api

// Owner checks read the owner from the database, so these tests run the
// real router over a private PostgreSQL (pgtest) and the fake Temporal of
// helpers_test.go, which counts the runs the API tried to start.

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimflow/claimflow/dev/pgtest"
)

// pgTestAPI serves the API over db and the fake Temporal.
func pgTestAPI(t testing.TB, db *pgxpool.Pool) *testAPI {
	t.Helper()
	auth, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logCapture{}
	tmp := &fakeTemporal{}
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: tmp, DB: db, Log: slog.New(slog.NewTextHandler(logs, nil)),
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, DecisionTimeout: 5 * time.Second})
	t.Cleanup(h.Close)
	return &testAPI{Handler: h, temporal: tmp, logs: logs}
}

// owned are rows of one owner (student/user <p>s-1, vendor <p>v), made
// with SQL so that no run is involved.
type owned struct {
	student, other, vendor                     string
	course, couponType                         string
	enrollment, cancelled, coupon, otherCoupon string
}

func ownedRows(ctx context.Context, t *testing.T, db *pgxpool.Pool, p string) owned {
	t.Helper()
	o := owned{student: p + "s-1", other: p + "s-2", vendor: p + "v", course: p + "c", couponType: p + "ct",
		enrollment: p + "enr", cancelled: p + "enr-cancelled", coupon: p + "k", otherCoupon: p + "k-other"}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("fixture: %v", err)
		}
	}
	must(db.Exec(ctx, `INSERT INTO courses (id, title, capacity, enrolled) VALUES ($1, 'c', 5, 1)`, o.course))
	must(db.Exec(ctx, `
		INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, confirmed_at)
		VALUES ($1, $2, $3, 'confirmed', 'enrollment-x', 'run-1', now(), now(), now())`, o.enrollment, o.course, o.student))
	must(db.Exec(ctx, `
		INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, confirmed_at, cancelled_at)
		VALUES ($1, $2, $3, 'cancelled', 'enrollment-y', 'run-2', now(), now(), now(), now())`, o.cancelled, o.course, o.student))
	must(db.Exec(ctx, `INSERT INTO vendors (id, name) VALUES ($1, 'v')`, o.vendor))
	must(db.Exec(ctx, `INSERT INTO coupon_types (id, vendor_id, name, stock, issued, payout_cents) VALUES ($1, $2, 't', 5, 2, 100)`,
		o.couponType, o.vendor))
	must(db.Exec(ctx, `
		INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
		VALUES ($1, $2, $3, 'issued', 'issue-x', 'run-3', now(), now())`, o.coupon, o.couponType, o.student))
	must(db.Exec(ctx, `
		INSERT INTO coupons (id, type_id, user_id, status, workflow_id, run_id, requested_at, issued_at)
		VALUES ($1, $2, $3, 'issued', 'issue-y', 'run-4', now(), now())`, o.otherCoupon, o.couponType, o.other))
	return o
}

// TestOwnersReadOnlyTheirOwn: each owned read lets its owner and admins in
// and answers anyone else exactly as a missing ID; catalogue reads are
// open to any subject.
func TestOwnersReadOnlyTheirOwn(t *testing.T) {
	db, p := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := ownedRows(ctx, t, db, p)
	a := pgTestAPI(t, db)
	owner, other := token(t, o.student, "", time.Hour), token(t, o.other, "", time.Hour)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	vendor := token(t, o.vendor, RoleVendor, time.Hour)
	vendorAsStudent := token(t, o.vendor, "", time.Hour)    // the vendor's ID without the vendor role
	otherVendor := token(t, p+"v-2", RoleVendor, time.Hour) // a vendor, not this one

	for _, tc := range []struct {
		name, path, token string
		want              int
		missing           string // the path of a missing ID whose answer a 404 must equal
	}{
		{"owner reads its enrollment", "/v1/enrollments/" + o.enrollment, owner, 200, ""},
		{"admin reads an enrollment", "/v1/enrollments/" + o.enrollment, admin, 200, ""},
		{"another student reads an enrollment", "/v1/enrollments/" + o.enrollment, other, 404, "/v1/enrollments/" + p + "nope"},
		{"a vendor reads a student's enrollment", "/v1/enrollments/" + o.enrollment, vendor, 404, "/v1/enrollments/" + p + "nope"},
		{"owner reads its coupon", "/v1/coupons/" + o.coupon, owner, 200, ""},
		{"admin reads a coupon", "/v1/coupons/" + o.coupon, admin, 200, ""},
		{"another user reads a coupon", "/v1/coupons/" + o.coupon, other, 404, "/v1/coupons/" + p + "nope"},
		{"the vendor reads itself", "/v1/vendors/" + o.vendor, vendor, 200, ""},
		{"admin reads a vendor", "/v1/vendors/" + o.vendor, admin, 200, ""},
		{"a student reads a vendor", "/v1/vendors/" + o.vendor, owner, 404, "/v1/vendors/" + p + "nope"},
		{"the vendor's ID without role vendor", "/v1/vendors/" + o.vendor, vendorAsStudent, 404, "/v1/vendors/" + p + "nope"},
		{"another vendor", "/v1/vendors/" + o.vendor, otherVendor, 404, "/v1/vendors/" + p + "nope"},
		{"a student reads a course", "/v1/courses/" + o.course, other, 200, ""},
		{"a student reads a coupon type", "/v1/coupon-types/" + o.couponType, other, 200, ""},
		{"a vendor reads a course", "/v1/courses/" + o.course, vendor, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := a.call(http.MethodGet, tc.path, tc.token, nil)
			if rec.Code != tc.want {
				t.Fatalf("GET %s = %d %s, want %d", tc.path, rec.Code, rec.Body.String(), tc.want)
			}
			if tc.missing == "" {
				return
			}
			miss := a.call(http.MethodGet, tc.missing, admin, nil)
			if miss.Code != http.StatusNotFound || miss.Body.String() != rec.Body.String() {
				t.Fatalf("a non-owner's answer %q differs from a missing ID's %d %q", rec.Body.String(), miss.Code, miss.Body.String())
			}
		})
	}
}

// TestCancelChecksTheEnrollmentsOwner: cancelling checks the owner the
// database names, not one the caller sends, before Temporal is asked: a
// student cancelling another student's enrollment hears 404 like for a
// missing ID; the owner and an admin get through; an enrollment already
// cancelled is answered from its row without a run.
func TestCancelChecksTheEnrollmentsOwner(t *testing.T) {
	db, p := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := ownedRows(ctx, t, db, p)
	a := pgTestAPI(t, db)
	missing := a.call(http.MethodDelete, "/v1/enrollments/"+p+"nope", token(t, "admin-1", RoleAdmin, time.Hour), nil)
	if missing.Code != http.StatusNotFound || errorOf(t, missing).Code != "enrollment_not_found" {
		t.Fatalf("cancel a missing enrollment = %d %s", missing.Code, missing.Body.String())
	}
	for _, tc := range []struct {
		name, id, token string
		want            int // 0: reached Temporal
	}{
		{"another student", o.enrollment, token(t, o.other, "", time.Hour), http.StatusNotFound},
		{"a vendor", o.enrollment, token(t, o.vendor, RoleVendor, time.Hour), http.StatusNotFound},
		{"the owner", o.enrollment, token(t, o.student, "", time.Hour), 0},
		{"an admin", o.enrollment, token(t, "admin-1", RoleAdmin, time.Hour), 0},
		{"the owner, already cancelled", o.cancelled, token(t, o.student, "", time.Hour), http.StatusOK},
		{"another student, already cancelled", o.cancelled, token(t, o.other, "", time.Hour), http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := a.temporal.Calls()
			rec := a.call(http.MethodDelete, "/v1/enrollments/"+tc.id, tc.token, nil)
			if tc.want == 0 {
				reachedTemporal(t, rec)
				return
			}
			if rec.Code != tc.want {
				t.Fatalf("= %d %s, want %d", rec.Code, rec.Body.String(), tc.want)
			}
			if tc.want == http.StatusNotFound && rec.Body.String() != missing.Body.String() {
				t.Fatalf("a non-owner's answer %q differs from a missing ID's %q", rec.Body.String(), missing.Body.String())
			}
			if tc.want == http.StatusOK && !jsonHas(t, rec, "status", "cancelled") {
				t.Fatalf("already cancelled: %s", rec.Body.String())
			}
			if a.temporal.Calls() != calls {
				t.Fatal("the cancellation reached Temporal")
			}
		})
	}
	var status string
	if err := db.QueryRow(ctx, `SELECT status FROM enrollments WHERE id = $1`, o.enrollment).Scan(&status); err != nil || status != "confirmed" {
		t.Errorf("enrollment is %q (%v), want it untouched", status, err)
	}
}

// TestUseChecksTheCouponsOwner: a coupon that is not the acting user's is
// answered as a missing one, before any run starts; acting as someone else
// stays 403.
func TestUseChecksTheCouponsOwner(t *testing.T) {
	db, p := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := ownedRows(ctx, t, db, p)
	a := pgTestAPI(t, db)
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	missing := a.call(http.MethodPost, "/v1/coupons/"+p+"nope/use", admin, map[string]any{"user_id": o.student})
	if missing.Code != http.StatusNotFound || errorOf(t, missing).Code != "coupon_not_found" {
		t.Fatalf("use a missing coupon = %d %s", missing.Code, missing.Body.String())
	}
	for _, tc := range []struct {
		name, token, userID string
		want                int // 0: reached Temporal
	}{
		{"another user, as itself", token(t, o.other, "", time.Hour), o.other, http.StatusNotFound},
		{"an admin for another user", admin, o.other, http.StatusNotFound},
		{"another user, as the owner", token(t, o.other, "", time.Hour), o.student, http.StatusForbidden},
		{"the owner", token(t, o.student, "", time.Hour), o.student, 0},
		{"an admin for the owner", admin, o.student, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := a.temporal.Calls()
			rec := a.call(http.MethodPost, "/v1/coupons/"+o.coupon+"/use", tc.token, map[string]any{"user_id": tc.userID})
			if tc.want == 0 {
				if a.temporal.Calls() != calls+1 {
					t.Fatalf("= %d %s without reaching Temporal", rec.Code, rec.Body.String())
				}
				return
			}
			if rec.Code != tc.want {
				t.Fatalf("= %d %s, want %d", rec.Code, rec.Body.String(), tc.want)
			}
			if tc.want == http.StatusNotFound && rec.Body.String() != missing.Body.String() {
				t.Fatalf("a non-owner's answer %q differs from a missing ID's %q", rec.Body.String(), missing.Body.String())
			}
			if tc.want == http.StatusForbidden && errorOf(t, rec).Field != "user_id" {
				t.Fatalf("403 without the field: %s", rec.Body.String())
			}
			if a.temporal.Calls() != calls {
				t.Fatal("the use reached Temporal")
			}
		})
	}
}

func jsonHas(t *testing.T, rec *httptest.ResponseRecorder, key, want string) bool {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("answer %q: %v", rec.Body.String(), err)
	}
	got, _ := body[key].(string)
	return got == want
}
