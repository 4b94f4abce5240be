package activities

// A private PostgreSQL cluster for the tests that contend the database
// guards: started on first use (so the tests that need no database do not
// pay for it), migrated once, and stopped when the package's tests end.
// Each test creates rows under IDs of its own (testDB's prefix) and asserts
// on those rows only, so tests never see each other's data. (No database per
// test: CREATE DATABASE needs SQL built at run time, which
// TestSQLIsParameterized rightly refuses in this package.)

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/claimflow/claimflow/internal/devstack"
)

// pgRootEnv names a directory under which the cluster's data directory is
// created instead of the system temp dir; scripts/mutate sets it so it can
// find (and stop) a cluster a crashed test binary left running.
const pgRootEnv = "CLAIMFLOW_TEST_PG_ROOT"

var testPG struct {
	once sync.Once
	err  error
	pg   *devstack.Postgres
	dir  string

	pool *pgxpool.Pool

	mu sync.Mutex
	n  int
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if err := stopTestPostgres(); err != nil {
		fmt.Fprintln(os.Stderr, "stop test postgres:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func stopTestPostgres() error {
	if testPG.pool != nil {
		testPG.pool.Close()
	}
	if testPG.pg == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := testPG.pg.Stop(ctx); err != nil {
		return err
	}
	return os.RemoveAll(testPG.dir)
}

// startTestPostgres initialises and starts the cluster and migrates the
// template database.
func startTestPostgres(ctx context.Context) error {
	dir, err := os.MkdirTemp(os.Getenv(pgRootEnv), "activities-pg-")
	if err != nil {
		return fmt.Errorf("make a data dir: %w", err)
	}
	testPG.dir = dir
	// Run as root, the cluster runs as the postgres system user, which
	// must be able to reach the data dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("open up %s: %w", dir, err)
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		if d == filepath.Clean(os.TempDir()) {
			break
		}
		_ = os.Chmod(d, 0o755)
	}
	port, err := devstack.FreePort()
	if err != nil {
		return err
	}
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{
		DataDir: filepath.Join(dir, "pg"), Port: port, Database: "guards",
	})
	if err != nil {
		return fmt.Errorf("start a private postgres: %w", err)
	}
	testPG.pg = pg
	cfg, err := pgxpool.ParseConfig(pg.URL)
	if err != nil {
		return fmt.Errorf("parse %s: %w", pg.URL, err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", pg.URL, err)
	}
	testPG.pool = pool
	if err := Migrate(ctx, pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		return fmt.Errorf("migrate %s: %w", pg.URL, err)
	}
	return nil
}

// testDB returns a pool on the migrated database, and a prefix unique to
// the test for the IDs it creates, so tests never see each other's rows. It
// skips the test under -short only.
func testDB(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("contends the database guards on a private PostgreSQL cluster; skipped under -short")
	}
	testPG.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		testPG.err = startTestPostgres(ctx)
	})
	if testPG.err != nil {
		t.Fatalf("private postgres: %v", testPG.err)
	}
	testPG.mu.Lock()
	testPG.n++
	prefix := fmt.Sprintf("%s-%d-", sanitize(t.Name()), testPG.n)
	testPG.mu.Unlock()
	return testPG.pool, prefix
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// testActivities returns Activities on db, with a logger that writes to the
// test log and a producer that takes every message (for the best-effort
// .DLT copies).
func testActivities(t *testing.T, db *pgxpool.Pool) *Activities {
	return &Activities{
		DB:       db,
		Producer: acceptingProducer{},
		Log:      slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

type acceptingProducer struct{}

func (acceptingProducer) SendMessage(*sarama.ProducerMessage) (int32, int64, error) { return 0, 0, nil }
func (acceptingProducer) SendMessages([]*sarama.ProducerMessage) error              { return nil }

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// refusalOf returns the refusal type of an activity error ("" when err is
// nil or not a refusal).
func refusalOf(err error) string {
	var appErr *temporal.ApplicationError
	if errors.As(err, &appErr) && appErr.NonRetryable() {
		return appErr.Type()
	}
	return ""
}
