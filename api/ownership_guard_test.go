package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimflow/claimflow/internal/devstack"
	"github.com/claimflow/claimflow/internal/store"
)

// Cancelling checks the owner the database names, not one the caller sends:
// a student cancelling another student's enrollment is refused 403 before
// Temporal is asked; its owner and an admin get through. This needs the
// enrollment row, so it runs on a private PostgreSQL cluster.
func TestCancelChecksTheEnrollmentsOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the enrollment from a private PostgreSQL cluster; skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := ownershipTestDB(ctx, t)
	if _, err := db.Exec(ctx, `INSERT INTO courses (id, title, capacity, enrolled) VALUES ('c1', 'c1', 5, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `
		INSERT INTO enrollments (id, course_id, student_id, status, workflow_id, run_id, requested_at, recorded_at, confirmed_at)
		VALUES ('enr-s2', 'c1', 's-2', 'confirmed', 'enrollment-enr-s2', 'run-1', now(), now(), now())`); err != nil {
		t.Fatal(err)
	}

	auth, err := NewHS256([]byte(testSecret), JWTOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logCapture{}
	tmp := &fakeTemporal{}
	reg := prometheus.NewRegistry()
	h := New(Config{Temporal: tmp, DB: db, Log: slog.New(slog.NewTextHandler(logs, nil)),
		Security: Security{Auth: auth}, Metrics: reg, Gatherer: reg, DecisionTimeout: 5 * time.Second})
	t.Cleanup(h.Close)
	a := &testAPI{Handler: h, temporal: tmp, logs: logs}

	for _, tc := range []struct {
		name    string
		token   string
		allowed bool
	}{
		{"another student", token(t, "s-1", "", time.Hour), false},
		{"the owner", token(t, "s-2", "", time.Hour), true},
		{"an admin", token(t, "admin-1", RoleAdmin, time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := tmp.Calls()
			rec := a.call(http.MethodDelete, "/v1/enrollments/enr-s2", tc.token, nil)
			if !tc.allowed {
				if rec.Code != http.StatusForbidden {
					t.Fatalf("= %d %s, want 403", rec.Code, rec.Body.String())
				}
				if e := errorOf(t, rec); e.Code != "forbidden" || e.Field != "student_id" {
					t.Fatalf("error = %+v, want forbidden on student_id", e)
				}
				if tmp.Calls() != calls {
					t.Fatal("a forbidden cancellation reached Temporal")
				}
				return
			}
			reachedTemporal(t, rec)
		})
	}
	var status string
	if err := db.QueryRow(ctx, `SELECT status FROM enrollments WHERE id = 'enr-s2'`).Scan(&status); err != nil || status != "confirmed" {
		t.Errorf("enrollment is %q (%v), want it untouched", status, err)
	}
}

// ownershipTestDB starts a private cluster for this test and migrates it.
func ownershipTestDB(ctx context.Context, t *testing.T) *pgxpool.Pool {
	t.Helper()
	// Under CLAIMFLOW_TEST_PG_ROOT when set (scripts/mutate stops clusters
	// a crashed test left there).
	dir, err := os.MkdirTemp(os.Getenv("CLAIMFLOW_TEST_PG_ROOT"), "api-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Run as root, the cluster runs as the postgres system user.
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if d == filepath.Clean(os.TempDir()) {
			break
		}
		_ = os.Chmod(d, 0o755)
	}
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	pg, err := devstack.StartPostgres(ctx, devstack.PostgresOptions{DataDir: filepath.Join(dir, "pg"), Port: port})
	if err != nil {
		t.Fatalf("start a private postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	db, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := store.Migrate(ctx, db, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	return db
}
