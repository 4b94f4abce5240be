package main

import (
	"flag"
	"fmt"

	"github.com/claimflow/claimflow/cmd/internal/services"
)

// clusterDefaults moves the ports the user did not set to the production
// shape's.
func clusterDefaults(fs *flag.FlagSet, o *services.StackOptions) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	p := services.ClusterPorts
	for _, d := range []struct {
		flag string
		v    *int
		port int
	}{
		{"temporal-port", &o.TemporalPort, p.Temporal}, {"kafka-port", &o.KafkaPort, p.Kafka}, {"pg-port", &o.PGPort, p.PG},
		{"payout-port", &o.PayoutPort, p.Payout}, {"notify-port", &o.NotifyPort, p.Notify}, {"metrics-port", &o.MetricsPort, p.Metrics},
	} {
		if !set[d.flag] {
			*d.v = d.port
		}
	}
	if !set["http-addr"] {
		o.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", p.API)
	}
}
