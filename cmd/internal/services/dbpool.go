package services

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector serves a pgx pool's statistics on /metrics: whether
// queries wait for a connection, and how long, is the first question when
// a database call is slow while Postgres is not.
type poolCollector struct {
	pool                                    *pgxpool.Pool
	acquires, acquireSeconds, emptyAcquires *prometheus.Desc
	canceledAcquires, conns, maxConns       *prometheus.Desc
}

// WatchPool adds pool's statistics to the registry, labelled by what the
// pool serves (e.g. "services").
func (t *Telemetry) WatchPool(pool *pgxpool.Pool, name string) {
	labels := prometheus.Labels{"pool": name}
	d := func(metric, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc("claimflow_db_pool_"+metric, help, variable, labels)
	}
	t.Registry.MustRegister(&poolCollector{
		pool:             pool,
		acquires:         d("acquires_total", "connections taken from the pool"),
		acquireSeconds:   d("acquire_seconds_total", "time spent taking connections from the pool, waits included"),
		emptyAcquires:    d("empty_acquires_total", "acquires that found no idle connection and waited for one to be made or returned"),
		canceledAcquires: d("canceled_acquires_total", "acquires given up by their context while waiting"),
		conns:            d("connections", "the pool's connections by state", "state"),
		maxConns:         d("max_connections", "the pool's bound"),
	})
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquires, c.acquireSeconds, c.emptyAcquires, c.canceledAcquires, c.conns, c.maxConns} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.acquireSeconds, prometheus.CounterValue, s.AcquireDuration().Seconds())
	ch <- prometheus.MustNewConstMetric(c.emptyAcquires, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.canceledAcquires, prometheus.CounterValue, float64(s.CanceledAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.AcquiredConns()), "acquired")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.IdleConns()), "idle")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(s.ConstructingConns()), "constructing")
	ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(s.MaxConns()))
}
