package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// RoleURL connects to the cluster's database as role (trust
// authentication on 127.0.0.1, so no password; over verified TLS with
// PostgresOptions.TLS).
func (p *Postgres) RoleURL(role string) string {
	return p.connURL(role, p.Database)
}

// ensureRoles gives the database its two roles, as deploy/postgres/init.sh
// does in compose: owner owns the database and may create in its public
// schema; runtime may log in and nothing more (`claimflow migrate` grants
// it its DML). Neither is a superuser. PUBLIC loses CREATE on the public
// schema (PostgreSQL before 15 grants it), so the runtime role cannot
// create a table either. A data dir whose tables the superuser created
// (before the cluster had roles) hands them to the owner, so the owner can
// migrate them. Every step is idempotent: it runs on each start.
func (p *Postgres) ensureRoles(ctx context.Context, owner, runtime string) error {
	if owner == "" || runtime == "" || owner == runtime {
		return fmt.Errorf("postgres roles: an owner and a different runtime role are required, got %q and %q", owner, runtime)
	}
	for _, role := range []string{owner, runtime} {
		if err := p.ensureRole(ctx, role); err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return fmt.Errorf("connect to postgres to set up roles: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	o := pgx.Identifier{owner}.Sanitize()
	stmts := []string{
		"ALTER DATABASE " + pgx.Identifier{p.Database}.Sanitize() + " OWNER TO " + o,
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE, CREATE ON SCHEMA public TO " + o,
		// Tables the superuser created before the cluster had roles; their
		// indexes and serial sequences follow the table.
		`DO $$
DECLARE t regclass;
BEGIN
  FOR t IN SELECT c.oid::regclass FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
             AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
  LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO %I', t, current_setting('claimflow.owner'));
  END LOOP;
END $$`,
	}
	if _, err := conn.Exec(ctx, "SELECT set_config('claimflow.owner', $1, false)", owner); err != nil {
		return fmt.Errorf("postgres roles: %w", err)
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("postgres roles: %.60s: %w", s, err)
		}
	}
	return nil
}

// ensureRole creates a login role without any attribute beyond LOGIN.
func (p *Postgres) ensureRole(ctx context.Context, role string) error {
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		return fmt.Errorf("connect to postgres to create role %q: %w", role, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role).Scan(&exists); err != nil {
		return fmt.Errorf("check whether role %q exists: %w", role, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+
		" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS")
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate_object: a concurrent start won
		return nil
	}
	if err != nil {
		return fmt.Errorf("create role %q: %w", role, err)
	}
	slog.InfoContext(ctx, "postgres role created", "role", role)
	return nil
}
