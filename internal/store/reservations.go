package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reservation is an enrollment still reserved: a seat taken whose event is
// not known to be out. Its owner is the run that will finish it: the desk
// run that reserved it (WorkflowID, RunID) for the workflow task that
// decides its batch, then its batch's run, or the run of its own a batch
// run or a promotion started.
type Reservation struct {
	ID         string
	CourseID   string
	StudentID  string
	BatchID    string // "" for a promoted enrollment
	PromotedBy string // the step whose promotion reserved it, if any
	WorkflowID string
	RunID      string
	RecordedAt time.Time
	Age        time.Duration // as the database's clock tells it
}

// Reservations lists the enrollments still reserved, oldest first, on the
// courses whose ID starts with prefix ("" for every course).
func Reservations(ctx context.Context, db DB, prefix string) ([]Reservation, error) {
	rows, err := db.Query(ctx, `
		SELECT e.id, e.course_id, e.student_id, COALESCE(e.batch_id, ''), COALESCE(e.promoted_by, ''), e.workflow_id, e.run_id,
		       e.recorded_at, EXTRACT(EPOCH FROM clock_timestamp() - e.recorded_at)
		FROM enrollment_reservations r JOIN enrollments e ON e.id = r.id
		WHERE e.status = '`+EnrollmentReserved+`' AND starts_with(e.course_id, $1)
		ORDER BY e.recorded_at, e.id`, prefix)
	if err != nil {
		return nil, fmt.Errorf("list reservations: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Reservation, error) {
		var v Reservation
		var age float64
		err := r.Scan(&v.ID, &v.CourseID, &v.StudentID, &v.BatchID, &v.PromotedBy, &v.WorkflowID, &v.RunID, &v.RecordedAt, &age)
		v.Age = time.Duration(age * float64(time.Second))
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("list reservations: %w", err)
	}
	return out, nil
}
