package main

import (
	"net"
	"strconv"
	"testing"

	"github.com/claimflow/claimflow/cmd/internal/services"
	appconfig "github.com/claimflow/claimflow/internal/config"
)

// TestClusterPortsStayClearOfDev: `claimflow dev --shape cluster` runs
// beside `claimflow dev` on one machine, so no port of one is a port of the
// other, with every port each derives from its bases (deploy/temporal/
// server.sh: base+0..4 gRPC, +10 HTTP, +100..104 membership, +200..204
// metrics; deploy/kafka/kafka.sh: base+N clients, base+100+N controllers).
func TestClusterPortsStayClearOfDev(t *testing.T) {
	dev := map[int]string{
		devPorts.API: "api", devPorts.Temporal: "temporal", devPorts.UI: "ui", devPorts.Kafka: "kafka", devPorts.PG: "postgres",
		services.Simulators["payoutsim"]: "payoutsim", services.Simulators["notifysim"]: "notifysim",
	}
	cfg, err := appconfig.Load()
	if err != nil {
		t.Fatal(err)
	}
	_, p, err := net.SplitHostPort(cfg.MetricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := strconv.Atoi(p)
	dev[metrics] = "worker metrics"
	cluster := map[int]string{services.ClusterPorts.PG: "postgres", services.ClusterPorts.Payout: "payoutsim", services.ClusterPorts.Notify: "notifysim"}
	add := func(port int, what string) {
		if other, ok := cluster[port]; ok {
			t.Errorf("cluster port %d is both %s and %s", port, other, what)
		}
		cluster[port] = what
	}
	for i := range 5 {
		add(services.ClusterPorts.Temporal+i, "temporal gRPC")
		add(services.ClusterPorts.Temporal+100+i, "temporal membership")
		add(services.ClusterPorts.Temporal+200+i, "temporal metrics")
	}
	add(services.ClusterPorts.Temporal+10, "temporal HTTP")
	for i := range services.ClusterKafka {
		add(services.ClusterPorts.Kafka+i, "kafka")
		add(services.ClusterPorts.Kafka+100+i, "kafka controller")
	}
	for i := range services.ClusterAPIs {
		add(services.ClusterPorts.API+i, "api")
	}
	for i := range services.ClusterWorkers + services.ClusterConsumers {
		add(services.ClusterPorts.Metrics+i, "metrics")
	}
	for port, what := range cluster {
		if d, ok := dev[port]; ok {
			t.Errorf("port %d: the cluster's %s and claimflow dev's %s", port, what, d)
		}
	}
}
