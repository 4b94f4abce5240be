package activities

import (
	"context"
	"fmt"
	"time"

	"github.com/claimflow/claimflow/workflows"
)

// FindStrandedReservations lists the reservations no run finishes: seats a
// desk's batch reserved longer than in.OlderThan ago whose enrollment is
// still reserved, grouped by batch, oldest first, at most in.Limit of them
// (workflows.RecoverReservations). Promoted enrollments are not among them:
// the promotion that reserved one starts its run in a durable step.
func (a *Activities) FindStrandedReservations(ctx context.Context, in workflows.RecoverReservationsInput) (workflows.FindStrandedResult, error) {
	var res workflows.FindStrandedResult
	limit := in.Limit
	if limit <= 0 {
		limit = 1000
	}
	rows, err := a.DB.Query(ctx, `
		SELECT e.id, e.course_id, e.student_id, e.requested_at, e.batch_id, COALESCE(e.occurred_at, e.recorded_at), e.recorded_at
		FROM enrollment_reservations r JOIN enrollments e ON e.id = r.id
		WHERE e.status = 'reserved' AND e.batch_id IS NOT NULL AND e.promoted_by IS NULL
		  AND e.recorded_at < clock_timestamp() - $1 * interval '1 millisecond'
		ORDER BY e.recorded_at, e.id LIMIT $2`, in.OlderThan.Milliseconds(), limit)
	if err != nil {
		return res, fmt.Errorf("find stranded reservations: %w", err)
	}
	defer rows.Close()
	index := map[string]int{}
	for rows.Next() {
		var c workflows.EnrollmentInput
		var recorded time.Time
		if err := rows.Scan(&c.EnrollmentID, &c.CourseID, &c.StudentID, &c.RequestedAt, &c.BatchID, &c.OccurredAt, &recorded); err != nil {
			return res, fmt.Errorf("read stranded reservations: %w", err)
		}
		c.RequestedAt, c.OccurredAt = c.RequestedAt.UTC(), c.OccurredAt.UTC()
		i, ok := index[c.BatchID]
		if !ok {
			i = len(res.Batches)
			index[c.BatchID] = i
			res.Batches = append(res.Batches, workflows.StrandedBatch{BatchID: c.BatchID, Oldest: recorded.UTC()})
		}
		res.Batches[i].Claims = append(res.Batches[i].Claims, c)
	}
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("read stranded reservations: %w", err)
	}
	return res, nil
}
