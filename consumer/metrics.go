package consumer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's measurements. A nil *Metrics records nothing,
// so tests and tools need not set one up.
type Metrics struct {
	consumerLag *prometheus.GaugeVec
	consumed    *prometheus.CounterVec
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
	}
	reg.MustRegister(m.consumerLag, m.consumed)
	return m
}

func (m *Metrics) observeConsumed(topic string, partition int32, lag int64, records int) {
	if m == nil {
		return
	}
	m.consumerLag.WithLabelValues(topic, strconv.Itoa(int(partition))).Set(float64(max(lag, 0)))
	m.consumed.WithLabelValues(topic).Add(float64(records))
}
