package activities

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/claimflow/claimflow/internal/buckets"
)

// Metrics are the activities' own measurements. A nil *Metrics records
// nothing, so tests and tools need not set one up.
type Metrics struct {
	publishSeconds *prometheus.HistogramVec
	publishErrors  *prometheus.CounterVec
}

// NewMetrics registers the activity metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		publishSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "claimflow_kafka_publish_seconds",
			Help:    "Time from send to acknowledgement by all in-sync replicas.",
			Buckets: buckets.Seconds(),
		}, []string{"topic"}),
		publishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_kafka_publish_errors_total",
			Help: "Sends that Kafka did not acknowledge.",
		}, []string{"topic"}),
	}
	reg.MustRegister(m.publishSeconds, m.publishErrors)
	return m
}

func (m *Metrics) observePublish(topic string, began time.Time, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.publishErrors.WithLabelValues(topic).Inc()
		return
	}
	m.publishSeconds.WithLabelValues(topic).Observe(time.Since(began).Seconds())
}
