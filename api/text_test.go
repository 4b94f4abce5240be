package api

import (
	"net/http"
	"testing"
	"time"
)

// TestControlCharactersAreRefusedWithTheField: a control character in a
// title, a name or an ID is a 400 invalid_field naming the field, answered
// before the database is asked (the test database is never there).
func TestControlCharactersAreRefusedWithTheField(t *testing.T) {
	a := newTestAPI(t, Security{})
	admin := token(t, "admin-1", RoleAdmin, time.Hour)
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		field      string
	}{
		{"NUL in a course title", "/v1/courses", map[string]any{"title": "a\x00b", "capacity": 1}, "title"},
		{"newline in a course title", "/v1/courses", map[string]any{"title": "a\nb", "capacity": 1}, "title"},
		{"C1 control in a course title", "/v1/courses", map[string]any{"title": "a\u0085b", "capacity": 1}, "title"},
		{"tab in a vendor name", "/v1/vendors", map[string]any{"name": "a\tb"}, "name"},
		{"DEL in a coupon type name", "/v1/coupon-types", map[string]any{"vendor_id": "v-1", "name": "x\x7f", "stock": 1, "payout_cents": 1}, "name"},
		{"unit separator in a coupon type name", "/v1/coupon-types", map[string]any{"vendor_id": "v-1", "name": "\x1f", "stock": 1, "payout_cents": 1}, "name"},
		{"NUL in a course id", "/v1/courses", map[string]any{"id": "c\x00", "title": "t", "capacity": 1}, "id"},
		{"escape in a vendor id", "/v1/vendors", map[string]any{"id": "v\x1b[31m", "name": "n"}, "id"},
		{"NUL in a vendor_id", "/v1/coupon-types", map[string]any{"vendor_id": "v\x00", "name": "n", "stock": 1, "payout_cents": 1}, "vendor_id"},
		{"NUL in a student_id", "/v1/courses/c1/enrollments", map[string]any{"student_id": "s\x00"}, "student_id"},
		{"newline in a user_id", "/v1/coupon-types/t1/coupons", map[string]any{"user_id": "u\n"}, "user_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := a.call(http.MethodPost, tc.path, admin, tc.body)
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("= %d %s, want 400", rec.Code, rec.Body.String())
			}
			if e := errorOf(t, rec); e.Code != "invalid_field" || e.Field != tc.field {
				t.Fatalf("error = %+v, want invalid_field on %s", e, tc.field)
			}
		})
	}
	// Printable text beyond ASCII is fine: it gets past validation to the
	// (absent) database.
	rec := a.call(http.MethodPost, "/v1/courses", admin, map[string]any{"title": "Ünïcødé ☕", "capacity": 1})
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("a printable title = %d %s, want to reach the database", rec.Code, rec.Body.String())
	}
}
