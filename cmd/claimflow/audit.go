package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/claimflow/claimflow/cmd/internal/services"
	"github.com/claimflow/claimflow/dev/audit"
	appconfig "github.com/claimflow/claimflow/internal/config"
)

// runAudit is `claimflow audit`: it exits non-zero when the delivery
// guarantee was broken.
func runAudit(ctx context.Context, cfg appconfig.Config, log *slog.Logger, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	topics := fs.String("topics", strings.Join(cfg.ConsumerTopics, ","), "comma-separated topics to audit (CONSUMER_TOPICS)")
	group := fs.String("group", cfg.ConsumerGroup, "the consumer group whose committed offsets say what was consumed (CONSUMER_GROUP)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	show := fs.Int("show", 20, "list at most this many event IDs of each fault")
	ledger := fs.String("webhook-ledger", "", "base URL of a webhook receiver with a delivery ledger (the simulator's, GET /admin/deliveries) to check its effects too")
	useTemporal := fs.Bool("temporal", true, "ask Temporal whether undelivered events are still being retried, and which run holds each reservation")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: claimflow audit [flags]")
		fmt.Fprintln(fs.Output(), "exits 1 when an event was lost, an effect happened twice (two notifications of one claim, a webhook key")
		fmt.Fprintln(fs.Output(), "accepted twice), copies of an event differ, a notification has no event, or inline deliveries are out of")
		fmt.Fprintln(fs.Output(), "key order, or a reservation has had no run to finish it for longer than the recovery bound")
		fmt.Fprintln(fs.Output(), "(RECOVERY_AFTER + 2 × RECOVERY_EVERY); redelivered copies and webhook re-sends are reported, they are the")
		fmt.Fprintln(fs.Output(), "at-least-once guarantee")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	pool, err := services.OpenDB(ctx, cfg, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	in := audit.Input{Kafka: cfg.Kafka("claimflow-audit"), Topics: appconfig.SplitList(*topics), Group: *group, DB: pool, Show: *show,
		Namespace: cfg.Namespace, RecoveryBound: cfg.RecoveryBound()}
	if *ledger != "" {
		in.Webhook = audit.WebhookLedger(*ledger)
	}
	if *useTemporal {
		tc, err := services.DialTemporal(ctx, cfg, log, nil)
		if err != nil {
			log.Warn("Temporal unreachable; undelivered consumed events count as lost", "error", err)
		} else {
			defer tc.Close()
			in.Temporal = tc
		}
	}
	r, err := audit.Run(ctx, in)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		r.WriteText(out)
	}
	if !r.OK() {
		return audit.ErrFailed
	}
	return nil
}
