// Command claimflow runs the claimflow service and its local stack.
//
//	claimflow dev       the whole system on this machine, no Docker
//	claimflow api       the HTTP API
//	claimflow worker    the Temporal worker (workflows and activities)
//	claimflow migrate   apply database migrations as the owner, grant the runtime role, exit
//	claimflow replay    check workflow histories against this build
//	claimflow consumer  deliver each event's notification exactly once
//	claimflow audit     compare topics with the notifications delivered
//	claimflow token     mint a JWT for the local stack
//	claimflow payoutsim the vendor payout simulator on its own
//	claimflow notifysim the notification webhook simulator on its own
//
// Package main parses flags and calls packages: the services live in
// cmd/internal/services, the configuration in internal/config.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/claimflow/claimflow/cmd/internal/services"
	appconfig "github.com/claimflow/claimflow/internal/config"
	"github.com/claimflow/claimflow/internal/memtrim"
	"github.com/claimflow/claimflow/internal/tracing"
)

const usage = `usage: claimflow <command> [flags]

commands:
  dev       run the whole system locally: Temporal dev server + UI, Kafka (kfake), Postgres, API, worker, consumer
  api       serve the HTTP API
  worker    run the Temporal worker
  migrate   apply database migrations as the schema owner (MIGRATE_DATABASE_URL), grant the runtime role its DML, exit
  replay    replay workflow histories (files or live runs) against this build
  consumer  consume enrollment and coupon events and deliver their notifications
  audit     compare the consumed topics with the notifications table: lost, duplicates, order
  token     print a JWT for the local stack: token --sub s-1 [--role admin] [--ttl 1h]
  payoutsim serve the vendor payout simulator 'dev' runs (--addr, default 127.0.0.1:8090; POST /payouts)
  notifysim serve the notification webhook simulator 'dev' runs (--addr, default 127.0.0.1:8091; POST /notifications)

environment (defaults fit 'claimflow dev'):
%s
run 'claimflow <command> -h' for the command's flags.
the load tool is a command of its own: claimflow-bench -h
`

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Fprintf(os.Stderr, usage, appconfig.Usage())
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return // asked for help: not an error
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg, err := appconfig.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "claimflow:", err)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	if !cfg.IsSet("LOG_FORMAT") && cmd == "dev" {
		cfg.LogFormat = "text" // a person reads dev's terminal; machines read the services' logs
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var handler slog.Handler = slog.NewJSONHandler(os.Stderr, opts)
	if cfg.LogFormat == "text" {
		handler = slog.NewTextHandler(os.Stderr, opts)
	}
	// A line logged inside a traced request, activity or delivery carries
	// its trace_id and span_id.
	log := slog.New(tracing.LogHandler(handler))
	slog.SetDefault(log)

	switch cmd {
	case "dev", "api", "worker", "consumer":
		// Long-running services return a burst's freed heap once quiet
		// (docs/operations.md#memory).
		go memtrim.Run(ctx, memtrim.Options{Log: log})
		// Traces go where OTEL_* says; with none set, nowhere, at no cost.
		shutdown, err := tracing.Setup(ctx, "claimflow-"+cmd)
		if err != nil {
			log.Error(cmd+" failed", "error", err)
			os.Exit(1)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = shutdown(sctx)
		}()
	}
	err = run(ctx, cfg, log, cmd, args, os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return // -h printed the command's flags, as asked
	}
	if errors.Is(err, errUsage) {
		os.Exit(2)
	}
	if err != nil {
		log.Error(cmd+" failed", "error", err)
		os.Exit(1)
	}
}

// errUsage means the command line named no command this binary has.
var errUsage = errors.New("usage")

func run(ctx context.Context, cfg appconfig.Config, log *slog.Logger, cmd string, args []string, stdout, stderr io.Writer) error {
	switch cmd {
	case "dev":
		return runDev(ctx, cfg, log, args)
	case "api":
		fs := flag.NewFlagSet("api", flag.ContinueOnError)
		migrate := fs.Bool("migrate", false, "run 'claimflow migrate' (as MIGRATE_DATABASE_URL) before serving; deployments migrate once instead")
		fs.BoolVar(&cfg.Security.InsecureNoAuth, "insecure-no-auth", false, "serve without authentication, every request acting as an admin (never in production)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		return services.RunAPI(ctx, cfg, log, *migrate)
	case "worker":
		if err := flag.NewFlagSet("worker", flag.ContinueOnError).Parse(args); err != nil {
			return err
		}
		return services.RunWorker(ctx, cfg, log)
	case "migrate":
		if err := flag.NewFlagSet("migrate", flag.ContinueOnError).Parse(args); err != nil {
			return err
		}
		return services.Migrate(ctx, cfg, log)
	case "replay":
		return runReplay(ctx, cfg, log, args, stdout)
	case "consumer":
		fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
		topics := fs.String("topics", strings.Join(cfg.ConsumerTopics, ","), "comma-separated topics to consume (CONSUMER_TOPICS)")
		fs.StringVar(&cfg.ConsumerGroup, "group", cfg.ConsumerGroup, "consumer group (CONSUMER_GROUP)")
		migrate := fs.Bool("migrate", false, "run 'claimflow migrate' (as MIGRATE_DATABASE_URL) before consuming; deployments migrate once instead")
		if err := fs.Parse(args); err != nil {
			return err
		}
		cfg.ConsumerTopics = appconfig.SplitList(*topics)
		return services.RunConsumer(ctx, cfg, log, *migrate)
	case "audit":
		return runAudit(ctx, cfg, log, args, stdout)
	case "token":
		return runToken(ctx, cfg, log, args, stdout)
	case "payoutsim", "notifysim":
		return runSimulator(ctx, log, cmd, args)
	}
	fmt.Fprintf(stderr, "claimflow: unknown command %q\n\n", cmd)
	fmt.Fprintf(stderr, usage, appconfig.Usage())
	return errUsage
}
