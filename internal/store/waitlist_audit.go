package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// WaitlistReport is the waitlist's invariants over every course, as the
// audit checks them once the system has settled.
type WaitlistReport struct {
	Courses    int `json:"courses"`
	Waiting    int `json:"waiting"`
	Promotions int `json:"promotions"`
	// FreeSeatsWhileWaiting: courses with a free seat and a non-empty
	// waitlist (a promotion that never came).
	FreeSeatsWhileWaiting []string `json:"free_seats_while_waiting,omitempty"`
	// Oversold: courses with more seats taken than capacity.
	Oversold []string `json:"oversold,omitempty"`
	// CounterMismatches: courses whose waitlisted or enrolled counter
	// differs from their rows.
	CounterMismatches []string `json:"counter_mismatches,omitempty"`
	// DoublePromotions: a course's promotion number given twice.
	DoublePromotions int `json:"double_promotions"`
	// OutOfOrder: promotions that went to a later place in the queue
	// before an earlier one (FIFO broken).
	OutOfOrder int `json:"out_of_order"`
	// WaitlistedAndEnrolled: students with two active claims on a course.
	WaitlistedAndEnrolled int `json:"waitlisted_and_enrolled"`
}

// OK says every invariant holds.
func (r WaitlistReport) OK() bool {
	return len(r.FreeSeatsWhileWaiting) == 0 && len(r.Oversold) == 0 && len(r.CounterMismatches) == 0 &&
		r.DoublePromotions == 0 && r.OutOfOrder == 0 && r.WaitlistedAndEnrolled == 0
}

// AuditWaitlist checks the waitlist's invariants on the courses whose ID
// starts with prefix ("" for every course).
func AuditWaitlist(ctx context.Context, db DB, prefix string) (WaitlistReport, error) {
	var r WaitlistReport
	err := db.QueryRow(ctx, `
		SELECT count(*), coalesce(sum(waitlisted), 0),
		       (SELECT count(*) FROM enrollments WHERE promotion_seq IS NOT NULL AND starts_with(course_id, $1))
		FROM courses WHERE starts_with(id, $1)`, prefix).Scan(&r.Courses, &r.Waiting, &r.Promotions)
	if err != nil {
		return r, fmt.Errorf("audit the waitlists: %w", err)
	}
	if r.FreeSeatsWhileWaiting, err = idsOf(db.Query(ctx, `SELECT id FROM courses WHERE starts_with(id, $1) AND enrolled < capacity AND waitlisted > 0 ORDER BY id`, prefix)); err != nil {
		return r, fmt.Errorf("audit the waitlists: %w", err)
	}
	if r.Oversold, err = idsOf(db.Query(ctx, `SELECT id FROM courses WHERE starts_with(id, $1) AND enrolled > capacity ORDER BY id`, prefix)); err != nil {
		return r, fmt.Errorf("audit the waitlists: %w", err)
	}
	if r.CounterMismatches, err = idsOf(db.Query(ctx, `
			SELECT c.id FROM courses c
			LEFT JOIN (SELECT course_id,
			                  count(*) FILTER (WHERE status = 'waitlisted') AS waiting,
			                  count(*) FILTER (WHERE status IN ('reserved', 'confirmed', 'dead_lettered')) AS seated
			           FROM enrollments WHERE starts_with(course_id, $1) GROUP BY course_id) e ON e.course_id = c.id
			WHERE starts_with(c.id, $1) AND (c.waitlisted <> coalesce(e.waiting, 0) OR c.enrolled <> coalesce(e.seated, 0))
			ORDER BY c.id`, prefix)); err != nil {
		return r, fmt.Errorf("audit the waitlists: %w", err)
	}
	err = db.QueryRow(ctx, `
		SELECT
		  (SELECT count(*) FROM (SELECT 1 FROM enrollments WHERE promotion_seq IS NOT NULL AND starts_with(course_id, $1)
		                         GROUP BY course_id, promotion_seq HAVING count(*) > 1) d),
		  (SELECT count(*) FROM enrollments p
		   WHERE p.promotion_seq IS NOT NULL AND starts_with(p.course_id, $1) AND (
		     EXISTS (SELECT 1 FROM enrollments w WHERE w.course_id = p.course_id AND w.holds = 'place'
		             AND w.waitlist_seq < p.waitlist_seq)
		     OR EXISTS (SELECT 1 FROM enrollments q WHERE q.course_id = p.course_id AND q.promotion_seq < p.promotion_seq
		             AND q.waitlist_seq > p.waitlist_seq))),
		  (SELECT count(*) FROM (SELECT 1 FROM enrollments
		                         WHERE status IN ('reserved', 'confirmed', 'dead_lettered', 'waitlisted') AND starts_with(course_id, $1)
		                         GROUP BY course_id, student_id HAVING count(*) > 1) t)`, prefix).
		Scan(&r.DoublePromotions, &r.OutOfOrder, &r.WaitlistedAndEnrolled)
	if err != nil {
		return r, fmt.Errorf("audit the waitlists: %w", err)
	}
	return r, nil
}

// idsOf reads a one-column result of IDs.
func idsOf(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
