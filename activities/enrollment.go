// Package activities performs claimflow's effects: Postgres writes, Kafka
// publishes and compensations. Every activity is idempotent, keyed on the
// enrollment or event ID, because Temporal retries an activity whose result
// it did not see.
package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/internal/tracing"
	"github.com/claimflow/claimflow/workflows"
)

// Producer is the part of sarama.SyncProducer activities need.
type Producer interface {
	SendMessage(msg *sarama.ProducerMessage) (partition int32, offset int64, err error)
	SendMessages(msgs []*sarama.ProducerMessage) error
}

// Activities holds the dependencies of every activity; the worker registers
// its methods under the names workflows refers to.
type Activities struct {
	DB       *pgxpool.Pool
	Producer Producer
	Log      *slog.Logger
	Metrics  *Metrics
	// Payouts reaches the vendors' payout API (coupon uses).
	Payouts Payouts
	// WaitlistPerSeat bounds a course's waitlist at this many places per
	// seat of capacity (0: no waitlist at all).
	WaitlistPerSeat int

	// lastSendFailure is when a batch send last failed (Unix nanoseconds),
	// for PublishBatchInput.FailFast.
	lastSendFailure atomic.Int64
}

const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
)

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Publish sends one event and returns only once every in-sync replica has it.
// Publishing is at-least-once: a retry after a lost ack sends the same event
// ID again, and consumers dedupe on it.
func (a *Activities) Publish(ctx context.Context, in workflows.PublishInput) error {
	if in.StampPublishedFor != "" {
		// An attempt whose ack was recorded but whose completion never
		// reached Temporal (worker or server restart) need not send again.
		var published bool
		err := a.DB.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM enrollments WHERE id = $1`,
			in.StampPublishedFor).Scan(&published)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("check whether %s was published: %w", in.Message.Event.ID, err)
		}
		if published {
			return nil
		}
	}
	if err := a.send(ctx, in.Message); err != nil {
		return err
	}
	if in.StampPublishedFor == "" {
		return nil
	}
	_, err := a.DB.Exec(ctx, `
		UPDATE enrollments SET published_at = COALESCE(published_at, clock_timestamp()), updated_at = now()
		WHERE id = $1`, in.StampPublishedFor)
	if err != nil {
		return fmt.Errorf("record that %s was published: %w", in.Message.Event.ID, err)
	}
	return nil
}

func (a *Activities) send(ctx context.Context, m workflows.Message) error {
	payload, err := json.Marshal(m.Event)
	if err != nil {
		return fmt.Errorf("encode event %s: %w", m.Event.ID, err)
	}
	msg := &sarama.ProducerMessage{
		Topic: m.Topic,
		Key:   sarama.StringEncoder(m.Key),
		Value: sarama.ByteEncoder(payload),
		Headers: []sarama.RecordHeader{
			{Key: []byte("event_id"), Value: []byte(m.Event.ID)},
			{Key: []byte("type"), Value: []byte(m.Event.Type)},
		},
	}
	ctx, span := produceSpan(ctx, m.Topic, 1)
	tracing.Inject(ctx, msg)
	began := time.Now()
	_, _, err = a.Producer.SendMessage(msg)
	endSpan(span, err)
	a.Metrics.observePublish(m.Topic, began, err)
	if err != nil {
		return fmt.Errorf("publish %s to %s: %w", m.Event.ID, m.Topic, err)
	}
	return nil
}

// MarkConfirmed ends a published enrollment. A cancellation that won the race
// is left alone.
func (a *Activities) MarkConfirmed(ctx context.Context, enrollmentID string) error {
	_, err := a.DB.Exec(ctx, `
		UPDATE enrollments SET status = 'confirmed', confirmed_at = COALESCE(confirmed_at, clock_timestamp()), updated_at = now()
		WHERE id = $1 AND status IN ('reserved', 'dead_lettered')`, enrollmentID)
	if err != nil {
		return fmt.Errorf("confirm enrollment %s: %w", enrollmentID, err)
	}
	return nil
}

// ReleaseSeat is the compensation of one claim that ReserveSeats reserved.
// Only a reservation that is still open gives its seat back, so running it
// twice frees one seat.
func (a *Activities) ReleaseSeat(ctx context.Context, in workflows.ReleaseSeatInput) error {
	return pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		var courseID string
		err := tx.QueryRow(ctx, `
			UPDATE enrollments SET status = 'failed', failed_at = clock_timestamp(), updated_at = now()
			WHERE id = $1 AND status IN ('reserved', 'dead_lettered')
			RETURNING course_id`, in.EnrollmentID).Scan(&courseID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("fail enrollment %s: %w", in.EnrollmentID, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE courses SET enrolled = enrolled - 1 WHERE id = $1`, courseID); err != nil {
			return fmt.Errorf("give back the seat of %s in %s: %w", in.EnrollmentID, courseID, err)
		}
		return nil
	})
}

// RecordDeadLetter parks a message whose publish exhausted its retries: a row
// an operator can list and act on, the enrollment marked dead_lettered, and a
// best-effort copy on the .DLT topic for tools that watch Kafka. It answers
// the row's ID and round, which an operator's decision names.
func (a *Activities) RecordDeadLetter(ctx context.Context, in workflows.DeadLetterInput) (workflows.DeadLetterRecord, error) {
	var rec workflows.DeadLetterRecord
	payload, err := json.Marshal(in.Message.Event)
	if err != nil {
		return rec, fmt.Errorf("encode event %s: %w", in.Message.Event.ID, err)
	}
	var enrollmentID *string
	if in.EnrollmentID != "" {
		enrollmentID = &in.EnrollmentID
	}
	err = pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO dead_letters (event_id, event_type, topic, message_key, payload, workflow_id, run_id, enrollment_id, error, rounds, status)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'open')
			ON CONFLICT (event_id, stage) DO UPDATE SET
				status = 'open', error = EXCLUDED.error, run_id = EXCLUDED.run_id,
				rounds = GREATEST(dead_letters.rounds, EXCLUDED.rounds), updated_at = now()
			RETURNING id, rounds`,
			in.Message.Event.ID, in.Message.Event.Type, in.Message.Topic, in.Message.Key, payload,
			in.WorkflowID, in.RunID, enrollmentID, in.Error, in.Round).Scan(&rec.ID, &rec.Round)
		if err != nil {
			return fmt.Errorf("insert dead letter for %s: %w", in.Message.Event.ID, err)
		}
		if enrollmentID == nil {
			return nil
		}
		_, err = tx.Exec(ctx, `
			UPDATE enrollments SET status = 'dead_lettered', updated_at = now()
			WHERE id = $1 AND status = 'reserved'`, in.EnrollmentID)
		if err != nil {
			return fmt.Errorf("mark enrollment %s dead-lettered: %w", in.EnrollmentID, err)
		}
		return nil
	})
	if err != nil {
		return rec, err
	}
	dlt := in.Message
	dlt.Topic = in.Message.Topic + ".DLT"
	if err := a.sendDeadLetterCopy(dlt, rec.ID, in.Error); err != nil {
		// The row is the record of truth; the copy is for Kafka-side tooling
		// and Kafka is likely the thing that is down.
		a.Log.Warn("dead letter not copied to topic", "topic", dlt.Topic, "event_id", in.Message.Event.ID,
			"workflow_id", in.WorkflowID, "run_id", in.RunID, "error", err)
	}
	return rec, nil
}

func (a *Activities) sendDeadLetterCopy(m workflows.Message, id int64, cause string) error {
	payload, err := json.Marshal(m.Event)
	if err != nil {
		return err
	}
	_, _, err = a.Producer.SendMessage(&sarama.ProducerMessage{
		Topic: m.Topic,
		Key:   sarama.StringEncoder(m.Key),
		Value: sarama.ByteEncoder(payload),
		Headers: []sarama.RecordHeader{
			{Key: []byte("event_id"), Value: []byte(m.Event.ID)},
			{Key: []byte("dead_letter_id"), Value: fmt.Appendf(nil, "%d", id)},
			{Key: []byte("error"), Value: []byte(cause)},
		},
	})
	return err
}

// ResolveDeadLetter records what became of a dead letter.
func (a *Activities) ResolveDeadLetter(ctx context.Context, in workflows.ResolveDeadLetterInput) error {
	_, err := a.DB.Exec(ctx, `UPDATE dead_letters SET status = $2, updated_at = now() WHERE id = $1`, in.ID, string(in.State))
	if err != nil {
		return fmt.Errorf("mark dead letter %d %s: %w", in.ID, in.State, err)
	}
	return nil
}

// CancelEnrollment frees the seat of a confirmed enrollment. Cancelling a
// cancelled enrollment reports it unchanged.
func (a *Activities) CancelEnrollment(ctx context.Context, in workflows.CancelEnrollmentInput) (workflows.CancelEnrollmentResult, error) {
	var res workflows.CancelEnrollmentResult
	err := pgx.BeginFunc(ctx, a.DB, func(tx pgx.Tx) error {
		var status, by, from string
		err := tx.QueryRow(ctx, `
			SELECT course_id, student_id, status, COALESCE(cancelled_by, ''), COALESCE(cancelled_from, '')
			FROM enrollments WHERE id = $1 FOR UPDATE`,
			in.EnrollmentID).Scan(&res.CourseID, &res.StudentID, &status, &by, &from)
		if errors.Is(err, pgx.ErrNoRows) {
			return workflows.Refuse(workflows.RefusalEnrollmentNotFound, "enrollment %s does not exist", in.EnrollmentID)
		}
		if err != nil {
			return fmt.Errorf("look up enrollment %s: %w", in.EnrollmentID, err)
		}
		res.Status = workflows.EnrollmentStatus(status)
		switch res.Status {
		case workflows.StatusCancelled:
			if in.RunID != "" && by == in.RunID {
				// This run's own earlier attempt, whose answer was lost:
				// answer as it would have, so the run frees and tells.
				res.Changed = true
				res.FreedSeat, res.LeftWaitlist = from != string(workflows.StatusWaitlisted), from == string(workflows.StatusWaitlisted)
			}
			return nil
		case workflows.StatusReserved, workflows.StatusDeadLettered:
			return workflows.Refuse(workflows.RefusalEnrollmentPending,
				"enrollment %s is %s; it can be cancelled once confirmed (or compensated through its dead letter)", in.EnrollmentID, status)
		case workflows.StatusFailed:
			return workflows.Refuse(workflows.RefusalEnrollmentInactive, "enrollment %s failed and holds no seat", in.EnrollmentID)
		case workflows.StatusWaitlisted:
			// Leaving the queue: under the course's lock, as joining it was.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM courses WHERE id = $1 FOR UPDATE`, res.CourseID); err != nil {
				return fmt.Errorf("lock course %s: %w", res.CourseID, err)
			}
			if _, err := tx.Exec(ctx, `
				UPDATE enrollments SET status = 'cancelled', cancelled_at = clock_timestamp(), updated_at = now(),
					cancelled_by = $2, cancelled_from = 'waitlisted'
				WHERE id = $1`, in.EnrollmentID, in.RunID); err != nil {
				return fmt.Errorf("take %s off the waitlist: %w", in.EnrollmentID, err)
			}
			if _, err := tx.Exec(ctx, `UPDATE courses SET waitlisted = waitlisted - 1 WHERE id = $1`, res.CourseID); err != nil {
				return fmt.Errorf("count the waitlist of %s: %w", res.CourseID, err)
			}
			res.Changed, res.LeftWaitlist, res.Status = true, true, workflows.StatusCancelled
			return nil
		}
		if _, err := tx.Exec(ctx, `
			UPDATE enrollments SET status = 'cancelled', cancelled_at = clock_timestamp(), updated_at = now(),
				cancelled_by = $2, cancelled_from = $3
			WHERE id = $1`, in.EnrollmentID, in.RunID, status); err != nil {
			return fmt.Errorf("cancel enrollment %s: %w", in.EnrollmentID, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE courses SET enrolled = enrolled - 1 WHERE id = $1`, res.CourseID); err != nil {
			return fmt.Errorf("free the seat of %s in %s: %w", in.EnrollmentID, res.CourseID, err)
		}
		res.Changed, res.FreedSeat, res.Status = true, true, workflows.StatusCancelled
		return nil
	})
	return res, err
}
