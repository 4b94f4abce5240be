package activities

// The tests that contend the database guards run on pgtest's private
// PostgreSQL cluster.

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/workflows"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testDB is pgtest.DB: a migrated database and a prefix for the test's IDs.
func testDB(t *testing.T) (*pgxpool.Pool, string) { return pgtest.DB(t) }

func sanitize(s string) string { return pgtest.Sanitize(s) }

// superuser connects as the cluster's superuser, for what the runtime role
// may not do (pageinspect, ANALYZE, LISTEN beside the app); the connection
// closes when the test ends.
func superuser(ctx context.Context, t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, pgtest.SuperuserURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// testActivities returns Activities on db, with a logger that writes to the
// test log and a producer that takes every message (for the best-effort
// .DLT copies).
func testActivities(t *testing.T, db *pgxpool.Pool) *Activities {
	return &Activities{
		DB:       db,
		Producer: acceptingProducer{},
		Log:      slog.New(slog.NewTextHandler(testLogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

type acceptingProducer struct{}

func (acceptingProducer) SendMessage(*sarama.ProducerMessage) (int32, int64, error) { return 0, 0, nil }
func (acceptingProducer) SendMessages([]*sarama.ProducerMessage) error              { return nil }

type testLogWriter = pgtest.LogWriter

// refusalOf returns the refusal type of an activity error ("" when err is
// nil or not a refusal).
func refusalOf(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) && appErr.NonRetryable() {
		return appErr.Type()
	}
	return ""
}

// seatClaim is one claim for reserveSeat.
type seatClaim struct {
	EnrollmentID, CourseID, StudentID, WorkflowID, RunID string
	RequestedAt                                          time.Time
	Waitlist                                             bool
}

// seatResult is what reserveSeat answers of a claim that was not refused.
type seatResult struct {
	Position int // on the waitlist; 0 when it holds a seat
}

// reserveSeat decides one claim through ReserveSeats, as a desk decides a
// batch of one, and answers its refusal as the error an activity refusal
// is (naming the holder of an already_enrolled claim).
func reserveSeat(ctx context.Context, a *Activities, in seatClaim) (seatResult, error) {
	res, err := a.ReserveSeats(ctx, workflows.ReserveSeatsInput{
		Claims: []workflows.EnrollmentInput{{EnrollmentID: in.EnrollmentID, CourseID: in.CourseID, StudentID: in.StudentID,
			RequestedAt: in.RequestedAt, Waitlist: in.Waitlist, BatchID: "batch-" + in.EnrollmentID, OccurredAt: in.RequestedAt}},
		WorkflowID: in.WorkflowID, RunID: in.RunID,
	})
	if err != nil {
		return seatResult{}, err
	}
	d := res.Decisions[0]
	switch d.Status {
	case workflows.StatusRefused:
		if d.Refusal == workflows.RefusalAlreadyEnrolled {
			return seatResult{}, workflows.RefusalWithHolder(d.Refusal, d.EnrollmentID, "%s", d.Message)
		}
		return seatResult{}, workflows.Refuse(d.Refusal, "%s", d.Message)
	case workflows.StatusWaitlisted:
		return seatResult{Position: d.Position}, nil
	}
	return seatResult{}, nil
}
