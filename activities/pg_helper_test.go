package activities

// The tests that contend the database guards run on pgtest's private
// PostgreSQL cluster.

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/IBM/sarama"
	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testDB is pgtest.DB: a migrated database and a prefix for the test's IDs.
func testDB(t *testing.T) (*pgxpool.Pool, string) { return pgtest.DB(t) }

func sanitize(s string) string { return pgtest.Sanitize(s) }

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
