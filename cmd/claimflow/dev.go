package main

import (
	"errors"

	"github.com/claimflow/claimflow/cmd/internal/services"
	appconfig "github.com/claimflow/claimflow/internal/config"

	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

// devPorts are `claimflow dev`'s default ports (the simulators':
// services.Simulators).
var devPorts = struct{ API, Temporal, UI, Kafka, PG int }{8080, 7233, 8233, 9092, 55432}

// runDev is `claimflow dev`: the whole system in this process until a
// signal, or until the API or the Temporal server stops on its own.
func runDev(ctx context.Context, cfg appconfig.Config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	var o services.StackOptions
	fs.StringVar(&o.DataDir, "data-dir", ".claimflow", "where Temporal, Kafka and Postgres keep their data across restarts")
	fs.StringVar(&o.HTTPAddr, "http-addr", fmt.Sprintf("127.0.0.1:%d", devPorts.API), "API listen address")
	fs.IntVar(&o.TemporalPort, "temporal-port", devPorts.Temporal, "Temporal gRPC port")
	fs.IntVar(&o.UIPort, "ui-port", devPorts.UI, "Temporal Web UI port")
	fs.IntVar(&o.KafkaPort, "kafka-port", devPorts.Kafka, "Kafka (kfake) port")
	fs.IntVar(&o.PGPort, "pg-port", devPorts.PG, "port of the private PostgreSQL cluster (unused when DATABASE_URL is set)")
	fs.StringVar(&o.PGBin, "pg-bin", "", "bin directory of the PostgreSQL server to run (initdb, pg_ctl, postgres); default: one on PATH or in /usr/lib/postgresql/*/bin, else a build downloaded once into the user cache")
	fs.BoolVar(&o.PGTLS, "pg-tls", false, "serve the private PostgreSQL over TLS only, with a CA generated into its data dir; the URLs handed out use sslmode=verify-full (not with --shape cluster, whose Temporal server connects in plaintext)")
	fs.IntVar(&o.PayoutPort, "payout-port", services.Simulators["payoutsim"], "port of the payout simulator (unused when VENDOR_PAYOUT_URL is set)")
	fs.IntVar(&o.NotifyPort, "notify-port", services.Simulators["notifysim"], "port of the notification webhook simulator (unused when NOTIFY_WEBHOOK_URL is set)")
	fs.BoolVar(&o.InsecureNoAuth, "insecure-no-auth", false, "serve the API without authentication, every request acting as an admin (never beyond a sandbox)")
	list := fs.String("services", "api,worker,consumer", "services run inside this process; the others (or all, with \"none\") run as 'claimflow api|worker|consumer' processes against the printed addresses")
	shape := fs.String("shape", "dev", "\"dev\": the Temporal dev server and kfake, the services in this process; \"cluster\": the production shape from a checkout (a 5-process Temporal server on PostgreSQL, 3 Apache Kafka brokers, 2 APIs, 2 workers and a consumer as processes), on ports of its own, on a new --data-dir")
	var r services.Replicas
	fs.IntVar(&r.APIs, "apis", services.ClusterAPIs, "with --shape cluster: API processes (ports from --http-addr up)")
	fs.IntVar(&r.Workers, "workers", services.ClusterWorkers, "with --shape cluster: worker processes")
	fs.IntVar(&o.MetricsPort, "metrics-port", services.ClusterPorts.Metrics, "with --shape cluster: the first worker's /metrics port (the other workers and the consumers follow)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if r.APIs < 1 || r.Workers < 1 {
		return fmt.Errorf("--apis %d --workers %d: at least one of each", r.APIs, r.Workers)
	}
	o.Progress = os.Stderr
	switch *shape {
	case "dev":
		o.PGSettings = services.DevPGSettings
	case "cluster":
		if o.PGTLS {
			return errors.New("--pg-tls is not for --shape cluster: its Temporal server connects to PostgreSQL in plaintext")
		}
		clusterDefaults(fs, &o)
		return runCluster(ctx, cfg, log, o, r)
	default:
		return fmt.Errorf("--shape %q: want dev or cluster", *shape)
	}
	if err := o.ChooseServices(*list); err != nil {
		return err
	}
	// Given in the environment, these name services the stack then does
	// not start; their defaults are what the stack starts.
	if cfg.IsSet("DATABASE_URL") {
		o.DatabaseURL = cfg.DatabaseURL
	}
	if cfg.IsSet("VENDOR_PAYOUT_URL") {
		o.PayoutURL = cfg.PayoutURL
	}
	if cfg.IsSet("NOTIFY_WEBHOOK_URL") {
		o.NotifyURL = cfg.NotifyWebhookURL
	}

	began := time.Now()
	s, err := services.StartStack(ctx, cfg, log, o)
	if err != nil {
		return err
	}
	fmt.Printf("%s (started in %s)\n", s.ReadyLine(), time.Since(began).Round(time.Millisecond))
	s.PrintAuthHint(os.Stderr)
	var apiDone <-chan struct{} // nil without an API: never ready
	if s.API != nil {
		apiDone = s.API.Done()
		fmt.Fprintf(os.Stderr, "try: curl -s -XPOST %s/v1/courses -H \"authorization: Bearer $TOKEN\" -H 'content-type: application/json' -d '{\"id\":\"cs101\",\"title\":\"Intro\",\"capacity\":20}'\n",
			"http://"+s.API.Addr)
	} else {
		fmt.Fprintf(os.Stderr, "services outside this process need: %s\n", services.ShellLine(s.OutsideEnv()))
		fmt.Fprintf(os.Stderr, "claimflow migrate and the bench's outbox peer also need the schema owner's: MIGRATE_DATABASE_URL='%s'\n",
			appconfig.RedactURL(s.Config.MigrateDatabaseURL))
	}
	fmt.Fprintln(os.Stderr, "stop with Ctrl-C (SIGINT) or SIGTERM")

	select {
	case <-ctx.Done():
	case <-apiDone:
		log.Error("API stopped unexpectedly", "error", s.API.Err())
	case <-s.Temporal.Done(): // the dev shape always has its dev server
		log.Error("Temporal dev server exited unexpectedly; see its log", "log", s.Temporal.LogFile)
	}
	fmt.Fprintln(os.Stderr, "shutting down...")
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout+15*time.Second)
	defer cancel()
	if err := s.Stop(stopCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	fmt.Fprintln(os.Stderr, "stopped cleanly")
	return nil
}

// runCluster is `claimflow dev --shape cluster` until a signal.
func runCluster(ctx context.Context, cfg appconfig.Config, log *slog.Logger, o services.StackOptions, r services.Replicas) error {
	began := time.Now()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locate the claimflow binary: %w", err)
	}
	c, err := services.StartCluster(ctx, cfg, log, o, r, self)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "claimflow cluster ready in %s: APIs %s; stop with Ctrl-C (SIGINT) or SIGTERM\n",
		time.Since(began).Round(time.Millisecond), strings.Join(c.APIs, " "))
	fmt.Println(c.Env())
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "shutting down...")
	stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Stop(stopCtx, cfg); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	fmt.Fprintln(os.Stderr, "stopped cleanly")
	return nil
}
