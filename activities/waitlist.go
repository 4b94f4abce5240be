package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/workflows"
)

// The waitlist's effects. Every change to a course's queue happens under
// the course row's lock (FOR UPDATE), as every change to its seats does,
// so places and promotions are numbered in exactly the order they happen.

// waitlistLimit is a course's bound: WaitlistPerSeat places per seat.
func (a *Activities) waitlistLimit(capacity int) int {
	return capacity * a.WaitlistPerSeat
}

// PromoteWaitlist moves the head of a course's waitlist into every free
// seat, in queue order, in one transaction: each promoted enrollment is
// reserved as a claimed seat is, stamped promoted_at and promoted_by. The
// enrollments promoted by an earlier attempt with the same By come back
// first, so the caller starts each one's run whatever attempt committed.
func (a *Activities) PromoteWaitlist(ctx context.Context, in workflows.PromoteWaitlistInput) (workflows.PromoteWaitlistResult, error) {
	var res workflows.PromoteWaitlistResult
	err := pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		res.Promoted = nil
		var capacity, enrolled, waitlisted int
		var promotions int64
		err := tx.QueryRow(ctx, `SELECT capacity, enrolled, waitlisted, promotion_tail FROM courses WHERE id = $1 FOR UPDATE`, in.CourseID).
			Scan(&capacity, &enrolled, &waitlisted, &promotions)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("lock course %s: %w", in.CourseID, err)
		}
		collect := func(rows pgx.Rows) error {
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (workflows.EnrollmentInput, error) {
				var e workflows.EnrollmentInput
				err := r.Scan(&e.EnrollmentID, &e.CourseID, &e.StudentID, &e.RequestedAt)
				return e, err
			})
			res.Promoted = append(res.Promoted, got...)
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT id, course_id, student_id, requested_at FROM enrollments
			WHERE promoted_by = $1 AND course_id = $2 ORDER BY promotion_seq`, in.By, in.CourseID)
		if err != nil {
			return fmt.Errorf("look up earlier promotions by %s: %w", in.By, err)
		}
		if err := collect(rows); err != nil {
			return fmt.Errorf("look up earlier promotions by %s: %w", in.By, err)
		}
		n := min(capacity-enrolled, waitlisted)
		if n <= 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `
			WITH head AS (
				SELECT id, row_number() OVER (ORDER BY waitlist_seq) AS n FROM enrollments
				WHERE course_id = $1 AND holds = 'place' ORDER BY waitlist_seq LIMIT $2
			)
			UPDATE enrollments e SET status = 'reserved', promoted_at = clock_timestamp(), recorded_at = clock_timestamp(),
				promoted_by = $3, promotion_seq = $4 + head.n, updated_at = now()
			FROM head WHERE e.id = head.id`, in.CourseID, n, in.By, promotions); err != nil {
			return fmt.Errorf("promote %d from the waitlist of %s: %w", n, in.CourseID, err)
		}
		if _, err := tx.Exec(ctx, `
			UPDATE courses SET enrolled = enrolled + $2, waitlisted = waitlisted - $2, promotion_tail = promotion_tail + $2
			WHERE id = $1`, in.CourseID, n); err != nil {
			return fmt.Errorf("move %d seats of %s to the promoted: %w", n, in.CourseID, err)
		}
		res.Promoted = nil
		rows, err = tx.Query(ctx, `
			SELECT id, course_id, student_id, requested_at FROM enrollments
			WHERE promoted_by = $1 AND course_id = $2 ORDER BY promotion_seq`, in.By, in.CourseID)
		if err != nil {
			return fmt.Errorf("read the promotions by %s: %w", in.By, err)
		}
		return collect(rows)
	})
	return res, err
}
