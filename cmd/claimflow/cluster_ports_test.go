package main

import (
	"fmt"
	"net"
	"os"
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
	// Outside the kernel's ephemeral range too: a port in it can be taken
	// by any outgoing connection, and a restart then fails to bind.
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		_, _ = fmt.Sscan(string(b), &lo, &hi)
	}
	for port, what := range cluster {
		if d, ok := dev[port]; ok {
			t.Errorf("port %d: the cluster's %s and claimflow dev's %s", port, what, d)
		}
		if port >= lo && port <= hi {
			t.Errorf("the cluster's %s port %d is in the ephemeral range %d–%d", what, port, lo, hi)
		}
	}
}

// TestDevRunsOutsideACheckout: a built claimflow binary runs `claimflow
// dev` from any directory, with no TEMPORAL_CLI: the Temporal CLI's pins
// travel in the binary and the CLI comes from the user cache (or is built
// from those pins).
func TestDevRunsOutsideACheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dev stack")
	}
	s := newDevStack(t)
	s.cwd = t.TempDir()
	s.start("TEMPORAL_CLI=")
	s.api.must("POST", "/v1/courses", map[string]any{"id": "outside", "title": "Outside", "capacity": 1}, 201)
	s.api.must("POST", "/v1/courses/outside/enrollments?wait=confirmed", map[string]any{"student_id": "s1"}, 201)
}
