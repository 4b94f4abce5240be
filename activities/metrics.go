package activities

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
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
