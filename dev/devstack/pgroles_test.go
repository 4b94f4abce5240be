package devstack

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestPostgresRolesTakeOverAnOldDataDir: a data dir from before the
// cluster had roles (its tables the superuser's) gets the owner and the
// runtime role on the next start: the owner owns the database and the old
// tables (so it can migrate them), the runtime role can neither create a
// table nor read one it was not granted; and starting again changes
// nothing.
func TestPostgresRolesTakeOverAnOldDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL cluster; skipped under -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := PostgresOptions{DataDir: t.TempDir() + "/pg", Port: freePort(t)}
	pg, err := StartPostgres(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	exec := func(url, sql string) error {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatalf("connect %s: %v", url, err)
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec(pg.URL, "CREATE TABLE legacy (id bigserial PRIMARY KEY, note text)"); err != nil {
		t.Fatal(err)
	}

	opts.OwnerRole, opts.RuntimeRole = "test_owner", "test_app"
	for range 2 { // the second start finds everything in place
		if pg, err = StartPostgres(ctx, opts); err != nil {
			t.Fatal(err)
		}
	}
	owner, runtime := pg.RoleURL(opts.OwnerRole), pg.RoleURL(opts.RuntimeRole)
	conn, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var dbOwner, tableOwner string
	var super bool
	if err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(d.datdba), (SELECT tableowner FROM pg_tables WHERE tablename = 'legacy'),
		(SELECT bool_or(rolsuper OR rolcreatedb OR rolcreaterole) FROM pg_roles WHERE rolname = ANY($1))
		FROM pg_database d WHERE d.datname = current_database()`, []string{opts.OwnerRole, opts.RuntimeRole}).
		Scan(&dbOwner, &tableOwner, &super); err != nil {
		t.Fatal(err)
	}
	if dbOwner != opts.OwnerRole || tableOwner != opts.OwnerRole || super {
		t.Fatalf("database owned by %s, legacy by %s, a role with powers: %v; want both %s, none",
			dbOwner, tableOwner, super, opts.OwnerRole)
	}
	for _, sql := range []string{"ALTER TABLE legacy ADD COLUMN later int", "INSERT INTO legacy (note) VALUES ('owner')", "CREATE TABLE newer (id int)"} {
		if err := exec(owner, sql); err != nil {
			t.Errorf("%s as the owner: %v", sql, err)
		}
	}
	for _, sql := range []string{"CREATE TABLE hijacked (id int)", "SELECT * FROM legacy", "DROP TABLE legacy"} {
		err := exec(runtime, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s as the runtime role: err = %v, want insufficient_privilege", sql, err)
		}
	}
}
