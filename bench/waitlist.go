package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/store"
)

// WaitlistFigures are a churn/waitlist run's: what the churn cancelled, the
// claims that waited, the promotions and how long a freed seat took to
// become a promoted student's confirmed seat, and the waitlist audit of the
// run's courses.
type WaitlistFigures struct {
	Cancelled  int `json:"cancelled"`
	Waitlisted int `json:"waitlisted"`
	Promoted   int `json:"promoted"`
	// PromotionMS: the cancellation's cancelled_at → the promoted
	// enrollment's confirmed_at.
	PromotionMS StageLatency         `json:"promotion_ms"`
	Audit       store.WaitlistReport `json:"audit"`
}

// OK is the waitlist audit's verdict.
func (w WaitlistFigures) OK() bool { return w.Audit.OK() }

func waitlistFigures(ctx context.Context, db *pgxpool.Pool, runID string, courses []string, en *enroller) (WaitlistFigures, error) {
	w := WaitlistFigures{Cancelled: int(en.cancelled.Load()), Waitlisted: int(en.waitlisted.Load())}
	err := db.QueryRow(ctx, `
		SELECT count(*),
		       coalesce(avg(ms), 0),
		       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0),
		       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY ms), 0)
		FROM (SELECT extract(epoch FROM p.confirmed_at - f.cancelled_at) * 1000 AS ms
		      FROM enrollments p JOIN enrollments f ON p.promoted_by = f.id || ':cancelled'
		      WHERE p.course_id = ANY($1) AND p.confirmed_at IS NOT NULL AND f.cancelled_at IS NOT NULL) x`,
		courses).Scan(&w.PromotionMS.Count, &w.PromotionMS.Avg, &w.PromotionMS.P50, &w.PromotionMS.P95)
	if err != nil {
		return w, fmt.Errorf("promotion latency: %w", err)
	}
	w.PromotionMS.Avg, w.PromotionMS.P50, w.PromotionMS.P95 = round3(w.PromotionMS.Avg), round3(w.PromotionMS.P50), round3(w.PromotionMS.P95)
	if err := db.QueryRow(ctx, `SELECT count(*) FROM enrollments WHERE course_id = ANY($1) AND promotion_seq IS NOT NULL`, courses).
		Scan(&w.Promoted); err != nil {
		return w, fmt.Errorf("count promotions: %w", err)
	}
	if w.Audit, err = store.AuditWaitlist(ctx, db, runID); err != nil {
		return w, err
	}
	return w, nil
}
