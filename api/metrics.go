package api

import (
	"context"
	"strconv"
	"time"

	"github.com/claimflow/claimflow/internal/buckets"
	"github.com/claimflow/claimflow/internal/store"
	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	decisions *prometheus.CounterVec
}

func newMetrics(s *server) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_http_requests_total",
			Help: "HTTP requests by route, method and status.",
		}, []string{"route", "method", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "claimflow_http_request_seconds",
			Help:    "HTTP request latency by route and method.",
			Buckets: buckets.Seconds(),
		}, []string{"route", "method"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_claim_decisions_total",
			Help: "Claim outcomes answered to clients, by workflow type, status and refusal.",
		}, []string{"workflow", "status", "refusal"}),
	}
	openDeadLetters := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "claimflow_dead_letters_open",
		Help: "Dead letters waiting for an operator's retry or compensate.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := store.OpenDeadLetters(ctx, s.DB)
		if err != nil {
			return -1 // visible on the dashboard as "unknown"
		}
		return float64(n)
	})
	s.Metrics.MustRegister(m.requests, m.latency, m.decisions, openDeadLetters)
	return m
}

func (m *metrics) middleware(c *gin.Context) {
	began := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched" // keep unknown paths from exploding the label set
	}
	m.requests.WithLabelValues(route, c.Request.Method, strconv.Itoa(c.Writer.Status())).Inc()
	m.latency.WithLabelValues(route, c.Request.Method).Observe(time.Since(began).Seconds())
}

func (m *metrics) decided(workflow, status, refusal string) {
	m.decisions.WithLabelValues(workflow, status, refusal).Inc()
}

func metricsHandler(g prometheus.Gatherer) gin.HandlerFunc {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	return func(c *gin.Context) { h.ServeHTTP(c.Writer, c.Request) }
}
