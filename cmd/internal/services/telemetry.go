package services

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/claimflow/claimflow/activities"
	"github.com/claimflow/claimflow/consumer"
	"github.com/claimflow/claimflow/worker"
)

// Telemetry is one process's metrics: claimflow's own, the Temporal SDK's,
// and the Go runtime's, all served from one /metrics.
type Telemetry struct {
	Registry *prometheus.Registry
	Temporal *worker.TemporalMetrics
	// Activities are the worker's activities' metrics; Consumer the event
	// consumer's.
	Activities *activities.Metrics
	Consumer   *consumer.Metrics
	// ClosingRetries counts the updates this process's Temporal client
	// retried at once because their run was continuing as new (closing.go).
	ClosingRetries *prometheus.CounterVec
}

// NewTelemetry is a fresh registry with the Go runtime's, the Temporal
// SDK's and the activities' metrics.
func NewTelemetry() *Telemetry {
	t := &Telemetry{Registry: prometheus.NewRegistry(), Temporal: worker.NewTemporalMetrics()}
	t.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		t.Temporal,
	)
	t.Activities = activities.NewMetrics(t.Registry)
	t.Consumer = consumer.NewMetrics(t.Registry)
	t.ClosingRetries = NewClosingRetries(t.Registry)
	return t
}

// ServeMetrics serves /metrics (and /healthz) for processes without an API,
// such as the worker, on addr; empty addr serves nothing.
func ServeMetrics(addr string, t *Telemetry, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (METRICS_ADDR): %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "error", err)
		}
	}()
	log.Info("metrics listening", "addr", "http://"+ln.Addr().String()+"/metrics")
	return func() { _ = srv.Close() }, nil
}
