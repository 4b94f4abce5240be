// Package pgtest gives package tests a private, migrated PostgreSQL
// cluster: started on first use (so the tests that need no database do not
// pay for it), migrated once as the schema owner, and stopped when the
// package's tests end. Tests reach it as the runtime role, as the services
// do, so every test also proves store.RuntimeGrants suffice.
// Each test creates rows under IDs of its own (the prefix DB returns) and
// asserts on those rows only, so tests never see each other's data. (No
// database per test: CREATE DATABASE needs SQL built at run time, which
// the SQL scan of the packages using it rightly refuses.)
package pgtest

import (
	"context"
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/claimflow/claimflow/dev/devstack"
	"github.com/claimflow/claimflow/internal/store"
)

// RootEnv names a directory under which the cluster's data directory is
// created instead of the system temp dir, so a script can find (and stop)
// a cluster a crashed test binary left running.
const RootEnv = "CLAIMFLOW_TEST_PG_ROOT"

// The cluster's two roles, as the dev stack and compose have them: the
// owner migrates, DB's pool connects as the runtime role.
const (
	OwnerRole   = "pgtest_owner"
	RuntimeRole = "pgtest_app"
)

var testPG struct {
	once sync.Once
	err  error
	pg   *devstack.Postgres
	dir  string

	pool *pgxpool.Pool
	// ownerURL and runtimeURL connect as the two roles.
	ownerURL, runtimeURL string

	mu sync.Mutex
	n  int
}

// Main runs the package's tests, then stops the cluster if one started;
// call it from TestMain.
func Main(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop test postgres:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func stop() error {
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

// start initialises and starts the cluster and migrates its database.
func start(ctx context.Context) error {
	dir, err := os.MkdirTemp(os.Getenv(RootEnv), "claimflow-pg-")
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
		OwnerRole: OwnerRole, RuntimeRole: RuntimeRole,
	})
	if err != nil {
		return fmt.Errorf("start a private postgres: %w", err)
	}
	testPG.pg = pg
	testPG.ownerURL, testPG.runtimeURL = pg.RoleURL(OwnerRole), pg.RoleURL(RuntimeRole)
	if err := migrate(ctx, testPG.ownerURL); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(testPG.runtimeURL)
	if err != nil {
		return fmt.Errorf("parse %s: %w", testPG.runtimeURL, err)
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", testPG.runtimeURL, err)
	}
	testPG.pool = pool
	return nil
}

// migrate migrates as the owner and grants the runtime role, as
// `claimflow migrate` does.
func migrate(ctx context.Context, ownerURL string) error {
	pool, err := pgxpool.New(ctx, ownerURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", ownerURL, err)
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := store.Migrate(ctx, pool, log); err != nil {
		return fmt.Errorf("migrate %s: %w", ownerURL, err)
	}
	if err := store.GrantRuntime(ctx, pool, RuntimeRole, log); err != nil {
		return fmt.Errorf("grant %s: %w", RuntimeRole, err)
	}
	return nil
}

// DB returns a pool on the migrated database, connected as RuntimeRole,
// and a prefix unique to the test for the IDs it creates, so tests never
// see each other's rows. It skips the test under -short only. A fuzz
// target may call it with its *testing.F.
func DB(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	started(t)
	testPG.mu.Lock()
	testPG.n++
	prefix := fmt.Sprintf("%s-%d-", Sanitize(t.Name()), testPG.n)
	testPG.mu.Unlock()
	return testPG.pool, prefix
}

// URLs starts the cluster if needed and returns the URLs of its owner and
// runtime roles, for tests of the roles themselves.
func URLs(t testing.TB) (ownerURL, runtimeURL string) {
	t.Helper()
	started(t)
	return testPG.ownerURL, testPG.runtimeURL
}

// SuperuserURL starts the cluster if needed and returns the URL of its
// superuser, for tests that read the server's own pages (pageinspect).
func SuperuserURL(t testing.TB) string {
	t.Helper()
	started(t)
	return testPG.pg.URL
}

// started starts the cluster once; it skips the test under -short.
func started(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("contends the database guards on a private PostgreSQL cluster; skipped under -short")
	}
	testPG.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		testPG.err = start(ctx)
	})
	if testPG.err != nil {
		t.Fatalf("private postgres: %v", testPG.err)
	}
}

// Sanitize keeps letters and digits of s and turns the rest into _, for
// IDs built from test names.
func Sanitize(s string) string {
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

// LogWriter writes a logger's lines to the test log.
type LogWriter struct{ T testing.TB }

func (w LogWriter) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
