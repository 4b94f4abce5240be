package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/claimflow/claimflow/cmd/internal/services"
	appconfig "github.com/claimflow/claimflow/internal/config"
)

// clusterOptions are the options `claimflow dev --shape cluster` starts
// with when no port flag is given.
func clusterOptions(t *testing.T) services.StackOptions {
	t.Helper()
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	var o services.StackOptions
	clusterDefaults(fs, &o)
	return o
}

// TestClusterPortsStayClearOfDev: `claimflow dev --shape cluster` runs
// beside `claimflow dev` on one machine, so no port of one is a port of the
// other, with every port each derives from its bases.
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
	ports, err := services.ClusterPortList(clusterOptions(t), services.Replicas{APIs: services.ClusterAPIs, Workers: services.ClusterWorkers})
	if err != nil {
		t.Fatal(err)
	}
	// Outside the kernel's ephemeral range too: a port in it can be taken
	// by any outgoing connection, and a restart then fails to bind.
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		_, _ = fmt.Sscan(string(b), &lo, &hi)
	}
	cluster := map[int]string{}
	for _, p := range ports {
		if other, ok := cluster[p.Port]; ok {
			t.Errorf("cluster port %d is both %s and %s", p.Port, other, p.What)
		}
		cluster[p.Port] = p.What
		if d, ok := dev[p.Port]; ok {
			t.Errorf("port %d: the cluster's %s and claimflow dev's %s", p.Port, p.What, d)
		}
		if p.Port >= lo && p.Port <= hi {
			t.Errorf("the cluster's %s port %d is in the ephemeral range %d–%d", p.What, p.Port, lo, hi)
		}
	}
	if want := 3 + 1 + 5*3 + 2*services.ClusterKafka + services.ClusterAPIs + services.ClusterWorkers + services.ClusterConsumers; len(ports) != want {
		t.Errorf("%d ports listed, want %d", len(ports), want)
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

	// Its PostgreSQL runs with the dev stack's settings.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := pgx.Connect(ctx, s.database)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	for _, kv := range services.DevPGSettings {
		name, want, _ := strings.Cut(kv, "=")
		var got string
		if err := db.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil || got != want {
			t.Errorf("claimflow dev's PostgreSQL has %s = %q (%v), want %q", name, got, err, want)
		}
	}
}
