package store

import (
	"context"
	"fmt"
	"strconv"
)

// Owner lookups: who owns the resource an ID names, for the API's
// authorization (a non-owner is answered as if the ID did not exist). Each
// returns ErrNotFound (wrapped) when there is no such row.

// EnrollmentOwner returns the student of an enrollment.
func EnrollmentOwner(ctx context.Context, db DB, id string) (string, error) {
	var student string
	if err := db.QueryRow(ctx, `SELECT student_id FROM enrollments WHERE id = $1`, id).Scan(&student); err != nil {
		return "", fmt.Errorf("owner of enrollment %s: %w", id, err)
	}
	return student, nil
}

// CouponOwner returns the user a coupon was issued to.
func CouponOwner(ctx context.Context, db DB, id string) (string, error) {
	var user string
	if err := db.QueryRow(ctx, `SELECT user_id FROM coupons WHERE id = $1`, id).Scan(&user); err != nil {
		return "", fmt.Errorf("owner of coupon %s: %w", id, err)
	}
	return user, nil
}

// VendorOwner returns the subject that owns a vendor record: the vendor
// itself, under its own ID.
func VendorOwner(ctx context.Context, db DB, id string) (string, error) {
	var vendor string
	if err := db.QueryRow(ctx, `SELECT id FROM vendors WHERE id = $1`, id).Scan(&vendor); err != nil {
		return "", fmt.Errorf("owner of vendor %s: %w", id, err)
	}
	return vendor, nil
}

// NotificationOwner returns the recipient of a notification (by its ID,
// the delivery sequence number).
func NotificationOwner(ctx context.Context, db DB, id string) (string, error) {
	seq, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return "", fmt.Errorf("owner of notification %q: %w", id, ErrNotFound)
	}
	var recipient string
	if err := db.QueryRow(ctx, `SELECT coalesce(recipient, '') FROM notifications WHERE seq = $1`, seq).Scan(&recipient); err != nil {
		return "", fmt.Errorf("owner of notification %s: %w", id, err)
	}
	return recipient, nil
}
