package api

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

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
	// An enrollment's way through the claim batcher and back (where an
	// answer's time goes): waiting for its batch, the batch's
	// update call to a desk, its size, and the handler's answer.
	batchWait   prometheus.Histogram
	batchCall   prometheus.Histogram
	batchClaims prometheus.Histogram
	answer      prometheus.Histogram
	// Batches a desk could not list in its search attributes, sent again
	// to its next run.
	deskFull prometheus.Counter
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
		batchWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "claimflow_claim_batch_wait_seconds",
			Help:    "An enrollment claim's wait from its submission to the start of its batch's update call to a desk.",
			Buckets: buckets.Seconds(),
		}),
		batchCall: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "claimflow_claim_batch_call_seconds",
			Help:    "A claim batch's update call to a desk, from the call to its decisions back (calls that end without decisions are not counted).",
			Buckets: buckets.Seconds(),
		}),
		batchClaims: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "claimflow_claim_batch_claims",
			Help:    "Claims in one batch, counted when its update call to a desk starts.",
			Buckets: buckets.Claims(),
		}),
		answer: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "claimflow_claim_answer_seconds",
			Help:    "The enrollment handler's time from the claim's decision back to its answer written (?wait=confirmed answers, which wait for the confirmation, are not counted).",
			Buckets: buckets.Seconds(),
		}),
		deskFull: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "claimflow_claim_desk_full_total",
			Help: "Batches a desk turned away because its search attributes could not list them; each went to the desk's next run.",
		}),
	}
	openDeadLetters := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "claimflow_dead_letters_open",
		Help: "Dead letters waiting for an operator's retry or compensate.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := store.OpenDeadLetters(ctx, s.db)
		if err != nil {
			return -1 // visible on the dashboard as "unknown"
		}
		return float64(n)
	})
	s.cfg.Metrics.MustRegister(m.requests, m.latency, m.decisions, m.batchWait, m.batchCall, m.batchClaims, m.answer,
		m.deskFull, openDeadLetters)
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
	obs := m.latency.WithLabelValues(route, c.Request.Method)
	took := time.Since(began).Seconds()
	// A sampled request's latency carries its trace as an exemplar: a
	// Grafana latency panel links from the point to the trace.
	if sc := trace.SpanContextFromContext(c.Request.Context()); sc.IsSampled() {
		if eo, ok := obs.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(took, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	obs.Observe(took)
}

func (m *metrics) decided(workflow, status, refusal string) {
	m.decisions.WithLabelValues(workflow, status, refusal).Inc()
}

// The batcher's and the handler's observations; a nil *metrics (a batcher
// built by hand in a test) records nothing.

// batchStarted records a batch whose update call to a desk starts at
// call: its size and each claim's wait since submitted.
func (m *metrics) batchStarted(call time.Time, submitted []time.Time) {
	if m == nil {
		return
	}
	m.batchClaims.Observe(float64(len(submitted)))
	for _, at := range submitted {
		m.batchWait.Observe(call.Sub(at).Seconds())
	}
}

// batchDecided records a batch call that brought its decisions back.
func (m *metrics) batchDecided(took time.Duration) {
	if m == nil {
		return
	}
	m.batchCall.Observe(took.Seconds())
}

// deskRejected counts a batch a desk could not list and turned away.
func (m *metrics) deskRejected() {
	if m == nil {
		return
	}
	m.deskFull.Inc()
}

// answered records the handler's time from a decision to its answer.
func (m *metrics) answered(decided time.Time) {
	if m == nil {
		return
	}
	m.answer.Observe(time.Since(decided).Seconds())
}

func metricsHandler(g prometheus.Gatherer) gin.HandlerFunc {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true}) // exemplars need OpenMetrics
	return func(c *gin.Context) { h.ServeHTTP(c.Writer, c.Request) }
}
