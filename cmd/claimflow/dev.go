package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func runDev(ctx context.Context, cfg config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	var o stackOptions
	fs.StringVar(&o.DataDir, "data-dir", ".claimflow", "where Temporal, Kafka and Postgres keep their data across restarts")
	fs.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:8080", "API listen address")
	fs.IntVar(&o.TemporalPort, "temporal-port", 7233, "Temporal gRPC port")
	fs.IntVar(&o.UIPort, "ui-port", 8233, "Temporal Web UI port")
	fs.IntVar(&o.KafkaPort, "kafka-port", 9092, "Kafka (kfake) port")
	fs.IntVar(&o.PGPort, "pg-port", 55432, "port of the private PostgreSQL cluster (unused when DATABASE_URL is set)")
	fs.StringVar(&o.PGBin, "pg-bin", "", "bin directory of the PostgreSQL server to run (initdb, pg_ctl, postgres); default: one on PATH or in /usr/lib/postgresql/*/bin, else a build downloaded once into the user cache")
	fs.IntVar(&o.PayoutPort, "payout-port", 8090, "port of the payout simulator (unused when VENDOR_PAYOUT_URL is set)")
	fs.IntVar(&o.NotifyPort, "notify-port", 8091, "port of the notification webhook simulator (unused when NOTIFY_WEBHOOK_URL is set)")
	fs.BoolVar(&o.InsecureNoAuth, "insecure-no-auth", false, "serve the API without authentication, every request acting as an admin (never beyond a sandbox)")
	services := fs.String("services", "api,worker,consumer", "services run inside this process; the others (or all, with \"none\") run as 'claimflow api|worker|consumer' processes against the printed addresses")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.chooseServices(*services); err != nil {
		return err
	}
	o.DatabaseURL = os.Getenv("DATABASE_URL")
	o.PayoutURL = os.Getenv("VENDOR_PAYOUT_URL")
	o.NotifyURL = os.Getenv("NOTIFY_WEBHOOK_URL")
	o.Progress = os.Stderr

	began := time.Now()
	s, err := startStack(ctx, cfg, log, o)
	if err != nil {
		return err
	}
	fmt.Printf("%s (started in %s)\n", s.readyLine(), time.Since(began).Round(time.Millisecond))
	printAuthHint(os.Stderr, s)
	var apiDone <-chan struct{} // nil without an API: never ready
	if s.API != nil {
		apiDone = s.API.done
		fmt.Fprintf(os.Stderr, "try: curl -s -XPOST %s/v1/courses -H \"authorization: Bearer $TOKEN\" -H 'content-type: application/json' -d '{\"id\":\"cs101\",\"title\":\"Intro\",\"capacity\":20}'\n",
			"http://"+s.API.Addr)
	} else {
		fmt.Fprintf(os.Stderr, "services outside this process need: DATABASE_URL='%s' KAFKA_BROKERS=%s TEMPORAL_ADDRESS=%s JWT_SECRET=$(cat %s)\n",
			redactURL(s.Config.DatabaseURL), joinComma(s.Config.KafkaBrokers), s.Config.TemporalAddress, filepath.Join(s.opts.DataDir, secretFile))
	}
	fmt.Fprintln(os.Stderr, "stop with Ctrl-C (SIGINT) or SIGTERM")

	select {
	case <-ctx.Done():
	case <-apiDone:
		log.Error("API stopped unexpectedly", "error", s.API.err)
	case <-s.Temporal.Done():
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

// chooseServices sets which services run in the dev process.
func (o *stackOptions) chooseServices(list string) error {
	o.NoAPI, o.NoWorker, o.NoConsumer = true, true, true
	if list == "none" {
		return nil
	}
	for name := range strings.SplitSeq(list, ",") {
		switch strings.TrimSpace(name) {
		case "api":
			o.NoAPI = false
		case "worker":
			o.NoWorker = false
		case "consumer":
			o.NoConsumer = false
		default:
			return fmt.Errorf("--services: unknown service %q (want a list of api, worker, consumer, or none)", name)
		}
	}
	return nil
}
