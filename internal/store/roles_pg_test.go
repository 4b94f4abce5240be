package store_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/claimflow/claimflow/dev/pgtest"
	"github.com/claimflow/claimflow/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRuntimeRoleCannotChangeTheSchema: the role the services connect as
// is refused every statement that changes the schema or wipes a table, and
// the DML it was not granted, by PostgreSQL itself.
func TestRuntimeRoleCannotChangeTheSchema(t *testing.T) {
	db, prefix := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The control: the same connection may do what the services do, so a
	// refusal below is about the privilege, not the connection.
	if _, err := db.Exec(ctx, `INSERT INTO courses (id, title, capacity) VALUES ($1, 'roles', 1)`, prefix+"c"); err != nil {
		t.Fatalf("the runtime role cannot insert a course: %v", err)
	}
	for _, tc := range []struct{ name, sql string }{
		{"DROP TABLE", "DROP TABLE enrollments"},
		{"TRUNCATE", "TRUNCATE courses"},
		{"ALTER TABLE add column", "ALTER TABLE courses ADD COLUMN hijacked text"},
		{"ALTER TABLE drop constraint", "ALTER TABLE enrollments DROP CONSTRAINT enrollments_pkey"},
		{"CREATE TABLE", "CREATE TABLE hijacked (id int)"},
		{"CREATE INDEX", "CREATE INDEX hijacked ON courses (title)"},
		{"CREATE SCHEMA", "CREATE SCHEMA hijacked"},
		{"DELETE (not granted)", "DELETE FROM courses"},
		{"UPDATE payouts (not granted)", "UPDATE payouts SET amount_cents = 0"},
		{"goose's version table", "SELECT count(*) FROM goose_db_version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Exec(ctx, tc.sql)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
				t.Fatalf("%s as the runtime role: err = %v, want insufficient_privilege (42501)", tc.sql, err)
			}
		})
	}
}

// TestRuntimeGrantsCoverTheSchema: every table and sequence the migrations
// create has its row in store.RuntimeGrants (but goose's own), and the
// runtime role holds exactly the privileges listed there — so a migration
// that adds a table without its grant, or a grant widened by hand, fails.
func TestRuntimeGrantsCoverTheSchema(t *testing.T) {
	db, _ := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := db.Query(ctx, `
		SELECT c.relname, c.relkind = 'S',
		       CASE WHEN c.relkind = 'S'
		            THEN ARRAY(SELECT p FROM unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) p
		                       WHERE has_sequence_privilege(current_user, c.oid, p))
		            ELSE ARRAY(SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p
		                       WHERE has_table_privilege(current_user, c.oid, p))
		       END
		FROM pg_class c
		WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S')
		  AND c.relname NOT LIKE 'goose\_db\_version%'`)
	if err != nil {
		t.Fatal(err)
	}
	type held struct {
		sequence bool
		privs    []string
	}
	got := map[string]held{}
	var (
		name string
		h    held
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &h.sequence, &h.privs}, func() error {
		got[name] = held{h.sequence, slices.Sorted(slices.Values(h.privs))}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) < 8 {
		t.Fatalf("found only %d tables and sequences: %v", len(got), got)
	}
	for _, g := range store.RuntimeGrants {
		want := held{g.Sequence, slices.Sorted(slices.Values(g.Privileges))}
		have, ok := got[g.Object]
		if !ok {
			t.Errorf("RuntimeGrants lists %s, which the migrations do not create", g.Object)
			continue
		}
		delete(got, g.Object)
		if have.sequence != want.sequence || !slices.Equal(have.privs, want.privs) {
			t.Errorf("%s: the runtime role holds %s, RuntimeGrants lists %s",
				g.Object, strings.Join(have.privs, ", "), strings.Join(want.privs, ", "))
		}
	}
	for object, have := range got {
		t.Errorf("%s has no row in store.RuntimeGrants (the runtime role holds %v): add the DML the services need on it", object, have.privs)
	}
}

// TestGrantRuntimeNeedsTheRole: a runtime role that does not exist is an
// error that names it (the operator creates it with its password); the
// owner naming itself (one role for everything) grants nothing and passes.
func TestGrantRuntimeNeedsTheRole(t *testing.T) {
	ownerURL, _ := pgtest.URLs(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, err := store.Open(ctx, ownerURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		role string
		err  string
	}{
		{role: "no_such_role", err: `"no_such_role" (DATABASE_RUNTIME_ROLE) does not exist`},
		{role: "", err: "DATABASE_RUNTIME_ROLE is unset"},
		{role: pgtest.OwnerRole},
		{role: pgtest.RuntimeRole},
	} {
		err := store.GrantRuntime(ctx, owner, tc.role, log)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("GrantRuntime(%q) = %v, want %q", tc.role, err, tc.err)
		}
	}
}
