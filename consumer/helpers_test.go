package consumer

import (
	"log/slog"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/dev/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testDB is pgtest.DB: a migrated database and a prefix for the test's IDs.
func testDB(t *testing.T) (*pgxpool.Pool, string) { return pgtest.DB(t) }

// testActivities returns Activities on db, with a logger that writes to the
// test log and a producer that takes every message (for the best-effort
// .DLT copies).
func testActivities(t *testing.T, db *pgxpool.Pool) *Activities {
	return &Activities{
		DB:       db,
		Producer: acceptingProducer{},
		Log:      slog.New(slog.NewTextHandler(pgtest.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

type acceptingProducer struct{}

func (acceptingProducer) SendMessage(*sarama.ProducerMessage) (int32, int64, error) { return 0, 0, nil }

// concurrently runs fn(i) for i in [0, n) on n goroutines started together.
func concurrently(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			fn(i)
		}()
	}
	close(start)
	wg.Wait()
}
