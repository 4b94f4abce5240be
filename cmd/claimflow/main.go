// Command claimflow runs the claimflow service and its local stack.
//
//	claimflow dev       the whole system on this machine, no Docker
//	claimflow api       the HTTP API
//	claimflow worker    the Temporal worker (workflows and activities)
//	claimflow migrate   apply database migrations and exit
//	claimflow replay    check workflow histories against this build
//	claimflow consumer  deliver each event's notification exactly once
//	claimflow audit     compare topics with the notifications delivered
//	claimflow token     mint a JWT for the local stack
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const usage = `usage: claimflow <command> [flags]

commands:
  dev       run the whole system locally: Temporal dev server + UI, Kafka (kfake), Postgres, API, worker, consumer
  api       serve the HTTP API
  worker    run the Temporal worker
  migrate   apply database migrations and exit
  replay    replay workflow histories (files or live runs) against this build
  consumer  consume enrollment and coupon events and deliver their notifications
  audit     compare the consumed topics with the notifications table: lost, duplicates, order
  token     print a JWT for the local stack: token --sub s-1 [--role admin] [--ttl 1h]

environment (defaults fit 'claimflow dev'):
  ` + "%s" + `

run 'claimflow <command> -h' for the command's flags.
the load tool is a command of its own: claimflow-bench -h
`

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Fprintf(os.Stderr, usage, strings.Join(envVars, ", "))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "claimflow:", err)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	if _, set := os.LookupEnv("LOG_FORMAT"); !set && cmd == "dev" {
		cfg.LogFormat = "text" // a person reads dev's terminal; machines read the services' logs
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var handler slog.Handler = slog.NewJSONHandler(os.Stderr, opts)
	if cfg.LogFormat == "text" {
		handler = slog.NewTextHandler(os.Stderr, opts)
	}
	log := slog.New(handler)
	slog.SetDefault(log)

	switch cmd {
	case "dev":
		err = runDev(ctx, cfg, log, args)
	case "api":
		err = runAPICommand(ctx, cfg, log, args)
	case "worker":
		err = runWorkerCommand(ctx, cfg, log, args)
	case "migrate":
		err = runMigrate(ctx, cfg, log, args)
	case "replay":
		err = runReplay(ctx, cfg, log, args, os.Stdout)
	case "consumer":
		err = runConsumerCommand(ctx, cfg, log, args)
	case "audit":
		err = runAudit(ctx, cfg, log, args, os.Stdout)
	case "token":
		err = runToken(ctx, cfg, log, args, os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "claimflow: unknown command %q\n\n", cmd)
		fmt.Fprintf(os.Stderr, usage, strings.Join(envVars, ", "))
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		log.Error(cmd+" failed", "error", err)
		os.Exit(1)
	}
}
