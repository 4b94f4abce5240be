package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Open opens a pool of at most maxConns connections to databaseURL and
// checks that it answers. Every pool of claimflow's tables opens here, the
// bench's included, so they all meet the tables with the same planner
// setting.
func Open(ctx context.Context, databaseURL string, maxConns int32, tracer ...pgx.QueryTracer) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = maxConns
	if len(tracer) > 0 {
		// Traces every statement (services.OpenDB, when tracing is on).
		pc.ConnConfig.Tracer = tracer[0]
	}
	// The batch statements look rows up by "= ANY($1)" with hundreds of IDs.
	// A generic plan cached while a table was small (or before autovacuum
	// ever analyzed it) scans the whole table on every call, and stays
	// cached, so under load every batch reads whole tables. A custom plan
	// per call sees the array and the table as they are, for a planning
	// cost far below the scan it avoids. A DATABASE_URL that sets
	// plan_cache_mode itself wins.
	if _, set := pc.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("reach Postgres at %s: %w", pc.ConnConfig.Host, err)
	}
	return pool, nil
}
