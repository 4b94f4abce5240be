package services

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/claimflow/claimflow/dev/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestPoolMetricsShowAWaitForAConnection holds a one-connection pool's
// only connection while a query waits for it, on a real Postgres: the
// wait must show as an empty acquire and as acquire time.
func TestPoolMetricsShowAWaitForAConnection(t *testing.T) {
	_, runtimeURL := pgtest.URLs(t)
	cfg, err := pgxpool.ParseConfig(runtimeURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tel := NewTelemetry()
	tel.WatchPool(pool, "test")

	held, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const hold = 300 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		var one int
		done <- pool.QueryRow(ctx, "SELECT 1").Scan(&one)
	}()
	time.Sleep(hold)
	held.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	want := `
# HELP claimflow_db_pool_acquires_total connections taken from the pool
# TYPE claimflow_db_pool_acquires_total counter
claimflow_db_pool_acquires_total{pool="test"} 2
# HELP claimflow_db_pool_connections the pool's connections by state
# TYPE claimflow_db_pool_connections gauge
claimflow_db_pool_connections{pool="test",state="acquired"} 0
claimflow_db_pool_connections{pool="test",state="constructing"} 0
claimflow_db_pool_connections{pool="test",state="idle"} 1
# HELP claimflow_db_pool_max_connections the pool's bound
# TYPE claimflow_db_pool_max_connections gauge
claimflow_db_pool_max_connections{pool="test"} 1
`
	if err := testutil.GatherAndCompare(tel.Registry, strings.NewReader(want),
		"claimflow_db_pool_acquires_total", "claimflow_db_pool_connections", "claimflow_db_pool_max_connections"); err != nil {
		t.Error(err)
	}
	// The first acquire made the connection (empty too); the second found
	// it taken and waited about `hold` for it.
	mf, err := tel.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range mf {
		for _, m := range f.GetMetric() {
			values[f.GetName()] = m.GetCounter().GetValue()
		}
	}
	if got := values["claimflow_db_pool_empty_acquires_total"]; got != 2 {
		t.Errorf("empty acquires %v, want 2 (the first made the connection, the second waited for it)", got)
	}
	if got := values["claimflow_db_pool_acquire_seconds_total"]; got < hold.Seconds()*0.8 || got > 10 {
		t.Errorf("acquire time %vs, want about the %s the second query waited", got, hold)
	}
}
