package consumer

import (
	"errors"
	"strconv"

	"github.com/claimflow/claimflow/internal/kafka"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's measurements. A nil *Metrics records nothing,
// so tests and tools need not set one up.
type Metrics struct {
	consumerLag *prometheus.GaugeVec
	consumed    *prometheus.CounterVec
	rejected    *prometheus.CounterVec
}

// NewMetrics registers the consumer metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		consumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "claimflow_consumer_lag",
			Help: "Records on the partition after the last batch this consumer made durable.",
		}, []string{"topic", "partition"}),
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_consumer_records_total",
			Help: "Records the consumer made durable (delivered, skipped as done, or handed to a DeliverEvent run).",
		}, []string{"topic"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "claimflow_consumer_rejected_records_total",
			Help: "Records refused because no worker signed them (reason: unsigned or bad_signature); none is acted on.",
		}, []string{"topic", "reason"}),
	}
	reg.MustRegister(m.consumerLag, m.consumed, m.rejected)
	return m
}

func (m *Metrics) observeConsumed(topic string, partition int32, lag int64, records int) {
	if m == nil {
		return
	}
	m.consumerLag.WithLabelValues(topic, strconv.Itoa(int(partition))).Set(float64(max(lag, 0)))
	m.consumed.WithLabelValues(topic).Add(float64(records))
}

func (m *Metrics) observeRejected(topic string, err error) {
	if m == nil {
		return
	}
	reason := "bad_signature"
	if errors.Is(err, kafka.ErrUnsigned) {
		reason = "unsigned"
	}
	m.rejected.WithLabelValues(topic, reason).Inc()
}
