package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Grant is what the runtime role may do with one of the schema's objects.
type Grant struct {
	// Object is a table or a sequence in the public schema.
	Object string
	// Sequence is true for a sequence (bigserial columns' nextval).
	Sequence bool
	// Privileges are the SQL privilege names, e.g. SELECT, INSERT.
	Privileges []string
}

// RuntimeGrants is everything api, worker, consumer and audit may do: the
// DML their statements use, on claimflow's tables, and nothing else. No
// DELETE (no statement deletes a row: history is kept), no TRUNCATE,
// REFERENCES or TRIGGER, nothing on goose's version table, and no DDL (the
// runtime role owns nothing and has no CREATE). UPDATE is also what
// SELECT … FOR UPDATE and INSERT … ON CONFLICT DO UPDATE need.
// TestRuntimeGrantsCoverTheSchema ties this list to the migrated schema.
var RuntimeGrants = []Grant{
	{Object: "courses", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	{Object: "enrollments", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	// Written by enrollments' triggers, as the owner.
	{Object: "enrollment_reservations", Privileges: []string{"SELECT"}},
	{Object: "dead_letters", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	{Object: "vendors", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	{Object: "coupon_types", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	{Object: "coupons", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	{Object: "payouts", Privileges: []string{"SELECT", "INSERT"}},
	// UPDATE: a recipient marks notifications read (read_at).
	{Object: "notifications", Privileges: []string{"SELECT", "INSERT", "UPDATE"}},
	{Object: "dead_letters_id_seq", Sequence: true, Privileges: []string{"USAGE"}},
	{Object: "payouts_id_seq", Sequence: true, Privileges: []string{"USAGE"}},
	{Object: "notifications_seq_seq", Sequence: true, Privileges: []string{"USAGE"}},
}

// GrantRuntime gives role exactly RuntimeGrants, revoking whatever else
// this owner had granted it on the schema's tables and sequences, in one
// transaction; it runs after every migration, so a new table's grant ships
// with the migration that creates it. The role must exist (the operator
// creates it with its password: deploy/postgres/init.sh). When role is the
// connecting user itself (one role for everything) there is nothing to
// grant: it logs that the services run as the owner and returns.
func GrantRuntime(ctx context.Context, pool *pgxpool.Pool, role string, log *slog.Logger) error {
	if role == "" {
		return errors.New("grant the runtime role: DATABASE_RUNTIME_ROLE is unset and DATABASE_URL names no user")
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var exists, self bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1), $1 = current_user`, role).
			Scan(&exists, &self); err != nil {
			return fmt.Errorf("look up the runtime role %q: %w", role, err)
		}
		if !exists {
			return fmt.Errorf("the runtime role %q (DATABASE_RUNTIME_ROLE) does not exist: create it with LOGIN and a password (deploy/postgres/init.sh), or name another", role)
		}
		if self {
			log.Warn("the services connect as the schema owner: no least privilege (set MIGRATE_DATABASE_URL to the owner and DATABASE_URL to a runtime role)", "role", role)
			return nil
		}
		r := pgx.Identifier{role}.Sanitize()
		stmts := []string{
			"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM " + r,
			"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM " + r,
		}
		for _, g := range RuntimeGrants {
			kind := "TABLE"
			if g.Sequence {
				kind = "SEQUENCE"
			}
			stmts = append(stmts, fmt.Sprintf("GRANT %s ON %s %s TO %s",
				strings.Join(g.Privileges, ", "), kind, pgx.Identifier{"public", g.Object}.Sanitize(), r))
		}
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		log.Info("runtime role granted", "role", role, "objects", len(RuntimeGrants))
		return nil
	})
}
