package store

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Operators' decisions on dead letters. The decision is marked on the row in
// the statement that takes it, so of two concurrent decisions on one dead
// letter exactly one finds it open; the run is then signalled with the ID
// and round the statement answered.

// ErrDeadLetterNotOpen is DecideDeadLetter's answer for a dead letter that
// exists but is not open (decided already, or resolved).
var ErrDeadLetterNotOpen = errors.New("dead letter not open")

// DecideDeadLetter marks the open dead letter id with state (retrying or
// compensating) and returns it as marked. It returns pgx.ErrNoRows when
// there is no such dead letter and ErrDeadLetterNotOpen, with the row as it
// is, when it is not open.
func DecideDeadLetter(ctx context.Context, db DB, id int64, state string) (DeadLetter, error) {
	d, err := scanDeadLetter(db.QueryRow(ctx, `
		UPDATE dead_letters SET status = $2, updated_at = now()
		WHERE id = $1 AND status = '`+DeadLetterOpen+`'
		RETURNING `+deadLetterColumns, id, state))
	if !errors.Is(err, pgx.ErrNoRows) {
		return d, err
	}
	d, err = LoadDeadLetter(ctx, db, id)
	if err != nil {
		return d, err
	}
	return d, ErrDeadLetterNotOpen
}

// ReopenDeadLetter takes back a decision whose run was never told (the
// signal failed): the row is open again if it still carries that decision
// in that round.
func ReopenDeadLetter(ctx context.Context, db DB, id int64, state string, round int) error {
	_, err := db.Exec(ctx, `
		UPDATE dead_letters SET status = '`+DeadLetterOpen+`', updated_at = now()
		WHERE id = $1 AND status = $2 AND rounds = $3`, id, state, round)
	return err
}

// DeadLetterFilter selects open dead letters for a bulk decision; a zero
// field matches every row.
type DeadLetterFilter struct {
	Stage        string
	Topic        string
	CourseID     string // the event's data.course_id
	CouponTypeID string // the event's data.coupon_type_id
	// OpenedBefore and OpenedAfter compare with the time the event was
	// first dead-lettered (created_at): before is exclusive, after inclusive.
	OpenedBefore *time.Time
	OpenedAfter  *time.Time
}

// DecideDeadLetters marks at most limit open dead letters matching f with
// state, oldest first, and returns them as marked. Rows another decision
// holds at the same moment are skipped, not waited for, so concurrent bulk
// calls decide disjoint sets.
func DecideDeadLetters(ctx context.Context, db DB, f DeadLetterFilter, state string, limit int) ([]DeadLetter, error) {
	// The picked rows are a materialized CTE: a LIMIT in an IN (…)
	// subquery of the UPDATE may be evaluated more than once and pick more.
	rows, err := db.Query(ctx, `
		WITH picked AS MATERIALIZED (
			SELECT id AS picked_id FROM dead_letters
			WHERE status = '`+DeadLetterOpen+`'
				AND ($2 = '' OR stage = $2)
				AND ($3 = '' OR topic = $3)
				AND ($4 = '' OR payload #>> '{data,course_id}' = $4)
				AND ($5 = '' OR payload #>> '{data,coupon_type_id}' = $5)
				AND ($6::timestamptz IS NULL OR created_at < $6)
				AND ($7::timestamptz IS NULL OR created_at >= $7)
			ORDER BY id
			LIMIT $8
			FOR UPDATE SKIP LOCKED)
		UPDATE dead_letters d SET status = $1, updated_at = now()
		FROM picked
		WHERE d.id = picked.picked_id AND d.status = '`+DeadLetterOpen+`'
		RETURNING `+deadLetterColumns,
		state, f.Stage, f.Topic, f.CourseID, f.CouponTypeID, f.OpenedBefore, f.OpenedAfter, limit)
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) { return scanDeadLetter(r) })
	if err != nil {
		return nil, err
	}
	// RETURNING follows no ORDER BY; answer oldest first.
	slices.SortFunc(got, func(a, b DeadLetter) int { return cmp.Compare(a.ID, b.ID) })
	return got, nil
}
